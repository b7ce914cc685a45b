"""Peers named by host name, over real sockets: a name with several addresses of which the first is dead
(``localhost`` as ``::1`` then ``127.0.0.1``, for a peer that listens on 127.0.0.1 only), a name whose lookup
hangs, and a name that does not resolve for ten minutes.

The names are answered by trio's own hook for name resolution (``trio.socket.set_custom_hostname_resolver``,
which ``trio.open_tcp_stream`` consults in place of ``getaddrinfo``): this machine's resolver cannot be made
to return two addresses for one name or to hang. Everything after the lookup is the product's own dialling:
the bridge calls ``transport.open_amqp_connection``, which calls ``trio.open_tcp_stream`` (happy eyeballs:
each address in turn, the next one started 0.25 s after the last if it has not connected).
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from corda_trio import amqp, bridge, messaging, pki, store, transport
from corda_trio.testing import QueueBroker
from tests.ipv6 import needs_ipv6


class Names(trio.abc.HostnameResolver):
    """Answers names from a table: ``{name: [ip, ...]}``; ``None`` hangs until cancelled; unknown names
    fail as the C resolver does for a name that does not exist (``EAI_NONAME``)."""

    def __init__(self, table: dict[str, list[str] | None]) -> None:
        self.table = table
        self.asked: list[float] = []

    async def getaddrinfo(
        self, host: bytes | str | None, port: bytes | str | int | None, family: int = 0, type: int = 0,
        proto: int = 0, flags: int = 0,
    ) -> list[tuple[Any, ...]]:  # fmt: skip
        self.asked.append(trio.current_time())
        name = host.decode() if isinstance(host, bytes) else host
        if name not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        answers = self.table[name]
        if answers is None:
            await trio.sleep_forever()
        assert answers is not None and port is not None
        out = []
        for ip in answers:
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            sockaddr = (ip, int(port), 0, 0) if fam == socket.AF_INET6 else (ip, int(port))
            out.append((fam, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
        return out

    async def getnameinfo(self, sockaddr: tuple[Any, ...], flags: int) -> tuple[str, str]:
        raise NotImplementedError


@pytest.fixture
async def names() -> AsyncIterator[Names]:
    """Installed for this test's trio run only (the hook is a run-local variable)."""
    resolver = Names({})
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    yield resolver
    trio.socket.set_custom_hostname_resolver(previous)


NONAME = f"gaierror: [Errno {socket.EAI_NONAME}] Name or service not known"


@needs_ipv6
async def test_a_name_whose_first_address_is_dead_reaches_the_next(
    names: Names, nursery: trio.Nursery
) -> None:
    """A peer listening on 127.0.0.1 only, named ``localhost`` by a resolver that answers ``::1`` first
    (as glibc does when /etc/hosts lists ``::1 localhost``): nothing listens on ``[::1]:port``."""
    broker = QueueBroker(allow=lambda a: a == "inbox")
    listeners = await nursery.start(
        functools.partial(transport.serve_amqp, broker.handle, 0, host="127.0.0.1")
    )
    port = transport.listener_port(listeners)
    names.table["localhost"] = ["::1", "127.0.0.1"]
    with trio.fail_after(10):
        async with transport.open_amqp_connection("localhost", port) as conn:
            sender = await conn.open_sender("inbox")
            await sender.send(amqp.Message(body=b"reached"))
    assert names.asked, "the resolver was not asked: the name was not looked up through trio"


async def test_a_lookup_that_hangs_is_bounded_by_the_handshake_timeout(
    names: Names, autojump_clock: trio.abc.Clock
) -> None:
    names.table["slow.example"] = None
    start = trio.current_time()
    with pytest.raises(transport.HandshakeError, match=r"slow.example:10002 did not complete within 3.0 s"):
        async with transport.open_amqp_connection("slow.example", 10002, handshake_timeout=3.0):
            pass
    assert trio.current_time() - start == pytest.approx(3.0)


async def test_a_peer_name_that_does_not_resolve_is_one_line_a_minute_with_backoff(
    tmp_path: object,
    names: Names,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    autojump_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ten minutes of a peer named ``bob.example`` that DNS does not know: the bridge keeps running, asks
    the resolver once per attempt with the backoff in between (capped at 8 s here), and logs the first
    failure and then a line a minute."""
    caplog.set_level(logging.INFO, logger="corda_trio.bridge")
    key_hash = pki.key_hash(bob.identity.cert.public_key())
    resolver = messaging.PeerDirectory()
    resolver.put(
        messaging.Peer(legal_name=bob.legal_name, key_hash=key_hash, addresses=[("bob.example", 10002)])
    )
    ctx = pki.client_ssl_context(cert_chain=bob.tls_chain, key=bob.tls.key, trust_root=network.root.cert)
    config = bridge.BridgeConfig(initial_backoff_seconds=1.0, max_backoff_seconds=8.0, backoff_jitter=0.0)
    async with store.open_broker(tmp_path, config=store.BrokerConfig(commit_process=False)) as broker:  # type: ignore[arg-type]
        queue = await broker.declare_queue(messaging.outbound_queue(key_hash), durable=False)
        b = bridge.Bridge(queue=queue, resolver=resolver, ssl_context=ctx, config=config)
        with trio.move_on_after(600.5):
            await b.run()
    gaps = [later - earlier for earlier, later in zip(names.asked, names.asked[1:], strict=False)]
    assert gaps[:4] == pytest.approx([1.0, 2.0, 4.0, 8.0]) and min(gaps[4:]) == pytest.approx(8.0)
    assert b.failures == len(names.asked) == 78  # 1 + 2 + 4 + 8 s, then every 8 s for the rest of 600 s
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert lines[0] == f"bridge {queue.name}: could not connect to bob.example:10002: " + NONAME
    # the first, then one at the first attempt a minute or more after the last line: every 64 s
    assert len(lines) == 10, lines
    assert all("still retrying" in line and "bob.example:10002: gaierror" in line for line in lines[1:])


@needs_ipv6
async def test_an_ipv6_peer_is_named_in_brackets(
    tmp_path: object,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A peer at ``::1`` that refuses: the line said ``session with ::1:42401 ended``, where config files and
    console lines write ``[::1]:42401``; now the bridge's line and the failure it quotes write it so."""
    caplog.set_level(logging.INFO, logger="corda_trio.bridge")
    with socket.socket(socket.AF_INET6) as closed:  # bound, not listening: connections are refused
        closed.bind(("::1", 0))
        port = closed.getsockname()[1]
        key_hash = pki.key_hash(bob.identity.cert.public_key())
        resolver = messaging.PeerDirectory()
        resolver.put(messaging.Peer(legal_name=bob.legal_name, key_hash=key_hash, addresses=[("::1", port)]))
        ctx = pki.client_ssl_context(cert_chain=bob.tls_chain, key=bob.tls.key, trust_root=network.root.cert)
        async with store.open_broker(tmp_path, config=store.BrokerConfig(commit_process=False)) as broker:  # type: ignore[arg-type]
            queue = await broker.declare_queue(messaging.outbound_queue(key_hash), durable=False)
            b = bridge.Bridge(queue=queue, resolver=resolver, ssl_context=ctx, config=bridge.BridgeConfig())
            with trio.move_on_after(0.5):
                await b.run()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert lines == [
        f"bridge {queue.name}: could not connect to [::1]:{port}: "
        f"OSError: all attempts to connect to [::1]:{port} failed (Connection refused)"
    ]
