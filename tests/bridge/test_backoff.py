"""Reconnect backoff: the bound, the jitter, the reset; and a bridge's attempts against a dead address."""

from __future__ import annotations

import logging
import random
import ssl

import pytest
import trio

from corda_trio import bridge, logs, messaging, pki, store, transport
from corda_trio.bridge._outbound import _is_identity_failure
from tests.ports import refused_port


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
    dead_port = refused_port()  # nobody listens there
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


async def test_an_outage_logs_its_first_failure_then_a_line_a_minute_then_the_reconnection(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("tests.outage")
    caplog.set_level(logging.DEBUG, logger="tests.outage")
    outage = logs.Outage(log, "bridge b1: the node at 127.0.0.1:5")
    outage.connected()  # connected before any failure: nothing to say
    for attempt in range(1, 61):  # an attempt every 5 s for 5 minutes
        outage.failed(f"OSError: refused {attempt}", "bridge b1: session with the node ended: %s", attempt)
        await trio.sleep(5)
    outage.connected()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert lines[0] == (logging.WARNING, "bridge b1: session with the node ended: 1")
    still = [text for level, text in lines[1:-1] if level == logging.WARNING]
    # at 60, 120, 180, 240 and 295 s (the 13th, 25th, ... attempt)
    assert still == [
        f"bridge b1: the node at 127.0.0.1:5: still retrying, {n} failed attempts in {t} s, "
        f"latest: OSError: refused {n}"
        for n, t in [(13, 60), (25, 120), (37, 180), (49, 240)]
    ]
    back = "bridge b1: the node at 127.0.0.1:5: reconnected after 60 failed attempts / 300 s"
    assert lines[-1] == (logging.INFO, back)
    assert len(lines) == 6 and outage.failures == 0
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 55  # every attempt is at debug


async def test_a_bridge_to_an_unreachable_peer_logs_a_line_a_minute_not_one_per_attempt(
    tmp_path: object,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    autojump_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A peer down for 10 minutes, retried every second: 600 "session ... ended" lines before."""
    caplog.set_level(logging.INFO, logger="corda_trio.bridge")
    dead_port = refused_port()  # nobody listens there
    key_hash = pki.key_hash(bob.identity.cert.public_key())
    resolver = messaging.PeerDirectory()
    resolver.put(
        messaging.Peer(legal_name=bob.legal_name, key_hash=key_hash, addresses=[("127.0.0.1", dead_port)])
    )
    ctx = pki.client_ssl_context(cert_chain=bob.tls_chain, key=bob.tls.key, trust_root=network.root.cert)
    config = bridge.BridgeConfig(initial_backoff_seconds=1.0, max_backoff_seconds=1.0, backoff_jitter=0.0)
    async with store.open_broker(tmp_path, config=store.BrokerConfig(commit_process=False)) as broker:  # type: ignore[arg-type]
        queue = await broker.declare_queue(messaging.outbound_queue(key_hash), durable=False)
        b = bridge.Bridge(queue=queue, resolver=resolver, ssl_context=ctx, config=config)
        with trio.move_on_after(600.5):
            await b.run()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert b.failures >= 590
    assert lines[0].startswith(f"bridge {queue.name}: could not connect to 127.0.0.1:{dead_port}: OSError")
    assert len(lines) == 11, lines  # the first, then one a minute
    assert all("still retrying" in line and f"127.0.0.1:{dead_port}: OSError" in line for line in lines[1:])


def _raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    """``exc`` as raised (``raise exc from cause``), with its cause and traceback set."""
    try:
        raise exc from cause
    except BaseException as caught:
        return caught


def test_an_identity_failure_is_seen_among_the_errors_of_a_group() -> None:
    """A session's nursery that fails with several errors at once raises a group of them: the TLS
    identity failure among them (behind a HandshakeError) was not seen, so the address was not parked."""
    identity = _raised(
        transport.HandshakeError("TLS handshake failed"),
        pki.PeerIdentityError("expected O=Bob, L=Paris, C=FR, got O=Mallory, L=Rome, C=IT"),
    )
    other = transport.AmqpConnectionError("the connection ended")
    group = ExceptionGroup("session", [other, ExceptionGroup("inner", [identity])])
    assert _is_identity_failure(group)
    assert _is_identity_failure(_raised(RuntimeError("wrapped"), group))
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed: unable to get local issuer")
    assert _is_identity_failure(ExceptionGroup("session", [other, verify]))
    assert not _is_identity_failure(ExceptionGroup("session", [other, OSError("connection refused")]))
    # a certificate's dates are no identity failure (retried with the backoff, not parked): OpenSSL's
    # X509_V_ERR_CERT_NOT_YET_VALID (9) behind the HandshakeError the transport raises
    not_yet = ssl.SSLCertVerificationError(1, "certificate verify failed: certificate is not yet valid")
    not_yet.verify_code = 9
    date = _raised(transport.HandshakeError("TLS handshake failed"), not_yet)
    assert not _is_identity_failure(ExceptionGroup("session", [other, date]))
    looped = RuntimeError("a")
    looped.__context__ = RuntimeError("b")
    looped.__context__.__context__ = looped
    assert not _is_identity_failure(looped)
