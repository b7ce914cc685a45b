"""Apache Qpid Proton as a Corda peer: mutual TLS with a node's certificate, sends P2P-shaped messages.

    python proton_p2p_client.py --port P --address A --count N --tls DIR [--rcv-settle-mode second]
        [--detach-first detach|close] [--snd-settle-mode unsettled|settled|mixed] [--validated-user NAME]

DIR holds ``client.pem`` (the TLS chain), ``client.key`` and ``ca.pem`` (the network root). Each message
carries Corda's P2P application properties (``platform-topic``, ``platform-version`` int,
``_AMQ_DUPL_ID``...) and one Data body ``b"proton-<i>"``. Prints one JSON line with the counts of
accepted / rejected / released sends, the first rejection's condition, or the link / transport error, and
the receiver-settle-mode the peer's attach stated (``--rcv-settle-mode second`` proposes second).
``--snd-settle-mode`` is the link's (default mixed, Proton's; settled: Proton sends every message
pre-settled). ``--validated-user NAME``: each message also carries ``_AMQ_VALIDATED_USER`` NAME (a claim
the receiver checks against the TLS subject).

``--detach-first``: send the N messages on a first link and, without waiting for their outcomes, detach it
(``detach``: closed=false, spec 2.6.6; ``close``: closed=true), then attach a link of the same name on the
same connection and send the same N messages again: the counts are the second link's.
"""

from __future__ import annotations

import argparse
import json
import os

from proton import Link, Message, SSLDomain, int32
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption


class SettleModes(LinkOption):
    def __init__(self, rcv_mode: int, snd_mode: int) -> None:
        self.rcv_mode = rcv_mode
        self.snd_mode = snd_mode

    def apply(self, link: Link) -> None:
        link.rcv_settle_mode = self.rcv_mode
        link.snd_settle_mode = self.snd_mode


class Client(MessagingHandler):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(auto_accept=False)
        self.args = args
        self.sent = self.accepted = self.rejected = self.released = 0
        self.error: str | None = None
        self.rejection: str | None = None
        self.remote_rcv_settle_mode: str | None = None

    def on_start(self, event):
        a = self.args
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_credentials(os.path.join(a.tls, "client.pem"), os.path.join(a.tls, "client.key"), None)
        domain.set_trusted_ca_db(os.path.join(a.tls, "ca.pem"))
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER)  # Corda checks names after the handshake
        conn = event.container.connect(f"amqps://127.0.0.1:{a.port}", reconnect=False, ssl_domain=domain)
        mode = Link.RCV_SECOND if a.rcv_settle_mode == "second" else Link.RCV_FIRST
        snd = {"unsettled": Link.SND_UNSETTLED, "settled": Link.SND_SETTLED, "mixed": Link.SND_MIXED}
        self.options = SettleModes(mode, snd[a.snd_settle_mode])
        event.container.create_sender(conn, a.address, options=self.options)
        self.detached = False

    def on_link_opened(self, event):
        second = event.link.remote_rcv_settle_mode == Link.RCV_SECOND
        self.remote_rcv_settle_mode = "second" if second else "first"

    def on_sendable(self, event):
        if getattr(event.sender, "detached_here", False):  # (the first link, with --detach-first)
            return
        while event.sender.credit and self.sent < self.args.count:
            i = self.sent
            msg = Message(
                body=b"proton-%d" % i,
                durable=True,
                id=f"proton-{i}",
                properties={
                    "platform-topic": "test.p2p",
                    "platform-version": int32(1),
                    "corda-vendor": "qpid-proton",
                    "release-version": "1",
                    "sender-uuid": "proton",
                    "send-seq-no": i,
                    "_AMQ_DUPL_ID": f"proton-{i}",
                },
            )
            if self.args.validated_user is not None:
                msg.properties["_AMQ_VALIDATED_USER"] = self.args.validated_user
            msg.inferred = True  # bytes body as a Data section
            event.sender.send(msg)
            self.sent += 1
        if self.args.detach_first and not self.detached and self.sent == self.args.count:
            # the first link goes with every delivery unsettled; the same name again, the same messages
            self.detached = True
            event.sender.detached_here = True  # (kept with the link: proton's wrappers share attributes)
            if self.args.detach_first == "detach":
                event.sender.detach()
            else:
                event.sender.close()
            # (outcomes the first link received before it went are not the second link's: with less credit
            # than N, as at a float, some arrive before the last message is sent)
            self.sent = self.accepted = self.rejected = self.released = 0
            self.rejection = None
            event.container.create_sender(
                event.connection, self.args.address, name=event.sender.name, options=self.options
            )

    def _counts(self, event) -> bool:
        """Whether the event's link counts (with --detach-first, only the second link does: the first
        one is detached here)."""
        return not getattr(event.link, "detached_here", False)

    def on_accepted(self, event):
        if not self._counts(event):
            return
        self.accepted += 1
        self._maybe_close(event)

    def on_rejected(self, event):
        if not self._counts(event):
            return
        self.rejected += 1
        cond = event.delivery.remote.condition
        self.rejection = self.rejection or (cond.name if cond else None)
        self._maybe_close(event)

    def on_released(self, event):
        if not self._counts(event):
            return
        self.released += 1
        self._maybe_close(event)

    def _maybe_close(self, event):
        if self.accepted + self.rejected + self.released == self.args.count:
            event.connection.close()

    def on_link_error(self, event):
        if not self._counts(event):
            return
        cond = event.link.remote_condition
        self.error = f"{cond.name}: {cond.description}" if cond else "link error"
        event.connection.close()

    def on_transport_error(self, event):
        cond = event.transport.condition
        self.error = self.error or (f"{cond.name}: {cond.description}" if cond else "transport error")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--tls", required=True)
    ap.add_argument("--rcv-settle-mode", choices=["first", "second"], default="first")
    ap.add_argument("--detach-first", choices=["detach", "close"])
    ap.add_argument("--snd-settle-mode", choices=["unsettled", "settled", "mixed"], default="mixed")
    ap.add_argument("--validated-user")
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
                "rejection": client.rejection,
                "error": client.error,
                "remote_rcv_settle_mode": client.remote_rcv_settle_mode,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
