"""Send N messages to, then receive N from, an AMQP 1.0 server with azure-servicebus's pure-Python client.

``azure.servicebus._pyamqp`` shares no code with Proton or with us: its own codec (booleans as 0x56 inside
performatives), its own engine, a synchronous socket loop. Prints one JSON line with the counts.

    python pyamqp_client.py --port 5672 --address q --count 2000 --size 1024 [--tls DIR] [--settle second]
        [--client-cert] [--p2p]

``--p2p``: a Corda peer: each message carries Corda's P2P application properties (``platform-topic``,
``platform-version`` int, ``_AMQ_DUPL_ID`` ``pyamqp-<i>`` ...) and the Data body ``pyamqp-<i>``, and
nothing is received afterwards. With ``--tls`` the server's host name is not checked then (Corda
certificates name legal entities, not hosts).
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import traceback
from pathlib import Path

from azure.servicebus._pyamqp import ReceiveClient, SendClient, authentication
from azure.servicebus._pyamqp.constants import ReceiverSettleMode, SenderSettleMode
from azure.servicebus._pyamqp.message import Message, Properties


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--address", default="q")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--tls", help="directory with ca.pem (and client.pem, client.key): TLS")
    parser.add_argument("--client-cert", action="store_true", help="with --tls: present client.pem (mutual)")
    parser.add_argument("--settle", choices=["first", "second"], default="second")
    parser.add_argument("--credit", type=int, default=100, help="receiver link credit")
    parser.add_argument("--user", default="SystemUsers/Peer")
    parser.add_argument("--password", default="SystemUsers/Peer")
    parser.add_argument("--p2p", action="store_true", help="send P2P-shaped messages only (a Corda peer)")
    args = parser.parse_args()

    # SASL PLAIN is the client's only non-CBS mechanism (CBS needs an Azure-style $cbs node)
    auth = authentication.SASLPlainAuth(authcid=args.user, passwd=args.password)
    common: dict[str, object] = {"auth": auth, "idle_timeout": 30}
    if args.tls:
        d = Path(args.tls)
        ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
        ctx.check_hostname = not args.p2p
        if args.client_cert:
            ctx.load_cert_chain(str(d / "client.pem"), str(d / "client.key"))
        common.update(ssl_context=ctx, custom_endpoint_address=f"amqps://localhost:{args.port}")
        host = "localhost"
    else:
        common.update(use_tls=False)
        host = f"127.0.0.1:{args.port}"
    result: dict[str, object] = {"sent": 0, "accepted": 0, "received": 0, "mismatches": 0, "duplicates": 0}
    body = bytes(args.size)
    started = time.monotonic()
    try:
        sender = SendClient(host, args.address, send_settle_mode=SenderSettleMode.Unsettled, **common)
        sender.open()
        for i in range(args.count):
            if args.p2p:
                message = Message(
                    data=[b"pyamqp-%d" % i],
                    properties=Properties(message_id=f"pyamqp-{i}"),
                    application_properties={
                        "platform-topic": "test.p2p", "platform-version": 1, "corda-vendor": "pyamqp",
                        "release-version": "1", "sender-uuid": "pyamqp", "send-seq-no": i,
                        "_AMQ_DUPL_ID": f"pyamqp-{i}",
                    },
                )  # fmt: skip
            else:
                payload = i.to_bytes(4, "big") + body[4:]
                message = Message(data=[payload], properties=Properties(message_id=f"m{i}"))
            sender.send_message(message)
            result["sent"] = i + 1
            result["accepted"] = i + 1  # send_message returns only once the outcome is accepted
        sender.close()
        if not args.p2p:
            receive(args, common, host, body, result)
    except Exception as exc:  # report, do not hide: the test prints it
        result["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    result["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(result), flush=True)
    return 0


def receive(
    args: argparse.Namespace, common: dict[str, object], host: str, body: bytes, result: dict[str, object]
) -> None:
    """Receive the messages sent back from ``args.address``, counting duplicates and mismatches."""
    mode = ReceiverSettleMode.Second if args.settle == "second" else ReceiverSettleMode.First
    receiver = ReceiveClient(
        host, args.address, receive_settle_mode=mode, link_credit=args.credit, timeout=20, **common
    )
    receiver.open()
    seen: set[int] = set()
    for frame, message in receiver.receive_messages_iter():
        data = b"".join(message.data)
        seq = int.from_bytes(data[:4], "big")
        if seq in seen:
            result["duplicates"] = int(result["duplicates"]) + 1  # type: ignore[call-overload]
        seen.add(seq)
        if data[4:] != body[4:] or message.properties.message_id not in (f"m{seq}", f"m{seq}".encode()):
            result["mismatches"] = int(result["mismatches"]) + 1  # type: ignore[call-overload]
        receiver.settle_messages(frame[1], frame[2], "accepted")
        result["received"] = len(seen)
        if len(seen) >= args.count:
            break
    receiver.close()


if __name__ == "__main__":
    sys.exit(main())
