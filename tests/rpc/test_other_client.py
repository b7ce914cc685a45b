"""The RPC server driven by a websocket client that is not ours: the ``websockets`` library (its own RFC 6455
implementation, which offers permessage-deflate), written from ``protocol_spec/rpc.md`` alone.

The client is synchronous and runs in a worker thread while the server runs in the test's Trio loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from .test_rpc import PASSWORD, serving


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


async def test_the_server_going_down_closes_another_librarys_connection_with_1001() -> None:
    logged_in = trio.Event()

    def session(ws: ClientConnection) -> int | None:
        _request(ws, 1, "login", user="reader", password=PASSWORD)
        assert "ok" in _frame(ws)
        trio.from_thread.run_sync(logged_in.set)
        try:
            ws.recv(timeout=20)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else None
        return None

    async with trio.open_nursery() as outer:
        result: list[int | None] = []

        async def client(url: str) -> None:
            result.append(await _in_thread(url, session))

        async with serving() as (url, _):
            outer.start_soon(client, url)
            with trio.fail_after(30):
                await logged_in.wait()
        # (leaving ``serving`` stops the server with the client still connected)
    assert result == [1001]
