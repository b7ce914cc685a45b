"""TCP ports chosen now and listened on later (``network bootstrap`` writes them into each ``node.toml``).

A port the kernel hands out for ``bind(0)`` comes from its *ephemeral* range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), the same range it takes the local port
of every outgoing connection from.  Between a bootstrap and the start of a node, any process on the machine
that connects anywhere may be given that port, and the node then cannot listen (``Address already in use``).
Ports below the range are never given out implicitly, so they are chosen there, at random, each checked free
by binding it; where the range cannot be read, or nothing below it is free, the kernel's choice is taken.
"""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
"""Nothing below this is chosen: the ports there belong to well-known and commonly configured services."""
_TRIES_PER_PORT = 50


def ephemeral_port_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's ``(first, last)`` ephemeral port, or ``None`` where it cannot be read (not Linux)."""
    try:
        first, last = (int(word) for word in path.read_text(encoding="ascii").split())
    except (OSError, ValueError):
        return None
    return (first, last) if 0 < first <= last <= 65535 else None


def free_ports(
    host: str, count: int, *, ephemeral: tuple[int, int] | None = None, lowest: int = LOWEST_PORT
) -> list[int]:
    """``count`` distinct TCP ports on ``host`` that nothing is bound to now, outside the ephemeral range.

    Args:
        ephemeral: the kernel's ephemeral range; read from ``/proc`` when not given.
        lowest: the lowest port chosen.

    Raises:
        OSError: ``host`` cannot be bound to on this machine at all.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    held: list[socket.socket] = []
    try:
        ephemeral = ephemeral or ephemeral_port_range()
        below = range(lowest, ephemeral[0]) if ephemeral is not None else range(0)
        tried: set[int] = set()
        while len(held) < count and below and len(tried) < min(len(below), _TRIES_PER_PORT * count):
            port = random.choice(below)
            if port in tried:
                continue
            tried.add(port)
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError as exc:
                s.close()
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue
                raise
            held.append(s)
        while len(held) < count:  # the kernel's choice: no range known, or nothing below it free
            s = socket.socket(family, socket.SOCK_STREAM)
            held.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()
