"""A process's own certificates with the files they were read from, and the check that each is valid at
a given time (pure: the caller reads the clock and passes ``now``).

A node, the network map service and a float present certificates that peers check with their own clocks:
one expired or not valid yet makes every peer refuse it, although OpenSSL loads it without a word. The
check here turns that into one line naming the file, the certificate and the time, with a hint; the node,
the map service and ``float start`` refuse to start on it, and a float refuses an activation on it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import final

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ._certs import check_validity_period
from ._errors import CertificateValidationError
from ._roles import get_cert_role

__all__ = ["OwnCertificate", "check_own_certificates", "format_time", "own_certificates"]


@final
@attrs.frozen(kw_only=True)
class OwnCertificate:
    """One of a process's own certificates and the file it was read from."""

    path: Path
    cert: x509.Certificate

    @property
    def role(self) -> str:
        """``TLS``, ``NODE_CA``, ``DOORMAN_CA``, ``LEGAL_IDENTITY``, or ``ROOT`` (the network root)."""
        role = get_cert_role(self.cert)
        return "ROOT" if role is None else role.name

    @property
    def subject(self) -> str:
        return self.cert.subject.rfc4514_string()

    @property
    def not_after(self) -> dt.datetime:
        return self.cert.not_valid_after_utc

    def describe(self) -> str:
        return f"{self.path}: certificate {self.subject!r}"


def own_certificates(files: Iterable[tuple[Path, Sequence[x509.Certificate]]]) -> tuple[OwnCertificate, ...]:
    """Each distinct certificate of ``files`` ((path, certificates) pairs) once, with the first file that
    holds it (the node CA and doorman CA are in both the TLS and the identity chain)."""
    seen: set[bytes] = set()
    out = []
    for path, certs in files:
        for cert in certs:
            der = cert.public_bytes(serialization.Encoding.DER)
            if der not in seen:
                seen.add(der)
                out.append(OwnCertificate(path=path, cert=cert))
    return tuple(out)


def check_own_certificates(certs: Sequence[OwnCertificate], *, now: dt.datetime) -> None:
    """Check that every one of ``certs`` is valid at ``now``.

    Raises:
        CertificateValidationError: one is expired or not valid yet; the message starts with its file
            and says which certificate and when (``reason`` ``expired`` or ``not-yet-valid``).
    """
    for own in certs:
        try:
            check_validity_period(own.cert, now=now)
        except CertificateValidationError as exc:
            hint = (
                "have it renewed"
                if exc.reason == "expired"
                else "peers whose clock agrees with this one refuse it: is this machine's clock behind?"
            )
            raise CertificateValidationError(
                f"{own.path}: {exc} (this machine's clock: {format_time(now)}; {hint})", reason=exc.reason
            ) from None


def format_time(when: dt.datetime) -> str:
    """``when`` as the lifetime messages give it (ISO 8601, to the second)."""
    return when.isoformat(timespec="seconds")
