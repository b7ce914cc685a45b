"""A small in-memory AMQP 1.0 queue broker on Apache Qpid Proton (the interop tests' Proton server).

    python proton_broker.py --port N [--tls DIR --require-client-cert] [--idle-timeout S] [--max-frame-size B]

Listens on 127.0.0.1 only. Messages sent to an address are stored (and accepted); a peer that attaches a
receiving link from an address gets them in order. Prints ``READY <port>`` when listening. Stops on SIGTERM.
TLS uses DIR/server.pem, DIR/server.key and (mutual TLS) DIR/ca.pem.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys

from proton import SSLDomain
from proton.handlers import MessagingHandler
from proton.reactor import Container


class Broker(MessagingHandler):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(prefetch=args.prefetch, auto_accept=True)
        self.args = args
        self.queues: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.consumers: dict[str, list] = collections.defaultdict(list)

    def on_start(self, event):
        scheme = "amqps" if self.args.tls else "amqp"
        domain = None
        if self.args.tls:
            d = self.args.tls
            domain = SSLDomain(SSLDomain.MODE_SERVER)
            domain.set_credentials(os.path.join(d, "server.pem"), os.path.join(d, "server.key"), None)
            if self.args.require_client_cert:
                domain.set_trusted_ca_db(os.path.join(d, "ca.pem"))
                domain.set_peer_authentication(SSLDomain.VERIFY_PEER, os.path.join(d, "ca.pem"))
            else:
                domain.set_peer_authentication(SSLDomain.ANONYMOUS_PEER)
        event.container.listen(f"{scheme}://127.0.0.1:{self.args.port}", ssl_domain=domain)
        print(f"READY {self.args.port}", flush=True)

    def on_connection_bound(self, event):
        event.connection.container = "proton-interop-broker"
        if self.args.max_frame_size:
            event.transport.max_frame_size = self.args.max_frame_size
        if self.args.idle_timeout:
            event.transport.idle_timeout = self.args.idle_timeout

    def on_link_opening(self, event):
        link = event.link
        if link.is_sender:
            addr = link.remote_source.address
            link.source.address = addr
            link.target.copy(link.remote_target)
            self.consumers[addr].append(link)
        else:
            link.target.address = link.remote_target.address
            link.source.copy(link.remote_source)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode

    def _forget(self, link):
        if link.is_sender:
            for links in self.consumers.values():
                if link in links:
                    links.remove(link)

    def on_link_closing(self, event):
        self._forget(event.link)

    def on_disconnected(self, event):
        if event.connection:
            link = event.connection.link_head(0)
            while link:
                self._forget(link)
                link = link.next(0)

    def on_message(self, event):
        addr = event.link.target.address or event.message.address or ""
        self.queues[addr].append(event.message)
        self._dispatch(addr)

    def on_sendable(self, event):
        self._dispatch(event.link.source.address)

    def _dispatch(self, addr):
        queue = self.queues.get(addr)
        for link in list(self.consumers.get(addr, [])):
            while queue and link.credit > 0:
                link.send(queue.popleft())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tls", metavar="DIR")
    ap.add_argument("--require-client-cert", action="store_true")
    ap.add_argument("--prefetch", type=int, default=1000)
    ap.add_argument("--max-frame-size", type=int, default=0)
    ap.add_argument("--idle-timeout", type=float, default=0.0)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Container(Broker(args)).run()


if __name__ == "__main__":
    main()
