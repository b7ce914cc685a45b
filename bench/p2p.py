"""Peer-to-peer benchmark: two node processes, mutual TLS, durable queues with fsync group commit both sides.

    python -m bench.p2p [--messages 20000] [--senders 128] [--size 1024] [--half-seconds 5] [--records DIR]
    python -m bench.p2p --via-float [--repeat N] [...]    # through a float, then directly, side by side
    python -m bench.p2p --rate 500 [...]                  # phase 2 at a given offered load
    python -m bench.p2p --repeat 5 [...]                  # five whole runs, medians of their figures

``--via-float`` runs the benchmark twice with the same settings: with B behind a float (a ``corda-trio float
start`` process: A's bridge -> float -> control link -> B's ``FloatTunnel`` -> B's inbox; B has no P2P
port), then directly. The direct run's phase 2 uses the float run's half rate (the lower one), so both
latencies are taken at one offered load that both paths sustain. The last line then carries both
summaries, ``throughput_ratio`` (via float / direct) and ``p99_delta_ms``, plus the float process's CPU per
message. ``--repeat N`` runs N such rounds back to back and reports the medians of the rounds' paired ratios
and deltas (with each round's in ``per_round``): on a shared machine one pair swings with whatever else runs.

``--repeat N`` without ``--via-float`` runs the whole benchmark N times (each round measures its own maximum
and offers half of it) and reports the medians of the rounds' figures, with each round's in ``per_round``:
on this kind of machine one round's p99 moves by a few milliseconds from run to run, a median of five does
much less.

``BENCH_P2P_TRACE=DIR`` writes ``DIR/sender.trace.json`` and ``DIR/receiver.trace.json``: every Trio task step
that took more than 2 ms of CPU or 4 ms of wall time, and every garbage collection (generation, CPU ms), each
with its ``time.time_ns()``, to line up with the per-message records of ``--records`` when looking for the
cause of a slow message (cheap enough to leave the figures representative), and for phase 2 the task steps
per task name and the scheduler's polls for I/O (``phase2_io_waits``) and of those the ones that may sleep,
with nothing runnable (``phase2_io_sleeps``): divided by the messages, how many hops a message costs.

``BENCH_P2P_PROFILE=DIR`` runs both node processes under cProfile (timed by process CPU time) and writes
``DIR/sender.pstats`` and ``DIR/receiver.pstats`` (the figures are then not representative).

Node A (sender) and node B (receiver) each run a broker (WAL queues, fsync ``always``, commit helper process),
the messaging service, the inbound acceptor and the bridge manager (``corda_trio.messaging`` / ``.bridge``)
on 127.0.0.1 with certificates from a throwaway network (``corda_trio.pki``). Two phases:

1. **Maximum sustained throughput**: ``--senders`` tasks in A call ``MessagingService.send`` (each returns
   once the message is durable in A's outbound queue) back to back for ``--messages`` messages of
   ``--size`` bytes; the rate is messages / (first created -> B's handler has had every one of them, and A's
   outbound queue is empty: each durable in B's inbox, settled ``accepted`` back to A, deduplicated and handed
   to B's handler).
2. **Latency at half load**, open loop: messages are created at half the measured rate for ``--half-seconds``
   on a fixed schedule (their intended times do not depend on how the node keeps up); the latency of a
   message is from its intended time to the moment B's handler got it (durable at B, deduplicated). They
   are handed to the messaging service as the flow framework's outbound pump hands its flows' messages
   over: one ``send_many`` at a time (one group commit), holding every message whose time has come, and
   while it waits for durability the next ones come due and go in the next lot; a message's wait for its
   lot counts in its latency. ``--rate R`` offers ``R`` msg/s instead (with ``--via-float``: to both paths).

*CPU per message at low rates.* On the two-core virtual machine these figures come from, a node's CPU per
message grows as the offered rate falls (one run: ~2,100 us per message and node at 200 msg/s, ~600-870 us at
1,000 msg/s, ~240-300 us at half the maximum, ~120-250 us at the maximum), while the Python work per message
stays about the same. A message at a low rate goes through its steps alone, and every step that wakes an idle
process or an idle event loop (the bridge's send, the peer's disposition, each group commit's round trip to
the commit helper, the hold before the dedup commit) costs that virtual CPU a hundred microseconds or more:
measured outside the project, a process that sleeps 2 ms and wakes pays ~40 us of CPU for it, and a one-byte
pipe round trip between two processes ~190 us of CPU in all after an idle gap against ~13 us back to back; and
what a wake costs grows with the memory touched after it (a loop touching one byte in each of 256 pages: 34 us
back to back, 210 us after a 2 ms sleep), so fewer task steps or Python calls per message barely change a lone
message's CPU, fewer sleeps would. py-spy at 200 msg/s shows ``epoll`` waits and the system calls that wake
another process (``sendmsg`` to the commit helper, the TLS socket's ``send``) at the top. Committing inline
instead of through the helper did not change the figure (tried, not kept). So a latency measured at half load
on such a machine is taken with both nodes close to saturation (``busy_cores_half``), and batches, not
per-message work, set CPU per message there.

Every body starts with its message's dedup id (then filler): B's handler checks each body against its id and
that no message is handed over twice, and the run ends with the sent and handled ids compared; any difference
(lost, unexpected, twice, another message's body) fails the run with a ``wrong deliveries`` line.

Times are ``time.time_ns()`` in both processes (one machine, one clock). CPU per message of each node is its
process time plus its commit helper's, read from /proc. Writes one record per message of phase 2
(``protocol_spec/bench-records.md``) with ``--records DIR`` for ``corda-trio report``; the last line printed
is one JSON object with ``msgs_per_s``, ``p50_ms``, ``p99_ms`` and the CPU figures. The machine may be shared:
the JSON carries the load average before and after, and the whole machine's CPU in each phase as mean cores:
``steal_cores_phase1`` / ``steal_cores_half`` (time a hypervisor gave other guests: the nodes waited for a
CPU then) and ``busy_cores_half``; and ``reference_cpu_ms``, the CPU time of a fixed pure-Python workload
before and after the run (``corda_trio.testing.reference_cpu_ms``): a virtual CPU can run slower on one day
than on another without any stolen time, and CPU per message scales with it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from corda_trio.testing import MachineCpu, cpu_with_helpers, load_average, reference_cpu_ms

TOPIC = "bench.p2p"


# --- the node processes -------------------------------------------------------------------------------------


def _node_main(node_dir: Path) -> None:
    import trio

    from corda_trio import bridge, messaging, pki, store

    plan = json.loads((node_dir / "plan.json").read_text())
    profile = os.environ.get("BENCH_P2P_PROFILE")
    trace_dir = os.environ.get("BENCH_P2P_TRACE")
    # BENCH_P2P_TRACE's instrument (the profile, if asked for too, goes first), told when phase 2 starts
    tracer = _Tracer() if trace_dir and not profile else None

    def say(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    async def run() -> None:
        name = pki.CordaX500Name.parse(plan["name"])
        root = pki.read_certificate(node_dir / "root.pem")
        tls = {"cert_chain": node_dir / "tls.pem", "key": node_dir / "tls.key", "trust_root": root}
        key_hash = plan["key_hash"]
        peers = messaging.PeerDirectory()
        async with store.open_broker(node_dir / "store") as broker, trio.open_nursery() as nursery:
            config = messaging.MessagingConfig(legal_name=name, key_hash=key_hash, inbox_credit=2048)
            service = await messaging.MessagingService.open(broker, config, peers)
            acceptor = bridge.InboundAcceptor(
                inbox=service.inbox,
                ssl_context=pki.server_ssl_context(**tls),  # type: ignore[arg-type]
                config=bridge.AcceptorConfig(credit=1024),
                on_checked=service.remember_received,
            )
            tunnel = None
            if plan.get("float_control_port"):  # --via-float: no P2P port, the float forwards inward
                from corda_trio.bridge import float as fl

                creds = fl.TunnelCredentials.read(
                    node_dir / "tunnel.pem", node_dir / "tunnel.key", node_dir / "tunnel-ca.pem"
                )
                tunnel = fl.FloatTunnel(
                    inbox=service.inbox,
                    tunnel_context=creds.client_context(),
                    config=fl.TunnelConfig(floats=[("127.0.0.1", plan["float_control_port"])], credit=2048),
                    on_checked=service.remember_received,
                )
            manager = bridge.BridgeManager(
                messaging=service,
                resolver=peers,
                ssl_context=pki.client_ssl_context(**tls),  # type: ignore[arg-type]
                config=bridge.BridgeConfig(credit=1024),
            )
            delivered: dict[str, int] = {}
            anomalies: list[str] = []  # a message handed over twice, or whose body is not its id's
            # [the count of messages handled to wait for, the event set when it is reached]
            target: list[Any] = [math.inf, trio.Event()]

            async def handled(count: int) -> None:
                """Return once this node's handler has had ``count`` messages."""
                if len(delivered) < count:
                    target[:] = [count, trio.Event()]
                    await target[1].wait()
                target[0] = math.inf

            async def handler(message: messaging.ReceivedMessage) -> None:
                dedup_id = message.dedup_id
                if dedup_id in delivered or message.data != _body(dedup_id, plan["size"]):
                    anomalies.append(dedup_id)
                delivered[dedup_id] = time.time_ns()
                if len(delivered) >= target[0]:
                    target[1].set()

            service.add_message_handler(TOPIC, handler)
            if tunnel is None:
                port = await nursery.start(acceptor.run)
            else:
                await nursery.start(tunnel.run)
                port = (await tunnel.wait_active())[1]
            await nursery.start(manager.run)
            await nursery.start(service.run)
            # as the node's entry points do once ready (corda_trio.node.freeze_startup_heap; the bench uses
            # the product from below the CLI): full collections then skip what lives as long as the process
            gc.collect()
            gc.freeze()
            cpu0 = cpu_with_helpers(os.getpid())
            say({"ready": port})
            if plan["role"] == "receiver":
                # end of phase 1: when this node's handler has had every message so far
                line = await trio.to_thread.run_sync(sys.stdin.readline)  # off the hot path
                await handled(json.loads(line)["wait_handled"])
                cpu_phase2 = cpu_with_helpers(os.getpid())
                if tracer is not None:
                    tracer.start_counting()
                say({"handled_at": max(delivered.values())})
                line = await trio.to_thread.run_sync(sys.stdin.readline)
                # (every message is durable in this node's inbox by now, but the handler may lag behind)
                await handled(json.loads(line)["expect"])
                (node_dir / "delivered.json").write_text(json.dumps(delivered))
                say(
                    {
                        "done": True,
                        "cpu_seconds": cpu_with_helpers(os.getpid()) - cpu0,
                        "half_cpu_seconds": cpu_with_helpers(os.getpid()) - cpu_phase2,
                        "anomalies": anomalies[:20],
                        "anomaly_count": len(anomalies),
                    }
                )
                nursery.cancel_scope.cancel()
                return
            line = await trio.to_thread.run_sync(sys.stdin.readline)  # the receiver's port
            peer = json.loads(line)
            peers.put(
                messaging.Peer(
                    legal_name=pki.CordaX500Name.parse(peer["name"]),
                    key_hash=peer["key_hash"],
                    addresses=[("127.0.0.1", peer["port"])],
                )
            )
            to = pki.CordaX500Name.parse(peer["name"])
            created: dict[str, int] = {}
            enqueued: dict[str, int] = {}

            async def one(dedup_id: str, intended: int) -> None:
                created[dedup_id] = intended
                body = _body(dedup_id, plan["size"])
                await service.send(service.create_message(TOPIC, body, dedup_id=dedup_id), to)
                enqueued[dedup_id] = time.time_ns()

            async def lot(due: list[tuple[str, int]]) -> None:
                # handed over together, as the flow framework's outbound pump hands over what its flows
                # sent meanwhile (one send_many, one group commit)
                messages = []
                for dedup_id, intended in due:
                    created[dedup_id] = intended
                    body = _body(dedup_id, plan["size"])
                    messages.append(service.create_message(TOPIC, body, dedup_id=dedup_id))
                await service.send_many(messages, to)
                now = time.time_ns()
                for dedup_id, _intended in due:
                    enqueued[dedup_id] = now

            queue = await service.outbound_queue_for(peer["key_hash"])

            async def drained() -> None:
                # (polled: 20 ms is cheap next to the messages, and phase 1 ends when B has them all anyway)
                while queue.statistics().depth:  # noqa: ASYNC110
                    await trio.sleep(0.02)

            # warm-up: connection, TLS, first group commits
            for i in range(200):
                await one(f"w-{i}", time.time_ns())
            await drained()
            # phase 1: closed loop, `senders` tasks back to back; done when all are durable at B (accepted)
            n, senders = plan["messages"], plan["senders"]
            cpu_a0 = cpu_with_helpers(os.getpid())
            machine_a0 = MachineCpu()
            counter = iter(range(n))

            async def sender() -> None:
                for i in counter:
                    await one(f"max-{i}", time.time_ns())

            t0 = time.time_ns()
            async with trio.open_nursery() as load:
                for _ in range(senders):
                    load.start_soon(sender)
            await drained()
            # phase 1 ends when B's handler has had them all (B's inbox may still hold a backlog when A's
            # outbound queue is empty; phase 2 must not start on top of it)
            say({"phase1_sent": 200 + n})
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            t1 = json.loads(line)["handled_at"]
            cpu_max = cpu_with_helpers(os.getpid()) - cpu_a0
            machine_phase1 = MachineCpu().since(machine_a0)
            rate_max = n / ((t1 - t0) / 1e9)
            # (to 0.1 msg/s, as the summary reports it: --via-float hands that figure to the direct run, which
            # must then offer exactly as many messages)
            rate = plan.get("half_rate") or max(0.1, round(rate_max / 2, 1))
            # phase 2: open loop at half the measured rate
            count = max(1, int(rate * plan["half_seconds"]))
            start = time.time_ns() + 50_000_000
            cpu_h0 = cpu_with_helpers(os.getpid())
            machine_h0 = MachineCpu()
            if tracer is not None:
                tracer.start_counting()
            i = 0
            while i < count:
                # every message whose time has come (late ones too: their latency counts from their
                # intended time) goes out in one lot, the next lot once this one is durable (the flow
                # framework's outbound pump)
                now = time.time_ns()
                due = []
                while i < count and (intended := start + int(i * 1e9 / rate)) <= now:
                    due.append((f"half-{i}", intended))
                    i += 1
                if due:
                    await lot(due)
                elif i < count:
                    await trio.sleep(max(0.0, (start + int(i * 1e9 / rate) - time.time_ns()) / 1e9))
            await drained()
            cpu_half = cpu_with_helpers(os.getpid()) - cpu_h0
            machine_half = MachineCpu().since(machine_h0)
            (node_dir / "sent.json").write_text(json.dumps({"created": created, "enqueued": enqueued}))
            say(
                {
                    "done": True,
                    "phase1_seconds": (t1 - t0) / 1e9,
                    "phase1_msgs_per_s": rate_max,
                    "phase1_cpu_seconds": cpu_max,
                    "half_cpu_seconds": cpu_half,
                    "half_rate": rate,
                    "half_count": count,
                    "machine_phase1": machine_phase1,
                    "machine_half": machine_half,
                    "expect": 200 + n + count,
                }
            )
            nursery.cancel_scope.cancel()

    if profile:  # cProfile of this node process (slows it down: for finding hot spots, not for figures)
        import cProfile

        # CPU time, not wall time: on a shared machine wall time charges the functions that were running
        # when the process was preempted (a sendmsg that wakes the commit helper, say)
        with cProfile.Profile(time.process_time) as prof:
            trio.run(run)
        prof.dump_stats(str(Path(profile) / f"{plan['role']}.pstats"))
    elif tracer is not None:
        assert trace_dir is not None
        try:
            trio.run(run, instruments=[tracer])
        finally:
            tracer.close()
            Path(trace_dir, f"{plan['role']}.trace.json").write_text(
                json.dumps(
                    {
                        "steps": tracer.steps,
                        "gc": tracer.collections,
                        "phase2_steps_by_task": tracer.counts,
                        "phase2_io_waits": tracer.io_waits,
                        "phase2_io_sleeps": tracer.io_sleeps,
                    }
                )
            )
    else:
        trio.run(run)


class _Tracer:
    """A Trio instrument for ``BENCH_P2P_TRACE``: long task steps and garbage collections, timestamped;
    from phase 2 on, the task steps per task name and the scheduler's waits for I/O (how many hops a
    message costs)."""

    STEP_CPU_S = 0.002
    STEP_WALL_S = 0.004

    def __init__(self) -> None:
        #: [time_ns, task name, CPU ms, wall ms]
        self.steps: list[tuple[int, str, float, float]] = []
        #: [time_ns, generation, CPU ms, objects collected]
        self.collections: list[tuple[int, int, float, int]] = []
        self._cpu = self._wall = self._gc_cpu = 0.0
        self.counts: dict[str, int] = {}
        self.io_waits = 0
        self.io_sleeps = 0
        self._counting = False
        gc.callbacks.append(self._on_gc)

    def start_counting(self) -> None:
        self._counting = True

    def before_io_wait(self, timeout: float) -> None:
        if self._counting:
            self.io_waits += 1
            if timeout > 0:
                self.io_sleeps += 1

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)

    def before_task_step(self, task: Any) -> None:
        if self._counting:
            self.counts[task.name] = self.counts.get(task.name, 0) + 1
        self._cpu = time.thread_time()
        self._wall = time.perf_counter()

    def after_task_step(self, task: Any) -> None:
        cpu = time.thread_time() - self._cpu
        wall = time.perf_counter() - self._wall
        if cpu > self.STEP_CPU_S or wall > self.STEP_WALL_S:
            self.steps.append((time.time_ns(), task.name, round(cpu * 1e3, 2), round(wall * 1e3, 2)))

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_cpu = time.thread_time()
        else:
            cpu_ms = round((time.thread_time() - self._gc_cpu) * 1e3, 2)
            self.collections.append((time.time_ns(), info["generation"], cpu_ms, info["collected"]))


@functools.cache
def _filler(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


def _body(dedup_id: str, size: int) -> bytes:
    """A message's body: its id, then filler, ``size`` bytes in all (the receiver checks every body)."""
    return (dedup_id.encode() + b"|" + _filler(size))[:size]


# --- the orchestrator ---------------------------------------------------------------------------------------


def _write_node(base: Path, creds: Any, root: Any, plan: dict[str, Any]) -> Path:
    from corda_trio import pki

    d = base / creds.legal_name.organisation
    d.mkdir()
    pki.write_certificates(d / "tls.pem", creds.tls_chain)
    pki.write_private_key(d / "tls.key", creds.tls.key, None)
    pki.write_certificates(d / "root.pem", [root])
    key_hash = pki.key_hash(creds.identity.cert.public_key())
    (d / "plan.json").write_text(json.dumps({**plan, "name": str(creds.legal_name), "key_hash": key_hash}))
    return d


def _start(d: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.p2p", "--node", str(d)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )


def _read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"a node process exited early (code {proc.wait()})")
    return json.loads(line)  # type: ignore[no-any-return]


def _pct(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, max(0, math.ceil(q * len(sorted_ns)) - 1))] / 1e6


def _start_float(base: Path, net: Any, b: Any, now: dt.datetime) -> tuple[subprocess.Popen[str], int]:
    """A float process (``corda-trio float start``) for B, and its control port; B's tunnel files."""
    from corda_trio import pki
    from corda_trio.bridge import float as fl

    tunnel = fl.TunnelPki.create(now=now)
    d = base / "float"
    d.mkdir()
    tunnel.issue("float", "bench-float", now=now).write(d, "tunnel")
    b_dir = base / b.legal_name.organisation
    tunnel.issue("bridge", "bench-bridge", now=now).write(b_dir, "tunnel")
    for where in (d, b_dir):
        pki.write_certificates(where / "tunnel-ca.pem", [tunnel.ca.cert])
    (d / "float.toml").write_text(
        '[control]\nport = 0\ncert = "tunnel.pem"\nkey = "tunnel.key"\nca = "tunnel-ca.pem"\n'
        # one peer gets the whole window (2048): link credit 1024, as the acceptor grants
        '[public]\nhost = "127.0.0.1"\nport = 0\npeer_link_window = 2048\n'
        f'[tls.node]\ncert_chain = "{b_dir}/tls.pem"\nkey = "{b_dir}/tls.key"\n'
        f'trust_root = "{b_dir}/root.pem"\n'
        '[audit]\npath = "audit.jsonl"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "corda_trio", "float", "start", "--config", str(d / "float.toml")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "control port listening" not in line:
        proc.kill()
        raise SystemExit(f"the float did not start: {line!r} (code {proc.wait()})")
    return proc, int(line.rsplit(":", 1)[1])


def run_benchmark(
    args: argparse.Namespace, *, via_float: bool = False, half_rate: float | None = None
) -> dict[str, Any]:
    """Run both phases; returns the summary (and writes records if ``args.records``).

    ``via_float``: B sits behind a float process; ``half_rate``: phase 2's rate instead of half the maximum.
    """
    from corda_trio import pki

    now = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    net = pki.NetworkCredentials.create(now=now)
    a = net.issue_node(pki.CordaX500Name.parse("O=BenchA, L=London, C=GB"), now=now)
    b = net.issue_node(pki.CordaX500Name.parse("O=BenchB, L=Paris, C=FR"), now=now)
    load_before, speed_before = load_average(), reference_cpu_ms()
    started_at = dt.datetime.now(dt.UTC)
    with tempfile.TemporaryDirectory(prefix="bench-p2p-") as tmp:
        base = Path(tmp)
        common = {"size": args.size, "messages": args.messages, "senders": args.senders}
        a_dir = _write_node(
            base, a, net.root.cert, {**common, "role": "sender", "half_seconds": args.half_seconds}
        )
        b_dir = _write_node(base, b, net.root.cert, {**common, "role": "receiver"})
        flt = None
        if via_float:
            flt, control_port = _start_float(base, net, b, now)
            b_plan = json.loads((b_dir / "plan.json").read_text())
            (b_dir / "plan.json").write_text(json.dumps({**b_plan, "float_control_port": control_port}))
        if half_rate is not None:
            a_plan = json.loads((a_dir / "plan.json").read_text())
            (a_dir / "plan.json").write_text(json.dumps({**a_plan, "half_rate": half_rate}))
        receiver = _start(b_dir)
        sender = _start(a_dir)
        try:
            float_cpu0 = cpu_with_helpers(flt.pid) if flt is not None else 0.0
            port = _read(receiver)["ready"]
            _read(sender)
            b_info = json.loads((b_dir / "plan.json").read_text())
            _tell(sender, {"name": b_info["name"], "key_hash": b_info["key_hash"], "port": port})
            _tell(receiver, {"wait_handled": _read(sender)["phase1_sent"]})
            _tell(sender, {"handled_at": _read(receiver)["handled_at"]})
            a_done = _read(sender)
            _tell(receiver, {"expect": a_done["expect"]})
            b_done = _read(receiver)
            float_cpu = cpu_with_helpers(flt.pid) - float_cpu0 if flt is not None else None
            sender.wait(60)
            receiver.wait(60)
        finally:
            for proc in (sender, receiver, flt):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
        sent = json.loads((a_dir / "sent.json").read_text())
        delivered = json.loads((b_dir / "delivered.json").read_text())
    finished_at = dt.datetime.now(dt.UTC)
    missing = sorted(set(sent["created"]) - set(delivered))
    unexpected = sorted(set(delivered) - set(sent["created"]))
    if missing or unexpected or b_done["anomaly_count"]:
        # never expected: a message lost, or handed over under another message's id, twice, or with
        # another message's body
        raise SystemExit(
            f"wrong deliveries: {len(missing)} missing {missing[:10]}, {len(unexpected)} unexpected "
            f"{unexpected[:10]}, {b_done['anomaly_count']} twice or with a wrong body {b_done['anomalies']}"
        )
    half = [k for k in sent["created"] if k.startswith("half-")]
    latencies = sorted(delivered[k] - sent["created"][k] for k in half)
    total = a_done["expect"] - 200
    summary: dict[str, Any] = {
        "scenario": "p2p-via-float" if via_float else "p2p",
        "msgs_per_s": round(a_done["phase1_msgs_per_s"], 1),
        "half_rate_msgs_per_s": round(a_done["half_rate"], 1),
        "p50_ms": round(_pct(latencies, 0.50), 3),
        "p99_ms": round(_pct(latencies, 0.99), 3),
        "max_ms": round(latencies[-1] / 1e6, 3),
        "half_messages": len(half),
        "messages": args.messages,
        "senders": args.senders,
        "size_bytes": args.size,
        "cpu_us_per_msg_sender_phase1": round(a_done["phase1_cpu_seconds"] / args.messages * 1e6, 1),
        # at half load batches are smaller and each message costs more: what the sender is busy with then
        "cpu_us_per_msg_sender_half": round(a_done["half_cpu_seconds"] / a_done["half_count"] * 1e6, 1),
        "cpu_us_per_msg_receiver_half": round(b_done["half_cpu_seconds"] / a_done["half_count"] * 1e6, 1),
        "cpu_us_per_msg_receiver_all": round(b_done["cpu_seconds"] / (total + 200) * 1e6, 1),
        "fsync": "always (group commit, commit helper process), both nodes",
        "tls": "mutual TLS, network root",
        "path": "A -> float process -> tunnel (mutual TLS, tunnel PKI) -> B" if via_float else "A -> B",
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "cpus": os.cpu_count(),
        # the whole machine during each phase (mean cores): on a virtual machine, time stolen by the
        # hypervisor for other guests is time the nodes waited for a CPU
        "steal_cores_phase1": a_done["machine_phase1"]["steal_cores"],
        "steal_cores_half": a_done["machine_half"]["steal_cores"],
        "busy_cores_half": a_done["machine_half"]["busy_cores"],
        # how fast the CPU ran Python, before and after (corda_trio.testing.reference_cpu_ms; lower is faster)
        "reference_cpu_ms": [speed_before, reference_cpu_ms()],
    }
    if float_cpu is not None:
        summary["cpu_us_per_msg_float_all"] = round(float_cpu / (total + 200) * 1e6, 1)
    if args.records is not None:
        from bench._harness import write_open_loop_run

        summary["records"] = write_open_loop_run(
            args.records,
            scenario="p2p",
            description="node A MessagingService.send -> durable outbound queue -> bridge (AMQP 1.0, "
            "mutual TLS) -> durable inbox at node B -> B's handler; open loop at half the measured maximum",
            clock="epoch ns (time.time_ns) in both processes on one machine",
            link="BenchA -> BenchB",
            size_bytes=args.size,
            params={"messages": args.messages, "senders": args.senders, "half_seconds": args.half_seconds},
            rate_per_s=summary["half_rate_msgs_per_s"],
            started_at=started_at,
            finished_at=finished_at,
            stages=[
                {"created": sent["created"][k], "enqueued": sent["enqueued"][k], "delivered": delivered[k]}
                for k in half
            ],
        )
    return summary


def _tell(proc: subprocess.Popen[str], obj: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(obj) + "\n")
    proc.stdin.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.p2p", description=__doc__.split("\n\n")[0])
    ap.add_argument("--node", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--messages", type=int, default=20000, help="messages of phase 1 (default 20000)")
    ap.add_argument("--senders", type=int, default=128, help="concurrent sending tasks (default 128)")
    ap.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    ap.add_argument("--half-seconds", type=float, default=5.0, help="length of phase 2 (default 5 s)")
    ap.add_argument("--records", type=Path, help="write one record per phase-2 message into this directory")
    ap.add_argument(
        "--rate", type=float, help="phase 2 at this offered rate (msg/s) instead of half the measured maximum"
    )
    ap.add_argument("--via-float", action="store_true", help="also run with B behind a float; compare")
    ap.add_argument(
        "--repeat", type=int, default=1, help="rounds (with --via-float: of both paths); medians (default 1)"
    )
    args = ap.parse_args(argv)
    if args.node is not None:
        _node_main(args.node)
        return 0
    if args.messages < 1 or args.senders < 1 or args.size < 0 or args.half_seconds <= 0 or args.repeat < 1:
        ap.error("--messages, --senders and --repeat must be >= 1, --size >= 0, --half-seconds > 0")
    if args.rate is not None and not (0 < args.rate < math.inf):
        ap.error(f"--rate must be a positive number of messages per second, got {args.rate}")
    if args.via_float:
        return _compare_via_float(args)
    summary = _direct_rounds(args)
    rounds = summary.get("rounds", 1)
    print(
        (f"medians of {rounds} rounds: " if rounds > 1 else "")
        + f"max sustained {summary['msgs_per_s']:,.0f} msg/s durable at the peer; at half load "
        f"({summary['half_rate_msgs_per_s']:,.0f} msg/s, open loop): p50 {summary['p50_ms']} ms, "
        f"p99 {summary['p99_ms']} ms; CPU per message: sender {summary['cpu_us_per_msg_sender_phase1']} us "
        f"(at half load {summary['cpu_us_per_msg_sender_half']}), receiver "
        f"{summary['cpu_us_per_msg_receiver_all']} us (at half load "
        f"{summary['cpu_us_per_msg_receiver_half']}); load average {summary['loadavg_before']}; cores stolen "
        f"by the hypervisor: {summary['steal_cores_phase1']} (phase 1), {summary['steal_cores_half']} "
        f"(half load); reference workload {summary['reference_cpu_ms']} ms CPU (before, after)"
    )
    print(json.dumps(summary))
    return 0


_PAIRED = ("throughput_ratio", "p99_delta_ms", "p50_delta_ms")
#: The figures of one direct round that ``--repeat`` reports as medians (and per round).
_ROUND_FIGURES = (
    "msgs_per_s", "half_rate_msgs_per_s", "p50_ms", "p99_ms", "max_ms", "cpu_us_per_msg_sender_phase1",
    "cpu_us_per_msg_sender_half", "cpu_us_per_msg_receiver_half", "cpu_us_per_msg_receiver_all",
    "steal_cores_phase1", "steal_cores_half", "busy_cores_half",
)  # fmt: skip


def _direct_rounds(args: argparse.Namespace) -> dict[str, Any]:
    """``args.repeat`` whole runs A -> B; one run's summary as it is, else the medians of the rounds'
    figures, each round's in ``per_round`` (and its records, with ``--records``, as a run of its own)."""
    rounds = [run_benchmark(args, half_rate=args.rate) for _ in range(args.repeat)]
    if len(rounds) == 1:
        return rounds[0]
    summary = dict(rounds[-1])
    for key in _ROUND_FIGURES:
        summary[key] = round(statistics.median(r[key] for r in rounds), 3)
    summary["half_messages"] = sum(r["half_messages"] for r in rounds)
    summary["loadavg_before"] = rounds[0]["loadavg_before"]
    summary["reference_cpu_ms"] = [rounds[0]["reference_cpu_ms"][0], rounds[-1]["reference_cpu_ms"][-1]]
    if "records" in summary:
        summary["records"] = [r["records"] for r in rounds]
    summary["rounds"] = len(rounds)
    summary["per_round"] = [{key: r[key] for key in _ROUND_FIGURES} for r in rounds]
    return summary


def _compare_via_float(args: argparse.Namespace) -> int:
    # Each round: via the float first, whose half rate (the lower of the two) is then offered to both paths,
    # so the latencies are compared at one load that each path sustains; then directly. With --repeat, the
    # rounds alternate the two paths and the figures are the medians of the rounds' paired ones (on a
    # shared machine a single pair swings with whatever else runs).
    rounds = []
    for _ in range(args.repeat):
        via = run_benchmark(args, via_float=True, half_rate=args.rate)
        direct = run_benchmark(args, half_rate=via["half_rate_msgs_per_s"])
        rounds.append(
            {
                "throughput_ratio": round(via["msgs_per_s"] / direct["msgs_per_s"], 3),
                "p99_delta_ms": round(via["p99_ms"] - direct["p99_ms"], 3),
                "p50_delta_ms": round(via["p50_ms"] - direct["p50_ms"], 3),
                "direct": direct,
                "via_float": via,
            }
        )
    result: dict[str, Any] = {
        "scenario": "p2p-via-float",
        **{k: round(statistics.median(r[k] for r in rounds), 3) for k in _PAIRED},
        "rounds": len(rounds),
        "half_rate_msgs_per_s": via["half_rate_msgs_per_s"],
        "direct": direct,
        "via_float": via,
    }
    if len(rounds) > 1:
        result["per_round"] = [
            {k: r[k] for k in _PAIRED}
            | {"direct_msgs_per_s": r["direct"]["msgs_per_s"], "via_msgs_per_s": r["via_float"]["msgs_per_s"],
               "direct_p99_ms": r["direct"]["p99_ms"], "via_p99_ms": r["via_float"]["p99_ms"],
               "direct_steal_cores_half": r["direct"]["steal_cores_half"],
               "via_steal_cores_half": r["via_float"]["steal_cores_half"]}
            for r in rounds
        ]  # fmt: skip
    print(
        f"direct {direct['msgs_per_s']:,.0f} msg/s, via float {via['msgs_per_s']:,.0f} msg/s "
        f"(ratio {result['throughput_ratio']}); at {via['half_rate_msgs_per_s']:,.0f} msg/s: p99 direct "
        f"{direct['p99_ms']} ms, via float {via['p99_ms']} ms (delta {result['p99_delta_ms']} ms); float CPU "
        f"{via.get('cpu_us_per_msg_float_all')} us/msg; load average {direct['loadavg_before']}"
        + (
            f"; medians of {len(rounds)} rounds: ratio {result['throughput_ratio']}, p99 delta "
            f"{result['p99_delta_ms']} ms"
            if len(rounds) > 1
            else ""
        )
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
