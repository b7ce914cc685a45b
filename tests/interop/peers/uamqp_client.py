"""Send N messages to, then receive N from, an AMQP 1.0 server with uamqp (azure-uamqp-c's Python binding).

``uamqp`` wraps azure-uamqp-c: its own C codec and engine, and its own TLS (OpenSSL ``tlsio``); it connects
only over TLS (``amqps``), with SASL PLAIN here, and its Python API has no client certificate, so there is no
mutual-TLS variant. Prints one JSON line with the counts.

    python uamqp_client.py --port 5671 --tls DIR --address q --count 2000 --size 1024
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import uamqp
from uamqp import authentication
from uamqp.constants import MessageState, ReceiverSettleMode


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls", required=True, help="directory with ca.pem (the server's CA)")
    parser.add_argument("--address", default="q")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--credit", type=int, default=100, help="receiver prefetch (link credit)")
    parser.add_argument("--settle", choices=["first", "second"], default="second")
    parser.add_argument("--user", default="SystemUsers/Peer")
    parser.add_argument("--password", default="SystemUsers/Peer")
    args = parser.parse_args()

    host = "localhost"  # the server certificate's name
    result: dict[str, object] = {"sent": 0, "accepted": 0, "received": 0, "mismatches": 0, "duplicates": 0}
    body = bytes(args.size)
    started = time.monotonic()
    try:

        def auth() -> authentication.SASLPlain:  # one per connection (uamqp consumes it)
            return authentication.SASLPlain(
                host, args.user, args.password, port=args.port, verify=str(Path(args.tls) / "ca.pem")
            )

        target = f"amqps://{host}:{args.port}/{args.address}"
        sender = uamqp.SendClient(target, auth=auth())
        try:
            for i in range(args.count):
                payload = i.to_bytes(4, "big") + body[4:]
                properties = uamqp.message.MessageProperties(message_id=f"m{i}")
                message = uamqp.Message(payload, properties=properties)
                sender.queue_message(message)
            states = sender.send_all_messages(close_on_done=False)
            result["sent"] = len(states)
            result["accepted"] = sum(1 for s in states if s == MessageState.SendComplete)
        finally:
            sender.close()
        result["send_seconds"] = round(time.monotonic() - started, 3)
        # ReceiveAndDelete expects pre-settled deliveries (it sends no dispositions)
        mode = ReceiverSettleMode.PeekLock if args.settle == "second" else ReceiverSettleMode.ReceiveAndDelete
        receiver = uamqp.ReceiveClient(
            f"amqps://{host}:{args.port}/{args.address}",
            auth=auth(),
            prefetch=args.credit,
            receive_settle_mode=mode,
            auto_complete=False,
            timeout=20_000,
        )
        seen: set[int] = set()
        try:
            for message in receiver.receive_messages_iter():
                data = b"".join(message.get_data())
                seq = int.from_bytes(data[:4], "big")
                if seq in seen:
                    result["duplicates"] = int(result["duplicates"]) + 1  # type: ignore[call-overload]
                seen.add(seq)
                message_id = message.properties.message_id
                if data[4:] != body[4:] or message_id not in (f"m{seq}", f"m{seq}".encode()):
                    result["mismatches"] = int(result["mismatches"]) + 1  # type: ignore[call-overload]
                message.accept()
                result["received"] = len(seen)
                if len(seen) >= args.count:
                    break
        finally:
            receiver.close()
    except Exception as exc:  # report, do not hide: the test prints it
        result["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    result["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
