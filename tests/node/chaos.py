"""A chaos run of a whole real network, looking for lost or doubled work: ``python -m tests.node.chaos``.

A map service and three ``corda-trio node start`` processes (Alice, Bob, Carol; with ``--float``, Bob behind
two ``corda-trio float start`` processes, a hot-warm pair on Bob's advertised port) carry a steady load for
``--minutes``, while at random (seeded) times one fault strikes: ``kill -9`` of a node (then it is started
again), ``SIGSTOP`` of a node for a few seconds (then ``SIGCONT``), ``SIGTERM`` of a node (then it is started
again), ``kill -9`` of the map service (started again), and with ``--float`` ``kill -9`` of the active float
(started again, as the standby).

The load and its ledger:

* flows started over RPC with a client id each (PingPong, Broadcast and the ``Stream`` of
  ``tests.node.stream_flows``), from every node to every other. A start counts once the node acknowledged it
  (``launch_flow`` returned its id: the start is durable); whatever breaks (the node dies, the connection
  drops), the driver connects again and starts it again by its client id, which finds the same flow, and
  waits for its end. Every acknowledged flow must end exactly once, finished, with its result (PingPong: its
  rounds, Broadcast: one answer per recipient, Stream: its count, which its responder reaches only by taking
  every message once and in order; PingPong's responder likewise fails on a ping repeated or skipped).
  None may be started anew once its start was acknowledged (the node's log says which it started and which
  it found by client id), and once they all ended no node may hold a flow still running or parked (a
  responder waiting for a message that was lost), nor remember one that failed;
* plain P2P messages (as ``soak.py`` sends them) with known dedup ids on a topic no handler takes, dialled
  into each node's inbox with another member's TLS identity; a batch whose outcome is unknown (the
  connection broke) is sent again with the same ids. Such messages wait in the inbox, unacked, for a handler
  (at most half the inbox credit of them; the driver stays below that), so once the network is quiet each
  node's inbox must hold exactly the distinct messages it accepted: fewer is a loss, more a duplicate kept.

At the end the faults stop, every process is up, the driver waits for every flow it started (at most
``--settle`` seconds) and for the inboxes, prints one JSON summary and exits 1 on any loss, duplicate, wrong
result, flow that did not end, or process that could not start again.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from corda_trio import amqp, messaging, network, pki, rpc
from corda_trio.node import _config
from corda_trio.node._processes import NodeProcess, open_node_processes, start_node_process
from tests.ports import free_port

from .netutil import PASSWORD, make_network, open_inbox_sender, set_map_max_age, start_map_process, stop
from .parking_flows import node_env
from .stream_flows import MODULE as STREAM_MODULE
from .test_float_e2e import listening_ports, write_float_toml

NAMES = ("O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR", "O=Carol,L=New York,C=US")
CLI = [sys.executable, "-m", "corda_trio"]
#: plain messages sent to one node at most: all of them wait in its inbox, below half its inbox credit
#: (past that they would go to the dead letters)
PLAIN_PER_NODE = 400
PLAIN_BATCH = 10
PLAIN_TOPIC = "chaos.plain"


@attrs.define
class Flow:
    """One flow of the ledger: ``client_id`` on node ``node``, and what it must return."""

    node: int
    client_id: str
    flow: str
    args: dict[str, Any]
    expected: Any
    acked: bool = False
    #: the start was acknowledged with another flow id than ``C-<client_id>``
    wrong_id: str | None = None
    #: when (``time.time()``) the node acknowledged its start first
    acked_at: float | None = None
    outcome: str = "pending"  # pending / finished / failed / wrong-result
    detail: str = ""
    attempts: int = 0


class Chaos:
    def __init__(
        self, net: Path, minutes: float, seed: int, floats: bool, settle: float, log_level: str = "info"
    ) -> None:
        self.net, self.minutes, self.seed, self.floats, self.settle = net, minutes, seed, floats, settle
        self.log_level = log_level
        self.random = random.Random(seed)  # the faults: the same seed, the same faults in the same order
        self.load_random = random.Random(seed + 1)
        self.nodes: list[NodeProcess] = []
        self.paths: list[Path] = []
        self.up = [trio.Event() for _ in NAMES]
        self.map: trio.Process | None = None
        self.float_procs: list[trio.Process | None] = [None, None]
        self.float_tomls: list[Path] = []
        self.faults: dict[str, int] = {}
        self.fault_log: list[str] = []
        self.restart_failures: list[str] = []
        self.flows: list[Flow] = []
        self.stopping = False
        #: per node: dedup ids it accepted (Accepted outcome), ids sent with no outcome yet
        self.plain_acked: list[set[str]] = [set() for _ in NAMES]
        self.plain_unknown: list[set[str]] = [set() for _ in NAMES]
        self.plain_resent = 0
        self.t0 = 0.0
        self.inboxes: list[dict[str, Any]] = []
        self.leftovers: list[str] = []
        self.background: trio.Nursery | None = None

    def note(self, text: str) -> None:
        line = f"{time.monotonic() - self.t0:7.1f}s {text}"
        self.fault_log.append(line)
        print(line, flush=True)

    # --- processes ---------------------------------------------------------------------------------

    async def restart_node(self, i: int) -> None:
        """Start node ``i`` again (its process has exited); up to three tries."""
        old = self.nodes[i]
        for attempt in range(3):
            try:
                self.nodes[i] = await start_node_process(self.paths[i], old.config, env=node_env())
                self.up[i].set()
                return
            except Exception as exc:
                self.restart_failures.append(f"{NAMES[i]} attempt {attempt + 1}: {exc}"[:2000])
                self.note(f"{NAMES[i]} did not start again: {str(exc)[:300]}")
                await trio.sleep(2)
        raise RuntimeError(f"{NAMES[i]} could not be started again: {self.restart_failures[-1]}")

    async def start_float(self, k: int) -> int:
        """Start float ``k`` (``self.float_procs[k]``); returns its control port."""
        proc = await trio.lowlevel.open_process(
            [*CLI, "float", "start", "--config", str(self.float_tomls[k])],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.float_tomls[k].parent,
        )
        self.float_procs[k] = proc
        seen = b""
        assert proc.stdout is not None
        with trio.fail_after(60):
            while b"control port listening" not in seen or not seen.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(4096)
                assert chunk, f"float {k} exited: {seen!r}"
                seen += chunk
        return int(seen.split(b"control port listening on ")[1].split(b"\n")[0].rsplit(b":", 1)[1])

    async def drain_float_output(self, proc: trio.Process) -> None:
        """Read a float's stdout to its end (a full pipe would block it)."""
        assert proc.stdout is not None
        try:
            while await proc.stdout.receive_some(65536):
                pass
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    # --- faults ------------------------------------------------------------------------------------

    async def one_fault(self) -> None:
        kinds = ["kill9", "sigstop", "sigterm", "kill9-map"]
        if self.floats:
            kinds.append("kill9-float")
        kind = self.random.choice(kinds)
        i = self.random.randrange(len(NAMES))
        self.faults[kind] = self.faults.get(kind, 0) + 1
        if kind in ("kill9", "sigterm"):
            node = self.nodes[i]
            self.up[i] = trio.Event()
            self.note(f"{kind} {NAMES[i]} (pid {node.process.pid})")
            code = await node.stop(signal.SIGKILL if kind == "kill9" else signal.SIGTERM)
            await trio.sleep(self.random.uniform(0, 3))
            await self.restart_node(i)
            self.note(f"{NAMES[i]} exited {code}, started again (pid {self.nodes[i].process.pid})")
        elif kind == "sigstop":
            node = self.nodes[i]
            pause = self.random.uniform(2, 15)  # (past the 10 s AMQP idle timeout at times)
            self.note(f"SIGSTOP {NAMES[i]} for {pause:.1f} s")
            node.process.send_signal(signal.SIGSTOP)
            try:
                await trio.sleep(pause)
            finally:
                node.process.send_signal(signal.SIGCONT)
        elif kind == "kill9-map":
            assert self.map is not None
            self.note("kill -9 the map service")
            self.map.kill()
            await self.map.wait()
            await trio.sleep(self.random.uniform(0, 5))
            self.map = await start_map_process(self.net)
        else:
            bob = self.nodes[1]
            port = bob.config.p2p_address.port
            active = [
                k
                for k, p in enumerate(self.float_procs)
                if p is not None and p.returncode is None and port in listening_ports(p.pid)
            ]
            if not active:
                self.note("no active float to kill")
                return
            k = active[0]
            proc = self.float_procs[k]
            assert proc is not None
            self.note(f"kill -9 the active float {k} (pid {proc.pid})")
            proc.kill()
            await proc.wait()
            await trio.sleep(self.random.uniform(0, 5))
            await self.start_float(k)
            assert self.background is not None
            self.background.start_soon(self.drain_float_output, self.float_procs[k])

    async def chaos(self, until: float) -> None:
        """One fault after another until ``until`` (5 to 20 s apart)."""
        await trio.sleep(self.random.uniform(5, 15))
        while trio.current_time() < until:
            await self.one_fault()
            await trio.sleep(max(0.0, min(self.random.uniform(5, 20), until - trio.current_time())))

    # --- load --------------------------------------------------------------------------------------

    async def drive(self, flow: Flow) -> None:
        """Start ``flow`` by its client id and wait for its end, again and again until it ends."""
        i = flow.node
        while flow.outcome == "pending":
            await self.up[i].wait()
            flow.attempts += 1
            try:
                with trio.fail_after(120):
                    async with rpc.connect(self.nodes[i].rpc_url, "ops", PASSWORD) as client:
                        flow_id = await client.launch_flow(flow.flow, flow.args, client_id=flow.client_id)
                        flow.acked = True
                        if flow.acked_at is None:
                            flow.acked_at = time.time()
                        if flow_id != f"C-{flow.client_id}":
                            flow.wrong_id = flow_id
                        final = await client.flow_result(flow_id)
            except (rpc.RpcConnectionError, OSError, trio.TooSlowError) as exc:
                if flow.attempts > 1000:
                    flow.outcome, flow.detail = "failed", f"gave up: {exc}"
                await trio.sleep(0.5)
                continue
            except rpc.RpcError as exc:
                if exc.code in ("draining", "unavailable"):  # the node is stopping
                    await trio.sleep(0.5)
                    continue
                flow.outcome, flow.detail = "failed", f"{exc.code}: {exc}"[:500]
                return
            state = final.get("state")
            if state != "finished":
                flow.outcome, flow.detail = "failed", json.dumps(final)[:500]
            elif final.get("result") != flow.expected:
                flow.outcome, flow.detail = "wrong-result", json.dumps(final)[:500]
            else:
                flow.outcome = "finished"

    async def flow_worker(self, i: int, j: int) -> None:
        n = 0
        others = [name for k, name in enumerate(NAMES) if k != i]
        while not self.stopping:
            n += 1
            cid = f"chaos-{self.seed}-{i}{j}-{n}"
            kind = n % 5
            if kind == 4:
                args: dict[str, Any] = {"recipient": NAMES[j], "count": 60, "batch": 10}
                flow = Flow(i, cid, "tests.stream.Stream", args, 60)
            elif kind % 2:
                # each recipient answers "<its name> got <message>", in the order of the recipients
                answers = [f"{pki.CordaX500Name.parse(r)} got {cid}" for r in others]
                flow = Flow(i, cid, "Broadcast", {"recipients": others, "message": cid}, answers)
            else:
                flow = Flow(i, cid, "PingPong", {"recipient": NAMES[j], "rounds": 3}, 3)
            self.flows.append(flow)
            await self.drive(flow)

    async def plain_worker(self, until: float) -> None:
        """Plain messages into each inbox, at a pace that spreads PLAIN_PER_NODE over the run."""
        pace = (until - trio.current_time()) / (PLAIN_PER_NODE / PLAIN_BATCH) / len(NAMES)
        batches = [0] * len(NAMES)
        pending: list[list[str]] = [[] for _ in NAMES]  # ids whose outcome is unknown, to send again
        while not self.stopping:
            open_ = [
                k
                for k in range(len(NAMES))
                if pending[k] or len(self.plain_acked[k] | self.plain_unknown[k]) < PLAIN_PER_NODE
            ]
            if not open_:
                return
            i = self.load_random.choice(open_)
            if pending[i]:
                self.plain_resent += len(pending[i])
            else:
                batches[i] += 1
                pending[i] = [f"plain-{self.seed}-{i}-{batches[i]}-{k}" for k in range(PLAIN_BATCH)]
            await self.up[i].wait()
            sender = (i + 1 + self.load_random.randrange(2)) % len(NAMES)
            ids = pending[i]
            self.plain_unknown[i].update(ids)
            try:
                with trio.fail_after(30):
                    await send_plain(self.nodes[sender].config, self.nodes[i], ids, self.plain_acked[i])
            except Exception:
                pass
            pending[i] = [d for d in ids if d not in self.plain_acked[i]]
            self.plain_unknown[i].difference_update(self.plain_acked[i])
            await trio.sleep(pace)

    # --- the run -----------------------------------------------------------------------------------

    async def setup_floats(self, configs: list[tuple[Path, _config.NodeConfig]]) -> None:
        bob_path, bob_cfg = configs[1]
        tunnel = self.net.parent / "tunnel"
        await trio.run_process(
            [*CLI, "float", "tunnel-pki", "--out", str(tunnel), "--float", "float-a", "--float", "float-b",
             "--bridge", "bridge"],
            capture_stdout=True,
        )  # fmt: skip
        self.float_tomls = []
        for name in ("float-a", "float-b"):
            toml = write_float_toml(self.net.parent / name, bob_cfg, tunnel, name=name)
            # a fixed control port, so that a float started again is where Bob's node.toml says
            text = toml.read_text(encoding="utf-8")
            toml.write_text(text.replace("\nport = 0\n", f"\nport = {free_port()}\n", 1), encoding="utf-8")
            self.float_tomls.append(toml)
        control_ports = [await self.start_float(k) for k in range(2)]
        bob_cfg = attrs.evolve(
            bob_cfg,
            floats=_config.FloatSettings(
                control=tuple(network.NetworkHostAndPort(host="127.0.0.1", port=p) for p in control_ports),
                tunnel_cert=tunnel / "bridge.pem",
                tunnel_key=tunnel / "bridge.key",
                tunnel_ca=tunnel / "tunnel-ca.pem",
            ),
        )
        bob_path.write_text(_config.dump_node_config(bob_cfg, bob_path.parent), encoding="utf-8")
        configs[1] = (bob_path, _config.load_node_config(bob_path))

    async def run(self) -> dict[str, Any]:
        self.t0 = time.monotonic()
        configs = make_network(
            self.net, NAMES, with_map=True, flows_modules=(STREAM_MODULE,), log_level=self.log_level
        )
        set_map_max_age(self.net, 2)
        self.map = await start_map_process(self.net)
        try:
            async with trio.open_nursery() as outer:
                self.background = outer
                if self.floats:
                    await self.setup_floats(configs)
                    for proc in self.float_procs:
                        assert proc is not None
                        outer.start_soon(self.drain_float_output, proc)
                await self.run_nodes(configs)
                outer.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                for proc in [self.map, *self.float_procs]:
                    if proc is not None:
                        await stop(proc)
        return self.summary()

    async def run_nodes(self, configs: list[tuple[Path, _config.NodeConfig]]) -> None:
        started: list[NodeProcess] = []
        try:
            async with open_node_processes(configs, env=node_env()) as nodes:
                self.paths = [path for path, _cfg in configs]
                self.nodes = list(nodes)
                started.extend(nodes)
                for event in self.up:
                    event.set()
                async with rpc.connect(nodes[0].rpc_url, "ops", PASSWORD) as a:
                    with trio.fail_after(60):
                        while len(await a.network_map()) < 3:  # noqa: ASYNC110
                            await trio.sleep(0.2)
                until = trio.current_time() + self.minutes * 60
                async with trio.open_nursery() as load:
                    for i in range(3):
                        for j in range(3):
                            if i != j:
                                load.start_soon(self.flow_worker, i, j)
                    load.start_soon(self.plain_worker, until)
                    await self.chaos(until)  # (returns after the fault in progress at ``until``)
                    self.note("faults and new work stop; waiting for the flows started")
                    self.stopping = True
                    await self.wake_everyone()
                    with trio.move_on_after(self.settle) as settle:
                        await self.wait_flows_ended()
                    if settle.cancelled_caught:
                        self.note(f"flows still pending after {self.settle} s")
                    load.cancel_scope.cancel()
                await self.wake_everyone()
                self.inboxes = await self.inbox_depths()
                self.leftovers = await self.leftover_flows()
        finally:
            with trio.CancelScope(shield=True):
                for node in self.nodes:
                    if node not in started:
                        await node.stop()

    async def wait_flows_ended(self) -> None:
        while any(f.outcome == "pending" for f in self.flows):  # noqa: ASYNC110 (a poll of many tasks' state)
            await trio.sleep(0.5)

    async def wake_everyone(self) -> None:
        for node in self.nodes:
            if node.process.returncode is None:
                node.process.send_signal(signal.SIGCONT)

    async def leftover_flows(self) -> list[str]:
        """Flows still running or parked on a node once the ledger's flows all ended (a responder waiting
        for a message that was lost, say; waited for up to 60 s), and the failed flows nodes remember
        (responders included)."""
        live: list[str] = []
        failed: list[str] = []
        with trio.move_on_after(60):
            while True:
                live, failed = [], []
                for i, node in enumerate(self.nodes):
                    async with rpc.connect(node.rpc_url, "ops", PASSWORD) as client:
                        for f in await client.list_flows():
                            text = f"{NAMES[i]}: {f['flow']} {f['flow_id']} {f['status']} {f['error']}"[:500]
                            if f["state"] in ("running", "parked"):
                                live.append(text)
                            elif f["state"] == "failed":
                                failed.append(text)
                if not live:
                    break
                await trio.sleep(2)
        return live + failed

    async def inbox_depths(self) -> list[dict[str, Any]]:
        """Each node's inbox and dead letters once their depth holds still (plain messages all delivered)."""
        out: list[dict[str, Any]] = []
        for i, node in enumerate(self.nodes):
            inbox = messaging.inbox_address(node.addresses["key_hash"])
            low, high = len(self.plain_acked[i]), len(self.plain_acked[i] | self.plain_unknown[i])
            last: tuple[int, int] | None = None
            with trio.move_on_after(60):
                while True:
                    async with rpc.connect(node.rpc_url, "ops", PASSWORD) as client:
                        stats = {s["name"]: s for s in await client.queue_statistics()}
                    now = (
                        stats.get(inbox, {}).get("depth", 0),
                        stats.get(messaging.DEAD_LETTER_QUEUE, {}).get("depth", 0),
                    )
                    if now == last and low <= sum(now) <= high:
                        break
                    last = now
                    await trio.sleep(2)
            out.append({"inbox": last[0], "dead_letters": last[1]})
        return out

    def doubled_starts(self) -> list[tuple[str, str]]:
        """Flows a node started anew (its log says so) after it had acknowledged their start: a client id
        that did not find its flow (a start before the acknowledgement may be repeated: not durable yet)."""
        acked = {f"C-{f.client_id}": f.acked_at for f in self.flows if f.acked_at is not None}
        out = []
        for i, node in enumerate(self.nodes):
            for flow_id, when in started_by_rpc(node.config.log_path.parent):
                at = acked.get(flow_id)
                if at is not None and when > at:
                    out.append((flow_id, f"on {NAMES[i]} at {when:.3f}, acknowledged at {at:.3f}"))
        return out

    def summary(self) -> dict[str, Any]:
        acked = [f for f in self.flows if f.acked]
        problems: list[str] = []
        for f in acked:
            if f.outcome != "finished":
                problems.append(f"flow {f.client_id} on {NAMES[f.node]}: {f.outcome} {f.detail}")
            if f.wrong_id:
                problems.append(f"flow {f.client_id}: acknowledged as {f.wrong_id}")
        messages: dict[str, Any] = {}
        for i, name in enumerate(NAMES):
            got = self.inboxes[i] if self.inboxes else {}
            accepted, unknown = len(self.plain_acked[i]), len(self.plain_unknown[i])
            held = got.get("inbox", -1) + got.get("dead_letters", 0)
            lost = max(0, accepted - held)
            duplicated = max(0, held - accepted - unknown)
            messages[name] = {"accepted": accepted, "unknown": unknown, "held": held, **got,
                              "lost": lost, "duplicated": duplicated}  # fmt: skip
            if lost or duplicated or got.get("dead_letters"):
                problems.append(f"plain messages to {name}: {messages[name]}")
        problems.extend(f"restart: {r}" for r in self.restart_failures)
        problems.extend(f"flow left: {x}" for x in self.leftovers)
        doubled = self.doubled_starts()
        problems.extend(
            f"flow {cid} started again after its start was acknowledged: {when}" for cid, when in doubled
        )
        return {
            "seed": self.seed,
            "minutes": self.minutes,
            "float": self.floats,
            "faults": self.faults,
            "flows": {
                "started": len(acked),
                "finished": sum(f.outcome == "finished" for f in acked),
                "failed": sum(f.outcome == "failed" for f in acked),
                "wrong_result": sum(f.outcome == "wrong-result" for f in acked),
                "pending": sum(f.outcome == "pending" for f in acked),
                "restarts_by_client_id": sum(f.attempts - 1 for f in acked),
                "started_twice": len(doubled),
            },
            "messages": messages,
            "plain_resent": self.plain_resent,
            # (not a loss: a message a flow consumed before a kill -9 or a stop, handed over again after the
            # restart, its flow finished meanwhile; figures for whoever reads the run)
            "refused_session_messages": {
                NAMES[i]: sum(
                    "refused: unknown session" in line
                    for path in sorted(node.config.log_path.parent.glob("node.log*"))
                    for line in path.read_text(errors="replace").splitlines()
                )
                for i, node in enumerate(self.nodes)
            },
            "problems": problems,
        }


def started_by_rpc(log_dir: Path) -> list[tuple[str, float]]:
    """(flow id, time) of each ``flow NAME ID started by RPC user`` line of a node's log files (a flow the
    node started anew, not one it found by its client id)."""
    found = []
    for path in sorted(log_dir.glob("node.log*")):
        for line in path.read_text(errors="replace").splitlines():
            m = STARTED.match(line)
            if m:
                when = dt.datetime.strptime(m["time"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                found.append((m["id"], when))
    return found


STARTED = re.compile(
    r"(?P<time>\S+ \S+) INFO corda_trio\.node\.flows: flow \S+ (?P<id>C-\S+) started by RPC user "
)


async def send_plain(sender_cfg: Any, victim: NodeProcess, ids: list[str], acked: set[str]) -> None:
    """Dial ``victim``'s advertised P2P address as ``sender_cfg``'s node and send one plain message per dedup
    id in ``ids`` to its inbox (:data:`PLAIN_TOPIC`), adding to ``acked`` each one it accepted."""
    async with open_inbox_sender(sender_cfg, victim) as sender:
        for n, dedup_id in enumerate(ids):
            out = messaging.OutgoingMessage(topic=PLAIN_TOPIC, data=b"x" * 200, dedup_id=dedup_id)
            message = messaging.to_amqp(
                out, platform_version=1, release_version="0.1.0", sender_uuid="chaos", send_seq_no=n
            )
            outcome = await sender.send(message)
            if isinstance(outcome, amqp.Accepted):
                acked.add(dedup_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--float", action="store_true", help="Bob behind a hot-warm pair of floats")
    parser.add_argument("--settle", type=float, default=180, help="seconds the flows may take to end")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--log-level", default="info", help="the nodes' log level (debug: every message)")
    args = parser.parse_args()
    net = args.dir or Path(tempfile.mkdtemp(prefix="chaos-")) / "net"
    print(f"network in {net}", flush=True)
    chaos = Chaos(net, args.minutes, args.seed, args.float, args.settle, args.log_level)
    summary = trio.run(chaos.run)
    print(json.dumps(summary, indent=1))
    sys.exit(1 if summary["problems"] else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
