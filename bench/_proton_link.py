"""Proton halves of ``bench/amqp_link.py``: a discarding server and a pipelining sender (python-qpid-proton).

    python bench/_proton_link.py server --port P --certs DIR
    python bench/_proton_link.py client --port P --certs DIR -n N --size S

Mutual TLS with DIR/{ca,server,client}.pem and keys; the server accepts every message (auto-accept, credit
1000, like our QueueBroker); the client sends N unsettled messages (Data body + application properties) and
prints one JSON line once every one of them is accepted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from proton import Message, SSLDomain
from proton.handlers import MessagingHandler
from proton.reactor import Container


def _domain(mode: int, certs: str, me: str) -> SSLDomain:
    d = SSLDomain(mode)
    d.set_credentials(os.path.join(certs, f"{me}.pem"), os.path.join(certs, f"{me}.key"), None)
    d.set_trusted_ca_db(os.path.join(certs, "ca.pem"))
    d.set_peer_authentication(SSLDomain.VERIFY_PEER, os.path.join(certs, "ca.pem"))
    return d


class Server(MessagingHandler):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(prefetch=1000, auto_accept=True)
        self.args = args

    def on_start(self, event):
        event.container.listen(
            f"amqps://127.0.0.1:{self.args.port}",
            ssl_domain=_domain(SSLDomain.MODE_SERVER, self.args.certs, "server"),
        )
        print("READY", flush=True)

    def on_message(self, event):
        pass  # auto_accept settles it


class Client(MessagingHandler):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(auto_settle=True)
        self.args = args
        self.sent = self.accepted = 0
        self.t0 = self.t1 = 0.0
        self.body = b"x" * args.size

    def on_start(self, event):
        url = f"amqps://localhost:{self.args.port}"
        conn = event.container.connect(
            url, ssl_domain=_domain(SSLDomain.MODE_CLIENT, self.args.certs, "client"), reconnect=False
        )
        event.container.create_sender(conn, "bench")

    def on_sendable(self, event):
        if not self.t0:
            self.t0 = time.perf_counter()
        while event.sender.credit and self.sent < self.args.n:
            msg = Message(body=self.body, properties={"seq": self.sent, "platform-topic": "bench"})
            msg.inferred = True
            event.sender.send(msg)
            self.sent += 1

    def on_accepted(self, event):
        self.accepted += 1
        if self.accepted == self.args.n:
            self.t1 = time.perf_counter()
            event.connection.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--certs", required=True)
    ap.add_argument("-n", type=int, default=10000)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.role == "server":
        Container(Server(args)).run()
        return
    client = Client(args)
    Container(client).run()
    print(json.dumps({"messages": client.accepted, "seconds": client.t1 - client.t0}), flush=True)


if __name__ == "__main__":
    main()
