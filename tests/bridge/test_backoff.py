"""Reconnect backoff: the bound, the jitter, the reset; and a bridge's attempts against a dead address."""

from __future__ import annotations

import random

import pytest
import trio

from corda_trio import bridge, messaging, pki, store


def test_backoff_doubles_to_the_cap_with_jitter_and_resets() -> None:
    b = bridge.Backoff(rng=random.Random(7))
    bounds = [1, 2, 4, 8, 16, 32, 60, 60, 60]
    for bound in bounds:
        delay = b.next_delay()
        assert bound * 0.8 <= delay <= bound
    b.reset()
    assert 0.8 <= b.next_delay() <= 1.0
    delays = {round(bridge.Backoff(rng=random.Random(s)).next_delay(), 6) for s in range(20)}
    assert len(delays) > 10  # jittered: peers that failed together spread out


class RecordingResolver(messaging.PeerDirectory):
    """A directory that records when the bridge looked the peer up (once per attempt)."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups: list[float] = []

    def peer(self, key_hash: str) -> messaging.Peer | None:
        self.lookups.append(trio.current_time())
        return super().peer(key_hash)


async def test_bridge_redials_within_the_backoff_bound(
    tmp_path: object,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    autojump_clock: trio.abc.Clock,
) -> None:
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # nobody listens there
    resolver = RecordingResolver()
    key_hash = pki.key_hash(bob.identity.cert.public_key())
    resolver.put(
        messaging.Peer(legal_name=bob.legal_name, key_hash=key_hash, addresses=[("127.0.0.1", dead_port)])
    )
    ctx = pki.client_ssl_context(cert_chain=bob.tls_chain, key=bob.tls.key, trust_root=network.root.cert)
    async with store.open_broker(tmp_path, config=store.BrokerConfig(commit_process=False)) as broker:  # type: ignore[arg-type]
        queue = await broker.declare_queue(messaging.outbound_queue(key_hash), durable=False)
        b = bridge.Bridge(queue=queue, resolver=resolver, ssl_context=ctx)
        with trio.move_on_after(300):
            await b.run()
    gaps = [t2 - t1 for t1, t2 in zip(resolver.lookups, resolver.lookups[1:], strict=False)]
    bounds = [1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 60]
    assert len(gaps) >= 8
    for gap, bound in zip(gaps, bounds, strict=False):
        assert bound * 0.8 - 0.01 <= gap <= bound + 0.01
    assert b.failures == len(resolver.lookups) - 1 or b.failures == len(resolver.lookups)


@pytest.mark.parametrize("jitter", [-0.1, 1.5])
def test_backoff_rejects_bad_jitter(jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter"):
        bridge.Backoff(jitter=jitter)
