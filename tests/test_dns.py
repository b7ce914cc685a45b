"""Host name lookups that a DNS server never answers do not take the worker threads everything else needs.

Real lookups against a real silent DNS server: a UDP socket that reads queries and never answers, named as
the only nameserver by a ``resolv.conf`` bind-mounted over ``/etc/resolv.conf`` in a private mount namespace
of the child process (``unshare -m``), so the C library's resolver waits its ``options timeout`` per query.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NAMESERVER = "127.0.0.77"  # (any address of 127/8 is the loopback interface's on Linux)
DNS_TIMEOUT_SECONDS = 4

#: 48 lookups that hang (more than trio's 40 default worker threads), then one thread hop measured
CHILD = textwrap.dedent(
    """
    import sys, time
    import trio
    from corda_trio import dns
    from corda_trio.node._cli import run_trio

    async def main():
        failed = []

        async def lookup(i):
            try:
                await trio.socket.getaddrinfo(f"hang{i}.corda-trio.example", 80)
            except OSError as exc:
                failed.append(exc)

        async with trio.open_nursery() as nursery:
            for i in range(48):
                nursery.start_soon(lookup, i)
            await trio.sleep(0.5)
            started = time.monotonic()
            await trio.to_thread.run_sync(time.sleep, 0)
            took = time.monotonic() - started
            nursery.cancel_scope.cancel()
        return took, len(failed)

    mode = sys.argv[1]
    if mode == "plain":
        took, failed = trio.run(main)
    elif mode == "library":
        async def with_resolver():
            dns.use_own_dns_threads()
            dns.use_own_dns_threads()  # (a second call keeps the first one's threads)
            return await main()
        took, failed = trio.run(with_resolver)
    else:
        took, failed = run_trio(main)
    print(f"{took:.3f} {failed}")
    """
)


def _unshare_unavailable() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"'unshare -m' is not permitted here: {probe.stderr.strip()}"
    return None


@pytest.fixture
def silent_dns(tmp_path: Path):
    """A nameserver that reads every query and never answers, and a resolv.conf naming only it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        server.bind((NAMESERVER, 53))
    except OSError as exc:
        server.close()
        pytest.skip(f"cannot listen on {NAMESERVER}:53: {exc}")
    conf = tmp_path / "resolv.conf"
    conf.write_text(f"nameserver {NAMESERVER}\noptions timeout:{DNS_TIMEOUT_SECONDS} attempts:1\n")
    try:
        yield conf
    finally:
        server.close()


def _run_child(conf: Path, mode: str) -> tuple[float, int]:
    script = f'mount --bind {conf} /etc/resolv.conf && exec {sys.executable} -c "$CHILD" {mode}'
    env = {**os.environ, "PYTHONPATH": str(REPO), "CHILD": CHILD}
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    took, failed = done.stdout.split()
    return float(took), int(failed)


@pytest.mark.skipif(_unshare_unavailable() is not None, reason=str(_unshare_unavailable()))
def test_hanging_lookups_leave_the_worker_threads_free(silent_dns: Path) -> None:
    # Without a resolver of ours, the 48 hanging lookups hold trio's 40 threads until the C library gives up,
    # and a thread hop waits that long (the test's premise: the server really makes lookups hang)
    took, failed = _run_child(silent_dns, "plain")
    assert took > DNS_TIMEOUT_SECONDS - 1.5, took
    # With it (as every corda-trio command runs Trio, and as a library user calls it): at once
    for mode in ("command", "library"):
        took, failed = _run_child(silent_dns, mode)
        assert took < 1.0, (mode, took)
        assert failed == 0  # (cancelled while still waiting for the server: none had failed yet)
