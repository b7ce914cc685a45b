"""The lifetimes of a process's own certificates (a node's, the network map service's, a float's): refused at
start when out of date, a warning when they expire soon, one error line when one expires while it runs, and
(a node) their not-after times for ``/metrics``.

Theory of operation
-------------------
A node presents its TLS chain (TLS leaf, node CA, doorman CA) in every handshake and publishes its identity
chain (legal identity, node CA, doorman CA) in its NodeInfo; both end at the network root it pins. Peers
check every one of these certificates' dates with their own clocks, so once one has expired (or while one is
not valid yet) every peer refuses the node. OpenSSL would load such a chain without a word, and the node
would start, log "node ready", and then fail every connection with TLS alerts. So:

* at start each certificate of those files is checked against this machine's clock: an expired or
  not-yet-valid one refuses the start in one line naming the file, the certificate and the time
  (``.../tls.chain.pem: certificate 'O=Alice,L=London,C=GB' expired at 2026-...``);
* one that expires within :data:`EXPIRY_WARNING_DAYS` days gives a warning line at start;
* while the node runs, :func:`watch_expiry` logs one error line when the first of them expires (not one per
  refused connection: those are the bridges' and the acceptor's, which name the TLS alert);
* ``/metrics`` shows each one's not-after time (``corda_trio_certificate_not_after_timestamp_seconds``,
  labelled with its role and subject), for an alert well before it comes.

The clock is read here (``datetime.now``) and passed to ``pki``, which never reads one.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Final

import trio

from corda_trio import pki
from corda_trio.pki import OwnCertificate, check_own_certificates, own_certificates

__all__ = [
    "EXPIRY_WARNING_DAYS",
    "OwnCertificate",
    "check_own_certificates",
    "expiry_warning",
    "own_certificates",
    "watch_expiry",
]

log = logging.getLogger("corda_trio.node")

#: A certificate that expires within this many days gives a warning line at start (Corda's doorman renews
#: nothing by itself either; a month leaves an operator time to have a certificate issued and rolled out).
EXPIRY_WARNING_DAYS: Final[int] = 30


def expiry_warning(
    certs: Sequence[OwnCertificate], *, now: dt.datetime, days: int = EXPIRY_WARNING_DAYS
) -> str | None:
    """The warning line for the first of ``certs`` to expire if that is within ``days`` days of ``now``."""
    if not certs:
        return None
    first = min(certs, key=lambda c: c.not_after)
    left = first.not_after - now
    if left > dt.timedelta(days=days):
        return None
    return (
        f"{first.describe()} expires at {pki.format_time(first.not_after)} (in {_span(left)}): have it "
        "renewed before then"
    )


async def watch_expiry(
    certs: Sequence[OwnCertificate], *, consequence: str, logger: logging.Logger = log
) -> None:
    """Log one error line as each of ``certs`` expires, earliest first (returns when all have expired):
    ``<file>: certificate '<subject>' expired at <time>: <consequence>``.

    The wait is measured on the wall clock, re-read after each sleep: trio's clock does not move while the
    machine is suspended, and the wall clock may be stepped.
    """
    for own in sorted(certs, key=lambda c: c.not_after):
        while (left := (own.not_after - dt.datetime.now(dt.UTC)).total_seconds()) >= 0:  # noqa: ASYNC110
            await trio.sleep(min(left + 0.001, 3600.0))
        logger.error("%s expired at %s: %s", own.describe(), pki.format_time(own.not_after), consequence)


def _span(delta: dt.timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds >= 2 * 86400:
        return f"{seconds // 86400} days"
    if seconds >= 2 * 3600:
        return f"{seconds // 3600} hours"
    if seconds >= 120:
        return f"{seconds // 60} minutes"
    return f"{seconds} s"
