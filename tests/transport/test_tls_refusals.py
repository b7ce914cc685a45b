"""A refused TLS peer gets the alert that fits, and our side logs one line with its address and the reason."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import ssl

import pytest
import trio
import trio.testing

from corda_trio import pki, transport

from ..ipv6 import needs_ipv6

NOW = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=30)
ALICE = pki.CordaX500Name.parse("O=Alice, L=London, C=GB")
BOB = pki.CordaX500Name.parse("O=Bob, L=New York, C=US")


@pytest.fixture(scope="module")
def network() -> pki.NetworkCredentials:
    return pki.NetworkCredentials.create(now=NOW)


@pytest.fixture(scope="module")
def bob(network: pki.NetworkCredentials) -> pki.NodeCredentials:
    return network.issue_node(BOB, now=NOW)


def _context(
    chain: list, key: object, root: pki.CertAndKey, *, server: bool, tls12: bool = False
) -> ssl.SSLContext:  # type: ignore[type-arg]
    build = pki.server_ssl_context if server else pki.client_ssl_context
    ctx = build(cert_chain=chain, key=key, trust_root=root.cert)  # type: ignore[arg-type]
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return ctx


async def _serve(
    nursery: trio.Nursery, network: pki.NetworkCredentials, bob: pki.NodeCredentials, host: str = "127.0.0.1"
) -> int:
    async def handler(conn: transport.AmqpConnection) -> None:
        await trio.sleep_forever()

    server_ctx = _context(bob.tls_chain, bob.tls.key, network.root, server=True)
    listeners = await nursery.start(
        functools.partial(
            transport.serve_amqp,
            handler,
            0,
            host=host,
            ssl_context=server_ctx,
            peer_check=pki.check_peer_is_network_node,
        )
    )
    return transport.listener_port(listeners)


async def _client_sees(port: int, ctx: ssl.SSLContext) -> BaseException | bytes:
    """Handshake, then read: what the refused client learns (TLS 1.3 reports a refusal on the first read)."""
    raw = await trio.open_tcp_stream("127.0.0.1", port)
    tls = trio.SSLStream(raw, ctx, server_hostname=None)
    try:
        await tls.do_handshake()
        await tls.send_all(b"AMQP\x03\x01\x00\x00")
        return await tls.receive_some(100)
    except trio.BrokenResourceError as exc:
        return exc.__cause__ or exc
    finally:
        await trio.aclose_forcefully(tls)


@pytest.mark.parametrize("tls12", [False, True], ids=["tls1.3", "tls1.2"])
async def test_a_foreign_root_gets_unknown_ca_and_one_log_line(
    nursery: trio.Nursery,
    network: pki.NetworkCredentials,
    bob: pki.NodeCredentials,
    caplog: pytest.LogCaptureFixture,
    tls12: bool,
) -> None:
    port = await _serve(nursery, network, bob)
    other = pki.NetworkCredentials.create(now=NOW)
    mallory = other.issue_node(ALICE, now=NOW)
    # Mallory trusts our root (so she accepts Bob) but presents a chain from another root.
    ctx = _context(mallory.tls_chain, mallory.tls.key, network.root, server=False, tls12=tls12)
    with caplog.at_level(logging.WARNING, logger="corda_trio.transport"), trio.fail_after(10):
        seen = await _client_sees(port, ctx)
        await trio.testing.wait_all_tasks_blocked()  # the server logs after the client was answered
    assert isinstance(seen, ssl.SSLError), seen
    assert "ALERT_UNKNOWN_CA" in str(seen).upper() or "unknown ca" in str(seen).lower(), seen
    assert not transport.is_certificate_date_failure(seen)  # (a bridge parks such an address)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("inbound 127.0.0.1:") and " refused: TLS handshake failed: " in line
    assert "certificate verify failed" in line and "\n" not in line


async def test_a_node_ca_minting_another_name_is_refused_with_one_log_line(
    nursery: trio.Nursery,
    network: pki.NetworkCredentials,
    bob: pki.NodeCredentials,
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = await _serve(nursery, network, bob)
    alice = network.issue_node(ALICE, now=NOW)
    key = pki.generate_ec_key()
    sybil = pki.create_certificate(
        role=pki.CertRole.TLS, subject=pki.CordaX500Name.parse("OU=Sybil, O=Alice, L=London, C=GB"),
        public_key=key.public_key(), issuer_cert=alice.node_ca.cert, issuer_key=alice.node_ca.key, now=NOW,
    )  # fmt: skip
    ctx = _context([sybil, alice.node_ca.cert, network.doorman.cert], key, network.root, server=False)
    with caplog.at_level(logging.WARNING, logger="corda_trio.transport"), trio.fail_after(10):
        seen = await _client_sees(port, ctx)
        await trio.testing.wait_all_tasks_blocked()
    # After a completed handshake ssl can send no other alert: the peer gets close_notify, a clean end.
    assert seen == b"", seen
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("inbound 127.0.0.1:") and "(name-mismatch)" in line and "\n" not in line


# --- certificates out of their validity period: both sides say whose, which and when -----------------------

EXPIRED = "expired"
NOT_YET_VALID = "not-yet-valid"


def _out_of_date(network: pki.NetworkCredentials, name: pki.CordaX500Name, when: str) -> pki.NodeCredentials:
    if when == EXPIRED:  # expired twenty minutes ago
        return network.issue_node(name, now=NOW, validity=dt.timedelta(minutes=10))
    # valid from a minute from now on (the issuer's clock is ahead of ours; create_certificate backdates 1 h)
    return network.issue_node(name, now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1, minutes=1))


async def _refused_dial_error(port: int, ctx: ssl.SSLContext) -> Exception:
    with trio.fail_after(10):
        try:
            async with transport.open_amqp_connection("127.0.0.1", port, ssl_context=ctx):
                pass
        except (transport.HandshakeError, transport.AmqpConnectionError) as exc:
            return exc
    raise AssertionError("the connection was not refused")


async def _refused_dial(port: int, ctx: ssl.SSLContext) -> str:
    return str(await _refused_dial_error(port, ctx))


@pytest.mark.parametrize("when", [EXPIRED, NOT_YET_VALID])
@pytest.mark.parametrize("tls12", [False, True], ids=["tls1.3", "tls1.2"])
async def test_a_client_certificate_out_of_date_is_named_on_both_sides(
    nursery: trio.Nursery,
    network: pki.NetworkCredentials,
    bob: pki.NodeCredentials,
    caplog: pytest.LogCaptureFixture,
    when: str,
    tls12: bool,
) -> None:
    port = await _serve(nursery, network, bob)
    alice = _out_of_date(network, ALICE, when)
    ctx = _context(alice.tls_chain, alice.tls.key, network.root, server=False, tls12=tls12)
    with caplog.at_level(logging.WARNING, logger="corda_trio.transport"):
        client_says = await _refused_dial(port, ctx)
        await trio.testing.wait_all_tasks_blocked()
    (server_says,) = [r.getMessage() for r in caplog.records]
    assert server_says.startswith("inbound 127.0.0.1:") and "\n" not in server_says
    if when == EXPIRED:  # (a server keeps none of the certificates of a client it refused: no name)
        assert "a certificate of the peer's chain has expired (this machine's clock: " in server_says
        assert "the peer refused our certificate: it has expired by the peer's clock" in client_says
    else:
        assert "a certificate of the peer's chain is not valid yet" in server_says
        assert "is one of the clocks wrong?" in server_says
        assert "the peer refused our certificate: TLS alert bad_certificate" in client_says
        assert "not valid yet by the peer's clock" in client_says


@pytest.mark.parametrize("when", [EXPIRED, NOT_YET_VALID])
async def test_a_server_certificate_out_of_date_is_named_on_both_sides(
    nursery: trio.Nursery,
    network: pki.NetworkCredentials,
    caplog: pytest.LogCaptureFixture,
    when: str,
) -> None:
    stale = _out_of_date(network, BOB, when)
    port = await _serve(nursery, network, stale)
    alice = network.issue_node(ALICE, now=NOW)
    ctx = _context(alice.tls_chain, alice.tls.key, network.root, server=False)
    with caplog.at_level(logging.WARNING, logger="corda_trio.transport"):
        refused = await _refused_dial_error(port, ctx)
        await trio.testing.wait_all_tasks_blocked()
    client_says = str(refused)
    # a matter of time, not of identity: a bridge retries it with its backoff instead of parking the address
    assert transport.is_certificate_date_failure(refused), repr(refused)
    (server_says,) = [r.getMessage() for r in caplog.records]
    leaf = stale.tls.cert
    if when == EXPIRED:
        expected = (
            "the peer's certificate 'O=Bob,L=New York,C=US' expired at "
            + leaf.not_valid_after_utc.isoformat()
        )
        assert expected in client_says, client_says
        assert "the peer refused our certificate: it has expired by the peer's clock" in server_says
    else:
        expected = (
            f"the peer's certificate 'O=Bob,L=New York,C=US' is not valid before "
            f"{leaf.not_valid_before_utc.isoformat()} (this machine's clock: "
        )
        assert expected in client_says and "is one of the clocks wrong?" in client_says, client_says
        assert "the peer refused our certificate: TLS alert bad_certificate" in server_says


@needs_ipv6
async def test_a_refused_ipv6_peer_is_named_in_brackets(
    nursery: trio.Nursery,
    network: pki.NetworkCredentials,
    bob: pki.NodeCredentials,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The line named an IPv6 peer ``::1:42401``, where config files and console lines write
    ``[::1]:42401``: now every log line writes an address so."""
    port = await _serve(nursery, network, bob, host="::1")
    with caplog.at_level(logging.WARNING, logger="corda_trio.transport"), trio.fail_after(10):
        raw = await trio.open_tcp_stream("::1", port)
        client_port = raw.socket.getsockname()[1]
        await raw.send_all(b"GET / HTTP/1.1\r\n\r\n")  # not TLS
        with contextlib.suppress(trio.BrokenResourceError):  # (answered, then closed: by us, or reset)
            while await raw.receive_some(100):
                pass
        await raw.aclose()
        await trio.testing.wait_all_tasks_blocked()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"inbound [::1]:{client_port} refused: TLS handshake failed: "), line
