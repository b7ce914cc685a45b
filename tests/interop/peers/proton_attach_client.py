"""Apache Qpid Proton with a small max-frame-size attaching a sender to a long address, then a short one.

    python proton_attach_client.py --port P --max-frame-size 512 --address-length 2000

Plain AMQP, SASL ANONYMOUS. Attaches a sender to an address of ``--address-length`` characters and a second
one to ``short``; once the server has answered the first, sends one message on the second. Prints one JSON
line: the long link's remote condition (or ``null``) and whether its answer had a target, the second link's
outcome, and any connection or transport error (a frame above our max-frame-size is one).
"""

from __future__ import annotations

import argparse
import json

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container


class Client(MessagingHandler):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(auto_accept=False)
        self.args = args
        self.out: dict[str, object] = {
            "long_condition": None, "long_remote_target": None, "short": None, "error": None,
        }  # fmt: skip
        self.long = self.short = None
        self.long_done = self.sent = False

    def on_start(self, event):
        a = self.args
        conn = event.container.connect(
            f"amqp://127.0.0.1:{a.port}", reconnect=False, max_frame_size=a.max_frame_size,
            allowed_mechs="ANONYMOUS",
        )  # fmt: skip
        self.long = event.container.create_sender(conn, "x" * a.address_length, name="long")
        self.short = event.container.create_sender(conn, "short", name="short")

    def on_link_error(self, event):
        if event.link.name == "long":
            cond = event.link.remote_condition
            self.out["long_condition"] = cond.name if cond else None
            self.out["long_description"] = cond.description if cond else None
            self._long_answered(event)
        else:
            self._error(event.link.remote_condition)
            event.connection.close()

    def on_link_opened(self, event):
        if event.link.name == "long":
            self.out["long_remote_target"] = event.link.remote_target.address
            if event.link.remote_target.address is not None:  # not refused
                self._long_answered(event)

    def _long_answered(self, event):
        self.long_done = True
        self._send()

    def on_sendable(self, event):
        self._send()

    def _send(self):
        if self.long_done and not self.sent and self.short is not None and self.short.credit:
            self.short.send(Message(body=b"after"))
            self.sent = True

    def on_accepted(self, event):
        self.out["short"] = "accepted"
        event.connection.close()

    def on_rejected(self, event):
        self.out["short"] = "rejected"
        event.connection.close()

    def _error(self, cond):
        if self.out["error"] is None:
            self.out["error"] = f"{cond.name}: {cond.description}" if cond else "unknown"

    def on_connection_error(self, event):
        self._error(event.connection.remote_condition)
        event.connection.close()

    def on_transport_error(self, event):
        self._error(event.transport.condition)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-frame-size", type=int, default=512)
    parser.add_argument("--address-length", type=int, default=2000)
    client = Client(parser.parse_args())
    Container(client).run()
    print(json.dumps(client.out))


if __name__ == "__main__":
    main()
