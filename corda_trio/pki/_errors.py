"""Errors of ``corda_trio.pki``: one root, one class per condition, messages that say what is wrong."""

from __future__ import annotations

__all__ = [
    "CertificateValidationError",
    "InvalidNameError",
    "KeyStoreError",
    "PeerIdentityError",
    "PkiError",
]


class PkiError(Exception):
    """Root of every error raised by :mod:`corda_trio.pki`."""


class InvalidNameError(PkiError, ValueError):
    """An X.500 legal name breaks Corda's rules (the message names the attribute and the rule)."""


class CertificateValidationError(PkiError):
    """A certificate or certificate path is not acceptable.

    Attributes:
        reason: a short machine-readable reason (``"expired"``, ``"wrong-role"``, ``"untrusted-root"``,
            ``"bad-signature"``, ``"wrong-parent"``, ``"name-constraint"``, ``"malformed"``, ...).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class PeerIdentityError(PkiError):
    """The peer of a TLS connection is not who it must be (wrong legal name, role or no certificate).

    This always means the *remote* side is misconfigured or hostile; the connection must be dropped.
    """


class KeyStoreError(PkiError):
    """A key or certificate file is missing, unreadable, has unsafe permissions or a wrong passphrase."""
