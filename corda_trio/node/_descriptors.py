"""How many connections the node's listeners may hold, given the process's open-file limit (``ulimit -n``).

Theory of operation
-------------------
Every connection a listener accepts takes a file descriptor, and so does everything else the node does:
each durable queue holds its directory and its tail segment open (more while it keeps sealed segments or is
compacted), a queue is created for each new peer, each outbound bridge holds a socket, and the log file,
the map cache (SQLite), the commit helper's pipes and Trio's own wake-up take a few. The listeners' caps
(p2p :data:`transport.DEFAULT_MAX_CONNECTIONS`, RPC :data:`rpc.DEFAULT_MAX_CONNECTIONS`, ``/metrics``
:data:`METRICS_MAX_CONNECTIONS`) were fixed numbers: under a soft limit below their sum (``ulimit -n 64``,
or 256 as some systems set it), anyone who can open TCP connections to the RPC or p2p port could take every
descriptor, and the node's next new queue (a flow to a peer it had not sent to yet) failed with ``EMFILE``:
the node stopped (found by holding 70 idle TCP connections to the RPC port of a node under
``prlimit --nofile=64:64`` and starting a flow to a new peer).

So before it listens, :func:`plan_descriptors` compares the soft limit with what the caps, the over-cap
clients the HTTP listeners may be answering ``503`` at once (``transport.MAX_REFUSING`` each: 32 refusals in
flight took as many descriptors as the shrunk caps allowed connections) and :data:`RESERVED_DESCRIPTORS` need
together (1120 and what the node holds once its store is open: ``in_use``). Below it, the soft limit is first
raised to the hard limit (what the JVM does for a Corda node; the store takes three more descriptors for each
peer the node sends to, so more is better). If it is still short, the node says so in one warning line at
start (the limit, the figure, the caps it uses) and shrinks the caps in proportion so that a share of what is
free stays for the store and the bridges (:func:`reserve_for` of it), an HTTP listener answering at most an
eighth of its shrunk cap at once (at least one). A client over a shrunk cap is refused like any over the cap
(a closed socket, ``503`` from RPC and ``/metrics``, a line at most every 10 s), while the store keeps its
descriptors. Restarted after sending to 40 peers under ``ulimit -n 128``, a node held 107 descriptors at start
(two for each of its 42 queues); planned as if it held none (p2p 37, RPC 18) its peers' connections took the
rest and no flow finished in 40 s; planned with them (p2p 8, RPC 4), 32 did.

The same plan sizes the other AMQP listeners: in ``[bridge] mode = "external"`` the node's local bridge
endpoint (``bridge``, :data:`transport.DEFAULT_MAX_CONNECTIONS` by default, in place of the p2p listener),
and in a ``corda-trio bridge start`` process its acceptor of peers (``p2p``; that process runs no RPC,
``/metrics`` or store, and says ``this bridge process`` in its warning).
"""

from __future__ import annotations

import math
import os
import resource
from typing import Final

import attrs

from corda_trio import rpc, transport

from ._metrics import MAX_CONNECTIONS as METRICS_MAX_CONNECTIONS

__all__ = [
    "MAX_RAISED_LIMIT",
    "RESERVED_DESCRIPTORS",
    "ListenerCaps",
    "open_descriptors",
    "plan_descriptors",
    "reserve_for",
]

#: Descriptors kept free of the listeners' connections when the limit allows: the store (two a queue, a
#: queue per peer and per dedup generation), the outbound bridges (a socket per peer), the log file, the
#: map cache, the commit helper's pipes. A node at start holds about 27, and three more per peer it sends to
#: (its queue's directory and segment, its bridge's socket; measured with 40 peers: 27 -> 187 descriptors
#: with the 40 inbound connections): 256 leaves room for about 75 peers with every listener full.
RESERVED_DESCRIPTORS: Final[int] = 256
#: How far a low soft limit is raised at most (Linux's default ``fs.nr_open``: no soft limit may pass it).
MAX_RAISED_LIMIT: Final[int] = 1 << 20


def reserve_for(free: int) -> int:
    """What stays for the store and the bridges when the descriptors still free at start are too few for
    every default: half of them (at most :data:`RESERVED_DESCRIPTORS`)."""
    return min(RESERVED_DESCRIPTORS, free // 2)


@attrs.frozen(kw_only=True)
class ListenerCaps:
    """The connection caps of the node's listeners, and the open-file limit they were planned for.

    The HTTP listeners (RPC, ``/metrics``) also answer over-cap clients ``503`` in tasks of their own, each
    holding a descriptor up to a second: ``*_refusing`` bounds them (``None``: the transport's default,
    :data:`transport.MAX_REFUSING`). The p2p listener closes an over-cap client at once."""

    p2p: int | None  # None: the node runs no p2p listener of its own (a float, an external bridge)
    rpc: int | None  # None: no RPC (a bridge process)
    rpc_refusing: int | None = None
    metrics: int | None  # None: no ``/metrics``
    metrics_refusing: int | None = None
    #: the local endpoint a bridge process connects to (``[bridge] mode = "external"``; ``None``: not served)
    bridge_endpoint: int | None = None
    soft_limit: int | None  # None: unlimited
    #: the warning to log at start when the limit is too low for the defaults (``None``: it is not)
    warning: str | None = None


def open_descriptors() -> int:
    """How many descriptors this process holds now (Linux ``/proc/self/fd``, else ``/dev/fd``; 0 unknown)."""
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(where)) - 1)  # (less the one listdir held)
        except OSError:
            continue
    return 0


def plan_descriptors(
    *,
    p2p: bool,
    metrics: bool,
    rpc_listener: bool = True,
    bridge_endpoint: bool = False,
    in_use: int = 0,
    process: str = "node",
) -> ListenerCaps:
    """Plan the listeners' caps for this process's ``RLIMIT_NOFILE`` (raising its soft limit if it is below
    what the defaults need and the hard limit allows). ``p2p`` / ``metrics`` / ``rpc_listener`` /
    ``bridge_endpoint``: whether the process runs them; ``in_use``: the descriptors it holds already
    (:func:`open_descriptors` once its store is open: two for each queue, so a node that sent to many peers
    holds many); ``process``: what the warning calls it (``node``, ``bridge process``)."""
    defaults = {"p2p": transport.DEFAULT_MAX_CONNECTIONS} if p2p else {}
    if bridge_endpoint:
        defaults["bridge"] = transport.DEFAULT_MAX_CONNECTIONS
    if rpc_listener:
        defaults["rpc"] = rpc.DEFAULT_MAX_CONNECTIONS
    if metrics:
        defaults["metrics"] = METRICS_MAX_CONNECTIONS
    # each HTTP listener holds up to its cap plus the over-cap clients it is answering (the AMQP ones, p2p
    # and the bridge endpoint, close an over-cap client at once)
    http = ("rpc", "metrics")
    held = {name: cap + (transport.MAX_REFUSING if name in http else 0) for name, cap in defaults.items()}
    needed = in_use + sum(held.values()) + RESERVED_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        # as far as the hard limit allows, as the JVM does: the store takes more descriptors with each peer
        target = MAX_RAISED_LIMIT if hard == resource.RLIM_INFINITY else min(hard, MAX_RAISED_LIMIT)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (OSError, ValueError):
                pass
    if soft == resource.RLIM_INFINITY or soft >= needed or not held:
        return ListenerCaps(
            p2p=defaults.get("p2p"),
            rpc=defaults.get("rpc"),
            metrics=defaults.get("metrics"),
            bridge_endpoint=defaults.get("bridge"),
            soft_limit=None if soft == resource.RLIM_INFINITY else soft,
        )
    # Shrunk in proportion, an HTTP listener answering at most an eighth of its cap (at least one) at once.
    free = max(0, soft - in_use)
    reserve = reserve_for(free)
    scale = (free - reserve) / sum(held.values())
    caps = {name: max(1, math.floor(cap * scale)) for name, cap in defaults.items()}
    refusing = {name: max(1, cap // 8) for name, cap in caps.items() if name in http}
    used = ", ".join(f"{name} {cap}" for name, cap in caps.items())
    asked = " + ".join(f"{name} {cap}" for name, cap in held.items())
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    # a node holds a store; a bridge process only the bridges' sockets
    node = process == "node"
    held_at_start = ", its store's among them" if node else ""
    new_peers = "queues and bridges" if node else "bridges"
    kept = "store and bridges" if node else "bridges"
    warning = (
        f"the open-file limit (ulimit -n) is {soft}, below the {needed} this {process} needs ({in_use} open "
        f"at start{held_at_start} + {asked} connections + {RESERVED_DESCRIPTORS} for new peers' "
        f"{new_peers}), and the hard limit is {hard_text}: its listeners take at most {used} connections, so "
        f"that {reserve} stay for the {kept}; raise the limit (ulimit -n, systemd LimitNOFILE=) to serve more"
    )
    return ListenerCaps(
        p2p=caps.get("p2p"),
        rpc=caps.get("rpc"),
        rpc_refusing=refusing.get("rpc"),
        metrics=caps.get("metrics"),
        metrics_refusing=refusing.get("metrics"),
        bridge_endpoint=caps.get("bridge"),
        soft_limit=soft,
        warning=warning,
    )
