"""How an address is written: ``host:port``, an IPv6 host in brackets (``[::1]:10002``).

PURE (stdlib only, no I/O): every layer writes addresses, in config files, URLs, console lines and log lines,
and every layer may import this module, ``corda_trio.transport`` and ``corda_trio.bridge`` included (they may
not import ``corda_trio.network``, which re-exports :func:`host_port_text` as ``network.host_port_text``).
Without the brackets ``::1:42401`` does not say where the address ends and the port begins, and it is not
what an operator can paste into a config file.
"""

from __future__ import annotations

__all__ = ["host_port_text"]


def host_port_text(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets (``[::1]:10002``): the one way an address is written
    in a config file, a URL, a console line, a log line and ``str(NetworkHostAndPort)``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
