"""Real node processes whose store lost a part (found by an outside crash harness: ``store/keyed`` deleted and
the node started without its flows, their sessions and peers left hanging; likewise an outbound queue with
unsent messages, the inbox, a dedup generation). The start is refused in one line naming the part and its
place, nothing on disk changes; put back, the node starts with its flows; dropped on purpose with
``store check --repair``, it starts without them."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from corda_trio import network, pki, rpc, store
from corda_trio.node import _config
from corda_trio.node._processes import open_node_processes

from .netutil import PASSWORD, make_network, open_map_process

pytestmark = pytest.mark.slow

BOB = "O=Bob,L=Paris,C=FR"


def _tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    out: dict[str, tuple[int, bytes | None]] = {".": (root.stat().st_mtime_ns, None)}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = (
            path.stat().st_mtime_ns,
            path.read_bytes() if path.is_file() else None,
        )
    return out


def _one(pattern: str, root: Path) -> Path:
    (found,) = root.glob(pattern)
    return found


def _empty(directory: Path) -> None:
    for entry in directory.iterdir():
        entry.unlink()


async def _cli(*args: str) -> tuple[int, str, str]:
    done = await trio.run_process(
        [sys.executable, "-m", "corda_trio", *args],
        capture_stdout=True, capture_stderr=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_a_node_whose_store_lost_a_part_does_not_start(tmp_path: Path) -> None:
    (a_path, a_cfg), bob = make_network(tmp_path / "net", ["O=Alice,L=London,C=GB", BOB])
    root = a_cfg.store_directory
    async with open_node_processes([(a_path, a_cfg), bob]) as (alice, bob_node):
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as client:
            assert await client.start_flow("PingPong", recipient=BOB, rounds=2) == 2
            await bob_node.stop()
            # Bob is gone: this one waits, checkpointed, its message unsent in Alice's outbound queue
            flow_id = await client.launch_flow("PingPong", recipient=BOB, rounds=2)
    start = [sys.executable, "-m", "corda_trio", "node", "start", "--config", str(a_path)]

    async def running_flows() -> list[str]:
        async with open_node_processes([(a_path, a_cfg)]) as (node,):
            async with rpc.connect(node.rpc_url, "ops", PASSWORD) as client:
                return [f["flow_id"] for f in await client.list_flows("running")]

    dedup = "internal.p2p.dedup.0"
    damage: dict[str, tuple[Callable[[], object], str, str]] = {
        # case: (what is done, how the line names the part, where it says it is)
        "the checkpoints deleted": (
            lambda: shutil.rmtree(root / "keyed"),
            "keyed log flows.checkpoints",
            "keyed/flows.checkpoints",
        ),
        "the outbound queue deleted": (
            lambda: shutil.rmtree(_one("internal.peers.*", root)),
            "queue internal.peers.",
            "internal.peers.",
        ),
        "the inbox emptied": (
            lambda: _empty(_one("p2p.inbound.*", root)),
            "queue p2p.inbound.",
            "p2p.inbound.",
        ),
        "a dedup generation emptied": (lambda: _empty(root / dedup), f"queue {dedup}", dedup),
    }
    kept = tmp_path / "store-kept"
    for case, (do, named, where) in damage.items():
        shutil.copytree(root, kept)
        do()
        before = _tree(a_cfg.base_directory)
        with trio.fail_after(60):  # (a node that starts runs until stopped)
            done = await trio.run_process(start, capture_stdout=True, capture_stderr=True, check=False)
        (line,) = done.stderr.decode().splitlines()
        assert done.returncode == 1 and b"node ready" not in done.stdout, case
        assert line.startswith("corda-trio: error: O=Alice, L=London, C=GB: cannot start, store "), line
        assert f"{named}" in line and f"({root}/{where}" in line, line
        assert f"`corda-trio store check {root} --repair`" in line, line
        # the refused start changed nothing: not the store, its record, the log or the lock file (the store's
        # parts are checked before the node writes anything)
        assert _tree(a_cfg.base_directory) == before, case
        shutil.rmtree(root)
        kept.rename(root)
    # put back, the node starts with its flow
    assert await running_flows() == [flow_id]
    record = json.loads((a_cfg.base_directory / "store.json").read_text())
    assert record == {"store_directory": "store", "part_list": True}
    assert json.loads((root / store.PARTS_FILE).read_text())["keyed"] == ["flows.checkpoints"]

    # Reset on purpose: the checkpoints deleted, then taken off the part list. The node starts without them.
    shutil.rmtree(root / "keyed")
    code, out, _err = await _cli("store", "check", str(root), "--repair")
    assert code == 0 and "DROPPED  keyed/flows.checkpoints" in out, out
    assert await running_flows() == []


async def test_a_store_from_before_the_part_list_starts_and_gets_one(tmp_path: Path) -> None:
    """A node directory written by the previous version (store.json without ``part_list``, no parts.json)
    starts and gets both; from then on parts.json deleted is refused too (the parts deleted with it could
    not be told), until ``store check --repair`` writes it anew."""
    ((a_path, a_cfg),) = make_network(tmp_path / "net", ["O=Alice,L=London,C=GB"])
    async with open_node_processes([(a_path, a_cfg)]):
        pass
    record, parts = a_cfg.base_directory / "store.json", a_cfg.store_directory / store.PARTS_FILE
    record.write_text(json.dumps({"store_directory": "store"}) + "\n")
    os.unlink(parts)
    async with open_node_processes([(a_path, a_cfg)]):
        pass
    assert json.loads(record.read_text())["part_list"] is True
    assert [q for q in json.loads(parts.read_text())["queues"] if q.startswith("p2p.inbound.")]
    os.unlink(parts)
    start = [sys.executable, "-m", "corda_trio", "node", "start", "--config", str(a_path)]
    with trio.fail_after(60):
        done = await trio.run_process(start, capture_stdout=True, capture_stderr=True, check=False)
    (line,) = done.stderr.decode().splitlines()
    assert done.returncode == 1 and f"cannot start, {parts}: missing" in line, line
    assert f"`corda-trio store check {a_cfg.store_directory} --repair`" in line and not parts.exists()
    code, out, _err = await _cli("store", "check", str(a_cfg.store_directory), "--repair")
    assert code == 0 and "REBUILT  parts.json" in out, out
    async with open_node_processes([(a_path, a_cfg)]):
        pass


async def _map_node_infos(cfg: _config.NodeConfig) -> tuple[str, ...]:
    """The hashes of the NodeInfos the network map service lists now."""
    assert cfg.network_map_url is not None
    response = await network.NetworkMapClient(cfg.network_map_url).fetch_map()
    root = pki.read_certificate(cfg.trust_root)
    now = dt.datetime.now(dt.UTC)
    return network.verify_network_map(response.signed_map, trust_root=root, now=now).node_info_hashes


async def test_a_damaged_keyed_log_refuses_the_start_before_the_node_shows_itself(tmp_path: Path) -> None:
    """Found by the corruption harness: the checkpoints' manifest deleted (a part that is there, with records,
    so the part list check passes) was only noticed when the flow manager opened the log, after the node had
    signed and written a new NodeInfo file, opened its map cache, could publish to the map and listened for
    peers; and the line said "the node stopped" of a node that never started. Now the keyed logs are
    recovered with the queues: one line naming the manifest, exit 1, nothing but the log and lock written, and
    the map never hears of this start."""
    net = tmp_path / "net"
    (a_path, a_cfg), bob = make_network(net, ["O=Alice,L=London,C=GB", BOB], with_map=True)
    start = [sys.executable, "-m", "corda_trio", "node", "start", "--config", str(a_path)]
    async with open_map_process(net, max_age_seconds=1):
        async with open_node_processes([(a_path, a_cfg), bob]) as (alice, _bob):
            async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as client:
                assert await client.start_flow("PingPong", recipient=BOB, rounds=1) == 1
        manifest = a_cfg.store_directory / store.KEYED_DIR / "flows.checkpoints" / "manifest"
        manifest.unlink()
        published = await _map_node_infos(a_cfg)
        assert len(published) == 2, published
        before = _tree(a_cfg.base_directory)
        with trio.fail_after(60):  # (a node that starts runs until stopped)
            done = await trio.run_process(start, capture_stdout=True, capture_stderr=True, check=False)
        await trio.sleep(1.5)  # (past the map's max-age: a publication would be listed by now)
        assert await _map_node_infos(a_cfg) == published
    (line,) = done.stderr.decode().splitlines()
    assert done.returncode == 1 and done.stdout == b"", (done.returncode, done.stdout)
    assert line.startswith(
        f"corda-trio: error: O=Alice, L=London, C=GB: cannot start, the store is damaged: corrupt segment "
        f"{manifest} at offset 0: manifest missing"
    ), line
    root = a_cfg.store_directory
    assert f"`corda-trio store check {root}` to see what" in line, line
    assert f"`corda-trio store check {root} --repair` to salvage" in line, line
    after = _tree(a_cfg.base_directory)
    written = {"node.lock", "logs/node.log"}
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert set(changed) <= written, changed
    # salvaged as the line says, the node starts with the checkpoints it had
    code, out, _err = await _cli("store", "check", str(root), "--repair")
    assert code == 0 and "keyed/flows.checkpoints: 1 live records" in out, out
    async with open_node_processes([(a_path, a_cfg)]) as (alice,):
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as client:
            assert [f["state"] for f in await client.list_flows()] == ["finished"]
