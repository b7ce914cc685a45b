"""Corruption harness: every file a node keeps, damaged the ways disks and people damage them.

:func:`build_corpus` runs real node processes (Alice, Bob, Carol) with real traffic: finished flows with
their results, a parked responder (Bob), flows waiting for a stopped peer with their session init in an
outbound queue (Alice), dead letters (Bob: messages for a topic nobody handles), dedup ids, RPC users.
The nodes are stopped cleanly (and once, Alice, with ``kill -9`` right after a flow start was answered),
and each node directory is copied aside with a *ledger* of what was acknowledged: finished flows and
their results, the flows that were running (their checkpoints), and each durable queue's depth.
An earlier clean stop is copied too: the "older copy" a restored backup puts back.

:func:`run_trial` copies one snapshot, damages ONE file (a kind chosen by the seed: a bit flipped, a
truncation, a zeroed 4 KiB aligned range, garbage appended, the older copy put back, the file deleted,
the file emptied) and runs the real CLI on the copy: ``node start`` (until ready or exit, 20 s at most),
``store check``, ``store check --repair`` or ``store compact``. A trial passes when the command either
recovered with everything acknowledged intact (a torn tail of an active segment is truncated and reported,
as ``protocol_spec/store-format.md`` §6 documents: what it cut is the documented loss), or refused with one
line naming the file and exit 1 (2 for ``node.toml``: a configuration error), leaving the directory as it
was. Never a traceback, a hang, a lost
acknowledged message or finished flow result, or a flow resumed twice (one id listed twice).

Run many trials: ``python -m tests.node.corruption --trials 300 --seed 1`` (prints each failing seed; one
seed again: ``--only SEED``). ``tests/node/test_corruption.py`` runs 30 of them in CI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import msgpack
import trio

from corda_trio import amqp, messaging, rpc
from corda_trio.node._processes import open_node_processes, start_node_process
from tests.damage import damage_file

from .cli_helpers import CLI
from .netutil import PASSWORD, make_network
from .parking_flows import MODULE, node_env

ALICE, BOB, CAROL = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR", "O=Carol,L=Rome,C=IT"
#: messages for a topic nobody handles that Bob gets: past half its inbox credit (1,024) they are dead letters
UNHANDLED = 560
READY_SECONDS = 20.0
CLI_SECONDS = 30.0
DAMAGES = ("flip", "truncate", "zero4k", "append", "older", "delete", "empty")
COMMANDS = ("start", "check", "repair", "compact")


@attrs.frozen
class Snapshot:
    """A stopped node's directory and what it had acknowledged."""

    name: str
    directory: Path  # the node's directory (node.toml, keys, store, logs), copied aside
    older: Path  # the same node's directory at an earlier clean stop
    #: flow id -> (state, result): finished flows with their results, running/parked flows (result None)
    flows: dict[str, tuple[str, Any]]
    #: durable queue -> depth (``store list``)
    depths: dict[str, int]


#: A start refused for a store that turns out corrupt while it opens (after the part list check: the queues
#: and keyed logs are recovered when the store opens, before anything network-facing starts or any other file
#: is written) has by then written its lock file and log only; the store itself is left as it was. Prefixes
#: of paths relative to the node's directory.
WRITTEN_BEFORE_THE_STORE_OPENS = ("logs/node.log", "node.lock")


def _written_before_the_store_opens(path: str) -> bool:
    return path.startswith(WRITTEN_BEFORE_THE_STORE_OPENS)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root``: relative path -> kind and content hash (files), for before/after diffs."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


class ListError(Exception):
    """``store list`` failed (its stderr)."""


def store_depths(store_dir: Path) -> dict[str, int]:
    """``store list``: queue name -> depth."""
    done = subprocess.run([*CLI, "store", "list", str(store_dir)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ListError(done.stdout + done.stderr)
    depths = {}
    for line in done.stdout.splitlines():  # "<name>: <n> messages, ..." / "<name>: <n> live records, ..."
        fields = line.split()
        if len(fields) >= 2 and fields[0].endswith(":") and fields[1].isdigit():
            depths[fields[0].removesuffix(":")] = int(fields[1])
    return depths


def _unhandled(n: int) -> list[amqp.Message]:
    out = messaging.OutgoingMessage(topic="tests.nobody", data=msgpack.packb(n), dedup_id=f"u-{n}")
    return [
        messaging.to_amqp(out, platform_version=1, release_version="0.1.0", sender_uuid="c", send_seq_no=0)
    ]


async def _flows(client: rpc.RpcClient) -> dict[str, tuple[str, Any]]:
    return {f["flow_id"]: (f["state"], f.get("result")) for f in await client.list_flows()}


async def build_corpus(work: Path) -> list[Snapshot]:
    """Run the network and snapshot the stopped node directories (see the module docstring)."""
    from .test_hostile_peer import send_as  # (a test module: imported only when a corpus is built)

    nodes = make_network(work / "net", [ALICE, BOB, CAROL], flows_modules=(MODULE,))
    (a_path, a_cfg), (_b_path, b_cfg), (_c_path, c_cfg) = nodes
    env = node_env()
    snaps = work / "snapshots"
    snaps.mkdir()
    # phase 1: finished flows, then a clean stop: the older copies
    async with open_node_processes(nodes, env=env) as (_alice, _bob, _carol):
        async with rpc.connect(_alice.rpc_url, "ops", PASSWORD) as a:
            assert await a.start_flow("PingPong", recipient=BOB, rounds=2) == 2
            assert await a.start_flow("PingPong", recipient=CAROL, rounds=1) == 1
    for name, cfg in (("alice", a_cfg), ("bob", b_cfg)):
        shutil.copytree(cfg.base_directory, snaps / f"{name}-older", symlinks=True)
    # phase 2: more finished flows, dead letters and a parked responder on Bob, flows waiting for Carol
    async with open_node_processes(nodes, env=env) as (alice, bob, carol):
        async with (
            rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
            rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
        ):
            assert await a.start_flow("PingPong", recipient=BOB, rounds=3) == 3
            assert await a.start_flow("AskDouble", recipient=BOB, first="4", second="5") == 10
            await a.launch_flow("AskDouble", recipient=BOB, first="abc")  # parks Bob's responder
            with trio.fail_after(60):
                while not await b.list_flows("parked"):  # noqa: ASYNC110 (another process)
                    await trio.sleep(0.1)
            with trio.fail_after(120):
                outcomes = await send_as(c_cfg, bob, [m for i in range(UNHANDLED) for m in _unhandled(i)])
            assert outcomes == [amqp.Accepted()] * UNHANDLED
            await carol.stop()
            for rounds in (1, 2):  # each waits for Carol: checkpointed, its init in Alice's outbound queue
                await a.launch_flow("PingPong", recipient=CAROL, rounds=rounds)
            alice_flows, bob_flows = await _flows(a), await _flows(b)
    out = []
    for name, cfg, flows in (("alice", a_cfg, alice_flows), ("bob", b_cfg, bob_flows)):
        copy = snaps / name
        shutil.copytree(cfg.base_directory, copy, symlinks=True)
        out.append(Snapshot(name, copy, snaps / f"{name}-older", flows, store_depths(copy / "store")))
    assert out[1].depths.get("internal.dead-letters", 0) > 0, out[1].depths
    # phase 3: Alice again, alone; a flow start answered (durable), then kill -9
    alice = await start_node_process(a_path, a_cfg, env=env)
    try:
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await a.launch_flow("PingPong", recipient=CAROL, rounds=3)
            killed_flows = await _flows(a)
    finally:
        assert await alice.stop(signal.SIGKILL) == -signal.SIGKILL
    copy = snaps / "alice-killed"
    shutil.copytree(a_cfg.base_directory, copy, symlinks=True)
    # the depths of a killed store: `store list` recovers nothing, it reads (a torn tail would be reported)
    out.append(Snapshot("alice-killed", copy, snaps / "alice", killed_flows, store_depths(copy / "store")))
    return out


@attrs.frozen
class Outcome:
    seed: int
    snapshot: str
    command: str
    damage: str
    file: str
    ok: bool
    why: str
    detail: str = ""


def _run(args: list[str], timeout: float) -> tuple[int | None, str, str]:
    try:
        done = subprocess.run(
            [*CLI, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or ""
        return None, out, err
    return done.returncode, done.stdout, done.stderr


def _start(node_dir: Path, timeout: float) -> tuple[int | None, str, str, subprocess.Popen[bytes] | None]:
    """``node start``: (exit code or None if it became ready, stdout, stderr, the process if ready)."""
    err_path = node_dir.parent / f"{node_dir.name}.stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [*CLI, "node", "start", "--config", str(node_dir / "node.toml")],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
            env={**os.environ, **node_env()}, start_new_session=True,
        )  # fmt: skip
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    out = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            out += chunk.decode(errors="replace")
        if "node ready:" in out:
            return None, out, err_path.read_text(), proc
        if proc.poll() is not None:
            out += (proc.stdout.read() or b"").decode(errors="replace")
            return proc.returncode, out, err_path.read_text(), None
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return -999, out, err_path.read_text(), None


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


async def _listed_flows(node_dir: Path) -> dict[str, list[tuple[str, Any]]]:
    runtime = json.loads((node_dir / "node.json").read_text())
    with trio.fail_after(20):
        async with rpc.connect(runtime["rpc"], "ops", PASSWORD) as client:
            flows = await client.list_flows()
    out: dict[str, list[tuple[str, Any]]] = {}
    for f in flows:
        out.setdefault(f["flow_id"], []).append((f["state"], f.get("result")))
    return out


def _one_line_naming(err: str, names: tuple[str, ...]) -> str | None:
    """Why ``err`` is not one ``corda-trio: error:`` line naming one of ``names``; None if it is."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if _traceback(err):
        return "traceback"
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr"
    if not lines[0].startswith("corda-trio: error:"):
        return "not an error line"
    if not any(n in lines[0] for n in names):
        return "does not name the file"
    return None


def _traceback(text: str) -> bool:
    """A Python traceback printed as such (a parked flow's error logged on one line quotes its own: fine)."""
    return any(line.startswith("Traceback (most recent call last)") for line in text.splitlines())


def _documented_loss(text: str, rel: str, kind: str, current: bytes, older: Path) -> bool:
    """A loss store-format.md §6 documents: a torn tail reported truncated in that file, or an older copy
    of an append-only file put back, which is that file cut at a record boundary (indistinguishable from
    a power loss before the sync of what came after)."""
    if "torn tail" in text and Path(rel).name in text:
        return True
    return kind == "older" and older.is_file() and current.startswith(older.read_bytes())


def run_trial(snaps: list[Snapshot], seed: int, work: Path, command: str | None = None) -> Outcome:
    """One trial (see the module docstring); ``work`` is a scratch directory for the copy."""
    rng = random.Random(seed)
    snap = rng.choice(snaps)
    command = command or rng.choice(COMMANDS)
    files = [p for p in _files(snap.directory) if not p.name.endswith(".stderr")]
    if command != "start":
        files = [p for p in files if p.is_relative_to(snap.directory / "store")]
    target = rng.choice(files)
    rel = str(target.relative_to(snap.directory))
    kind = rng.choice(DAMAGES)
    copy = work / f"t{seed}" / snap.directory.name
    if copy.parent.exists():
        shutil.rmtree(copy.parent)
    shutil.copytree(snap.directory, copy, symlinks=True)
    older = snap.older / rel
    original = target.read_bytes()
    what = damage_file(copy / rel, kind, rng, older if older.is_file() else None)

    def result(ok: bool, why: str, detail: str = "") -> Outcome:
        return Outcome(seed, snap.name, command, f"{kind}: {what}", rel, ok, why, detail)

    before = tree(copy)
    names = (rel, Path(rel).name, Path(rel).parent.name) if "/" in rel else (rel,)
    store_dir = copy / "store"
    try:
        if command == "start":
            code, out, err, proc = _start(copy, READY_SECONDS)
            if code == -999:
                return result(False, "hang: not ready and not exited in 20 s", err[-2000:])
            if proc is None:
                why = _one_line_naming(err, names)
                # (exit 2: the CLI's code for a configuration that is wrong, as a damaged node.toml is)
                if code != (2 if rel == "node.toml" else 1) or why:
                    return result(False, f"refused badly (exit {code}): {why}", err[-3000:])
                # a refused start writes nothing (the log and console files included)
                after = tree(copy)
                changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
                if not all(_written_before_the_store_opens(path) for path in changed):
                    return result(False, "a refused start changed the directory", str(changed))
                return result(True, "refused" + (" (wrote its log and lock)" if changed else ""), err.strip())
            try:
                listed = trio.run(_listed_flows, copy)
            except rpc.RpcError as exc:
                stopped = _stop(proc)
                # A bit flipped inside [[rpc.users]] password_hash is another valid hash (argon2 has no
                # checksum): the node runs with the configuration as it now reads, and the user cannot log in.
                if rel == "node.toml" and exc.code == "unauthenticated" and not _traceback(err):
                    return result(
                        True, "started with node.toml as it now reads (the RPC user's login changed)"
                    )
                return result(False, f"RPC refused on a started node: {exc}", err[-2000:])
            finally:
                if proc.poll() is None:
                    stopped = _stop(proc)
            if _traceback(err):
                return result(False, "traceback on a started node's stderr", err[-3000:])
            twice = {k: v for k, v in listed.items() if len(v) > 1}
            if twice:
                return result(False, "a flow listed twice", str(twice))
            lost = []
            for flow_id, (state, res) in snap.flows.items():
                now = listed.get(flow_id)
                if now is None:
                    lost.append(f"{flow_id} ({state}) gone")
                elif state == "finished" and now[0] != (state, res):
                    lost.append(f"{flow_id} finished with {res!r}, now {now[0]!r}")
            if lost:
                if not _documented_loss(err + _log_text(copy), rel, kind, original, older):
                    return result(False, "acknowledged flows lost", "; ".join(lost))
                return result(True, "recovered (torn tail truncated: documented loss)", "; ".join(lost))
            if stopped != 0:
                return result(False, f"the node stopped with {stopped}", err[-2000:])
            return result(True, "recovered", "")
        args = {
            "check": ["store", "check", str(store_dir)],
            "repair": ["store", "check", str(store_dir), "--repair"],
            "compact": ["store", "compact", str(store_dir)],
        }[command]
        code, out, err = _run(args, CLI_SECONDS)
        if code is None:
            return result(False, f"hang: {command} not done in {CLI_SECONDS} s", err[-2000:])
        if _traceback(err) or _traceback(out):
            return result(False, f"traceback from {command}", err[-3000:])
        if code not in (0, 1):
            return result(False, f"{command} exited {code}", err[-2000:])
        after = tree(copy)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if command == "check":
            if changed:
                return result(False, "store check changed the store", str(changed))
            if code == 1 and not any(n in out + err for n in names):
                return result(False, "store check failed without naming the file", out + err)
            return result(True, f"check exit {code}", (out + err)[-500:])
        part = _part_of(rel)
        if code == 1:
            if command == "compact":
                why = _one_line_naming(err, names)
                if why:
                    return result(False, f"compact refused badly: {why}", err[-2000:])
                if changed:
                    return result(False, "a refused compact changed the store", str(changed))
            return result(True, f"{command} exit 1", (out + err)[-500:])
        # done: every queue other than the damaged part kept its depth (repair: what the docs say it does)
        try:
            depths = store_depths(store_dir)
        except ListError as exc:
            return result(False, f"{command} exit 0, then store list failed", f"{out[-1000:]}\n{exc}")
        for queue, depth in snap.depths.items():
            if queue == part:
                continue
            if depths.get(queue) != depth:
                return result(False, f"{queue} depth {depth} -> {depths.get(queue)}", out[-1500:])
        if part in snap.depths and depths.get(part, 0) < snap.depths[part]:
            reported = any(f"{w} {part}:" in out or f"{w}  {part}" in out for w in ("REPAIRED", "DROPPED"))
            if not reported and not _documented_loss(out + err, rel, kind, original, older):
                return result(False, f"{part} lost messages silently", out[-1500:] + err[-500:])
        return result(True, f"{command} exit 0", out[-500:])
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)


def _log_text(node_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (node_dir / "logs").glob("*") if p.is_file())


def _part_of(rel: str) -> str | None:
    """The store part (queue or keyed log name) a file under ``store/`` belongs to."""
    parts = Path(rel).parts
    if len(parts) < 3 or parts[0] != "store":
        return None
    return f"keyed/{parts[2]}" if parts[1] == "keyed" and len(parts) > 3 else parts[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", type=int, action="append", help="run only this seed (repeatable)")
    parser.add_argument("--corpus", type=Path, help="reuse a corpus directory built before (kept)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="corruption-"))
    corpus = args.corpus or work
    snaps_file = corpus / "snapshots.json"
    if snaps_file.exists():
        snaps = [
            Snapshot(**{**s, "directory": Path(s["directory"]), "older": Path(s["older"]),
                         "flows": {k: tuple(v) for k, v in s["flows"].items()}})
            for s in json.loads(snaps_file.read_text())
        ]  # fmt: skip
    else:
        corpus.mkdir(parents=True, exist_ok=True)
        snaps = trio.run(build_corpus, corpus)
        snaps_file.write_text(json.dumps([attrs.asdict(s, value_serializer=_ser) for s in snaps]))
    print(f"corpus in {corpus}", flush=True)
    seeds = args.only or [args.seed * 100_000 + i for i in range(args.trials)]
    failures = 0
    for seed in seeds:
        t0 = time.monotonic()
        o = run_trial(snaps, seed, work)
        mark = "ok  " if o.ok else "FAIL"
        print(f"{mark} seed={seed} {o.snapshot} {o.command} {o.file} [{o.damage}] {o.why} "
              f"({time.monotonic() - t0:.1f}s)", flush=True)  # fmt: skip
        if not o.ok:
            failures += 1
            print("     " + o.detail.replace("\n", "\n     "), flush=True)
    print(f"{len(seeds) - failures}/{len(seeds)} trials passed", flush=True)
    return 1 if failures else 0


def _ser(_inst: object, _field: object, value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


if __name__ == "__main__":
    sys.exit(main())
