"""A real full disk under a running node: Alice's base directory (store, log file) is a small ext4 file
system on a loop device, filled by a file while flows run both ways (her RPC callers start PingPongs to
Bob; Bob's flows to her arrive over P2P into her durable inbox). She stops with exit code 1 and one line on
stderr naming the file and "No space left on device"; once space is freed, ``corda-trio store check``
passes and a restart finishes every flow either side acknowledged (the ledger: each launch that returned
an id), each exactly once. The same with her bridges in a ``corda-trio bridge start`` process, which stays
up while she is away and gives Bob's deliveries back to him (released) instead of holding them.

Needs root (``mount``), a loop device and ``mkfs.ext4``; skipped with the reason otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from corda_trio import rpc
from corda_trio.node import _config
from corda_trio.node._processes import start_node_process
from tests.ports import free_port

from .netutil import PASSWORD, make_network, stop
from .test_flows_e2e import ALICE, BOB, wait_for_peers

pytestmark = pytest.mark.slow

ROUNDS = 5
BRIDGE_PASSWORD_ENV = "TEST_BRIDGE_PASSWORD"
BRIDGE_ENV = {BRIDGE_PASSWORD_ENV: "bridge-secret"}


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Path]:
    """An empty 16 MiB ext4 file system mounted at ``tmp_path / "disk"`` (unmounted afterwards)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed")
    image, mount = tmp_path / "disk.img", tmp_path / "disk"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(16 * 1024 * 1024)
    made = _run("mkfs.ext4", "-q", str(image))
    assert made.returncode == 0, made.stderr
    mounted = _run("mount", "-o", "loop", str(image), str(mount))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a loop file system here: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        _run("umount", "-l", str(mount))


def _fill(path: Path) -> None:
    """Write ``path`` until the disk is full (the node's own writes keep the last blocks taken)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        chunk = b"\0" * 65536
        while True:
            try:
                os.write(fd, chunk)
            except OSError:
                if len(chunk) == 4096:
                    return
                chunk = chunk[:4096]
    finally:
        os.close(fd)


def _write_bridge_toml(path: Path, alice: _config.NodeConfig) -> None:
    certs = alice.base_directory / "certificates"
    path.write_text(
        f'[node]\nendpoint = "{alice.bridge_endpoint[0]}:{alice.bridge_endpoint[1]}"\nusername = "bridge"\n'
        f'password_env = "{BRIDGE_PASSWORD_ENV}"\n[p2p]\nlisten = "{alice.p2p_address}"\n'
        f'[tls]\ncert_chain = "{certs / "tls.chain.pem"}"\nkey = "{certs / "tls.key.pem"}"\n'
        f'trust_root = "{certs / "network-root.cert.pem"}"\npassphrase_file = "{certs / "passphrase"}"\n',
        encoding="utf-8",
    )


async def _start_bridge(config: Path, log: Path) -> trio.Process:
    """``corda-trio bridge start`` (its stderr to ``log``), once it listens for peers."""
    with open(log, "wb") as err:  # noqa: ASYNC230 (a local file, opened once)
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "corda_trio", "bridge", "start", "--config", str(config)],
            stdout=subprocess.PIPE, stderr=err, env={**os.environ, **BRIDGE_ENV},
        )  # fmt: skip
    assert process.stdout is not None
    said = b""
    with trio.fail_after(30):
        while b"listening on" not in said:
            chunk = await process.stdout.receive_some(4096)
            assert chunk, f"the bridge process exited (its stderr: {log})"
            said += chunk
    return process


@pytest.mark.parametrize("bridge_process", [False, True], ids=["in-node-bridge", "bridge-process"])
async def test_a_full_disk_stops_the_node_in_one_line_and_a_restart_loses_and_repeats_nothing(
    tmp_path: Path, small_ext4: Path, bridge_process: bool
) -> None:
    nodes = make_network(tmp_path / "net", [ALICE, BOB], shutdown_timeout_seconds=0.5)
    (alice_path, alice_cfg), (bob_path, bob_cfg) = nodes
    if bridge_process:  # her node serves its queues on a fixed local endpoint, the bridge process dials it
        alice_cfg = attrs.evolve(
            alice_cfg,
            bridge_mode=_config.BridgeMode.EXTERNAL,
            bridge_endpoint=("127.0.0.1", free_port()),
            bridge_password=_config.KeyPassphrase(env=BRIDGE_PASSWORD_ENV),
        )
        alice_path.write_text(_config.dump_node_config(alice_cfg, alice_path.parent), encoding="utf-8")
        alice_cfg = _config.load_node_config(alice_path)
        _write_bridge_toml(tmp_path / "bridge.toml", alice_cfg)
    base = alice_cfg.base_directory  # Alice's whole base directory goes onto the small disk
    shutil.copytree(base, small_ext4, dirs_exist_ok=True)
    shutil.rmtree(base)
    base.symlink_to(small_ext4)
    console = tmp_path / "alice.stderr"  # (off the full disk, as a terminal or journald would be)
    filler = small_ext4 / "filler"

    bob = await start_node_process(bob_path, bob_cfg)
    bridge: trio.Process | None = None
    try:
        alice = await start_node_process(alice_path, alice_cfg, console=console, env=BRIDGE_ENV)
        if bridge_process:
            bridge = await _start_bridge(tmp_path / "bridge.toml", tmp_path / "bridge.stderr")
        ledger: dict[str, list[str]] = {"alice": [], "bob": []}  # flow ids each launch acknowledged
        async with (
            rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
            rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
        ):
            await wait_for_peers(a, 2)
            await wait_for_peers(b, 2)

            async def launch(client: rpc.RpcClient, who: str, to: str) -> None:
                while True:
                    try:
                        ledger[who].append(await client.launch_flow("PingPong", recipient=to, rounds=ROUNDS))
                    except (rpc.RpcError, rpc.RpcConnectionError):
                        if alice.process.returncode is not None:
                            return
                    await trio.sleep(0.01)

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(launch, a, "alice", BOB)
                    nursery.start_soon(launch, b, "bob", ALICE)
                    while len(ledger["alice"]) < 5 or len(ledger["bob"]) < 5:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                    await trio.to_thread.run_sync(_fill, filler)
                    code = await alice.process.wait()
                    nursery.cancel_scope.cancel()
            # Bob's flows waiting on Alice: what his bridge holds for her must reach her after the restart.
            waiting = await b.list_flows("running")
        assert code == 1
        # One line says why she stopped, naming the file; before it at most the warning that her log file
        # (on the same disk) could not be written, if it filled first: nothing else, no traceback.
        *before, line = console.read_text().splitlines()
        disk = small_ext4  # (what the node names: its base directory is a link to it)
        assert before in (
            [],
            [
                f"corda-trio node: warning: cannot write the log file {disk}/logs/node.log: "
                "No space left on device; log records are dropped until it can be written again"
            ],
        )
        assert line.startswith(f"corda-trio: error: {alice_cfg.legal_name}: fatal store error"), line
        assert f"No space left on device: {disk}/store/" in line, line
        assert line.endswith(".seg"), line
        assert "Traceback" not in alice_cfg.log_path.read_text()

        # Free the space: the store checks clean and a restart finishes what either side acknowledged.
        filler.unlink()
        check = await trio.run_process(
            [sys.executable, "-m", "corda_trio", "store", "check", str(alice_cfg.store_directory)],
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
        assert check.returncode == 0, (check.stdout, check.stderr)
        if bridge is not None:
            assert bridge.returncode is None, "the bridge process stopped with its node"
        alice = await start_node_process(alice_path, alice_cfg, console=console, env=BRIDGE_ENV)
        try:
            async with (
                rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
                rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
            ):
                with trio.fail_after(60):
                    while await a.list_flows("running") or await b.list_flows("running"):  # noqa: ASYNC110
                        await trio.sleep(0.2)
                on_alice, on_bob = await a.list_flows(), await b.list_flows()
        finally:
            await alice.stop()
    finally:
        if bridge is not None:
            await stop(bridge)
        await bob.stop()
    if bridge is not None:
        assert "Traceback" not in (tmp_path / "bridge.stderr").read_text()
    for who, flows in (("alice", on_alice), ("bob", on_bob)):
        ids = [f["flow_id"] for f in flows]
        assert len(ids) == len(set(ids)), f"{who} lists a flow twice"
        states = {f["flow_id"]: (f["state"], f.get("result")) for f in flows}
        lost = [i for i in ledger[who] if states.get(i) != ("finished", ROUNDS)]
        assert not lost, f"{who}: acknowledged flows not finished: {[(i, states.get(i)) for i in lost]}"
        assert {f["state"] for f in flows} == {"finished"}, flows
    assert waiting, "no flow of Bob's was waiting for Alice when she stopped: nothing was tested"
    # Each PingPong had exactly one responder on the other side: no session init handled twice.

    def count(flows: list[dict[str, Any]], suffix: str) -> int:
        return sum(f["flow"].endswith(suffix) for f in flows)

    assert count(on_alice, "PingPongResponder") == count(on_bob, "PingPong")
    assert count(on_bob, "PingPongResponder") == count(on_alice, "PingPong")
