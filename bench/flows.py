"""Flow benchmark: PingPong flows between two node processes with durable checkpoints both sides.

    python -m bench.flows [--flows 5000] [--concurrency 256] [--rounds 1] [--open-seconds 5] [--records DIR]
                          [--no-bundle]

Node A (initiator) and node B (responder) each run the full stack (``corda_trio.testing._flow_process``): a
store broker (fsync ``always``, group commit in the commit helper process), the messaging service, the inbound
acceptor and the bridge manager (AMQP 1.0 over mutual TLS on 127.0.0.1), and the flow manager, whose
checkpoints go to the store's keyed log. One flow = one session init, ``--rounds`` round trips (one by
default), a checkpoint per transition on each side. Two phases, both in node A:

1. **Closed loop**: ``--flows`` flows with at most ``--concurrency`` running; throughput = flows / wall time.
2. **Open loop** at half the closed-loop throughput for ``--open-seconds`` (a flow starts at its intended time
   whatever the others do); latency = finished - intended.

CPU per flow on each side is the process's CPU time plus its commit helper's (from /proc) during the phase.
With ``--records DIR`` one record per open-loop flow is written (``protocol_spec/bench-records.md``) for
``corda-trio report``. The last line printed is one JSON object (``flows_per_s``, ``p50_ms``, ``p99_ms``, CPU
per flow each side, the load average before and after, and the mean cores of the machine that a hypervisor
stole for other guests in each phase, ``steal_cores_closed`` / ``steal_cores_open``: the machine may be
shared, which moves the figures; and ``reference_cpu_ms``, the CPU time of a fixed pure-Python workload before
and after the run, ``corda_trio.testing.reference_cpu_ms``: a virtual CPU can run slower on one day than on
another without any stolen time, and CPU per flow scales with it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._harness import write_open_loop_run
from corda_trio import messaging, pki, testing
from corda_trio.testing import MachineCpu, cpu_with_helpers, load_average, reference_cpu_ms

REPO = Path(__file__).resolve().parent.parent
A_NAME, B_NAME = "O=FlowBenchA, L=London, C=GB", "O=FlowBenchB, L=Paris, C=FR"


def _peer(name: str, key_hash: str, port: int) -> messaging.Peer:
    legal_name = pki.CordaX500Name.parse(name)
    return messaging.Peer(legal_name=legal_name, key_hash=key_hash, addresses=[("127.0.0.1", port)])


def _write_node(base: Path, creds: Any, root: Any, plan: dict[str, Any]) -> tuple[Path, str]:
    from corda_trio import pki

    d = base / creds.legal_name.organisation
    d.mkdir()
    (d / "name").write_text(str(creds.legal_name))
    pki.write_certificates(d / "tls.pem", creds.tls_chain)
    pki.write_private_key(d / "tls.key", creds.tls.key, None)
    pki.write_certificates(d / "identity.pem", creds.identity_chain)
    pki.write_certificates(d / "root.pem", [root])
    if plan:
        (d / "plan.json").write_text(json.dumps(plan))
    return d, pki.key_hash(creds.identity.cert.public_key())


def _start(d: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "corda_trio.testing._flow_process", str(d), "run"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"a node process exited early (code {proc.wait()})")
    return line.strip()


def _pct(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, max(0, math.ceil(q * len(sorted_ns)) - 1))] / 1e6


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from corda_trio import pki

    now = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    net = pki.NetworkCredentials.create(now=now)
    a = net.issue_node(pki.CordaX500Name.parse(A_NAME), now=now)
    b = net.issue_node(pki.CordaX500Name.parse(B_NAME), now=now)
    load_before, speed_before = load_average(), reference_cpu_ms()
    started_at = dt.datetime.now(dt.UTC)
    common = {
        "flow": "PingPong", "args": {"recipient": B_NAME, "rounds": args.rounds}, "wait_for_peers": 1,
        "bundle": not args.no_bundle,
    }  # fmt: skip
    plan = {
        **common,
        "phases": [
            {"prefix": "warm-", "count": 200, "concurrency": min(64, args.concurrency)},
            {"prefix": "closed-", "count": args.flows, "concurrency": args.concurrency},
            {"prefix": "open-", "count": -1, "rate_factor": 0.5, "seconds": args.open_seconds},
        ],
    }
    with tempfile.TemporaryDirectory(prefix="bench-flows-") as tmp:
        base = Path(tmp)
        a_dir, a_hash = _write_node(base, a, net.root.cert, {})
        b_dir, b_hash = _write_node(base, b, net.root.cert, {"bundle": not args.no_bundle})
        procs: list[subprocess.Popen[str]] = []
        try:
            responder = _start(b_dir)
            procs.append(responder)
            b_port = int(_line(responder).split()[1])
            b_peer = _peer(B_NAME, b_hash, b_port)
            testing.write_peer_file(base / "peers.json", [b_peer, _peer(A_NAME, a_hash, 0)])
            (a_dir / "plan.json").write_text(json.dumps(plan))
            initiator = _start(a_dir)
            procs.append(initiator)
            a_port = int(_line(initiator).split()[1])
            testing.write_peer_file(base / "peers.json", [b_peer, _peer(A_NAME, a_hash, a_port)])
            phases: dict[int, dict[str, Any]] = {}
            b_cpu: dict[int, float] = {}
            machine: dict[int, Any] = {}  # phase -> the whole machine's CPU (a snapshot, then the means)
            while True:
                line = _line(initiator)
                if line == "done":
                    break
                words = line.split(" ", 3)
                k = int(words[1])
                if words[2] == "start":
                    b_cpu[k] = cpu_with_helpers(responder.pid)
                    machine[k] = MachineCpu()
                elif words[2] == "done":
                    b_cpu[k] = cpu_with_helpers(responder.pid) - b_cpu[k]
                    machine[k] = MachineCpu().since(machine[k])
                    phases[k] = json.loads(words[3])
            closed = phases[1]
            open_ = phases[2]
            lat = json.loads((a_dir / "latencies-2.json").read_text())
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    finished_at = dt.datetime.now(dt.UTC)
    ends = sorted(t[3] - t[1] for t in lat)
    summary: dict[str, Any] = {
        "scenario": "flows",
        "flows_per_s": round(closed["flows"] / closed["seconds"], 1),
        "open_rate_flows_per_s": round(open_["rate"], 1),
        "open_flows": len(lat),
        "p50_ms": round(_pct(ends, 0.50), 3),
        "p99_ms": round(_pct(ends, 0.99), 3),
        "max_ms": round(ends[-1] / 1e6, 3),
        "closed_flows": closed["flows"],
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "bundles": not args.no_bundle,
        "cpu_ms_per_flow_initiator": round(closed["cpu_seconds"] / closed["flows"] * 1e3, 3),
        "cpu_ms_per_flow_responder": round(b_cpu[1] / closed["flows"] * 1e3, 3),
        "fsync": "always (group commit, commit helper process), both nodes; checkpoints in the keyed log",
        "tls": "mutual TLS, network root",
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "cpus": os.cpu_count(),
        # mean cores of the machine stolen by the hypervisor (for other guests) in the closed and open phases
        "steal_cores_closed": machine[1]["steal_cores"],
        "steal_cores_open": machine[2]["steal_cores"],
        # how fast the CPU ran Python, before and after (corda_trio.testing.reference_cpu_ms; lower is faster)
        "reference_cpu_ms": [speed_before, reference_cpu_ms()],
    }
    if args.records is not None:
        summary["records"] = write_open_loop_run(
            args.records,
            scenario="flows",
            description="PingPong flows A -> B (session init, round trips, durable checkpoints both sides), "
            "open loop at half the closed-loop throughput",
            clock="epoch ns (time.time_ns) in node A",
            link="FlowBenchA -> FlowBenchB",
            size_bytes=0,
            params={"flows": args.flows, "concurrency": args.concurrency, "rounds": args.rounds},
            rate_per_s=summary["open_rate_flows_per_s"],
            started_at=started_at,
            finished_at=finished_at,
            stages=[{"created": intended, "enqueued": started, "flow_finished": finished}
                    for _i, intended, started, finished in lat],
        )  # fmt: skip
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.flows", description=__doc__.split("\n\n")[0])
    ap.add_argument("--flows", type=int, default=5000, help="flows of the closed-loop phase (default 5000)")
    ap.add_argument("--concurrency", type=int, default=256, help="closed-loop flows at once (default 256)")
    ap.add_argument("--rounds", type=int, default=1, help="round trips per flow (default 1)")
    ap.add_argument(
        "--open-seconds", type=float, default=5.0, help="length of the open-loop phase (default 5 s)"
    )
    ap.add_argument("--records", type=Path, help="write one record per open-loop flow into this directory")
    ap.add_argument(
        "--no-bundle",
        action="store_true",
        help="one P2P message per session message (the flow manager's bundle=False), for comparison",
    )
    args = ap.parse_args(argv)
    if args.flows < 1 or args.concurrency < 1 or args.rounds < 1 or args.open_seconds <= 0:
        ap.error("--flows, --concurrency and --rounds must be >= 1, --open-seconds > 0")
    summary = run_benchmark(args)
    print(
        f"closed loop {summary['flows_per_s']:,.0f} flows/s; open loop at "
        f"{summary['open_rate_flows_per_s']:,.0f} flows/s: p50 {summary['p50_ms']} ms, "
        f"p99 {summary['p99_ms']} ms; CPU per flow: initiator "
        f"{summary['cpu_ms_per_flow_initiator']} ms, responder {summary['cpu_ms_per_flow_responder']} ms"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
