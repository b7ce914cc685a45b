"""The map service under too many clients and without descriptors: 503 over the cap, one log line per
interval, serving again at once when a slot or a descriptor is free."""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from corda_trio import network, pki, transport

from .conftest import make_service
from .test_server import http_call


async def _read_all(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(4096):
        data += chunk
    return data


async def test_over_the_cap_clients_get_503_and_a_freed_slot_serves_at_once(
    creds: pki.NetworkCredentials, tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    service = make_service(creds, tmp_path / "map.db")
    serve = functools.partial(network.serve_network_map, service, 0, max_connections=2)
    listeners = await nursery.start(serve)
    port = listeners[0].socket.getsockname()[1]
    with caplog.at_level(logging.WARNING, logger="corda_trio.transport"), trio.fail_after(20):
        holders = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]  # idle: hold both slots
        await trio.testing.wait_all_tasks_blocked()
        answers = []
        for _ in range(5):
            extra = await trio.open_tcp_stream("127.0.0.1", port)
            answers.append(await _read_all(extra))
            await extra.aclose()
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
            assert answer.endswith(b"\r\n\r\ntoo many connections; try again later\r\n")
        await holders[0].aclose()
        await trio.testing.wait_all_tasks_blocked()
        status, _, _ = await http_call(port, "GET", "/network-map")
        assert status == 200
        await holders[1].aclose()
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "all 2 slots are taken" in refusals[0], refusals


ROOT = str(Path(__file__).resolve().parents[2])
EMFILE_MAP = textwrap.dedent(
    """
    import datetime as dt, logging, resource, sys
    from pathlib import Path
    import trio
    from corda_trio import network, pki
    sys.path.insert(0, {root!r})
    from tests.network.conftest import make_service

    creds = pki.NetworkCredentials.create(now=dt.datetime.now(dt.UTC))
    service = make_service(creds, Path({db!r}))
    resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s %(message)s")

    async def main():
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(network.serve_network_map, service, 0)
            print(listeners[0].socket.getsockname()[1], flush=True)

    trio.run(main)
    """
)


@pytest.mark.slow
async def test_descriptor_exhaustion_is_one_line_per_interval_and_recovers_at_once(tmp_path: Path) -> None:
    code = EMFILE_MAP.format(root=ROOT, db=str(tmp_path / "map.db"))
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, stopped in finally
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    began = trio.current_time()
    try:
        assert proc.stdout is not None
        port = int(await trio.to_thread.run_sync(proc.stdout.readline))
        with trio.fail_after(60):
            held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(60)]  # > 48 descriptors
            # The server fails to accept meanwhile (EMFILE) and keeps trying without a line per try.
            with trio.move_on_after(1.0):
                await trio.sleep_forever()
            for stream in held[:30]:
                await stream.aclose()
            start = trio.current_time()
            status, _, _ = await http_call(port, "GET", "/network-map")
            assert status == 200 and trio.current_time() - start < 10
            for stream in held[30:]:
                await stream.aclose()
    finally:
        proc.kill()
        _, err = await trio.to_thread.run_sync(functools.partial(proc.communicate, timeout=30))
        elapsed = trio.current_time() - began
    lines = [line for line in err.decode().splitlines() if "accept failed" in line]
    assert 1 <= len(lines) <= 1 + elapsed // transport.ACCEPT_ERROR_LOG_INTERVAL_SECONDS, err.decode()
    # naming the limit it ran into (the child set 48), which the system's text does not say
    assert "EMFILE (Too many open files (the limit, ulimit -n, is 48))" in lines[0], lines[0]
