"""A free TCP port for a listener a test starts later (``network.free_ports`` says why not ``bind(0)``)."""

from __future__ import annotations

import socket

from corda_trio import network


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing is bound to now, outside the kernel's ephemeral range."""
    return network.free_ports(host, 1)[0]


_HELD: list[socket.socket] = []  # (bound for the rest of the test run, never listening)


def refused_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` where every connection is refused for the rest of the test run: it stays bound and
    never listens, so no other process can start listening there (a port closed again could be taken)."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, 0))
    _HELD.append(s)
    return int(s.getsockname()[1])
