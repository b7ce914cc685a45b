"""Soak a real local network and sample what a long-running node holds: ``python -m tests.node.soak``.

A map service and three ``corda-trio node start`` processes (Alice, Bob, Carol) are driven for
``--minutes`` with a steady mix: PingPong and Broadcast flows between every pair, plain P2P messages
dialled into each inbox with a member's own TLS identity, RPC clients that connect, log in, call and
disconnect over and over, Carol stopped with SIGTERM for ``--outage`` seconds and started again, and a
flow whose responder fails (parked) and is then killed. Every ``--interval`` seconds it records per node
(:func:`sample_node`): RSS, open descriptors and threads of the node and of its store's commit helper,
bytes and files per directory under the base directory, the number of ``/metrics`` series and the log
files. One JSON line per sample goes to ``--out``, a line per sample to stdout, and at the end the
second sample (the first under load) and the last one of each node side by side (:func:`curves`).

:func:`sample_node` and :func:`metrics_series` are for tests too (a bounded run of some cycle, then the
same numbers again).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from corda_trio import amqp, messaging, rpc
from corda_trio.node._processes import NodeProcess, open_node_processes, start_node_process

from .cli_helpers import descendants
from .netutil import PASSWORD, make_network, open_inbox_sender, open_map_process
from .parking_flows import MODULE, node_env

#: unlabelled /metrics gauges recorded with each sample (what the node holds in memory)
WATCHED_GAUGES = frozenset(
    f"corda_trio_{n}"
    for n in ("p2p_dedup_ids", "flows_running", "flows_parked", "flows_responders", "rpc_connections")
)
NAMES = ("O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR", "O=Carol,L=New York,C=US")


def process_numbers(pid: int) -> dict[str, int]:
    """RSS (KiB), open descriptors and threads of a live process, from ``/proc``."""
    out = {"rss_kib": 0, "fds": 0, "threads": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_kib"] = int(line.split()[1])
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return out


def directory_usage(base: Path, depth: int = 3) -> dict[str, tuple[int, int]]:
    """(bytes, files) of every directory under ``base`` down to ``depth`` levels, counting everything
    below it; keys are paths relative to ``base`` (``.`` for the whole)."""
    usage: dict[str, list[int]] = {}
    for root, _dirs, files in os.walk(base):
        rel = Path(root).relative_to(base)
        size = 0
        for name in files:
            try:
                size += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
        parts = rel.parts
        for n in range(min(len(parts), depth) + 1):
            key = "/".join(parts[:n]) or "."
            entry = usage.setdefault(key, [0, 0])
            entry[0] += size
            entry[1] += len(files)
    return {k: (v[0], v[1]) for k, v in usage.items()}


async def fetch_metrics(url: str) -> str:
    """The text of a ``/metrics`` page (``http://host:port/metrics``)."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: soak\r\nconnection: close\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data.partition(b"\r\n\r\n")[2].decode()


def metrics_series(text: str) -> dict[str, int]:
    """Series (sample lines) per metric family name of a Prometheus text page."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0) + 1
    return out


async def sample_node(node: NodeProcess) -> dict[str, Any]:
    """One sample of a running node process (see the module docstring)."""
    pid = node.process.pid
    helpers = sorted(descendants(pid))
    base = node.config.base_directory
    sample: dict[str, Any] = {
        "t": time.time(),
        "node": process_numbers(pid),
        "helpers": [process_numbers(p) for p in helpers],
        "dirs": directory_usage(base),
        "logs": sorted((p.name, p.stat().st_size) for p in node.config.log_path.parent.iterdir()),
    }
    if node.metrics_url:
        try:
            text = await fetch_metrics(node.metrics_url)
            series = metrics_series(text)
            sample["series"] = sum(series.values())
            sample["series_by_family"] = series
            sample["gauges"] = {
                name: float(value)
                for name, _, value in (line.partition(" ") for line in text.splitlines())
                if name in WATCHED_GAUGES
            }
        except OSError as exc:
            sample["series"] = f"unreachable: {exc}"
    return sample


async def send_plain(sender_cfg: Any, victim: NodeProcess, count: int, tag: str) -> None:
    """Dial ``victim``'s P2P port as ``sender_cfg``'s node and send ``count`` plain messages to its inbox
    (a topic no flow handles, each with its own dedup id)."""
    async with open_inbox_sender(sender_cfg, victim) as sender:
        for i in range(count):
            out = messaging.OutgoingMessage(topic="soak.plain", data=b"x" * 200, dedup_id=f"{tag}-{i}")
            message = messaging.to_amqp(
                out, platform_version=1, release_version="0.1.0", sender_uuid="soak", send_seq_no=i
            )
            outcome = await sender.send(message)
            assert isinstance(outcome, amqp.Accepted), outcome


class Soak:
    def __init__(self, net: Path, minutes: float, interval: float, outage: float, out: Path) -> None:
        self.net, self.minutes, self.interval, self.outage, self.out = net, minutes, interval, outage, out
        self.counts: dict[str, int] = {}
        self.errors: dict[str, str] = {}
        self.nodes: list[NodeProcess] = []
        self.carol_up = trio.Event()
        self.carol_up.set()
        self.samples: list[dict[str, Any]] = []
        self.paths: list[Path] = []

    def count(self, what: str, error: BaseException | None = None) -> None:
        key = what if error is None else f"{what}: error"
        self.counts[key] = self.counts.get(key, 0) + 1
        if error is not None:
            self.errors[what] = f"{type(error).__name__}: {error}"[:300]

    async def flows(self, i: int, j: int) -> None:
        dst = NAMES[j]
        while True:
            if 2 in (i, j):
                await self.carol_up.wait()
            try:
                with trio.fail_after(60):
                    async with rpc.connect(self.nodes[i].rpc_url, "ops", PASSWORD) as client:
                        for _ in range(20):
                            assert await client.start_flow("PingPong", recipient=dst, rounds=3) == 3
                            self.count("pingpong")
                            others = [n for k, n in enumerate(NAMES) if k != i]
                            await client.start_flow("Broadcast", recipients=others, message="soak")
                            self.count("broadcast")
            except Exception as exc:
                self.count("flows", exc)
                await trio.sleep(1)

    async def plain(self) -> None:
        n = 0
        while True:
            await self.carol_up.wait()
            for i, node in enumerate(self.nodes):
                sender_cfg = self.nodes[(i + 1) % 3].config
                try:
                    with trio.fail_after(30):
                        await send_plain(sender_cfg, node, 20, f"plain-{n}")
                    self.count("plain", None)
                except Exception as exc:
                    self.count("plain", exc)
                n += 1
            await trio.sleep(1)

    async def rpc_churn(self) -> None:
        while True:
            for node in list(self.nodes):
                try:
                    with trio.fail_after(30):
                        async with rpc.connect(node.rpc_url, "reader", PASSWORD) as client:
                            await client.ping()
                            await client.node_info()
                    self.count("rpc-session")
                except Exception as exc:
                    self.count("rpc-session", exc)
                try:
                    with trio.fail_after(30):
                        async with rpc.connect(node.rpc_url, "ops", "wrong password"):
                            pass
                except rpc.RpcError:
                    self.count("rpc-bad-login")
                except Exception as exc:
                    self.count("rpc-bad-login", exc)
            await trio.sleep(0.2)

    async def parked(self) -> None:
        """Alice asks Bob with a first value his responder cannot read: parked on Bob, then killed."""
        while True:
            await trio.sleep(5)
            try:
                with trio.fail_after(60):
                    async with (
                        rpc.connect(self.nodes[0].rpc_url, "ops", PASSWORD) as a,
                        rpc.connect(self.nodes[1].rpc_url, "ops", PASSWORD) as b,
                    ):
                        flow_id = await a.launch_flow("AskDouble", recipient=NAMES[1], first="abc")
                        while not (parked := await b.list_flows("parked")):  # noqa: ASYNC110
                            await trio.sleep(0.2)
                        for p in parked:
                            await b.kill_flow(p["flow_id"])
                        events = [e async for e in a.watch_flow(flow_id)]
                        self.count(f"parked-killed ({events[-1]['state']})")
            except Exception as exc:
                self.count("parked", exc)

    async def outage_cycle(self, start_after: float) -> None:
        await trio.sleep(start_after)
        carol = self.nodes[2]
        self.carol_up = trio.Event()
        code = await carol.stop(signal.SIGTERM)
        self.count(f"carol-sigterm-exit-{code}")
        await trio.sleep(self.outage)
        self.nodes[2] = await start_node_process(self.paths[2], carol.config, env=node_env())
        self.carol_up.set()
        self.count("carol-restarted")

    async def sampler(self) -> None:
        with open(self.out, "a", encoding="utf-8") as f:  # noqa: ASYNC230
            while True:
                row: dict[str, Any] = {"counts": dict(self.counts), "errors": dict(self.errors)}
                for name, node in zip(("alice", "bob", "carol"), self.nodes, strict=True):
                    if node.process.returncode is None:
                        row[name] = await sample_node(node)
                self.samples.append(row)
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(summary_line(row), flush=True)
                await trio.sleep(self.interval)

    async def run(self) -> None:
        configs = make_network(self.net, NAMES, with_map=True, flows_modules=(MODULE,))
        async with open_map_process(self.net, max_age_seconds=2):
            started: list[NodeProcess] = []
            try:
                async with open_node_processes(configs, env=node_env()) as nodes:
                    self.paths = [path for path, _cfg in configs]
                    self.nodes = list(nodes)
                    started.extend(nodes)
                    async with rpc.connect(nodes[0].rpc_url, "ops", PASSWORD) as a:
                        with trio.fail_after(60):
                            while len(await a.network_map()) < 3:  # noqa: ASYNC110
                                await trio.sleep(0.2)
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self.sampler)
                        for i in range(3):
                            for j in range(3):
                                if i != j:
                                    nursery.start_soon(self.flows, i, j)
                        nursery.start_soon(self.plain)
                        nursery.start_soon(self.rpc_churn)
                        nursery.start_soon(self.parked)
                        nursery.start_soon(self.outage_cycle, self.minutes * 60 / 3)
                        await trio.sleep(self.minutes * 60)
                        nursery.cancel_scope.cancel()
                    # a last sample after the load stopped (quiet)
                    await trio.sleep(self.interval)
                    with open(self.out, "a", encoding="utf-8") as f:  # noqa: ASYNC230
                        row = {"counts": dict(self.counts), "errors": dict(self.errors), "quiet": True}
                        for name, node in zip(("alice", "bob", "carol"), self.nodes, strict=True):
                            row[name] = await sample_node(node)
                        self.samples.append(row)
                        f.write(json.dumps(row) + "\n")
                        print(summary_line(row), flush=True)
            finally:
                # a Carol started again is not open_node_processes' to stop
                with trio.CancelScope(shield=True):
                    for node in self.nodes:
                        if node not in started:
                            await node.stop()


def summary_line(row: dict[str, Any]) -> str:
    parts = []
    for name in ("alice", "bob", "carol"):
        s = row.get(name)
        if s is None:
            parts.append(f"{name}: down")
            continue
        n, d = s["node"], s["dirs"]
        store = d.get("store", (0, 0))
        parts.append(
            f"{name}: rss {n['rss_kib'] // 1024}M fds {n['fds']} thr {n['threads']} "
            f"helper {[h['rss_kib'] // 1024 for h in s['helpers']]}M "
            f"disk {d['.'][0] // 1024}K/{d['.'][1]}f store {store[0] // 1024}K/{store[1]}f "
            f"series {s.get('series')} log {sum(sz for _n, sz in s['logs']) // 1024}K "
            f"{ {k.removeprefix('corda_trio_'): int(v) for k, v in s.get('gauges', {}).items()} }"
        )
    return f"{time.strftime('%H:%M:%S')} " + " | ".join(parts) + f" | {row['counts']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=6)
    parser.add_argument("--interval", type=float, default=10)
    parser.add_argument("--outage", type=float, default=60)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("soak.jsonl"))
    args = parser.parse_args()
    net = args.dir or Path(tempfile.mkdtemp(prefix="soak-")) / "net"
    print(f"network in {net}; samples to {args.out}", flush=True)
    soak = Soak(net, args.minutes, args.interval, args.outage, args.out)
    try:
        trio.run(soak.run)
    finally:
        print(curves(soak.samples))


def curves(samples: list[dict[str, Any]]) -> str:
    """The second sample (under load) and the last one of each node, side by side."""
    lines = []
    for name in ("alice", "bob", "carol"):
        rows = [r[name] for r in samples if name in r]
        if len(rows) < 2:
            continue
        first, last = rows[1], rows[-1]
        dirs = sorted(last["dirs"].items())
        numbers = {
            "rss_kib": (first["node"]["rss_kib"], last["node"]["rss_kib"]),
            "fds": (first["node"]["fds"], last["node"]["fds"]),
            "threads": (first["node"]["threads"], last["node"]["threads"]),
            "helper_rss_kib": tuple(sum(h["rss_kib"] for h in r["helpers"]) for r in (first, last)),
            "series": (first.get("series"), last.get("series")),
            "files": (first["dirs"]["."][1], last["dirs"]["."][1]),
            **{f"bytes {k}": (first["dirs"].get(k, (0, 0))[0], size) for k, (size, _n) in dirs},
            **{k: (first.get("gauges", {}).get(k), v) for k, v in last.get("gauges", {}).items()},
        }
        lines.append(f"{name}: " + "; ".join(f"{k} {a} -> {b}" for k, (a, b) in numbers.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
