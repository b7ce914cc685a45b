"""``corda-trio node start`` as real processes: ready line, RPC, /metrics, one node per base dir, signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import trio
import trio_websocket

from corda_trio import rpc, store
from corda_trio.node import _config
from corda_trio.node._processes import open_node_processes

from .netutil import PASSWORD, make_network, scrape_metrics

pytestmark = pytest.mark.slow


async def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = await trio.run_process(
        [sys.executable, "-m", "corda_trio", *args],
        capture_stdout=True, capture_stderr=True, check=False, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


async def _interrupted_flow_start(
    base: str, env: dict[str, str], signum: int, *, ignore_sigint: bool = False
) -> tuple[str, list[str], int]:
    """Run ``flow start`` to an unknown party until it reports the flow retrying, then send ``signum``.
    Returns (flow id, stderr lines, exit code); stdout must stay empty."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "corda_trio", "flow", "start", "--base-dir", base, "--user", "ops",
         "PingPong", "recipient=O=Nobody,L=Rome,C=IT"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
    )  # fmt: skip
    assert proc.stderr is not None and proc.stdout is not None
    said = b""
    try:
        with trio.fail_after(60):
            while b"is not in the network map\n" not in said:
                chunk = await proc.stderr.receive_some(4096)
                assert chunk, said
                said += chunk
        proc.send_signal(signum)
        with trio.fail_after(30):
            code = await proc.wait()
    finally:
        proc.kill()
    async with proc.stderr:
        while chunk := await proc.stderr.receive_some(4096):
            said += chunk
    assert await proc.stdout.receive_some(4096) == b""
    lines = said.decode().splitlines()
    return lines[0].split()[1], lines, code


async def test_two_nodes_start_see_each_other_and_stop_cleanly(tmp_path: Path) -> None:
    nodes = make_network(tmp_path / "net", ["O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"])
    async with open_node_processes(nodes) as procs:
        alice, bob = procs
        async with rpc.connect(alice.rpc_url, "reader", PASSWORD) as client:
            info = await client.node_info()
            assert info["legal_name"] == "O=Alice, L=London, C=GB" and not info["draining"]
            with trio.fail_after(30):
                while len(await client.network_map()) < 2:  # noqa: ASYNC110 (another process's state)
                    await trio.sleep(0.2)
            names = {n["legal_name"] for n in await client.network_map()}
            assert names == {"O=Alice, L=London, C=GB", "O=Bob, L=Paris, C=FR"}
            queues = await client.queue_statistics()
            assert any(q["name"].startswith("p2p.inbound.") for q in queues)
            with pytest.raises(rpc.RpcError) as denied:
                await client.drain()
            assert denied.value.code == "forbidden"

        before = await scrape_metrics(alice.metrics_url)
        assert before["corda_trio_node_info,legal_name=O=Alice, L=London, C=GB,version=0.1.0"] == 1
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as client:
            for _ in range(5):
                await client.ping()
            assert (await client.drain())["draining"] is True
            assert (await client.node_info())["draining"] is True
        after = await scrape_metrics(alice.metrics_url)
        assert after["corda_trio_rpc_calls_total,method=ping,outcome=ok"] >= 5 + before.get(
            "corda_trio_rpc_calls_total,method=ping,outcome=ok", 0
        )
        assert after["corda_trio_node_draining"] == 1
        assert after["corda_trio_rpc_connections_refused_total"] == 0  # (the RPC connection limit's count)

        # Abuse over the real node's RPC port: each gets its error or its answer, the node stays up.
        async with trio_websocket.open_websocket_url(alice.rpc_url) as ws:
            await ws.send_message(b"\xc1 not msgpack")
            assert msgpack.unpackb(await ws.get_message())["error"]["code"] == "malformed"
            await ws.send_message(msgpack.packb({"id": 1, "method": "node_info", "args": {}}))
            assert msgpack.unpackb(await ws.get_message())["error"]["code"] == "unauthenticated"
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as client:
            with pytest.raises(rpc.RpcError) as too_large:
                await client.call("ping", echo=b"x" * (10 * 1024 * 1024))
            assert too_large.value.code == "too-large"
        outcomes: dict[int, object] = {}

        async def one(i: int) -> None:
            try:
                async with rpc.connect(alice.rpc_url, "reader", PASSWORD if i % 10 else "wrong") as c:
                    outcomes[i] = (await c.node_info())["legal_name"]
            except rpc.RpcError as exc:
                outcomes[i] = exc.code

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for i in range(100):
                    nursery.start_soon(one, i)
        assert outcomes == {i: "O=Alice, L=London, C=GB" if i % 10 else "unauthenticated" for i in range(100)}

        # A second node on the same base directory is refused, clearly, and leaves the first alone.
        second = await trio.run_process(
            [sys.executable, "-m", "corda_trio", "node", "start", "--config", str(nodes[0][0])],
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
        stderr = second.stderr.decode()
        assert second.returncode == 1
        assert f"another node (pid {alice.process.pid}) is running in base directory" in stderr
        assert len(stderr.strip().splitlines()) == 1, stderr

        # The operator's commands: the password from the environment, never from the command line.
        base = str(nodes[0][1].base_directory)
        env = {**os.environ, "CORDA_TRIO_RPC_PASSWORD": PASSWORD}
        info = await _cli(["node", "info", "--base-dir", base, "--user", "reader"], env)
        assert (
            info.returncode == 0
            and "O=Alice, L=London, C=GB" in info.stdout
            and "O=Bob, L=Paris, C=FR" in info.stdout
        )
        as_json = json.loads(
            (await _cli(["node", "info", "--node", alice.rpc_url, "--user", "reader", "--json"], env)).stdout
        )
        assert as_json["key_hash"] == alice.addresses["key_hash"]
        undrain = await _cli(["node", "drain", "--config", str(nodes[0][0]), "--user", "ops", "--undo"], env)
        assert undrain.returncode == 0 and "taking new flows again" in undrain.stdout
        no_password = await _cli(
            ["node", "info", "--base-dir", base, "--user", "ops"],
            {k: v for k, v in os.environ.items() if k != "CORDA_TRIO_RPC_PASSWORD"},
        )
        assert no_password.returncode == 2
        assert no_password.stderr.strip() == (
            "corda-trio: error: no password: set $CORDA_TRIO_RPC_PASSWORD "
            "or run from a terminal to be prompted"
        )
        wrong = await _cli(
            ["node", "drain", "--base-dir", base, "--user", "ops"], {**env, "CORDA_TRIO_RPC_PASSWORD": "x"}
        )
        assert wrong.returncode == 2 and "unauthenticated: wrong user name or password" in wrong.stderr
        denied = await _cli(["node", "drain", "--base-dir", base, "--user", "reader"], env)
        assert denied.returncode == 2 and "forbidden: user reader may not call drain" in denied.stderr

        # 'flow start' to a party the network does not know: it says why the flow waits, and after Ctrl-C
        # which flow goes on running on the node. Also as a script's background job (SIGINT ignored), stopped
        # by SIGTERM: the same, without a traceback.
        flow_id, lines, code = await _interrupted_flow_start(base, env, signal.SIGINT)
        assert code == 130 and lines[-1] == "interrupted", lines
        other_id, other_lines, code = await _interrupted_flow_start(
            base, env, signal.SIGTERM, ignore_sigint=True
        )
        assert code == 0 and other_lines[-1] == "terminated", other_lines
        for fid, said in ((flow_id, lines), (other_id, other_lines)):
            assert said[:-1] == [
                f"flow {fid} retrying: O=Nobody, L=Rome, C=IT is not in the network map",
                f"flow {fid} goes on running on the node (`corda-trio flow watch` follows it, "
                "`corda-trio flow kill` stops it)",
            ]
        # one is killed; the other still retries when Alice stops (it must not hold her stop)
        killed = await _cli(["flow", "kill", "--base-dir", base, "--user", "ops", flow_id], env)
        assert killed.returncode == 0, killed.stderr
        assert killed.stdout.startswith(f"{flow_id}  failed ") and "killed by RPC user ops" in killed.stdout
        retried = await _cli(["flow", "retry", "--json", "--base-dir", base, "--user", "ops", flow_id], env)
        watched = await _cli(["flow", "watch", "--base-dir", base, "--user", "ops", flow_id], env)
        assert watched.returncode == 1 and watched.stdout.startswith(f"{flow_id}  failed "), watched
        watched = await _cli(["flow", "watch", "--json", "--base-dir", base, "--user", "ops", flow_id], env)
        assert watched.returncode == 1 and json.loads(watched.stdout)["state"] == "failed", watched
        assert retried.returncode == 1 and retried.stdout == "", retried
        assert retried.stderr.endswith(
            f"not-found: no running flow {flow_id}: it has ended (failed); only a running or parked flow can "
            "be retried\n"
        ), retried.stderr

        assert await bob.stop(signal.SIGINT) == 130
        with trio.fail_after(15):
            assert await alice.stop(signal.SIGTERM) == 0
    for _path, cfg in nodes:
        assert not (cfg.base_directory / "node.json").exists()
        log = cfg.log_path.read_text()
        assert "node stopped cleanly" in log and "Traceback" not in log
        # (Alice's flows waited out retries, for a peer not in the map: they did not hold the stop)
        assert "no flow is running" in log and "flows still running after" not in log
    assert "another node" not in json.dumps(nodes[0][1].log_path.read_text())


async def test_a_corrupt_store_stops_the_node_with_a_clear_error(tmp_path: Path) -> None:
    (path, cfg), _ = make_network(tmp_path / "net", ["O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"])
    async with store.open_broker(cfg.store_directory) as broker:
        queue = await broker.declare_queue("internal.test")
        for i in range(3):
            await queue.enqueue(b"payload-%d" % i * 50)
    (segment,) = (cfg.store_directory / "internal.test").glob("*.seg")
    data = bytearray(segment.read_bytes())
    data[data.index(b"payload-0") + 20] ^= 0xFF  # inside the first of three records: not a torn tail
    segment.write_bytes(bytes(data))
    done = await trio.run_process(
        [sys.executable, "-m", "corda_trio", "node", "start", "--config", str(path)],
        capture_stdout=True, capture_stderr=True, check=False,
    )  # fmt: skip
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    # (a node that never got up is not said to have stopped)
    assert "O=Alice, L=London, C=GB: cannot start, the store is damaged: corrupt segment " in stderr
    assert f"`corda-trio store check {cfg.store_directory} --repair`" in stderr and "Traceback" not in stderr
    assert b"node ready" not in done.stdout
    assert segment.read_bytes() == bytes(data)  # nothing was "repaired" behind the operator's back


async def test_a_missing_store_or_another_store_directory_stops_the_start(tmp_path: Path) -> None:
    """The first start records the store's path in store.json. A later start whose store is gone (moved
    away, a wrong restore), or whose [store] directory names another place, is refused in one line instead
    of running empty; put back, it starts; store.json deleted, it starts with a new store on purpose."""
    (path, cfg), _ = make_network(tmp_path / "net", ["O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"])
    command = [sys.executable, "-m", "corda_trio", "node", "start", "--config", str(path)]

    async def start_and_stop() -> None:
        async with open_node_processes([(path, cfg)]):
            pass

    async def refused() -> str:
        done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
        assert done.returncode == 1 and b"node ready" not in done.stdout
        (line,) = done.stderr.decode().splitlines()
        return line

    await start_and_stop()
    record = cfg.base_directory / "store.json"
    assert json.loads(record.read_text()) == {"store_directory": "store", "part_list": True}  # (relative)
    kept = cfg.store_directory.with_name("store-kept")
    cfg.store_directory.rename(kept)
    line = await refused()
    assert line.startswith("corda-trio: error: O=Alice, L=London, C=GB: the store ")
    assert "is missing or empty, but this node has run with it" in line
    assert not cfg.store_directory.exists() or not any(cfg.store_directory.iterdir())  # nothing was created
    text = path.read_text()
    path.write_text(text.replace('directory = "store"', 'directory = "store-kept"'))
    line = await refused()
    assert f"[store] directory is {kept.resolve()}, but this node has run with the store at" in line
    path.write_text(text)
    kept.rename(cfg.store_directory)
    await start_and_stop()  # its own store again
    cfg.store_directory.rename(kept)
    record.unlink()  # the operator means a new store
    await start_and_stop()
    assert any(cfg.store_directory.iterdir()) and record.exists()
    # a node directory copied (or moved) whole starts with its store: the record names it relative to it
    copy = tmp_path / "elsewhere" / "alice"
    shutil.copytree(cfg.base_directory, copy)
    moved = _config.load_node_config(copy / "node.toml")
    assert moved.store_directory.resolve() != cfg.store_directory.resolve()
    async with open_node_processes([(copy / "node.toml", moved)]):
        pass
