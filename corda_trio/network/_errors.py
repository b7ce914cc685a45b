"""Errors of ``corda_trio.network``."""

from __future__ import annotations

__all__ = ["MalformedPayloadError", "NetworkMapError", "NetworkMapHttpError", "PayloadRejectedError"]


class NetworkMapError(Exception):
    """Root of the errors of :mod:`corda_trio.network`."""


class MalformedPayloadError(NetworkMapError, ValueError):
    """A payload is not in its wire form (not msgpack, wrong tag or version, bad field, not canonical).

    Served as HTTP 400."""


class PayloadRejectedError(NetworkMapError):
    """A well-formed payload fails verification: bad signature, certificate not from the network root, wrong
    role, stale serial, platform version too low.  Served as HTTP 403 (409 for a stale serial).

    Attributes:
        reason: short machine-readable reason (``"bad-signature"``, ``"untrusted-root"``,
            ``"stale-serial"``...).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class NetworkMapHttpError(NetworkMapError):
    """The network map service answered with an error status (or could not be reached: ``status`` 0)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status
