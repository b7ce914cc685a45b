"""AMQP link throughput: ours -> ours versus Proton -> Proton, 1 KiB unsettled messages, mutual TLS, loopback.

    python -m bench.amqp_link [-n 20000] [--runs 3] [--size 1024] [--json out.json]

Each pair runs as two processes (sender, receiver) on 127.0.0.1 with mutual TLS from a throwaway CA (trustme).
The sender sends ``n`` unsettled messages (one Data body of ``size`` bytes + application properties) and
waits until every one is accepted; the receiver accepts each (credit 1000 on both sides). Reported per run:
messages per second (first transfer -> last outcome, measured in the sender) and CPU microseconds per
message of each process (from /proc, so a busy machine is visible as lower throughput but similar CPU).
The median run of each pair is compared at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROTON = HERE / "_proton_link.py"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_certs(d: Path) -> None:
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    for role, names in (("server", ("localhost", "127.0.0.1")), ("client", ("bench-client.example",))):
        leaf = ca.issue_cert(*names)
        leaf.private_key_pem.write_to_path(str(d / f"{role}.key"))
        (d / f"{role}.pem").write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))


def our_context(certs: Path, role: str) -> ssl.SSLContext:
    purpose = ssl.Purpose.CLIENT_AUTH if role == "server" else ssl.Purpose.SERVER_AUTH
    ctx = ssl.create_default_context(purpose, cafile=str(certs / "ca.pem"))
    ctx.load_cert_chain(str(certs / f"{role}.pem"), str(certs / f"{role}.key"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


# --- our two halves ---------------------------------------------------------------------------------------


def our_server(port: int, certs: Path) -> None:
    import trio

    from corda_trio import transport
    from corda_trio.testing import QueueBroker

    async def main() -> None:
        broker = QueueBroker(discard=True, credit=1000)
        serve = functools.partial(
            transport.serve_amqp, broker.handle, port, ssl_context=our_context(certs, "server")
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(serve)
            print("READY", flush=True)

    trio.run(main)


def our_client(port: int, certs: Path, n: int, size: int) -> None:
    import trio

    from corda_trio import amqp, transport

    async def main() -> None:
        body = b"x" * size
        async with transport.open_amqp_connection(
            "127.0.0.1", port, ssl_context=our_context(certs, "client"), server_hostname="localhost"
        ) as conn:
            sender = await conn.open_sender("bench")
            outstanding: list[transport.PendingDelivery] = []
            t0 = time.perf_counter()
            accepted = 0
            for i in range(n):
                msg = amqp.Message(application_properties={"seq": i, "platform-topic": "bench"}, body=body)
                try:
                    pending = sender.send_nowait(msg)
                except trio.WouldBlock:
                    # out of credit: collect outcomes (this also lets the writer flush), then wait for credit
                    for p in outstanding:
                        accepted += await p.outcome() == amqp.Accepted()
                    outstanding.clear()
                    pending = await sender.start_send(msg)
                assert pending is not None
                outstanding.append(pending)
                if len(outstanding) >= 512:
                    # a window of 512 in flight: wait for the oldest half (the writer flushes meanwhile)
                    for p in outstanding[:256]:
                        accepted += await p.outcome() == amqp.Accepted()
                    del outstanding[:256]
            for p in outstanding:
                accepted += await p.outcome() == amqp.Accepted()
            seconds = time.perf_counter() - t0
        print(json.dumps({"messages": accepted, "seconds": seconds}), flush=True)

    trio.run(main)


# --- driver -----------------------------------------------------------------------------------------------


def run_pair(pair: str, n: int, size: int, certs: Path) -> dict[str, Any]:
    port = free_port()
    # Both pairs take the same arguments: ours is this module, Proton's is bench/_proton_link.py.
    program = [sys.executable, "-m", "bench.amqp_link"] if pair == "ours" else [sys.executable, str(PROTON)]
    server_role, client_role = ("_server", "_client") if pair == "ours" else ("server", "client")
    endpoint = ["--port", str(port), "--certs", str(certs)]
    server_cmd = [*program, server_role, *endpoint]
    client_cmd = [*program, client_role, *endpoint, "-n", str(n), "--size", str(size)]
    cwd = HERE.parent
    server = subprocess.Popen(server_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if b"READY" not in line:
            raise RuntimeError(f"{pair} server failed: {line!r} {server.stderr.read()[-2000:]!r}")  # type: ignore[union-attr]
        server_cpu0 = cpu_seconds(server.pid)
        client = subprocess.Popen(client_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)
        client_cpu = 0.0
        while client.poll() is None:
            client_cpu = cpu_seconds(client.pid)
            time.sleep(0.05)
        out, err = client.communicate()
        server_cpu = cpu_seconds(server.pid) - server_cpu0
        lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
        if client.returncode != 0 or not lines:
            raise RuntimeError(f"{pair} client failed: {err.decode()[-2000:]}")
        result = json.loads(lines[-1])
    finally:
        server.terminate()
        server.wait(10)
    if result["messages"] != n:
        raise RuntimeError(f"{pair}: only {result['messages']} of {n} accepted")
    return {
        "pair": pair,
        "messages": n,
        "size_bytes": size,
        "seconds": round(result["seconds"], 3),
        "msgs_per_s": round(n / result["seconds"]),
        "sender_cpu_us_per_msg": round(client_cpu / n * 1e6, 1),
        "receiver_cpu_us_per_msg": round(server_cpu / n * 1e6, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", default="bench", choices=["bench", "_server", "_client"])
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int)
    ap.add_argument("--certs", type=Path)
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()
    if args.role == "_server":
        our_server(args.port, args.certs)
        return
    if args.role == "_client":
        our_client(args.port, args.certs, args.n, args.size)
        return
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp)
        make_certs(certs)
        runs: list[dict[str, Any]] = []
        for i in range(args.runs):
            for pair in ("ours", "proton"):
                r = run_pair(pair, args.n, args.size, certs)
                r["run"] = i
                runs.append(r)
                print(json.dumps(r), flush=True)
    summary: dict[str, Any] = {"runs": runs, "loadavg": os.getloadavg()[0]}
    for pair in ("ours", "proton"):
        mine = [r for r in runs if r["pair"] == pair]
        summary[pair] = {
            k: statistics.median(r[k] for r in mine)
            for k in ("msgs_per_s", "sender_cpu_us_per_msg", "receiver_cpu_us_per_msg")
        }
    summary["speedup"] = round(summary["ours"]["msgs_per_s"] / summary["proton"]["msgs_per_s"], 2)
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
