"""The RPC server driven by a websocket client that is not ours: the ``websockets`` library (its own RFC 6455
implementation, which offers permessage-deflate), written from ``protocol_spec/rpc.md`` alone.

The client is synchronous and runs in a worker thread while the server runs in the test's Trio loop.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from corda_trio.node._processes import open_node_processes

from ..node.netutil import PASSWORD as NODE_PASSWORD
from ..node.netutil import make_network
from .test_rpc import BAD_HOST_HANDSHAKE, PASSWORD, serving


def _request(ws: ClientConnection, request_id: int, method: str, **args: Any) -> None:
    ws.send(msgpack.packb({"id": request_id, "method": method, "args": args}))


def _frame(ws: ClientConnection) -> dict[str, Any]:
    data = ws.recv(timeout=20)
    assert isinstance(data, bytes), data  # the spec: every message is binary
    frame = msgpack.unpackb(data)
    assert isinstance(frame, dict)
    return frame


async def _in_thread(url: str, session: Callable[[ClientConnection], Any]) -> Any:
    def run() -> Any:
        with connect(url, max_size=None, open_timeout=20, close_timeout=5) as ws:
            return session(ws)

    with trio.fail_after(60):
        return await trio.to_thread.run_sync(run)


async def test_login_calls_events_and_bad_frames_from_another_websocket_library() -> None:
    def session(ws: ClientConnection) -> list[Any]:
        seen: list[Any] = []
        _request(ws, 1, "ping")
        seen.append(_frame(ws)["error"]["code"])  # before the login
        _request(ws, 2, "login", user="admin", password=PASSWORD)
        seen.append(_frame(ws))
        ws.send("a text message")
        seen.append(_frame(ws)["error"])
        ws.send(b"\xc1")
        seen.append(_frame(ws)["error"])
        _request(ws, 3, "nosuch")
        seen.append(_frame(ws)["error"]["code"])
        _request(ws, 4, "ping", echo={"bin": b"\x00\xff", "list": [1, None]})
        seen.append(_frame(ws))
        _request(ws, 5, "start_flow", flow="Ping", args={"n": 2})
        frames = [_frame(ws) for _ in range(4)]  # three progress events, then the result
        seen.append(frames)
        return seen

    async with serving() as (url, work):
        work.release.set()
        seen = await _in_thread(url, session)
    assert seen == [
        "unauthenticated",
        {"id": 2, "ok": {"user": "admin", "permissions": ["admin"]}},
        {"code": "malformed", "message": "text messages are not used: send binary msgpack"},
        {"code": "malformed", "message": "not msgpack: FormatError: a byte that begins no msgpack value"},
        "unknown-method",
        {"id": 4, "ok": {"bin": b"\x00\xff", "list": [1, None]}},
        [
            {"id": 5, "event": {"step": 0}},
            {"id": 5, "event": {"step": 1}},
            {"id": 5, "event": {"step": 2}},
            {"id": 5, "ok": {"flow": "Ping", "result": {"n": 2}}},
        ],
    ]


@pytest.mark.parametrize(
    ("abuse", "code"),
    [
        ("three wrong passwords", 1008),
        ("a request above 1 MiB", 1009),
    ],
)
async def test_the_close_codes_of_the_spec_reach_another_websocket_library(abuse: str, code: int) -> None:
    def session(ws: ClientConnection) -> tuple[int | None, str | None]:
        try:
            if abuse == "three wrong passwords":
                for i in range(3):
                    _request(ws, i, "login", user="admin", password="wrong")
                    assert _frame(ws)["error"]["code"] == "unauthenticated"
                ws.recv(timeout=20)
            else:
                _request(ws, 1, "ping", echo=b"x" * (1024 * 1024 + 1))
                ws.recv(timeout=20)
        except ConnectionClosed as closed:
            return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, None)
        return None, None

    async with serving() as (url, _):
        received, _reason = await _in_thread(url, session)
        assert received == code
        # and the server goes on serving
        assert await _in_thread(url, lambda ws: (_request(ws, 9, "ping"), _frame(ws))[1]["id"]) == 9


async def test_the_server_going_down_closes_another_librarys_connection_with_1001_and_its_reason() -> None:
    """The close reason is the server's ``going_away_reason``, cut to the 123 bytes a close frame carries
    (whole characters: a 2-byte character across the cut is left out)."""
    logged_in = trio.Event()

    def session(ws: ClientConnection) -> tuple[int, str] | None:
        _request(ws, 1, "login", user="reader", password=PASSWORD)
        assert "ok" in _frame(ws)
        trio.from_thread.run_sync(logged_in.set)
        try:
            ws.recv(timeout=20)
        except ConnectionClosed as closed:
            return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else None
        return None

    why = "node stopping: " + "x" * 107 + "é and more"  # (the é takes bytes 123 and 124)
    async with trio.open_nursery() as outer:
        result: list[tuple[int, str] | None] = []

        async def client(url: str) -> None:
            result.append(await _in_thread(url, session))

        async with serving(going_away_reason=why) as (url, _):
            outer.start_soon(client, url)
            with trio.fail_after(30):
                await logged_in.wait()
        # (leaving ``serving`` stops the server with the client still connected)
    assert result == [(1001, why[:122])]


@pytest.mark.slow
async def test_a_node_stopped_by_sigterm_closes_rpc_connections_saying_it_stops(tmp_path: Path) -> None:
    """A node that stops normally (SIGTERM) closed its RPC connections with reason "server going away";
    now "node stopping" (a fatal error adds why: tests/node/test_store_failure.py)."""
    logged_in = trio.Event()

    def session(ws: ClientConnection) -> tuple[int, str] | None:
        _request(ws, 1, "login", user="ops", password=NODE_PASSWORD)
        assert "ok" in _frame(ws)
        trio.from_thread.run_sync(logged_in.set)
        try:
            ws.recv(timeout=30)
        except ConnectionClosed as closed:
            return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else None
        return None

    nodes = make_network(tmp_path / "net", ["O=Alice,L=London,C=GB"])
    result: list[tuple[int, str] | None] = []
    async with open_node_processes(nodes) as (alice,), trio.open_nursery() as nursery:

        async def client() -> None:
            result.append(await _in_thread(alice.rpc_url, session))

        nursery.start_soon(client)
        with trio.fail_after(30):
            await logged_in.wait()
        assert await alice.stop() == 0
    assert result == [(1001, "node stopping")]


async def test_over_the_limit_another_websocket_library_reads_the_503_every_time() -> None:
    """The server answered a websocket handshake over its connection limit with a 503 and closed the socket
    with the request unread: the kernel then sends a reset, which destroyed the 503 in flight about one time
    in 30 (the client saw "connection reset" instead of "too many connections"). Now it reads the request to
    the client's close first: 100 attempts over the limit, 100 answers of 503."""
    async with serving(max_connections=1) as (url, _):
        # (the one slot is held by a client that is not logged in yet: it has the login timeout)
        async with await trio.open_tcp_stream("127.0.0.1", int(url.rsplit(":", 1)[1])):

            def attempts() -> list[str]:
                seen = []
                for _ in range(100):
                    try:
                        with connect(url, open_timeout=10):
                            seen.append("connected")
                    except InvalidStatus as exc:
                        seen.append(f"HTTP {exc.response.status_code}: {bytes(exc.response.body or b'')!r}")
                    except Exception as exc:  # a reset, or the socket closed before the answer
                        seen.append(f"{type(exc).__name__}: {exc}")
                return seen

            with trio.fail_after(120):
                seen = await trio.to_thread.run_sync(attempts)
    refused = "HTTP 503: b'too many connections; try again later\\r\\n'"
    assert [s for s in seen if s != refused] == [], collections.Counter(seen)


async def test_login_refuses_extra_arguments_and_a_second_login_says_it_is_logged_in_already() -> None:
    """``login`` ignored arguments other than user and password (every other method refuses them), and a
    second login answered ``unknown-method "unknown method 'login'"``. Now: an extra argument is
    ``bad-arguments`` and no failed login (three of them do not close the connection), and a second login is
    ``already-authenticated``."""

    def session(ws: ClientConnection) -> list[Any]:
        seen = []
        for i in range(3):
            _request(ws, i, "login", user="admin", password=PASSWORD, z=1)
            seen.append(_frame(ws)["error"])
        _request(ws, 3, "login", user="admin", password=PASSWORD)
        seen.append(_frame(ws)["ok"]["user"])
        _request(ws, 4, "login", user="reader", password=PASSWORD)
        seen.append(_frame(ws)["error"])
        _request(ws, 5, "ping", echo="still admin")
        seen.append(_frame(ws)["ok"])
        return seen

    async with serving() as (url, _):
        seen = await _in_thread(url, session)
    extra = {"code": "bad-arguments", "message": "login has no argument 'z' (login takes 'user', 'password')"}
    assert seen == [
        extra,
        extra,
        extra,
        "admin",
        {
            "code": "already-authenticated",
            "message": "this connection is logged in already (as admin); a connection logs in once: open "
            "another connection to act as another user",
        },
        "still admin",
    ]


@pytest.mark.slow
async def test_a_real_nodes_start_flow_errors_name_the_flows_arguments(tmp_path: Path) -> None:
    """A real node answered ``start_flow {"flow": "PingPong"}`` with Python's words ("PingPong.__init__()
    missing 1 required positional argument: 'recipient'") and a client id holding a NUL with "...without
    NUL, got 3 characters"."""

    def session(ws: ClientConnection) -> list[Any]:
        _request(ws, 1, "login", user="ops", password=NODE_PASSWORD)
        assert "ok" in _frame(ws)
        calls: list[dict[str, Any]] = [
            {"flow": "PingPong"},
            {"flow": "PingPong", "args": {"recipient": "O=Bob,L=Paris,C=FR", "colour": "red"}},
            {"flow": "PingPong", "args": {"recipient": "O=Bob,L=Paris,C=FR"}, "client_id": "a\0b"},
        ]
        seen = []
        for i, args in enumerate(calls, 2):
            _request(ws, i, "start_flow", **args)
            seen.append(_frame(ws)["error"])
        return seen

    nodes = make_network(tmp_path / "net", ["O=Alice,L=London,C=GB"])
    async with open_node_processes(nodes) as (alice,):
        seen = await _in_thread(alice.rpc_url, session)
    assert seen == [
        {"code": "bad-arguments", "message": "PingPong needs the argument 'recipient'"},
        {
            "code": "bad-arguments",
            "message": "PingPong has no argument 'colour' (arguments: recipient, rounds)",
        },
        {
            "code": "bad-arguments",
            "message": (
                "a client id is 1 to 200 characters without control characters, got U+0000 at character 2"
            ),
        },
    ]


@pytest.mark.slow
async def test_a_handshake_whose_host_is_not_a_host_name_does_not_stop_a_real_node(tmp_path: Path) -> None:
    """``Host: \\xff\\xfe`` in a websocket handshake, from anyone who can reach the RPC port, before any
    login, stopped the node (exit 1, a UnicodeDecodeError traceback). Now it is answered 400 and the node
    serves on."""
    nodes = make_network(tmp_path / "net", ["O=Alice,L=London,C=GB"])
    async with open_node_processes(nodes) as (alice,):
        port = int(alice.rpc_url.rsplit(":", 1)[1])
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(BAD_HOST_HANDSHAKE)
            answer = b""
            with trio.fail_after(10):
                while chunk := await stream.receive_some():
                    answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
        pong = await _in_thread(
            alice.rpc_url,
            lambda ws: (
                _request(ws, 1, "login", user="ops", password=NODE_PASSWORD),
                _frame(ws),
                _request(ws, 2, "ping"),
                _frame(ws),
            )[3],
        )
        assert pong == {"id": 2, "ok": "pong"}
        assert alice.process.returncode is None


async def test_connections_ended_during_their_close_are_one_info_line_per_client_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A logged-in client sends a request over the limit and a ping in one write, then goes: the server
    closes (1009) and the ping crosses that close, which ends the connection in trio-websocket
    (python-trio/trio-websocket#184). That was an info line per connection, 200 connections in a loop
    about 100 lines; now one info line for the host, the rest at debug."""

    def clients(url: str) -> None:
        for _ in range(200):
            with connect(url, max_size=None, open_timeout=20, close_timeout=5) as ws:
                _request(ws, 1, "login", user="admin", password=PASSWORD)
                assert "ok" in _frame(ws)
                with ws.protocol_mutex:  # (both frames in one write, before the server's close is read)
                    ws.protocol.send_binary(b"x" * (1024 * 1024 + 1))
                    ws.protocol.send_ping(b"are you there?")
                    ws.socket.sendall(b"".join(ws.protocol.data_to_send()))
                with contextlib.suppress(ConnectionClosed):
                    ws.recv(timeout=20)
                ws.close_socket()

    caplog.set_level(logging.DEBUG, logger="corda_trio.rpc")
    async with serving() as (url, _):
        with trio.fail_after(120):
            await trio.to_thread.run_sync(clients, url)
            await trio.sleep(0.5)  # (the last connections' ends)
    ended = [r for r in caplog.records if "ended during its close" in r.getMessage()]
    assert ended, "no connection ended during its close: the test no longer makes the ping cross the close"
    info = [r.getMessage() for r in ended if r.levelno >= logging.INFO]
    assert len(info) == 1, info[:3]
    assert info[0].startswith("RPC connection from 127.0.0.1:") and "ended during its close: " in info[0]


@pytest.mark.slow
async def test_every_documented_method_of_a_real_node_as_the_spec_describes_it(tmp_path: Path) -> None:
    """protocol_spec/rpc.md followed literally against real ``corda-trio node start`` processes: each method
    of its table, the frames of a call (events, then one final frame), the summary fields it lists and the
    error codes it names, read by another websocket implementation."""
    bob_name = "O=Bob,L=Paris,C=FR"

    def call(ws: ClientConnection, request_id: int, method: str, **args: Any) -> list[dict[str, Any]]:
        _request(ws, request_id, method, **args)
        frames = [_frame(ws)]
        while "event" in frames[-1]:
            frames.append(_frame(ws))
        assert all(f["id"] == request_id for f in frames)
        assert set(frames[-1]) in ({"id", "ok"}, {"id", "error"})
        return frames

    def ok(ws: ClientConnection, request_id: int, method: str, **args: Any) -> Any:
        return call(ws, request_id, method, **args)[-1]["ok"]

    def error(ws: ClientConnection, request_id: int, method: str, **args: Any) -> str:
        final = call(ws, request_id, method, **args)[-1]
        assert set(final["error"]) == {"code", "message"} and final["error"]["message"]
        return str(final["error"]["code"])

    summary_fields = {
        "flow_id", "flow", "flow_class", "state", "status", "result", "error", "suspends", "initiator",
        "started_by", "started_at",
    }  # fmt: skip

    def admin(ws: ClientConnection) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        seen["before login"] = error(ws, 1, "whoami")
        assert ok(ws, 2, "login", user="ops", password=NODE_PASSWORD) == {
            "user": "ops",
            "permissions": ["admin"],
        }
        assert ok(ws, 3, "whoami") == {"user": "ops", "permissions": ["admin"]}
        assert (ok(ws, 4, "ping"), ok(ws, 5, "ping", echo=[1, "x"])) == ("pong", [1, "x"])
        info = ok(ws, 6, "node_info")
        assert info["legal_name"] == "O=Alice, L=London, C=GB" and info["network_map"] == "directory"
        assert info["network_nodes"] == 2 and info["draining"] is False and info["pid"] > 0
        assert info["flows"] == ok(ws, 7, "registered_flows") and "PingPong" in info["flows"]
        network = ok(ws, 8, "network_map")
        assert {n["legal_name"]: n["self"] for n in network} == {
            "O=Alice, L=London, C=GB": True,
            "O=Bob, L=Paris, C=FR": False,
        }
        assert all(
            set(n) == {"legal_name", "key_hash", "addresses", "platform_version", "serial", "hash", "self"}
            for n in network
        )
        assert isinstance(ok(ws, 9, "queue_statistics"), list)
        # start_flow, waiting: one event {flow_id, state: running}, then the flow's result
        frames = call(ws, 10, "start_flow", flow="PingPong", args={"recipient": bob_name, "rounds": "2"})
        assert [set(f) for f in frames] == [{"id", "event"}, {"id", "ok"}]
        assert frames[0]["event"]["state"] == "running" and frames[1]["ok"] == 2
        waited = frames[0]["event"]["flow_id"]
        # not waiting, with a client id: its id C-<client id>; the same start again follows it
        assert ok(
            ws, 11, "start_flow", flow="PingPong", args={"recipient": bob_name}, wait=False, client_id="k1"
        ) == ("C-k1")
        assert ok(ws, 12, "start_flow", flow="PingPong", args={"recipient": bob_name}, client_id="k1") == 1
        watched = call(ws, 13, "watch_flow", flow_id="C-k1")[-1]["ok"]
        assert set(watched) == summary_fields
        assert (watched["state"], watched["result"], watched["started_by"]) == ("finished", 1, "ops")
        seen["failed"] = call(ws, 14, "start_flow", flow="FailingFlow", args={"recipient": bob_name})[-1][
            "error"
        ]
        # a flow that cannot reach its peer keeps running (retrying) until killed
        stuck = ok(
            ws, 15, "start_flow", flow="PingPong", args={"recipient": "O=Nobody,L=Paris,C=FR"}, wait=False
        )
        killed = ok(ws, 16, "kill_flow", flow_id=stuck)
        assert (killed["state"], killed["error"]) == ("failed", "killed by RPC user ops")
        flows = ok(ws, 17, "list_flows")
        assert all(set(f) == summary_fields for f in flows)
        assert {f["flow_id"]: f["state"] for f in flows} == {
            waited: "finished",
            "C-k1": "finished",
            seen["failed"]["message"].split(":")[0].removeprefix("flow "): "failed",
            stuck: "failed",
        }
        assert {f["flow_id"] for f in ok(ws, 18, "list_flows", state="failed")} == {
            f["flow_id"] for f in flows if f["state"] == "failed"
        }
        assert ok(ws, 29, "list_flows", state=None) == flows  # nil: all, as when left out
        # an ended flow's watch is its final frame only: a summary, also for a failed flow
        assert call(ws, 30, "watch_flow", flow_id=stuck) == [{"id": 30, "ok": killed}]
        seen["retry ended"] = error(ws, 19, "retry_flow", flow_id=waited)
        seen["unknown flow id"] = error(ws, 20, "watch_flow", flow_id="no-such-flow")
        seen["unknown flow"] = error(ws, 21, "start_flow", flow="NoSuchFlow")
        seen["bad state"] = error(ws, 22, "list_flows", state="sleeping")
        seen["wait not bool"] = error(
            ws, 23, "start_flow", flow="PingPong", args={"recipient": bob_name}, wait=1
        )
        seen["unknown method"] = error(ws, 24, "no_such_method")
        assert ok(ws, 25, "drain") == {"draining": True, "running_flows": 0}
        seen["draining"] = error(ws, 26, "start_flow", flow="PingPong", args={"recipient": bob_name})
        assert ok(ws, 27, "undrain") == {"draining": False, "running_flows": 0}
        seen["second login"] = error(ws, 28, "login", user="reader", password=NODE_PASSWORD)
        return seen

    def reader(ws: ClientConnection) -> list[str]:
        assert ok(ws, 1, "login", user="reader", password=NODE_PASSWORD)["permissions"] == ["read"]
        assert len(ok(ws, 2, "list_flows")) == 4  # every user's flows
        return [
            error(ws, 3, "start_flow", flow="PingPong", args={"recipient": bob_name}),
            error(ws, 4, "drain"),
            error(ws, 5, "kill_flow", flow_id="C-k1"),
        ]

    nodes = make_network(tmp_path / "net", ["O=Alice,L=London,C=GB", bob_name])
    async with open_node_processes(nodes) as (alice, _bob):
        seen = await _in_thread(alice.rpc_url, admin)
        refused = await _in_thread(alice.rpc_url, reader)
    assert seen["failed"]["code"] == "flow-failed"
    del seen["failed"]
    assert seen == {
        "before login": "unauthenticated",
        "retry ended": "not-found",
        "unknown flow id": "not-found",
        "unknown flow": "not-found",
        "bad state": "bad-arguments",
        "wait not bool": "bad-arguments",
        "unknown method": "unknown-method",
        "draining": "draining",
        "second login": "already-authenticated",
    }
    assert refused == ["forbidden", "forbidden", "forbidden"]
