"""The node's side of the floats while every float is away: its attempts (a round of floats every few
seconds, for as long as the outage lasts) are logged as a bridge logs its peer's outage, per float: the first
failure in full, then a line a minute at most; every failure is counted."""

from __future__ import annotations

import logging
import socket
import ssl

import pytest
import trio

from corda_trio.bridge import float as fl


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_floats_that_stay_away_are_logged_a_line_a_minute_each(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    floats = [("127.0.0.1", _closed_port()), ("127.0.0.1", _closed_port())]
    tunnel = fl.FloatTunnel(
        inbox=None,  # type: ignore[arg-type]  # (never reached: no float ever answers)
        tunnel_context=ssl.create_default_context(),
        config=fl.TunnelConfig(floats=floats),
    )
    caplog.set_level(logging.DEBUG, logger="corda_trio.bridge.float")
    async with trio.open_nursery() as nursery:
        await nursery.start(tunnel.run)
        await trio.sleep(600)  # ten minutes of rounds, 5 s apart at most
        nursery.cancel_scope.cancel()
    ours = [r for r in caplog.records if r.name == "corda_trio.bridge.float"]
    attempts = [r for r in ours if "connect" in r.getMessage()]
    lines = [r for r in attempts if r.levelno >= logging.INFO]
    assert len(attempts) >= 2 * 100, len(attempts)  # every attempt is still there, at debug
    for host, port in floats:
        mine = [r.getMessage() for r in lines if f"{host}:{port}" in r.getMessage()]
        # the first failure, then one 'still retrying' line a minute at most
        assert 2 <= len(mine) <= 1 + 10, mine
        assert "still retrying" in mine[-1], mine
