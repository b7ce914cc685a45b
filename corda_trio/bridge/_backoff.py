"""Reconnect backoff: 1 s doubling to 60 s, with jitter, reset after a successful handshake; and
:class:`Outage`, what a connection retried so logs while the other end is away.

A bridge whose node or peer is down fails an attempt per backoff for as long as the outage lasts: one line
each would fill the log. :class:`Outage` logs the first failure with its reason, then at most one line per
:data:`~corda_trio.logs.PEER_WARNING_SECONDS` saying it is still retrying (the count of failed attempts and
the latest reason; every failure is at debug), and one info line when a connection succeeds again
(``... reconnected after 7 failed attempts / 95 s``).
"""

from __future__ import annotations

import logging
import random
from typing import Any, Final

import attrs
import trio

from corda_trio import logs

__all__ = ["INITIAL_BACKOFF_SECONDS", "MAX_BACKOFF_SECONDS", "Backoff", "Outage"]

INITIAL_BACKOFF_SECONDS: Final = 1.0
MAX_BACKOFF_SECONDS: Final = 60.0


@attrs.define
class Backoff:
    """Delays between attempts: ``initial * 2**n`` capped at ``maximum``, each scaled by a random factor in
    ``[1 - jitter, 1]`` (so a delay never exceeds the bound, and peers that failed together spread out)."""

    initial: float = INITIAL_BACKOFF_SECONDS
    maximum: float = MAX_BACKOFF_SECONDS
    jitter: float = attrs.field(default=0.2, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])
    rng: random.Random = attrs.field(factory=random.Random)
    failures: int = 0

    def bound(self) -> float:
        """The un-jittered delay of the next attempt."""
        return min(self.maximum, self.initial * 2 ** min(self.failures, 64))

    def next_delay(self) -> float:
        """Record a failure and return how long to wait before the next attempt."""
        delay = self.bound() * (1.0 - self.jitter * self.rng.random())
        self.failures += 1
        return delay

    def reset(self) -> None:
        """A handshake succeeded: the next failure waits ``initial`` again."""
        self.failures = 0


@attrs.define(eq=False)
class Outage:
    """The log lines of one connection retried with backoff: bounded however long the other end is away.

    ``name`` starts every line (``"bridge b1: the node at 127.0.0.1:10005"``); ``level`` is that of the first
    failure and the still-retrying lines (the reconnection is at info). The clock is Trio's.
    """

    logger: logging.Logger
    name: str
    level: int = logging.WARNING
    interval_seconds: float = logs.PEER_WARNING_SECONDS
    #: Failed attempts since the last success (0: connected, or never tried).
    failures: int = 0
    _started: float = 0.0
    _last_line: float = 0.0

    def failed(self, reason: str, msg: str, *args: Any) -> None:
        """One attempt failed for ``reason`` (``logs.failure_text``); ``msg % args`` is the full line of the
        first failure of an outage."""
        now = trio.current_time()
        self.failures += 1
        if self.failures == 1:
            self._started = self._last_line = now
            self.logger.log(self.level, msg, *args)
        elif now - self._last_line >= self.interval_seconds:
            self._last_line = now
            self.logger.log(
                self.level, "%s: still retrying, %d failed attempts in %.0f s, latest: %s",
                self.name, self.failures, now - self._started, reason,
            )  # fmt: skip
        else:
            self.logger.debug(msg, *args)

    def connected(self) -> None:
        """An attempt succeeded: say so if it ends an outage, and start afresh."""
        if self.failures:
            plural = "s" if self.failures > 1 else ""
            elapsed = trio.current_time() - self._started
            self.logger.info(
                "%s: reconnected after %d failed attempt%s / %.0f s",
                self.name,
                self.failures,
                plural,
                elapsed,
            )
        self.failures = 0
