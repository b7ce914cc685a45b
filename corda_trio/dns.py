"""Host name lookups on threads of their own, so that a slow DNS server cannot stall the store.

Trio resolves a host name (``trio.open_tcp_stream("bob.example.com", ...)``, and so every bridge dial, map
poll and SOCKS proxy dial) with the C library's ``getaddrinfo`` on a worker thread, taken from the one
thread limiter that ``trio.to_thread.run_sync`` uses by default (40 threads). The store takes its worker
threads from that limiter too (opening and rolling segments, compaction, the map cache). A lookup that the
DNS server never answers holds its thread until the C library gives up (``options timeout`` x ``attempts``
per query of ``/etc/resolv.conf``: 10 s and more by default), even when Trio has abandoned the waiting task,
so 40 peers whose names hang took every thread, and every store operation that needs one waited behind them.

:func:`use_own_dns_threads` gives the current ``trio.run`` a resolver whose lookups take their threads from a
limiter of their own (``DNS_THREADS``): the default limiter stays free for everything else, and at most
``DNS_THREADS`` lookups run at once (the others wait for a thread, and are cancelled like any task). An IP
address literal never reaches it: Trio answers those without a thread. The module imports Trio and the
standard library only: every command that runs Trio installs it, and most need nothing of the transport.
"""

from __future__ import annotations

import socket
from typing import Final

import trio

__all__ = ["DNS_THREADS", "ThreadedResolver", "use_own_dns_threads"]

#: How many host name lookups may run at once (each on a thread of its own).
DNS_THREADS: Final = 32


class ThreadedResolver(trio.abc.HostnameResolver):
    """``getaddrinfo`` / ``getnameinfo`` of the C library, on threads of ``limiter`` (abandoned when the
    waiting task is cancelled: a thread stuck in the C library returns when the library gives up)."""

    def __init__(self, limiter: trio.CapacityLimiter) -> None:
        self.limiter = limiter

    async def getaddrinfo(
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[
        tuple[
            socket.AddressFamily,
            socket.SocketKind,
            int,
            str,
            tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes],
        ]
    ]:
        return await trio.to_thread.run_sync(
            socket.getaddrinfo, host, port, family, type, proto, flags,
            abandon_on_cancel=True, limiter=self.limiter,
        )  # fmt: skip

    async def getnameinfo(
        self, sockaddr: tuple[str, int] | tuple[str, int, int, int], flags: int
    ) -> tuple[str, str]:
        return await trio.to_thread.run_sync(
            socket.getnameinfo, sockaddr, flags, abandon_on_cancel=True, limiter=self.limiter
        )


def use_own_dns_threads() -> None:
    """Resolve host names in this ``trio.run`` on ``DNS_THREADS`` threads of their own (module docstring).

    Idempotent within a run, and a resolver the application installed itself
    (``trio.socket.set_custom_hostname_resolver``) is left in place.
    """
    previous = trio.socket.set_custom_hostname_resolver(ThreadedResolver(trio.CapacityLimiter(DNS_THREADS)))
    if previous is not None:  # ours from an earlier call, or the application's: it stays
        trio.socket.set_custom_hostname_resolver(previous)
