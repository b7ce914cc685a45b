"""A real node whose base directory is on a file system that runs out of inodes, not bytes (a tmpfs with a
tiny ``nr_inodes``): a flow to a peer it never sent to needs a new queue (a directory, a segment file), and
creating it fails with ``ENOSPC`` while ``df`` shows the bytes free.

The node stopped with ``error: <name>: No space left on device: <segment>``: not said to be the store, not
in its log file (which ended with the flow's start), and nothing said the disk had bytes to spare. It now
stops as on any store failure, in one line on stderr and a critical line in its log: ``fatal store error
... queue internal.peers.<peer>: cannot create it: No space left on device (no free inodes: all N are used,
M MiB free): <file>``. Nothing it acknowledged is lost: with inodes freed the store checks clean and a
restart finishes every flow whose launch returned an id.

Needs root (``mount``); skipped with the reason otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from corda_trio import rpc
from corda_trio.node._processes import open_node_processes, start_node_process

from .netutil import PASSWORD, make_network
from .test_flows_e2e import ALICE, BOB, CAROL, wait_for_peers

pytestmark = pytest.mark.slow


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs mounted at ``tmp_path / "disk"`` (unmounted afterwards); remount to set its inodes."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = _run("mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=1000", "tmpfs", str(mount))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        _run("umount", "-l", str(mount))


def _set_inodes(mount: Path, count: int) -> None:
    done = _run("mount", "-o", f"remount,nr_inodes={count}", str(mount))
    assert done.returncode == 0, done.stderr


async def test_no_inode_left_for_a_new_queue_stops_the_node_in_one_clear_line_and_loses_nothing(
    tmp_path: Path, tmpfs: Path
) -> None:
    nodes = make_network(tmp_path / "net", [ALICE, BOB, CAROL], shutdown_timeout_seconds=0.5)
    (alice_path, alice_cfg), *others = nodes
    base = alice_cfg.base_directory  # her whole base directory goes onto the tmpfs
    shutil.copytree(base, tmpfs, dirs_exist_ok=True)
    shutil.rmtree(base)
    base.symlink_to(tmpfs)
    console = tmp_path / "alice.stderr"  # (off the tmpfs, as a terminal or journald would be)
    acknowledged: list[str] = []
    async with open_node_processes(others, stop_timeout_seconds=5):
        alice = await start_node_process(alice_path, alice_cfg, console=console)
        try:
            async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
                await wait_for_peers(a, 3)
                with trio.fail_after(30):  # a queue for Bob exists from here on
                    first = await a.launch_flow("PingPong", recipient=BOB, rounds=2)
                    assert (await a.flow_result(first))["state"] == "finished"
                acknowledged.append(first)
                used = os.statvfs(tmpfs)
                _set_inodes(tmpfs, used.f_files - used.f_ffree + 1)  # one left: not enough for a queue
                with trio.fail_after(30):
                    try:
                        for _ in range(3):  # the first to Carol needs her queue
                            acknowledged.append(await a.launch_flow("PingPong", recipient=CAROL, rounds=2))
                            acknowledged.append(await a.launch_flow("PingPong", recipient=BOB, rounds=2))
                    except rpc.RpcConnectionError:
                        pass
                    code = await alice.process.wait()
        finally:
            await alice.stop()
        assert code == 1
        *_, line = console.read_text().splitlines()
        assert line.startswith(
            f"corda-trio: error: {alice_cfg.legal_name}: fatal store error, the node stopped"
        ), line
        assert ": cannot create it: No space left on device (no free inodes: all " in line, line
        assert f" MiB free): {tmpfs}/store/internal.peers." in line, line
        log = alice_cfg.log_path.read_text()
        assert "CRITICAL corda_trio.node: fatal store error, the node stops: queue internal.peers." in log, (
            log
        )
        assert "Traceback" not in log

        # Inodes back: the store checks clean and a restart finishes what was acknowledged.
        _set_inodes(tmpfs, 1000)
        check = await trio.run_process(
            [sys.executable, "-m", "corda_trio", "store", "check", str(alice_cfg.store_directory)],
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
        assert check.returncode == 0, (check.stdout, check.stderr)
        alice = await start_node_process(alice_path, alice_cfg, console=console)
        try:
            async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
                with trio.fail_after(30):
                    results = [await a.flow_result(i) for i in acknowledged]
        finally:
            assert await alice.stop() == 0
    assert len(acknowledged) >= 2, acknowledged  # (one to Bob before, at least one to Carol)
    assert [(r["state"], r["result"]) for r in results] == [("finished", 2)] * len(acknowledged), results
