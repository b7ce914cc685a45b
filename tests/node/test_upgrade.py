"""A node upgraded with work in flight: base directories an OLDER build wrote, opened by this one.

``golden/upgrade-86ac193/`` holds two nodes' directories that the build of commit 86ac193 (2026-11-29, before
the store's part list, the per-commit dedup records and the checkpoints' starter) wrote
(``make_upgrade_golden.py`` says how, ``GENERATED.txt`` names the commit): Alice was killed (SIGKILL) with
three flows waiting for Bob, who never ran, their messages in her outbound queue, and a PingPong of 300
rounds with herself mid-way. This build, as real ``node start`` processes, must resume every flow and finish
it, deliver each queued message once (Bob's responders: one each), and leave stores ``store check`` passes.

A store that a NEWER build wrote (a format version above this build's, in a segment or a manifest) is
refused in one line by ``node start``, ``store check`` (also ``--repair``), ``store list`` and ``store
compact``, which change nothing: before, it was "damaged" and the repair the message advised dropped every
message of the newer segment.
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import zlib
from pathlib import Path

import attrs
import pytest
import trio

from corda_trio import network, pki, rpc, store
from corda_trio.node import _config
from corda_trio.node._processes import NodeProcess, start_node_process
from tests.ports import free_port

from .cli_helpers import run_cli
from .make_upgrade_golden import ALICE, BOB, SELF_ROUNDS, TO_BOB
from .netutil import PASSWORD

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).parent / "golden" / "upgrade-86ac193"


def _copy_golden(tmp_path: Path) -> dict[str, tuple[Path, _config.NodeConfig]]:
    """The golden nodes copied to ``tmp_path``, each given free ports (the golden's may be taken here)."""
    shutil.copytree(GOLDEN, tmp_path / "golden", symlinks=True)
    for secret in (tmp_path / "golden").glob("net/nodes/*/certificates/*"):
        secret.chmod(0o600)  # (git keeps no file modes: a checkout leaves keys and passphrases 0644)
    nodes = {}
    for name in ("alice", "bob"):
        path = tmp_path / "golden" / "net" / "nodes" / name / "node.toml"
        cfg = _config.load_node_config(path)
        p2p, rpc_ = (network.NetworkHostAndPort(host="127.0.0.1", port=free_port()) for _ in "pr")
        cfg = attrs.evolve(cfg, p2p_address=p2p, p2p_listen=p2p, rpc_address=rpc_)
        path.write_text(_config.dump_node_config(cfg, path.parent), encoding="utf-8")
        nodes[name] = (path, _config.load_node_config(path))
    return nodes


def _tell(peer: _config.NodeConfig, about: _config.NodeConfig) -> None:
    """Copy the NodeInfo ``about`` wrote at its start (its new address) into ``peer``'s
    additional-node-infos/, as an operator of a directory-mode network does."""
    own = network.node_info_file_name(about.legal_name)
    shutil.copyfile(about.base_directory / own, peer.additional_node_infos / own)


def _tree(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


async def test_an_older_builds_base_directories_resume_and_finish(tmp_path: Path) -> None:
    nodes = _copy_golden(tmp_path)
    (alice_path, alice_cfg), (bob_path, bob_cfg) = nodes["alice"], nodes["bob"]
    running: list[NodeProcess] = []
    try:
        running.append(bob := await start_node_process(bob_path, bob_cfg))
        _tell(alice_cfg, bob_cfg)
        running.append(alice := await start_node_process(alice_path, alice_cfg))
        _tell(bob_cfg, alice_cfg)
        async with (
            rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
            rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
        ):
            with trio.fail_after(90):
                for client_id, result in [*TO_BOB.items(), ("self", SELF_ROUNDS)]:
                    final = await a.flow_result(f"C-{client_id}")
                    assert (final["state"], final["result"]) == ("finished", result), (client_id, final)
            # each queued init reached Bob once: one responder per flow, each answered both rounds
            responders = [f for f in await b.list_flows() if f["flow_class"].endswith("PingPongResponder")]
            assert sorted((f["state"], f["result"]) for f in responders) == [("finished", 2)] * len(TO_BOB)
            # and the upgraded node works on: a new flow each way
            with trio.fail_after(60):
                assert await a.start_flow("PingPong", recipient=BOB, rounds=2) == 2
                assert await b.start_flow("PingPong", recipient=ALICE, rounds=2) == 2
        for node in running:
            assert await node.stop() == 0, node.console_tail()
    finally:
        for node in running:
            await node.stop()
    for cfg in (alice_cfg, bob_cfg):
        checked = run_cli("store", "check", str(cfg.store_directory))
        assert checked.returncode == 0 and "CORRUPT" not in checked.stdout, checked.stdout + checked.stderr


def _bump_version(path: Path, crc_at: int) -> None:
    """Rewrite ``path`` (a segment or manifest) as a newer build would write it: format version 3 (at byte
    8), its checksum (at ``crc_at``, over the bytes before it) made right again."""
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, 3)
    struct.pack_into("<I", data, crc_at, zlib.crc32(data[:crc_at]))
    path.write_bytes(data)


@pytest.mark.parametrize("what", ["segment", "manifest"])
async def test_a_store_a_newer_build_wrote_is_refused_in_one_line_and_left_alone(
    tmp_path: Path, what: str
) -> None:
    nodes = _copy_golden(tmp_path)
    alice_path, alice_cfg = nodes["alice"]
    checkpoints = alice_cfg.store_directory / store.KEYED_DIR / "flows.checkpoints"
    if what == "segment":
        bumped = next(checkpoints.glob("*.seg"))
        _bump_version(bumped, 44)
    else:  # (the golden's queues are of format 2 already: the manifest is there)
        bumped = checkpoints / "manifest"
        _bump_version(bumped, 36)
    before = _tree(alice_cfg.base_directory)
    expected = (
        f"{bumped}: {what} format 3 was written by a newer build of corda-trio (this build reads format 2 "
        "and older); nothing was read or changed: run the newer build on this store"
    )
    started = run_cli("node", "start", "--config", str(alice_path))
    assert started.returncode == 1
    assert started.stderr == f"corda-trio: error: {alice_cfg.legal_name}: cannot start, {expected}\n"
    for args in (["store", "check"], ["store", "check", "--repair"], ["store", "list"], ["store", "compact"]):
        result = run_cli(*args, str(alice_cfg.store_directory))
        assert (result.returncode, result.stderr) == (1, f"corda-trio: error: {expected}\n"), args
    result = run_cli("store", "check", "--repair", str(checkpoints))  # (one queue's directory)
    assert (result.returncode, result.stderr) == (1, f"corda-trio: error: {expected}\n")
    assert _tree(alice_cfg.base_directory) == before
    assert pki.CordaX500Name.parse(ALICE) == alice_cfg.legal_name
