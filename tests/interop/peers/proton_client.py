"""Apache Qpid Proton client for the interop tests: send N messages to an address, then receive N back.

    python proton_client.py --port P --address A --count N [--size B] [--user U --password W]
                            [--receive-only | --send-only]

Each message has application properties ``{"seq": i, "kind": "interop"}`` and one Data body of ``--size``
bytes (byte ``i % 251`` repeated). Prints one JSON line: counts of accepted/rejected/released sends, received
messages, whether every received message matched, and the server's Open fields.
"""

from __future__ import annotations

import argparse
import json
import os

from proton import Message, SSLDomain
from proton.handlers import MessagingHandler
from proton.reactor import Container


def body(i: int, size: int) -> bytes:
    return bytes([i % 251]) * size


class Client(MessagingHandler):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(prefetch=100, auto_accept=False)
        self.args = args
        self.sent = self.accepted = self.rejected = self.released = self.received = 0
        self.mismatches = 0
        self.remote_container = None
        self.conn = None

    def on_start(self, event):
        a = self.args
        kwargs = {}
        if a.user:
            kwargs.update(user=a.user, password=a.password, allowed_mechs="PLAIN", allow_insecure_mechs=True)
        if a.tls:  # mutual TLS: our certificate, trust only the test CA, check the server's name
            domain = SSLDomain(SSLDomain.MODE_CLIENT)
            if not a.no_client_cert:
                domain.set_credentials(
                    os.path.join(a.tls, "client.pem"), os.path.join(a.tls, "client.key"), None
                )
            domain.set_trusted_ca_db(os.path.join(a.tls, "ca.pem"))
            domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, os.path.join(a.tls, "ca.pem"))
            kwargs["ssl_domain"] = domain
            url = f"amqps://localhost:{a.port}"
        else:
            url = f"amqp://127.0.0.1:{a.port}"
        self.conn = event.container.connect(url, reconnect=False, **kwargs)
        if not a.receive_only:
            event.container.create_sender(self.conn, a.address)
        else:
            event.container.create_receiver(self.conn, a.address)

    def on_connection_opened(self, event):
        self.remote_container = event.connection.remote_container

    def on_sendable(self, event):
        while event.sender.credit and self.sent < self.args.count:
            msg = Message(
                body=body(self.sent, self.args.size), properties={"seq": self.sent, "kind": "interop"}
            )
            msg.inferred = True  # bytes body as a Data section
            event.sender.send(msg)
            self.sent += 1

    def on_accepted(self, event):
        self.accepted += 1
        self._maybe_next(event)

    def on_rejected(self, event):
        self.rejected += 1
        self._maybe_next(event)

    def on_released(self, event):
        self.released += 1
        self._maybe_next(event)

    def _maybe_next(self, event):
        if self.accepted + self.rejected + self.released == self.args.count:
            event.sender.close()
            if self.args.send_only:
                event.connection.close()
            else:
                event.container.create_receiver(event.connection, self.args.address)

    def on_message(self, event):
        i = self.received
        msg = event.message
        ok = (msg.properties or {}).get("seq") == i and bytes(msg.body) == body(i, self.args.size)
        self.mismatches += 0 if ok else 1
        self.received += 1
        self.accept(event.delivery)
        if self.received == self.args.count:
            event.receiver.close()
            event.connection.close()

    def on_transport_error(self, event):
        cond = event.transport.condition
        print(
            json.dumps({"error": f"{cond.name}: {cond.description}" if cond else "transport error"}),
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--user")
    ap.add_argument("--password")
    ap.add_argument("--send-only", action="store_true")
    ap.add_argument("--receive-only", action="store_true")
    ap.add_argument("--tls", metavar="DIR", help="mutual TLS with DIR/client.pem, client.key, ca.pem")
    ap.add_argument("--no-client-cert", action="store_true", help="with --tls: server-authenticated TLS only")
    args = ap.parse_args()
    client = Client(args)
    Container(client).run()
    print(
        json.dumps(
            {
                "sent": client.sent,
                "accepted": client.accepted,
                "rejected": client.rejected,
                "released": client.released,
                "received": client.received,
                "mismatches": client.mismatches,
                "remote_container": client.remote_container,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
