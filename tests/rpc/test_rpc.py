"""The RPC server and client over real websockets on loopback: login, permissions, abuse, concurrency.

The handlers here are small real ones (the node's own are exercised end to end in ``tests/node``); what is
under test is the server: each bad request gets its error reply and the server keeps serving.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import random
import re
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
import trio
import trio_websocket

from corda_trio import rpc
from corda_trio.hostport import host_port_text
from tests.ipv6 import needs_ipv6
from tests.ports import refused_port

PASSWORD = "s3cret-pass"
HASH = rpc.hash_password(PASSWORD)
USERS = [
    rpc.RpcUser(username="admin", password_hash=HASH, permissions=frozenset({"admin"})),
    rpc.RpcUser(username="reader", password_hash=HASH, permissions=frozenset({"read"})),
    rpc.RpcUser(username="pinger", password_hash=HASH, permissions=frozenset({"start_flow:Ping"})),
]


class Work:
    """Stands for the node: work started by a call runs in the node's nursery, not the connection's."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.started = trio.Event()
        self.finished = trio.Event()
        self.release = trio.Event()
        self.start_args: list[dict[str, Any]] = []  # the arguments each start_flow call ran with

    async def start_flow(self, call: rpc.Call) -> Any:
        flow = call.args["flow"]
        self.start_args.append(dict(call.args))

        async def job() -> None:
            self.started.set()
            await self.release.wait()
            self.finished.set()

        self.nursery.start_soon(job)
        for i in range(3):
            await call.send_event({"step": i})
        await self.finished.wait()
        return {"flow": flow, "result": call.args.get("args", {})}

    async def echo_later(self, call: rpc.Call) -> Any:
        """(As ``watch_flow``: ``flow_id`` is ``"<echo>@<delay>"``; answers ``<echo>`` after ``<delay>``
        seconds.)"""
        echo, _, delay = call.args["flow_id"].rpartition("@")
        await trio.sleep(float(delay))
        return echo

    # Immediate handlers (answered by the connection's reader, as the node's calls that read memory are).
    def node_info(self, call: rpc.Call) -> Any:
        return {"user": call.user.username}

    def ping(self, call: rpc.Call) -> Any:
        return call.args.get("echo", "pong")

    def crash_now(self, call: rpc.Call) -> Any:
        raise RuntimeError("immediate handler bug")

    def unencodable(self, call: rpc.Call) -> Any:
        return {"value": object()}

    async def crash(self, call: rpc.Call) -> Any:
        await trio.lowlevel.checkpoint()
        raise RuntimeError("handler bug")


@contextlib.asynccontextmanager
async def serving(**limits: Any) -> AsyncIterator[tuple[str, Work]]:
    async with trio.open_nursery() as nursery:
        work = Work(nursery)
        server = rpc.RpcServer(
            **limits,
            handlers={
                "start_flow": work.start_flow,
                "queue_statistics": work.crash,
                "watch_flow": work.echo_later,
            },
            immediate={
                "node_info": work.node_info,
                "ping": work.ping,
                "list_flows": work.crash_now,
                "whoami": work.unencodable,
            },
            users=rpc.UserDatabase.of(USERS),
        )
        port = await nursery.start(server.run)
        yield f"ws://{host_port_text(server.host, port)}", work
        nursery.cancel_scope.cancel()


async def _served_again(url: str) -> None:
    """Wait (at most 10 s) until a new client logs in and is answered: a slot was given back (the server gives
    it back as it lets go of the connection that held it)."""
    with trio.fail_after(10):
        while True:
            try:
                async with rpc.connect(url, "admin", PASSWORD) as client:
                    assert await client.ping() == "pong"
                    return
            except rpc.RpcConnectionError:
                await trio.sleep(0.05)


async def test_login_call_and_progress_events() -> None:
    async with serving() as (url, work):
        async with rpc.connect(url, "admin", PASSWORD) as client:
            assert client.permissions == ("admin",)
            assert await client.ping() == "pong"
            assert await client.call("ping", echo=[1, b"\x00", {"a": None}]) == [1, b"\x00", {"a": None}]
            work.release.set()
            frames = [f async for f in client.stream("start_flow", flow="Ping", args={"n": 3})]
            assert frames == [
                {"event": {"step": 0}}, {"event": {"step": 1}}, {"event": {"step": 2}},
                {"ok": {"flow": "Ping", "result": {"n": 3}}},
            ]  # fmt: skip


@pytest.mark.parametrize(
    ("user", "password"), [("admin", "wrong"), ("nobody", PASSWORD), ("admin", ""), ("", "")]
)
async def test_wrong_credentials_are_refused(user: str, password: str) -> None:
    async with serving() as (url, _):
        with pytest.raises(rpc.RpcError) as info:
            async with rpc.connect(url, user, password):
                pass
        assert info.value.code == "unauthenticated"
        async with rpc.connect(url, "reader", PASSWORD) as client:  # still serving
            assert await client.ping() == "pong"


async def test_permissions_are_enforced() -> None:
    async with serving() as (url, work):
        work.release.set()
        async with (
            rpc.connect(url, "reader", PASSWORD) as reader,
            rpc.connect(url, "pinger", PASSWORD) as pinger,
        ):
            assert await reader.node_info() == {"user": "reader"}
            for call in (
                reader.start_flow("Ping"),
                pinger.start_flow("Other"),
                pinger.node_info(),
                reader.drain(),
            ):
                with pytest.raises(rpc.RpcError) as info:
                    await call
                assert info.value.code == "forbidden", info.value
            assert (await pinger.start_flow("Ping", x=1))["result"] == {"x": 1}
            # a flow argument named like a keyword of start_flow travels in the mapping
            assert (await pinger.start_flow("Ping", {"client_id": "c"}))["result"] == {"client_id": "c"}
            with pytest.raises(TypeError, match="not both"):
                await pinger.start_flow("Ping", {"x": 1}, x=2)
            with pytest.raises(rpc.RpcError) as info:
                await reader.call("no_such_method")
            assert info.value.code == "unknown-method"
            with pytest.raises(rpc.RpcError) as info:
                await reader.call("network_map")  # known, permitted, but this server has no handler
            assert info.value.code == "unavailable"
            with pytest.raises(rpc.RpcError) as info:
                await reader.queue_statistics()
            assert info.value.code == "internal" and "handler bug" in info.value.message
            with pytest.raises(rpc.RpcError) as info:
                await reader.list_flows()
            assert info.value.code == "internal" and "immediate handler bug" in info.value.message
            with pytest.raises(rpc.RpcError) as info:
                await reader.call("whoami")
            assert info.value.code == "internal" and "cannot be encoded" in info.value.message
            assert await reader.ping() == "pong"


def _unpack(data: bytes | str) -> dict[str, Any]:
    assert isinstance(data, bytes)
    frame = msgpack.unpackb(data)
    assert isinstance(frame, dict)
    return frame


MALFORMED = [
    (b"\xc1", None, "not msgpack: FormatError: a byte that begins no msgpack value"),
    (msgpack.packb([1, 2]), None, "must be a map"),
    (msgpack.packb({"id": "x", "method": "ping"}), None, "'id' must be an integer"),
    (msgpack.packb({"id": 7, "method": 5}), 7, "'method' must be a string"),
    (msgpack.packb({"id": 8, "method": "ping", "args": [1]}), 8, "'args' must be a map"),
    (msgpack.packb({"id": 9, "method": "ping", "extra": 1}), 9, "unknown frame field"),
    (msgpack.packb({"id": -1, "method": "ping"}), None, "'id' must be an integer"),
]


async def test_malformed_frames_get_error_replies_and_the_connection_goes_on() -> None:
    async with serving() as (url, _):
        async with trio_websocket.open_websocket_url(url) as ws:
            await ws.send_message(msgpack.packb({"id": 1, "method": "ping", "args": {}}))
            assert _unpack(await ws.get_message())["error"]["code"] == "unauthenticated"
            await ws.send_message("a text frame")
            assert _unpack(await ws.get_message())["error"]["code"] == "malformed"
            await ws.send_message(
                msgpack.packb({"id": 2, "method": "login", "args": {"user": "admin", "password": PASSWORD}})
            )
            assert _unpack(await ws.get_message()) == {
                "id": 2,
                "ok": {"user": "admin", "permissions": ["admin"]},
            }
            for data, request_id, text in MALFORMED:
                await ws.send_message(data)
                reply = _unpack(await ws.get_message())
                assert reply["id"] == request_id and reply["error"]["code"] == "malformed", reply
                assert text in reply["error"]["message"], reply
            await ws.send_message(msgpack.packb({"id": 3, "method": "ping", "args": {"echo": "alive"}}))
            assert _unpack(await ws.get_message()) == {"id": 3, "ok": "alive"}


async def test_a_10_mb_request_is_refused_and_the_server_keeps_serving() -> None:
    async with serving() as (url, _):
        async with rpc.connect(url, "admin", PASSWORD) as client:
            with pytest.raises(rpc.RpcError) as info:
                await client.call("ping", echo=b"x" * (10 * 1024 * 1024))
            assert info.value.code == "too-large"
        async with rpc.connect(url, "admin", PASSWORD) as client:
            assert await client.call("ping", echo=b"y" * 1000) == b"y" * 1000


async def test_an_argument_msgpack_cannot_hold_is_a_bad_arguments_error_and_the_client_goes_on() -> None:
    async with serving() as (url, _):
        async with rpc.connect(url, "admin", PASSWORD) as client:
            for value, why in ((2**70, "Integer value out of range"), (object(), "can not serialize")):
                with pytest.raises(rpc.RpcError) as info:
                    await client.call("ping", echo=value)
                assert info.value.code == "bad-arguments", info.value
                assert f"ping: an argument cannot be sent: {why}" in str(info.value)
            assert await client.call("ping", echo=2**63) == 2**63  # (the largest that fit still go)


async def test_too_many_failed_logins_close_the_connection() -> None:
    async with serving() as (url, _):
        async with trio_websocket.open_websocket_url(url) as ws:
            for i in range(3):
                await ws.send_message(
                    msgpack.packb({"id": i, "method": "login", "args": {"user": "admin", "password": "no"}})
                )
                assert _unpack(await ws.get_message())["error"]["code"] == "unauthenticated"
            with pytest.raises(trio_websocket.ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 1008


async def test_calls_before_the_login_are_not_failed_logins() -> None:
    """Only ``login`` requests count towards the three failed logins (and the failed-login metric): a client
    that calls ``ping`` first and mistypes its password twice still logs in."""
    async with serving() as (url, _):
        async with trio_websocket.open_websocket_url(url) as ws:
            frames = [
                {"id": 0, "method": "ping"},
                {"id": 1, "method": "whoami"},
                {"id": 2, "method": "login", "args": {"user": "admin", "password": "no"}},
                {"id": 3, "method": "login", "args": {"user": "admin", "password": "no"}},
            ]
            for frame in frames:
                await ws.send_message(msgpack.packb(frame))
                assert _unpack(await ws.get_message())["error"]["code"] == "unauthenticated"
            login = {"id": 4, "method": "login", "args": {"user": "admin", "password": PASSWORD}}
            await ws.send_message(msgpack.packb(login))
            assert _unpack(await ws.get_message())["ok"]["user"] == "admin"


async def test_failed_logins_are_one_line_per_source_address_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Anyone who can reach the port can send wrong passwords: each failed login was an info line in the log
    (2,000 wrong passwords, 2,000 lines). Now a source address gets one warning in full (with the user name),
    the rest of its minute is counted, and summed up with the user names tried once the minute is over
    (``logs.PeerWarnings``; its tests cover the summary)."""
    with caplog.at_level(logging.INFO, logger="corda_trio.rpc"):
        async with serving() as (url, _):
            for n in range(4):  # 12 failed logins, three per connection
                async with trio_websocket.open_websocket_url(url) as ws:
                    for i in range(3):
                        login = {"id": i, "method": "login", "args": {"user": f"u{n}", "password": "no"}}
                        await ws.send_message(msgpack.packb(login))
                        assert _unpack(await ws.get_message())["error"]["code"] == "unauthenticated"
            async with rpc.connect(url, "admin", PASSWORD) as client:
                assert (await client.ping()) == "pong"
    lines = [r for r in caplog.records if r.levelno >= logging.INFO and "login" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING], [r.getMessage() for r in lines]
    assert re.fullmatch(r"RPC login from 127\.0\.0\.1:\d+ failed for user 'u0'", lines[0].getMessage())


async def test_over_the_connection_limit_a_client_is_refused_with_503_until_a_slot_frees() -> None:
    async with serving(max_connections=2) as (url, _):
        async with rpc.connect(url, "admin", PASSWORD) as first, rpc.connect(url, "reader", PASSWORD):
            with pytest.raises(rpc.RpcConnectionError) as info:
                async with rpc.connect(url, "admin", PASSWORD):
                    pass
            assert str(info.value) == (
                f"unavailable: {url} refused the connection: HTTP 503 (too many connections; try again later)"
            )
            # a raw TCP client over the limit gets the same answer, then end of file
            port = int(url.rsplit(":", 1)[1])
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                answer = b""
                with trio.fail_after(10):
                    while chunk := await stream.receive_some():
                        answer += chunk
            assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
            assert await first.ping() == "pong"  # the ones in are served as before
        await _served_again(url)  # both left: there is room again


ENDPOINT_TEXT = b"this is a corda-trio RPC websocket endpoint: connect with a websocket client"
BIG_HEADER = b"X-Big: " + b"a" * 70_000 + b"\r\n"
#: A websocket handshake whose Host is not IDNA: wsproto's decoding of it raised UnicodeDecodeError in
#: trio-websocket's reader task, which ended the whole RPC server (and a node with it).
BAD_HOST_HANDSHAKE = (
    b"GET / HTTP/1.1\r\nHost: \xff\xfe\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def _raw_answer(port: int, request: bytes, *, piece_bytes: int | None = None) -> bytes:
    """What the server answers ``request`` (whole, or in pieces of ``piece_bytes``), read to its close."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        with trio.fail_after(10):
            for i in range(0, len(request), piece_bytes or len(request)):
                await stream.send_all(request[i : i + (piece_bytes or len(request))])
            answer = b""
            while chunk := await stream.receive_some():
                answer += chunk
    return answer


@pytest.mark.parametrize(
    ("request_bytes", "piece_bytes", "head", "why"),
    [
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            None,
            b"HTTP/1.1 400 Bad Request",
            b"Missing header, 'Connection: Upgrade'",
        ),
        (b"GARBAGE\r\n\r\n", None, b"HTTP/1.1 400 Bad Request", b"illegal request line: 'GARBAGE'"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n" + BIG_HEADER + b"\r\n",
            None,
            b"HTTP/1.1 431 Request Header Fields Too Large",
            b"request head larger than 16384 bytes",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n" + BIG_HEADER + b"\r\n",
            1000,
            b"HTTP/1.1 431 Request Header Fields Too Large",
            b"request head larger than 16384 bytes",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n",
            None,
            b"HTTP/1.1 426 Upgrade Required",
            b"Missing header, 'Sec-WebSocket-Version'",
        ),
        (BAD_HOST_HANDSHAKE, None, b"HTTP/1.1 400 Bad Request", b"the Host header is not a valid host name"),
    ],
    ids=["plain-get", "garbage", "70-kb-header", "70-kb-header-in-pieces", "websocket-version-8", "bad-host"],
)
async def test_what_is_not_a_websocket_handshake_gets_a_standard_answer_saying_what_the_port_is(
    request_bytes: bytes, piece_bytes: int | None, head: bytes, why: bytes
) -> None:
    """The RPC port answered plain HTTP and garbage with ``HTTP/1.1 400 `` (no reason phrase, no body), and a
    70 KB header too (not 431). Now: the standard status line, and a body saying what the port is for and
    what was wrong; the server goes on serving websocket clients."""
    async with serving() as (url, _):
        answer = await _raw_answer(int(url.rsplit(":", 1)[1]), request_bytes, piece_bytes=piece_bytes)
        status_line, _, rest = answer.partition(b"\r\n")
        headers, _, body = rest.partition(b"\r\n\r\n")
        assert status_line == head, answer
        assert body == ENDPOINT_TEXT + b" (" + why + b")\n", answer
        assert f"content-length: {len(body)}".encode() in headers.lower().split(b"\r\n")
        async with rpc.connect(url, "admin", PASSWORD) as client:
            assert await client.ping() == "pong"


async def test_curl_on_the_rpc_port_reads_what_the_port_is_for() -> None:
    async with serving() as (url, _):
        port = url.rsplit(":", 1)[1]
        with trio.fail_after(20):
            done = await trio.run_process(
                ["curl", "-si", "--max-time", "10", f"http://127.0.0.1:{port}/"], capture_stdout=True
            )
    assert done.stdout.startswith(b"HTTP/1.1 400 Bad Request\r\n"), done.stdout
    assert done.stdout.endswith(ENDPOINT_TEXT + b" (Missing header, 'Connection: Upgrade')\n"), done.stdout


async def test_a_connection_that_does_not_log_in_in_time_is_closed_with_1008() -> None:
    async with serving(login_timeout_seconds=0.5) as (url, _):
        async with rpc.connect(url, "admin", PASSWORD) as client:
            async with trio_websocket.open_websocket_url(url) as ws:
                with trio.fail_after(10), pytest.raises(trio_websocket.ConnectionClosed) as info:
                    await ws.get_message()  # says nothing: closed at the deadline
                assert info.value.reason.code == 1008
                assert info.value.reason.reason == "not logged in within 0.5 s"
            await trio.sleep(0.6)
            assert await client.ping() == "pong"  # logged in: may stay idle past the deadline


@pytest.mark.parametrize("closed_by", ["the login deadline", "three failed logins"])
async def test_a_ping_that_crosses_the_servers_close_does_not_stop_the_server(closed_by: str) -> None:
    """RFC 6455 lets a client's ping cross the server's close frame; trio-websocket answers it with a pong
    that wsproto refuses once our close is sent (``LocalProtocolError`` in the connection's reader task,
    python-trio/trio-websocket#184). That ended the whole server (and the node): it must end that
    connection only."""
    async with serving(login_timeout_seconds=0.5 if closed_by == "the login deadline" else 30) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            key = b"dGhlIHNhbXBsZSBub25jZQ=="
            await stream.send_all(
                b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )

            def masked(opcode: int, payload: bytes) -> bytes:  # (a zero mask: the payload as it is)
                assert len(payload) < 126
                return bytes([0x80 | opcode, 0x80 | len(payload)]) + b"\0\0\0\0" + payload

            received = b""
            with trio.fail_after(20):
                while b"\r\n\r\n" not in received:  # (a client waits for the 101 before it sends)
                    received += await stream.receive_some()
                received = received.split(b"\r\n\r\n", 1)[1]
                if closed_by == "three failed logins":
                    for i in range(3):
                        login = {"id": i, "method": "login", "args": {"user": "admin", "password": "no"}}
                        await stream.send_all(masked(0x2, msgpack.packb(login)))
                while True:  # the server's frames (unmasked, short), up to its close
                    while len(received) < 2 or len(received) < 2 + (received[1] & 0x7F):
                        received += await stream.receive_some()
                    opcode, size = received[0] & 0x0F, received[1] & 0x7F
                    if opcode == 0x8:
                        assert received[2:4] == (1008).to_bytes(2, "big")
                        break
                    received = received[2 + size :]
                await stream.send_all(masked(0x9, b"are you there?"))  # a ping sent before we saw it
                with contextlib.suppress(trio.BrokenResourceError):
                    while await stream.receive_some():
                        pass
        with trio.fail_after(20):
            async with rpc.connect(url, "admin", PASSWORD) as client:
                assert await client.ping() == "pong"


async def test_a_client_that_ignores_the_servers_close_gives_its_slot_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The login deadline closes the connection (1008); a client that never answers that close must not keep
    the connection, and its slot, for ever: the server drops it after ``DISCONNECT_TIMEOUT_SECONDS``."""
    from corda_trio.rpc import _server

    monkeypatch.setattr(_server, "DISCONNECT_TIMEOUT_SECONDS", 0.3)
    async with serving(max_connections=1, login_timeout_seconds=0.3) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(
                b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            received = b""
            with trio.fail_after(10):
                while chunk := await stream.receive_some():  # the 101, the close (1008), then the end
                    received += chunk
            assert b"\x88" in received.split(b"\r\n\r\n", 1)[1]
        await _served_again(url)


async def test_a_client_that_never_finishes_the_handshake_gives_its_slot_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from corda_trio.rpc import _server

    monkeypatch.setattr(_server, "HANDSHAKE_TIMEOUT_SECONDS", 0.3)
    async with serving(max_connections=1) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n")  # ... and never the rest
            with trio.fail_after(10):
                assert await stream.receive_some() == b""  # closed at the handshake deadline
        await _served_again(url)


async def test_the_server_going_down_closes_its_connections_with_1001() -> None:
    server = rpc.RpcServer(handlers={}, users=rpc.UserDatabase.of(USERS))
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await server.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        port = await nursery.start(run)
        async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{port}") as ws:
            await ws.send_message(
                msgpack.packb({"id": 1, "method": "login", "args": {"user": "admin", "password": PASSWORD}})
            )
            assert "ok" in _unpack(await ws.get_message())
            scope.cancel()
            with trio.fail_after(10), pytest.raises(trio_websocket.ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 1001


async def test_a_client_vanishing_mid_call_leaves_the_work_running() -> None:
    async with serving() as (url, work):
        async with rpc.connect(url, "admin", PASSWORD) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.start_flow, "Ping")
                await work.started.wait()
                nursery.cancel_scope.cancel()
        # The connection is gone; the work it started was not cancelled with it.
        work.release.set()
        with trio.fail_after(10):
            await work.finished.wait()
        async with rpc.connect(url, "admin", PASSWORD) as client:
            assert await client.ping() == "pong"


async def test_100_concurrent_clients_each_get_their_answer() -> None:
    answers: dict[int, Any] = {}
    errors: dict[int, str] = {}
    async with serving() as (url, _):

        async def one(i: int) -> None:
            password = PASSWORD if i % 10 else "wrong"
            try:
                async with rpc.connect(url, "reader", password) as client:
                    answers[i] = await client.call("ping", echo=i)
            except rpc.RpcError as exc:
                errors[i] = exc.code

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for i in range(100):
                    nursery.start_soon(one, i)
    assert answers == {i: i for i in range(100) if i % 10}
    assert errors == {i: "unauthenticated" for i in range(0, 100, 10)}


async def test_many_calls_in_flight_over_one_connection() -> None:
    async with serving() as (url, _):
        async with rpc.connect(url, "reader", PASSWORD) as client:
            results: list[Any] = [None] * 500

            async def one(i: int) -> None:
                results[i] = await client.call("ping", echo=i)

            async with trio.open_nursery() as nursery:
                for i in range(500):
                    nursery.start_soon(one, i)
            assert results == list(range(500))


async def test_callers_cancelled_while_waiting_never_strand_the_others() -> None:
    """The client has no reader task: a waiting caller reads the connection for all of them and hands the
    reading over when it leaves. Half the callers are cancelled at random moments (the reader among them,
    often); every other call still gets its own answer, and the connection goes on."""
    rng = random.Random(17)
    plan = [(rng.uniform(0, 0.05), rng.uniform(0.01, 0.3) if i % 2 else None) for i in range(300)]
    async with serving() as (url, _):
        async with rpc.connect(url, "reader", PASSWORD) as client:
            results: dict[int, Any] = {}

            async def one(i: int) -> None:
                delay, cancel_after = plan[i]
                with trio.move_on_after(cancel_after if cancel_after is not None else math.inf):
                    results[i] = int(await client.call("watch_flow", flow_id=f"{i}@{delay}"))

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for i in range(300):
                        nursery.start_soon(one, i)
            assert [results.get(i) for i in range(0, 300, 2)] == list(range(0, 300, 2))
            assert all(results[i] == i for i in range(1, 300, 2) if i in results)
            assert len(results) < 300, "no caller was cancelled: the test tested nothing"
            assert await client.ping() == "pong"


async def test_a_reader_cancelled_hands_the_reading_over() -> None:
    """The caller reading the connection for all is cancelled while the others' answers are still on their
    way: one of the waiting callers reads next, and gets its answer."""
    async with serving() as (url, _):
        async with rpc.connect(url, "reader", PASSWORD) as client:
            answer: list[Any] = []
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    slow = trio.CancelScope()

                    async def reader() -> None:
                        with slow:
                            await client.call("watch_flow", flow_id="never@60")

                    async def waiter() -> None:
                        answer.append(await client.call("watch_flow", flow_id="mine@2"))

                    nursery.start_soon(reader)
                    while not client._reading:  # the first caller took the reading
                        await trio.lowlevel.checkpoint()
                    nursery.start_soon(waiter)
                    while not any(p.waiting for p in client._pending.values()):  # the second one waits
                        await trio.lowlevel.checkpoint()
                    slow.cancel()
            assert answer == ["mine"]
            assert await client.ping() == "pong"


async def test_connecting_to_nothing_is_a_clear_error() -> None:
    port = refused_port()
    with pytest.raises(rpc.RpcConnectionError) as info:
        async with rpc.connect(f"ws://127.0.0.1:{port}", "admin", PASSWORD):
            pass
    # what went wrong is said (trio-websocket's own error is empty: its cause is used), and why each attempt
    # failed (it said only 'all attempts ... failed', not that nothing listens there)
    url = f"ws://127.0.0.1:{port}"
    expected = (
        f"unavailable: cannot connect to {url}: all attempts to connect to 127.0.0.1:{port} failed "
        "(Connection refused)"
    )
    assert str(info.value) == expected


@pytest.mark.parametrize(
    ("host", "written"),
    [("127.0.0.1", "127.0.0.1:{port}"), pytest.param("::1", "[::1]:{port}", marks=needs_ipv6)],
)
async def test_the_host_header_is_the_address_as_written_in_a_url(host: str, written: str) -> None:
    """``Host: ::1:40002`` (trio-websocket writes the host it dials, then the port) is refused with 400 by a
    strict reverse proxy in front of the RPC port (RFC 7230 and 3986: ``[::1]:40002``). A real listener
    records the request ``rpc.connect`` sends, and refuses it as such a proxy would."""
    heads: list[bytes] = []

    async def proxy(stream: trio.SocketStream) -> None:
        head = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in head:
                chunk = await stream.receive_some(4096)
                assert chunk, head
                head += chunk
        heads.append(head)
        await stream.send_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 8\r\n\r\nbad Host")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, proxy, 0, host=host))
        port = listeners[0].socket.getsockname()[1]
        url = f"ws://{host_port_text(host, port)}/"
        with pytest.raises(rpc.RpcConnectionError) as info:
            async with rpc.connect(url, "admin", PASSWORD, connect_timeout_seconds=10):
                pass
        nursery.cancel_scope.cancel()
    assert str(info.value) == f"unavailable: {url} refused the connection: HTTP 400 (bad Host)"
    (head,) = heads
    lines = head.decode("ascii").split("\r\n")
    assert lines[0] == "GET / HTTP/1.1", lines
    hosts = [x for x in lines if x.lower().startswith("host:")]
    assert hosts == [f"Host: {written.format(port=port)}"], lines


async def test_a_server_that_never_answers_the_upgrade_is_given_up_after_the_connect_timeout() -> None:
    """A listener that accepts the connection and never answers (a hung node, a proxy holding the request):
    ``connect_timeout_seconds`` ran out, but ``rpc.connect`` still waited for trio-websocket's reader task,
    which kept reading the silent connection until the other side closed it (found timing the error of a
    1 s timeout: 30 s, as long as the listener held the connection). It gives up at the timeout now."""

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        url = f"ws://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        start = trio.current_time()
        with trio.fail_after(20), pytest.raises(rpc.RpcConnectionError) as info:
            async with rpc.connect(url, "admin", PASSWORD, connect_timeout_seconds=1):
                pass
        assert 1 <= trio.current_time() - start < 10
        nursery.cancel_scope.cancel()
    assert str(info.value) == f"unavailable: cannot connect to {url}: ConnectionTimeout"


async def test_an_answer_that_is_not_http_is_a_clear_error() -> None:
    """A ``--node`` address whose server answers something that is not HTTP: wsproto takes the bad status
    line for a request to refuse and has the client answer 400, which h11 refuses (a client sends no
    response), so ``rpc.connect`` raised h11's ``LocalProtocolError`` ("can't handle event type Response
    when role=CLIENT"), a traceback from ``corda-trio node info`` (found feeding rpc.connect wrong answers).
    It is an RpcConnectionError saying what h11 found wrong."""

    async def not_http(stream: trio.SocketStream) -> None:
        await stream.receive_some(4096)
        await stream.send_all(b"-ERR unknown command\r\n\r\n")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, not_http, 0, host="127.0.0.1"))
        url = f"ws://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        with trio.fail_after(20), pytest.raises(rpc.RpcConnectionError) as info:
            async with rpc.connect(url, "admin", PASSWORD):
                pass
        nursery.cancel_scope.cancel()
    said = "illegal status line: '-ERR unknown command'"
    assert str(info.value) == f"unavailable: cannot connect to {url}: the answer is not HTTP ({said})"


async def test_a_server_that_closes_without_answering_the_upgrade_is_said_at_once() -> None:
    """``--node`` pointed at a port of another protocol that closes the connection on the request, as a
    node's P2P port does (checked by hand: ``node info --node ws://[::1]:P2P_PORT``): trio-websocket's
    reader returned, and ``rpc.connect`` still waited for the answer until the connect timeout, 10 s, then
    said only "ConnectionTimeout". It says at once that the server closed the connection."""

    async def amqp(stream: trio.SocketStream) -> None:
        await stream.receive_some(4096)
        await stream.send_all(b"AMQP\x03\x01\x00\x00")  # (the protocol header it expects instead)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, amqp, 0, host="127.0.0.1"))
        url = f"ws://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        start = trio.current_time()
        with trio.fail_after(20), pytest.raises(rpc.RpcConnectionError) as info:
            async with rpc.connect(url, "admin", PASSWORD, connect_timeout_seconds=10):
                pass
        assert trio.current_time() - start < 5
        nursery.cancel_scope.cancel()
    said = "the server closed the connection without answering the websocket upgrade"
    assert str(info.value) == f"unavailable: cannot connect to {url}: {said}"


async def test_an_ipv6_address_without_brackets_is_refused_saying_how_to_write_it() -> None:
    """``node info --node ::1:40002`` said only "URL host must not be None"; it says how to write it."""
    with pytest.raises(rpc.RpcConnectionError) as info:
        async with rpc.connect("ws://::1:40002", "admin", PASSWORD):
            pass
    said = "an IPv6 address is written in brackets in a URL, as in ws://[::1]:40002"
    assert str(info.value) == f"unavailable: cannot connect to ws://::1:40002: {said}"


@pytest.mark.parametrize("url", ["ws://", "ws://:40002", "wss://:40002"])
async def test_a_url_without_a_host_is_refused_saying_how_to_write_it(url: str) -> None:
    """``node info --node ""`` (the CLI writes ``ws://``) or ``ws://:40002`` said "URL host must not be
    None", Python's words for what is missing; it says what is missing and how to write the URL."""
    with pytest.raises(rpc.RpcConnectionError) as info:
        async with rpc.connect(url, "admin", PASSWORD):
            pass
    scheme = url.split(":")[0]
    said = f"the URL names no host: write it as {scheme}://HOST:PORT"
    assert str(info.value) == f"unavailable: cannot connect to {url}: {said}"


@needs_ipv6
async def test_a_client_logs_in_to_a_server_on_the_ipv6_loopback() -> None:
    async with serving(host="::1") as (url, _):
        assert url.startswith("ws://[::1]:")
        async with rpc.connect(url, "reader", PASSWORD) as client:
            assert client.user == "reader" and await client.ping() == "pong"


@pytest.mark.parametrize(
    ("method", "args", "message"),
    [
        ("start_flow", {"flow": "Ping", "wiat": False}, "start_flow has no argument 'wiat' (start_flow take"),
        (
            "start_flow",
            {"flow": "Ping", "wait": "no"},
            "start_flow: 'wait' must be a boolean or nil, got str",
        ),
        ("start_flow", {"flow": "Ping", "args": [1]}, "start_flow: 'args' must be a map or nil, got list"),
        ("start_flow", {"flow": None}, "start_flow needs 'flow': the flow's name"),
        ("watch_flow", {}, "watch_flow needs 'flow_id'"),
        ("watch_flow", {"flow_id": 7}, "watch_flow: 'flow_id' must be a string, got int"),
        ("node_info", {"verbose": True}, "node_info has no argument 'verbose' (node_info takes no argument"),
        ("list_flows", {"state": 3}, "list_flows: 'state' must be a string or nil, got int"),
        ("ping", {"echo": 1, "more": 2}, "ping has no argument 'more' (ping takes 'echo')"),
    ],
)
async def test_arguments_a_method_does_not_take_are_refused_not_ignored(
    method: str, args: dict[str, Any], message: str
) -> None:
    """A misspelt or mistyped argument (``wiat=False``, ``wait="no"``) would otherwise be ignored or read as
    something else: the call is refused with bad-arguments and nothing runs."""
    async with serving() as (url, work):
        work.release.set()
        async with rpc.connect(url, "admin", PASSWORD) as client:
            with pytest.raises(rpc.RpcError) as info:
                await client.call(method, **args)
            assert info.value.code == "bad-arguments" and info.value.message.startswith(message), info.value
            assert not work.started.is_set()
            assert await client.ping() == "pong"


async def test_an_optional_argument_given_as_nil_is_absent_for_every_method() -> None:
    """``start_flow`` refused ``client_id: nil``, ``wait: nil`` and ``args: nil`` with bad-arguments while
    ``list_flows`` took ``state: nil`` as absent (found calling the server with nil for each optional
    argument). Nil is now absent wherever an argument is optional; ``ping``'s ``echo`` takes any value, so
    nil is what it echoes."""
    async with serving() as (url, work):
        work.release.set()
        async with rpc.connect(url, "admin", PASSWORD) as client:
            for nil in ({"client_id": None}, {"wait": None}, {"args": None}, dict.fromkeys(["args", "wait"])):
                answer = await client.call("start_flow", flow="Ping", **nil)
                assert answer == {"flow": "Ping", "result": {}}, nil
            assert work.start_args == [{"flow": "Ping"}] * 4  # (the handler never sees the nils)
            assert await client.call("ping", echo=None) is None
            with pytest.raises(rpc.RpcError, match="watch_flow: 'flow_id' must be a string, got NoneType"):
                await client.call("watch_flow", flow_id=None)  # (a required one is not optional)


async def test_permissions_are_checked_before_arguments() -> None:
    async with serving() as (url, _):
        async with rpc.connect(url, "reader", PASSWORD) as client:
            with pytest.raises(rpc.RpcError) as info:
                await client.call("drain", bogus=1)
            assert info.value.code == "forbidden"


@pytest.mark.parametrize(
    ("password_hash", "message"),
    [
        ("plain-password", "must be an argon2 hash"),
        ("$argon2id$garbage", "is not a valid argon2 hash"),
        # 4 GiB and 1000 passes: every login attempt for the user (anybody's, with any password) made the
        # node allocate 4 GiB and work for minutes
        (
            "$argon2id$v=19$m=4194304,t=1000,p=1$YWJjZGVmZ2g$YWJjZGVmZ2hpamtsbW5vcA",
            "asks m=4194304 KiB and t=1000 passes per check: at most m=262144 and m*t=786432",
        ),
        ("$argon2id$v=19$m=65536,t=13,p=4$YWJjZGVmZ2g$YWJjZGVmZ2hpamtsbW5vcA", "t=13 passes"),
        # within the memory and work bounds, but 8192 lanes: a thread each per slice, 3.7 s a check
        (
            "$argon2id$v=19$m=65536,t=3,p=8192$YWJjZGVmZ2g$YWJjZGVmZ2hpamtsbW5vcA",
            "asks p=8192 lanes (one thread each) per check: at most p=64",
        ),
    ],
)
def test_a_password_hash_that_costs_too_much_to_check_is_refused(password_hash: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        rpc.check_password_hash(password_hash)


def test_the_hashes_hash_password_makes_and_the_limits_pass() -> None:
    rpc.check_password_hash(rpc.hash_password("s3cret"))
    at_the_bound = "$argon2id$v=19$m=262144,t=3,p=4$YWJjZGVmZ2g$YWJjZGVmZ2hpamtsbW5vcA"
    rpc.check_password_hash(at_the_bound)
    rpc.check_password_hash("$argon2id$v=19$m=65536,t=3,p=64$YWJjZGVmZ2g$YWJjZGVmZ2hpamtsbW5vcA")


@pytest.mark.parametrize("username", ["ops", "nobody"])
async def test_a_cancelled_login_does_not_wait_for_its_password_check(
    monkeypatch: pytest.MonkeyPatch, username: str
) -> None:
    """A stopping node waited for every password check in progress (a worker thread); one with a costly
    hash kept a node that had been told to stop running for half an hour."""
    import threading

    from corda_trio.rpc import _auth

    release = threading.Event()

    def slow_verify(password_hash: str, password: str) -> bool:
        release.wait(30)
        return False

    monkeypatch.setattr(_auth, "_verify", slow_verify)
    db = rpc.UserDatabase.of([rpc.RpcUser(username="ops", password_hash="h", permissions=frozenset())])
    try:
        with trio.fail_after(5):  # (the check itself would take 30 s)
            with trio.move_on_after(0.2) as scope:
                await db.authenticate(username, "wrong")
        assert scope.cancelled_caught
        assert not db._checking  # nothing left behind for a later login with the same password to wait on
    finally:
        release.set()


@contextlib.asynccontextmanager
async def _tls_front(ws_url: str, ca: Any) -> AsyncIterator[int]:
    """A TLS-terminating relay (as a reverse proxy in front of a node's ``ws://`` RPC port) on the loopback,
    its certificate for ``localhost`` from the trustme CA ``ca``: yields its port."""
    import ssl

    port = int(ws_url.rsplit(":", 1)[1])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(context)

    async def relay(tls: trio.SSLStream[trio.SocketStream]) -> None:
        async def pipe(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while data := await source.receive_some(65536):
                    await sink.send_all(data)
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await sink.aclose()

        with contextlib.suppress(trio.BrokenResourceError):
            await tls.do_handshake()
            async with await trio.open_tcp_stream("127.0.0.1", port) as plain, trio.open_nursery() as pair:
                pair.start_soon(pipe, tls, plain)
                pair.start_soon(pipe, plain, tls)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_ssl_over_tcp, relay, 0, context, host="127.0.0.1")
        )
        yield listeners[0].transport_listener.socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def test_wss_through_a_tls_front_logs_in_and_an_untrusted_certificate_is_said(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wss://`` through a TLS front whose certificate the client does not trust said "the server closed
    the connection without answering the websocket upgrade" (trio ran the TLS handshake inside
    trio-websocket's upgrade): it says that the certificate was refused, and how to trust another CA. With
    that CA named in ``SSL_CERT_FILE``, the same client logs in and calls over ``wss://``."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    async with serving() as (url, _), _tls_front(url, ca) as port:
        wss = f"wss://localhost:{port}"
        with trio.fail_after(20), pytest.raises(rpc.RpcConnectionError) as info:
            async with rpc.connect(wss, "admin", PASSWORD):
                pass
        said = (
            "TLS handshake failed: the server's certificate was refused: unable to get local issuer "
            "certificate (this client trusts the system's CAs; SSL_CERT_FILE names another CA bundle)"
        )
        assert str(info.value) == f"unavailable: cannot connect to {wss}: {said}"

        bundle = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(bundle))
        monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
        with trio.fail_after(20):
            async with rpc.connect(wss, "reader", PASSWORD) as client:
                assert client.user == "reader" and await client.ping() == "pong"


async def test_wss_to_a_plain_ws_rpc_port_says_the_port_speaks_ws() -> None:
    """``wss://`` to a node's own RPC port (plain ``ws://``): it said the server closed the connection
    without answering the websocket upgrade; it says the server does not speak TLS there, and the URL to
    use."""
    async with serving() as (url, _):
        wss = url.replace("ws://", "wss://")
        with trio.fail_after(20), pytest.raises(rpc.RpcConnectionError) as info:
            async with rpc.connect(wss, "admin", PASSWORD):
                pass
    why = str(info.value).removeprefix(f"unavailable: cannot connect to {wss}: TLS handshake failed: ")
    hint = f"(a node's own RPC port speaks ws://, not wss://: {url}?)"
    said = ("the server does not speak TLS", "the server closed the connection during it")
    assert why in (f"{said[0]} {hint}", f"{said[1]} {hint}")
