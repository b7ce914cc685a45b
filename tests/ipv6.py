"""``needs_ipv6``: skip a test on a machine without an IPv6 loopback (no ``socket.has_ipv6``, or ``::1``
cannot be bound, as in a container started with IPv6 disabled)."""

from __future__ import annotations

import socket

import pytest

__all__ = ["needs_ipv6"]


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(
    not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1 cannot be bound)"
)
