"""A socket-level guard for the float's process: no outbound network connection, ever.

The float only ever *accepts* connections (its control port and, while activated, its public port).
:func:`install_outbound_guard` adds a :func:`sys.addaudithook` hook that refuses, with ``PermissionError``,
every ``connect`` of an IPv4/IPv6 socket and every ``sendto`` / ``sendmsg`` with an explicit destination, in
the whole process (the float's own code, libraries, anything imported later), and reports each refusal to
``on_refused`` (the float writes it to its audit log). Audit hooks cannot be removed: call this only in a
process that is a float. Name resolution inside the C library (``getaddrinfo``) is not covered; the float
binds only to addresses its configuration names.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from typing import Any

from corda_trio import hostport

__all__ = ["install_outbound_guard"]

_GUARDED_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})
_INET = (socket.AF_INET, socket.AF_INET6)


def install_outbound_guard(on_refused: Callable[[str, str], None] | None = None) -> None:
    """Refuse every outbound IPv4/IPv6 connection in this process from now on (see the module docstring).

    Args:
        on_refused: called with (event name, destination) before the ``PermissionError`` is raised.
    """

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in _GUARDED_EVENTS:
            return
        sock, address = args[0], args[1] if len(args) > 1 else None
        if getattr(sock, "family", None) not in _INET or address is None:
            return
        where = (
            hostport.host_port_text(address[0], address[1])
            if isinstance(address, tuple) and len(address) >= 2
            else str(address)
        )
        if on_refused is not None:
            on_refused(event, where)
        raise PermissionError(f"the float makes no outbound connections ({event} to {where} refused)")

    sys.addaudithook(hook)
