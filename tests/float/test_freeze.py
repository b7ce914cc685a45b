"""Real processes frozen with SIGSTOP (and killed with SIGKILL) under a running sender: a float, its inside.

A frozen process keeps its sockets: the kernel still completes TCP handshakes on its listeners and buffers
what peers send, but nothing answers. So a frozen peer is seen only through the AMQP idle timeout (set to
``IDLE_TIMEOUT_SECONDS`` here, in float.toml ``[control]`` / ``[public]`` and in the nodes' bridges and
tunnel, instead of the default 10 s; advertised halved): the inside fails over from a frozen float, and a
float whose inside is frozen closes its public port, each within that timeout and a margin. Nothing a
frozen process held was settled, so the sender's bridge sends it again, and the ledger
(``test_processes.dump``: the receiver's committed handler receipts) must still be exactly messages
0..N-1, each once, in order.

Knob: ``FLOAT_FREEZE_ROUNDS`` (default 20) for the loop of random kills and freezes.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest
import trio

from corda_trio import pki
from corda_trio.bridge import float as fl
from tests.p2p_harness import wait_until
from tests.ports import free_port

from .test_processes import (
    FloatProc,
    Proc,
    dump,
    last_sent,
    listening,
    publish_sender_first,
    start_float,
    tcp_sockets,
    write_float,
    write_node,
)

pytestmark = [pytest.mark.slow, pytest.mark.crash]

#: the AMQP idle timeout of every connection here (the default is 10 s): heartbeats every 0.5 s
IDLE_TIMEOUT_SECONDS = 2.0
#: a freeze is noticed within the idle timeout plus room for a loaded 2-core machine (the silent side's
#: close is not waited for)
NOTICED_WITHIN_SECONDS = IDLE_TIMEOUT_SECONDS + 3.0


def freeze(proc: Proc) -> None:
    assert proc.process is not None
    proc.process.send_signal(signal.SIGSTOP)


def thaw(proc: Proc) -> None:
    assert proc.process is not None and proc.process.returncode is None
    proc.process.send_signal(signal.SIGCONT)


def closed_reasons(flt: FloatProc) -> list[str]:
    return [str(e["reason"]) for e in flt.audit() if e["event"] == "public-closed"]


async def start_sender(
    tmp_path: Path,
    nursery: trio.Nursery,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    root: object,
    floats: list[FloatProc],
    plan: dict[str, object],
) -> Proc:
    a = write_node(
        tmp_path,
        alice,
        root,
        send={"to": str(bob.legal_name), **plan},
        idle_timeout_seconds=IDLE_TIMEOUT_SECONDS,
    )
    await a.start(nursery)
    alice_port = int((await a.wait_line(lambda x: x.startswith("ready "))).split()[1])
    await publish_sender_first(
        tmp_path, (alice, [alice_port]), [(alice, [alice_port]), (bob, [f.public_port for f in floats])]
    )
    return a


async def test_a_frozen_inside_closes_the_public_port_and_reactivation_reopens_it(
    tmp_path: Path,
    network: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tunnel: fl.TunnelPki,
) -> None:
    """SIGSTOP the node behind the float mid-stream: the float notices the silent control link by its idle
    timeout, closes its public port and says why; SIGCONT: the node activates it again, and it reopens."""
    n = 3000
    root = network.root.cert
    fa = write_float(tmp_path, "float-a", tunnel, bob, root, idle_timeout_seconds=IDLE_TIMEOUT_SECONDS)
    b = a = Proc([])
    async with trio.open_nursery() as nursery:
        try:
            await start_float(fa, nursery)
            b = write_node(
                tmp_path,
                bob,
                root,
                tunnel=tunnel,
                floats=[fa],
                expect=n,
                idle_timeout_seconds=IDLE_TIMEOUT_SECONDS,
            )
            await b.start(nursery)
            await b.wait_line(lambda x: x.startswith("active "))
            plan = {"count": n, "batch": 50, "interval": 0.05}
            a = await start_sender(tmp_path, nursery, alice, bob, root, [fa], plan)
            with trio.fail_after(120):
                await wait_until(lambda: last_sent(a) >= n // 3)
            mark = len(fa.lines)
            freeze(b)
            line = await fa.wait_line(
                lambda x: "public listener closed" in x, after=mark, within=NOTICED_WITHIN_SECONDS
            )
            assert not listening(fa.public_port)
            # the reason names the silent inside, not "ExceptionGroup: Exceptions from Trio nursery"
            assert "no frame received" in line, line
            assert f"(idle timeout {IDLE_TIMEOUT_SECONDS * 1000:.0f} ms," in line, (
                line
            )  # float.toml's, not 10 s
            assert "no frame received" in closed_reasons(fa)[-1]
            seen = len(b.lines)
            thaw(b)
            await b.wait_line(lambda x: x.startswith("active "), after=seen, within=NOTICED_WITHIN_SECONDS)
            await fa.wait_line(lambda x: "public listener open" in x, after=mark)
            assert listening(fa.public_port)
            await b.wait_line(lambda x: x == "done", within=300)
            await a.wait_line(lambda x: x == "done", within=60)
        finally:
            for p in (a, b, fa):
                await p.kill()
            nursery.cancel_scope.cancel()
    assert await dump(b) == [[f"Alice-{i}", str(i)] for i in range(n)]


async def test_a_frozen_active_float_is_replaced_and_closes_its_public_port_when_thawed(
    tmp_path: Path,
    network: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tunnel: fl.TunnelPki,
) -> None:
    """SIGSTOP the active float mid-stream: the inside notices its silent control link by the idle timeout
    and activates the standby, and the sender's bridge follows (its own idle timeout ends its connection to
    the frozen float; the next address in the network map entry is the standby's). SIGCONT: the old float
    finds its control link gone and closes its public port, having settled nothing it could not forward."""
    n = 3000
    root = network.root.cert
    fa = write_float(tmp_path, "float-a", tunnel, bob, root, idle_timeout_seconds=IDLE_TIMEOUT_SECONDS)
    fb = write_float(tmp_path, "float-b", tunnel, bob, root, idle_timeout_seconds=IDLE_TIMEOUT_SECONDS)
    b = a = Proc([])
    async with trio.open_nursery() as nursery:
        try:
            await start_float(fa, nursery)
            await start_float(fb, nursery)
            b = write_node(
                tmp_path,
                bob,
                root,
                tunnel=tunnel,
                floats=[fa, fb],
                expect=n,
                idle_timeout_seconds=IDLE_TIMEOUT_SECONDS,
            )
            await b.start(nursery)
            line = await b.wait_line(lambda x: x.startswith("active "))
            assert int(line.split()[2]) == fa.public_port
            plan = {"count": n, "batch": 50, "interval": 0.05}
            a = await start_sender(tmp_path, nursery, alice, bob, root, [fa, fb], plan)
            with trio.fail_after(120):
                await wait_until(lambda: last_sent(a) >= n // 3)
            seen = len(b.lines)
            freeze(fa)
            line = await b.wait_line(
                lambda x: x.startswith("active "), after=seen, within=NOTICED_WITHIN_SECONDS
            )
            assert int(line.split()[2]) == fb.public_port
            mark = len(fa.lines)
            thaw(fa)
            line = await fa.wait_line(lambda x: "public listener closed" in x, after=mark, within=10)
            assert "ExceptionGroup" not in line, line
            assert not listening(fa.public_port)
            assert listening(fb.public_port)
            await b.wait_line(lambda x: x == "done", within=300)
            await a.wait_line(lambda x: x == "done", within=60)
        finally:
            for p in (a, b, fa, fb):
                await p.kill()
            nursery.cancel_scope.cancel()
    assert await dump(b) == [[f"Alice-{i}", str(i)] for i in range(n)]
    assert any(e["event"] == "link-attached" for e in fb.audit())  # the sender did reach the standby


async def test_a_standby_thawed_after_a_long_freeze_is_activated_within_the_tunnels_short_backoff(
    tmp_path: Path,
    network: pki.NetworkCredentials,
    bob: pki.NodeCredentials,
    tunnel: fl.TunnelPki,
) -> None:
    """kill -9 of the active float while the standby is frozen: every round of the node's tunnel fails (the
    frozen float's kernel completes the TCP connect, nothing answers TLS, so each costs the handshake
    timeout) and the rounds back off. SIGCONT of the standby after the fifth failed round: it is activated
    within one capped backoff (``TUNNEL_MAX_BACKOFF_SECONDS``) and a round, not after the 16 s (then 32 s,
    then 60 s) the bridges' backoff would wait by then. The node's tunnel keeps its default backoff here; its
    handshake timeout is 1 s (``[float] handshake_timeout_seconds``) to keep the rounds short."""
    handshake = 1.0
    root = network.root.cert
    fa = write_float(tmp_path, "float-a", tunnel, bob, root, idle_timeout_seconds=IDLE_TIMEOUT_SECONDS)
    fb = write_float(tmp_path, "float-b", tunnel, bob, root, idle_timeout_seconds=IDLE_TIMEOUT_SECONDS)
    b = Proc([])
    async with trio.open_nursery() as nursery:
        try:
            await start_float(fa, nursery)
            await start_float(fb, nursery)
            b = write_node(
                tmp_path,
                bob,
                root,
                tunnel=tunnel,
                floats=[fa, fb],
                idle_timeout_seconds=IDLE_TIMEOUT_SECONDS,
                tunnel_backoff=None,
                handshake_timeout_seconds=handshake,
            )
            await b.start(nursery)
            line = await b.wait_line(lambda x: x.startswith("active "))
            assert int(line.split()[2]) == fa.public_port
            assert b.process is not None
            freeze(fb)
            seen = len(b.lines)
            await fa.kill()
            # each attempt on the frozen standby is a connected socket of the node (a local port of its own)
            # to its control port, held for the handshake timeout
            attempts: set[int] = set()
            with trio.fail_after(60):
                while True:
                    now = {here for here, there, _ in tcp_sockets(b.process.pid) if there == fb.control_port}
                    attempts |= now
                    if len(attempts) >= 5 and not now:
                        break
                    await trio.sleep(0.02)
            assert not any(x.startswith("active ") for x in b.lines[seen:])
            thaw(fb)
            within = fl.TUNNEL_MAX_BACKOFF_SECONDS + handshake + 2.0  # + a loaded 2-core machine
            line = await b.wait_line(lambda x: x.startswith("active "), after=seen, within=within)
            assert int(line.split()[2]) == fb.public_port
            assert listening(fb.public_port)
        finally:
            for p in (b, fa, fb):
                await p.kill()
            nursery.cancel_scope.cancel()


async def test_random_kills_and_freezes_of_the_floats_and_the_inside_lose_and_repeat_nothing(
    tmp_path: Path,
    network: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tunnel: fl.TunnelPki,
) -> None:
    """Rounds of kill -9 (then restart), a short SIGSTOP (below the idle timeout) or a long one (past it),
    each of a random one of the two floats or the node behind them, at random moments while the sender
    sends: at the end every message was handled once, in order, and exactly one float is open."""
    rounds = int(os.environ.get("FLOAT_FREEZE_ROUNDS", "20"))
    seed = int(os.environ.get("FLOAT_FREEZE_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    n = 250 * rounds  # (at 83 a second: the last round ends with three quarters sent)
    root = network.root.cert
    floats = [
        write_float(
            tmp_path,
            f"float-{i}",
            tunnel,
            bob,
            root,
            control=free_port(),
            idle_timeout_seconds=IDLE_TIMEOUT_SECONDS,
        )
        for i in (0, 1)
    ]
    b = a = Proc([])
    done: list[str] = []
    async with trio.open_nursery() as nursery:
        try:
            for f in floats:
                await start_float(f, nursery)
            b = write_node(
                tmp_path,
                bob,
                root,
                tunnel=tunnel,
                floats=floats,
                expect=n,
                idle_timeout_seconds=IDLE_TIMEOUT_SECONDS,
            )
            await b.start(nursery)
            await b.wait_line(lambda x: x.startswith("active "))
            plan = {"count": n, "batch": 10, "interval": 0.12}  # sending outlasts the rounds
            a = await start_sender(tmp_path, nursery, alice, bob, root, floats, plan)
            long_left = 3  # a long freeze costs the idle timeout and more: a few are enough
            for r in range(rounds):
                await trio.sleep(rng.uniform(0.1, 2.0))
                victim = rng.choice([*floats, b])
                action = rng.choice(["kill", "stop", "stop-long" if long_left else "stop"])
                done.append(f"{r}:{action}:{'node' if victim is b else victim.directory.name}")
                if action == "kill":
                    await victim.kill()
                    await trio.sleep(rng.uniform(0, 1))
                    if victim is b:
                        b.lines.clear()
                        await b.start(nursery)
                    else:
                        await start_float(victim, nursery)  # type: ignore[arg-type]
                    continue
                freeze(victim)
                if action == "stop-long":
                    long_left -= 1
                    await trio.sleep(rng.uniform(IDLE_TIMEOUT_SECONDS + 0.5, NOTICED_WITHIN_SECONDS))
                else:  # below the idle timeout less the heartbeat interval (half the advertised half)
                    await trio.sleep(rng.uniform(0.2, IDLE_TIMEOUT_SECONDS - 0.8))
                thaw(victim)
            await b.wait_line(lambda x: x == "done", within=300)
            await a.wait_line(lambda x: x == "done", within=120)
            open_now = [f.directory.name for f in floats if listening(f.public_port)]
            assert len(open_now) == 1, (open_now, seed, done)
        finally:
            for p in (a, b, *floats):
                await p.kill()
            nursery.cancel_scope.cancel()
    ledger = await dump(b)
    assert ledger == [[f"Alice-{i}", str(i)] for i in range(n)], (seed, done, json.dumps(ledger)[:300])
