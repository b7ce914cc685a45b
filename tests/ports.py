"""A free TCP port for a listener a test starts later (``network.free_ports`` says why not ``bind(0)``)."""

from __future__ import annotations

from corda_trio import network


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing is bound to now, outside the kernel's ephemeral range."""
    return network.free_ports(host, 1)[0]
