"""kill -9 of flow node processes at random points, then restart: every flow completes, each payload is
received exactly once (asserted on the ledger each flow keeps in its checkpoint).

Knobs: ``FLOW_CRASH_ROUNDS`` (default 20 kills, alternating initiator and responder), ``FLOW_CRASH_FLOWS``
(default 5000 flows of 3 round trips, 50 at a time), ``FLOW_CRASH_SEED``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from corda_trio import messaging, pki, testing

REPO = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("FLOW_CRASH_ROUNDS", "20"))
# Enough that a quiet machine is still busy with them after the last kill (1000 finished before 20 kills).
FLOWS = int(os.environ.get("FLOW_CRASH_FLOWS", "5000"))
SEED = os.environ.get("FLOW_CRASH_SEED", "corda-trio-flows")
ALICE, BOB = "O=Alice, L=London, C=GB", "O=Bob, L=Paris, C=FR"


@attrs.define(eq=False)
class Node:
    directory: Path
    key_hash: str
    process: trio.Process | None = None
    port: int | None = None
    lines: list[str] = attrs.field(factory=list)

    def _cmd(self, mode: str) -> list[str]:
        return [
            sys.executable, "-m", "corda_trio.testing._flow_process", str(self.directory), mode,
            "--import", "tests.flows.crash_flows",
        ]  # fmt: skip

    @staticmethod
    def _env() -> dict[str, str]:
        return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    async def start(self, nursery: trio.Nursery) -> None:
        self.port = None
        self.process = await trio.lowlevel.open_process(
            self._cmd("run"), stdout=subprocess.PIPE, env=self._env()
        )
        nursery.start_soon(self._read, self.process)
        with trio.fail_after(60):
            while self.port is None:  # noqa: ASYNC110 (set by the reader task)
                await trio.sleep(0.02)

    async def _read(self, process: trio.Process) -> None:
        assert process.stdout is not None
        buf = b""
        async for chunk in process.stdout:
            buf += chunk
            *complete, buf = buf.split(b"\n")
            for raw in complete:
                line = raw.decode()
                self.lines.append(line)
                if line.startswith("ready "):
                    self.port = int(line.split()[1])

    async def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def dump(self) -> list[dict[str, object]]:
        result = await trio.run_process(self._cmd("dump"), capture_stdout=True, env=self._env())
        return json.loads(result.stdout)  # type: ignore[no-any-return]


def _write(base: Path, creds: pki.NodeCredentials, root: object, plan: dict[str, object]) -> Node:
    d = base / creds.legal_name.organisation
    d.mkdir(parents=True)
    (d / "name").write_text(str(creds.legal_name))
    pki.write_certificates(d / "tls.pem", creds.tls_chain)
    pki.write_private_key(d / "tls.key", creds.tls.key, None)
    pki.write_certificates(d / "identity.pem", creds.identity_chain)
    pki.write_certificates(d / "root.pem", [root])  # type: ignore[list-item]
    (d / "plan.json").write_text(json.dumps(plan))
    return Node(d, pki.key_hash(creds.identity.cert.public_key()))


def _publish(base: Path, nodes: dict[str, Node]) -> None:
    peers = [
        messaging.Peer(
            legal_name=pki.CordaX500Name.parse(name), key_hash=n.key_hash, addresses=[("127.0.0.1", n.port)]
        )
        for name, n in nodes.items()
        if n.port is not None
    ]
    testing.write_peer_file(base / "peers.json", peers)


@pytest.mark.crash
async def test_kill_9_initiator_and_responder_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    network = pki.NetworkCredentials.create(now=now)
    root = network.root.cert
    rounds = 3
    plan = {
        "flow": "LedgerPing", "args": {"recipient": BOB, "tag": "t{i}", "rounds": rounds}, "count": FLOWS,
        "concurrency": 50, "wait_for_peers": 1,
    }  # fmt: skip
    nodes = {
        ALICE: _write(tmp_path, network.issue_node(pki.CordaX500Name.parse(ALICE), now=now), root, plan),
        BOB: _write(tmp_path, network.issue_node(pki.CordaX500Name.parse(BOB), now=now), root, {}),
    }
    alice, bob = nodes[ALICE], nodes[BOB]
    async with trio.open_nursery() as nursery:
        try:
            for node in nodes.values():
                await node.start(nursery)
            _publish(tmp_path, nodes)
            kills = 0
            with trio.fail_after(60 + 8 * ROUNDS):
                for k in range(ROUNDS):
                    if "done" in alice.lines:
                        break
                    kills += 1
                    await trio.sleep(rng.uniform(0.05, 0.6))
                    victim = alice if k % 2 == 0 else bob
                    await victim.kill()
                    await victim.start(nursery)
                    _publish(tmp_path, nodes)
                while "done" not in alice.lines:  # noqa: ASYNC110 (set by the reader task)
                    await trio.sleep(0.05)
                # let Bob finish the last responders (their ends cross Alice's)
                await trio.sleep(0.5)
        finally:
            for node in nodes.values():
                if node.process is not None and node.process.returncode is None:
                    await node.kill()
            nursery.cancel_scope.cancel()
    assert kills == ROUNDS, f"the flows finished after {kills} kills: raise FLOW_CRASH_FLOWS"
    a_ledger, b_ledger = await alice.dump(), await bob.dump()
    initiators = {r["flow_id"]: r for r in a_ledger}
    assert sorted(initiators) == sorted(f"C-{i}" for i in range(FLOWS))
    for i in range(FLOWS):
        r = initiators[f"C-{i}"]
        assert (r["status"], r["result"]) == ("completed", [f"t{i} pong {j}" for j in range(rounds)]), r
    responders = [r for r in b_ledger if r["flow_name"] == "tests.LedgerPong"]
    assert all(r["status"] == "completed" for r in responders), [
        r for r in responders if r["status"] != "completed"
    ]
    received = sorted(json.dumps(r["result"]) for r in responders)
    expected = sorted(json.dumps([f"t{i} ping {j}/{rounds}" for j in range(rounds)]) for i in range(FLOWS))
    assert received == expected  # one responder per flow, each ping received exactly once, in order
