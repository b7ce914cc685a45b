"""The map service over real loopback sockets, spoken to by an ordinary HTTP client (``http.client`` in a
worker thread), and its persistence across restarts."""

from __future__ import annotations

import http.client
import logging
import socket
import tempfile
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from corda_trio import network, pki

from .conftest import ALICE, BOB, NOW, make_service, signed_node_info


def _request(
    port: int, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(
            method, path, body=body, headers={"Content-Type": "application/octet-stream"} if body else {}
        )
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


async def http_call(
    port: int, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    return await trio.to_thread.run_sync(_request, port, method, path, body)


async def test_publish_and_fetch(
    map_server: tuple[network.NetworkMapService, int],
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
) -> None:
    _, port = map_server
    alice_info, bob_info = signed_node_info(alice, 10002), signed_node_info(bob, 10003)
    status, _, body = await http_call(port, "POST", "/network-map/publish", alice_info)
    assert status == 200 and body.startswith(b"added ")
    assert (await http_call(port, "POST", "/network-map/publish", bob_info))[0] == 200
    assert (await http_call(port, "POST", "/network-map/publish", alice_info))[2].startswith(b"unchanged ")

    status, headers, body = await http_call(port, "GET", "/network-map")
    assert status == 200
    assert headers["cache-control"] == "max-age=7"
    assert headers["content-type"] == "application/octet-stream"
    network_map = network.verify_network_map(body, trust_root=creds.root.cert, now=NOW)
    alice_hash = network.decode_signed_node_info(alice_info).hash
    bob_hash = network.decode_signed_node_info(bob_info).hash
    assert set(network_map.node_info_hashes) == {alice_hash, bob_hash}

    status, _, body = await http_call(port, "GET", f"/network-map/node-info/{alice_hash.lower()}")
    assert status == 200 and body == alice_info
    node = network.verify_node_info(body, trust_root=creds.root.cert, now=NOW)
    assert node.legal_name == ALICE

    status, _, body = await http_call(
        port, "GET", f"/network-map/network-parameters/{network_map.network_parameters_hash}"
    )
    assert status == 200
    params, params_hash = network.verify_network_parameters(body, trust_root=creds.root.cert, now=NOW)
    assert params_hash == network_map.network_parameters_hash and params.max_message_size == 10 * 2**20


async def test_refusals_and_errors(
    map_server: tuple[network.NetworkMapService, int], alice: pki.NodeCredentials
) -> None:
    _, port = map_server
    # Tampered payload: flip a byte inside the signed raw bytes -> 403 with the reason.
    good = signed_node_info(alice, 10002)
    signed = network.decode_signed_node_info(good)
    raw = bytearray(signed.raw)
    raw[raw.index(b"127.0.0.1")] = ord("8")  # "827.0.0.1": still well formed, but not what Alice signed
    from corda_trio.network import _codec

    tampered = _codec.encode(network.SignedNodeInfo(raw=bytes(raw), signatures=signed.signatures).to_wire())
    status, _, body = await http_call(port, "POST", "/network-map/publish", tampered)
    assert status == 403 and body.startswith(b"bad-signature:")
    # Certificate from another root -> 403 untrusted-root.
    other = pki.NetworkCredentials.create(now=NOW).issue_node(ALICE, now=NOW)
    status, _, body = await http_call(port, "POST", "/network-map/publish", signed_node_info(other))
    assert status == 403 and body.startswith(b"untrusted-root:")
    # Garbage, empty -> 400.
    status, _, body = await http_call(port, "POST", "/network-map/publish", b"\x00garbage")
    assert status == 400 and b"malformed NodeInfo" in body
    assert (await http_call(port, "POST", "/network-map/publish", b""))[0] == 400
    # Stale serial -> 409; a newer one replaces.
    assert (await http_call(port, "POST", "/network-map/publish", signed_node_info(alice, 1, serial=100)))[
        0
    ] == 200
    status, _, body = await http_call(
        port, "POST", "/network-map/publish", signed_node_info(alice, 2, serial=99)
    )
    assert status == 409 and b"serial 100" in body
    status, _, body = await http_call(
        port, "POST", "/network-map/publish", signed_node_info(alice, 2, serial=101)
    )
    assert status == 200 and body.startswith(b"replaced ")
    # Lookups.
    assert (await http_call(port, "GET", "/network-map/node-info/" + "AB" * 32))[0] == 404
    status, _, body = await http_call(port, "GET", "/network-map/node-info/xyz")
    assert status == 400 and b"not a SHA-256 hash" in body
    assert (await http_call(port, "GET", "/network-map/network-parameters/" + "00" * 32))[0] == 404
    assert (await http_call(port, "GET", "/nothing-here"))[0] == 404
    status, headers, _ = await http_call(port, "GET", "/network-map/publish")
    assert status == 405 and headers["allow"] == "POST"
    assert (await http_call(port, "DELETE", "/network-map"))[0] == 405
    status, headers, body = await http_call(port, "HEAD", "/network-map")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    # Too large a body -> 413.
    assert (await http_call(port, "POST", "/network-map/publish", b"x" * (300 * 1024)))[0] == 413
    # The server is still up and serving.
    assert (await http_call(port, "GET", "/network-map"))[0] == 200


def _raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def test_malformed_http_gets_400_and_server_survives(
    map_server: tuple[network.NetworkMapService, int],
) -> None:
    _, port = map_server
    reply = await trio.to_thread.run_sync(_raw_exchange, port, b"THIS IS NOT HTTP\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 ")
    assert reply.endswith(b"\r\n\r\nbad request: illegal request line: 'THIS IS NOT HTTP'\n"), reply
    reply = await trio.to_thread.run_sync(
        _raw_exchange, port, b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"
    )
    assert reply.startswith(b"HTTP/1.1 400 ")
    # A client that disconnects half way through a body.
    reply = await trio.to_thread.run_sync(
        _raw_exchange,
        port,
        b"POST /network-map/publish HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc",
    )
    assert reply == b"" or reply.startswith(b"HTTP/1.1 400 ")
    # Two requests on one keep-alive connection.
    reply = await trio.to_thread.run_sync(
        _raw_exchange,
        port,
        b"GET /network-map HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert reply.count(b"HTTP/1.1 200 ") == 1 and reply.count(b"HTTP/1.1 404 ") == 1
    assert (await http_call(port, "GET", "/network-map"))[0] == 200


async def test_restart_keeps_content(
    creds: pki.NetworkCredentials, alice: pki.NodeCredentials, tmp_path: Path
) -> None:
    db = tmp_path / "map.db"
    alice_info = signed_node_info(alice)
    async with trio.open_nursery() as nursery:
        service = make_service(creds, db)
        listeners = await nursery.start(network.serve_network_map, service, 0)
        port = listeners[0].socket.getsockname()[1]
        assert (await http_call(port, "POST", "/network-map/publish", alice_info))[0] == 200
        nursery.cancel_scope.cancel()
    service.store.close()
    async with trio.open_nursery() as nursery:
        service = network.NetworkMapService(
            store=network.NetworkMapStore(db), trust_root=creds.root.cert,
            map_key=creds.network_map.key, map_cert_path=[creds.network_map.cert],
        )  # fmt: skip
        listeners = await nursery.start(network.serve_network_map, service, 0)
        port = listeners[0].socket.getsockname()[1]
        status, _, body = await http_call(port, "GET", "/network-map")
        assert status == 200
        hashes = network.verify_network_map(body, trust_root=creds.root.cert, now=NOW).node_info_hashes
        assert hashes == (network.decode_signed_node_info(alice_info).hash,)
        assert (await http_call(port, "GET", f"/network-map/node-info/{hashes[0]}"))[2] == alice_info
        nursery.cancel_scope.cancel()


async def test_h11_client_against_server(
    map_server: tuple[network.NetworkMapService, int], creds: pki.NetworkCredentials, bob: pki.NodeCredentials
) -> None:
    _, port = map_server
    client = network.NetworkMapClient(f"http://127.0.0.1:{port}")
    assert (await client.publish(signed_node_info(bob))).startswith("added ")
    response = await client.fetch_map()
    assert response.max_age_seconds == 7
    network_map = network.verify_network_map(response.signed_map, trust_root=creds.root.cert, now=NOW)
    node = network.verify_node_info(
        await client.fetch_node_info(network_map.node_info_hashes[0]), trust_root=creds.root.cert, now=NOW
    )
    assert node.legal_name == BOB
    with pytest.raises(network.NetworkMapHttpError) as info:
        await client.publish(b"junk")
    assert info.value.status == 400 and "malformed NodeInfo" in str(info.value)
    with pytest.raises(network.NetworkMapHttpError) as info:
        await network.NetworkMapClient("http://127.0.0.1:1").fetch_map()
    assert info.value.status == 0


@settings(max_examples=200)
@given(
    method=st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE"]),
    target=st.one_of(
        st.text(max_size=80).map(lambda s: "/" + s),
        st.sampled_from(["/network-map", "/network-map/publish", "/network-map/node-info/",
                         "/network-map/network-parameters/"]).flatmap(
            lambda p: st.text(alphabet="0123456789abcdefABCDEFxyz/?.", max_size=70).map(lambda s: p + s)
        ),
    ),
    body=st.binary(max_size=300),
)  # fmt: skip
def test_handler_answers_everything_with_a_status(method: str, target: str, body: bytes) -> None:
    """Whatever arrives, the handler answers 2xx/4xx (never raises, never 5xx)."""
    response = _FUZZ_SERVICE.handle(method, target, body)
    assert 200 <= response.status < 500
    if response.status >= 400:
        assert response.body.endswith(b"\n") and len(response.body) > 1


# Module-level service for the property test (function-scoped fixtures do not mix with @given); the
# directory is removed when the interpreter exits.
_FUZZ_DIR = tempfile.TemporaryDirectory(prefix="corda-trio-fuzz-")
_FUZZ_SERVICE = make_service(pki.NetworkCredentials.create(now=NOW), Path(_FUZZ_DIR.name) / "map.db")


async def test_a_flood_of_refused_nodeinfos_is_one_log_line_per_client_address(
    map_server: tuple[network.NetworkMapService, int], caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone who can reach the map's port could post NodeInfos of another network: each was a warning line
    (2,000 posts, 2,000 lines on the service's stderr). Now a client address gets its first refusal in full,
    the rest of the minute counted (``refused_publications``), each post still answered 403."""
    service, port = map_server
    other = pki.NetworkCredentials.create(now=NOW)
    body = signed_node_info(other.issue_node(pki.CordaX500Name.parse("O=Eve, L=Oslo, C=NO"), now=NOW))

    def post_many() -> list[int]:
        return [_request(port, "POST", "/network-map/publish", body)[0] for _ in range(300)]

    with caplog.at_level(logging.INFO, logger="corda_trio.network"), trio.fail_after(120):
        statuses = await trio.to_thread.run_sync(post_many)
    assert statuses == [403] * 300
    assert service.refused_publications == 300
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 1, lines[:3]
    assert (
        lines[0].startswith("refused NodeInfo from 127.0.0.1:") and "is not signed by the key of" in lines[0]
    )
