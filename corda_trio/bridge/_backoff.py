"""Reconnect backoff: 1 s doubling to 60 s, with jitter, reset after a successful handshake.

What a connection retried so logs while the other end is away is :class:`corda_trio.logs.Outage`, shared
with the network map client.
"""

from __future__ import annotations

import random
from typing import Final

import attrs

__all__ = ["INITIAL_BACKOFF_SECONDS", "MAX_BACKOFF_SECONDS", "Backoff"]

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
