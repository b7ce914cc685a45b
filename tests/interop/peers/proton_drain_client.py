"""Qpid Proton's receiver drains a server's sender (spec 2.6.7): ``python proton_drain_client.py --port P``.

Attaches a receiver from ``q`` with credit 1, takes the first message, waits 0.3 s (the server's sending task
now waits for credit), then ``drain(10)``: the sender must send what it has and give back the rest of the
credit. Prints one JSON line: messages received, and whether the drain completed (the receiver's credit
back to 0, no longer draining) before a 5 s timeout.
"""

from __future__ import annotations

import argparse
import json

from proton.handlers import MessagingHandler
from proton.reactor import Container


class Client(MessagingHandler):
    def __init__(self, port: int) -> None:
        super().__init__(prefetch=0)
        self.port = port
        self.received = 0
        self.drain_sent = False
        self.drained = False

    def on_start(self, event):
        conn = event.container.connect(
            f"amqp://127.0.0.1:{self.port}", reconnect=False, sasl_enabled=True, allowed_mechs="ANONYMOUS"
        )
        self.receiver = event.container.create_receiver(conn, "q")
        event.container.schedule(5, self)

    def on_link_opened(self, event):
        if event.receiver:
            event.receiver.flow(1)

    def on_message(self, event):
        self.received += 1
        if self.received == 1:
            event.container.schedule(0.3, self)

    def on_timer_task(self, event):
        if not self.drain_sent:
            self.drain_sent = True
            self.receiver.drain(10)
        else:
            event.container.stop()  # the drain was never answered

    def on_link_flow(self, event):
        link = event.link
        if self.drain_sent and link.is_receiver and not link.draining() and link.credit == 0:
            self.drained = True
            event.connection.close()
            event.container.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    client = Client(ap.parse_args().port)
    Container(client).run()
    print(json.dumps({"received": client.received, "drained": client.drained}), flush=True)


if __name__ == "__main__":
    main()
