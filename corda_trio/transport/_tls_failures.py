"""What a failed TLS handshake means, in words an operator can act on, for the certificate faults that come
with time: a certificate that expired, or one not valid yet because two machines' clocks disagree.

Theory of operation
-------------------
OpenSSL checks every certificate's dates while it verifies a chain and fails the handshake with a verify
code (``X509_V_ERR_CERT_HAS_EXPIRED`` = 10, ``X509_V_ERR_CERT_NOT_YET_VALID`` = 9); it then sends the
peer an alert (``certificate_expired`` for the first; ``bad_certificate`` for the second, which OpenSSL
also sends for other faults). Its own text, ``certificate verify failed: certificate has expired``, says
neither whose certificate nor which one of the chain nor when, and the refused side sees only
``SSLV3_ALERT_CERTIFICATE_EXPIRED``. :func:`describe_tls_failure` says:

* on the refusing side: which certificate and when it expired or becomes valid, with this machine's clock
  (a client still holds the server's certificates after refusing them; a server keeps none of a refused
  client's, so it says the client's chain and the clock only);
* on the refused side: that the peer refused *our* certificate, and why the alert says.

Anything else is left to the caller's generic text (``None``).

:func:`is_certificate_date_failure` tells such a failure from the others, for a caller that retries: a
certificate's dates are a matter of time (a clock that is behind, a renewed certificate not valid yet), so
the same peer may well be accepted a few seconds later, where a foreign root or another name will not be.
It counts the ``bad_certificate`` alert in, since OpenSSL sends it for a certificate not valid yet; OpenSSL
also sends it for rarer chain faults (a CA key too small, a path too long), which are then retried with the
caller's usual backoff too. A foreign root gets ``unknown_ca`` and a certificate with another name passes
the handshake (our peer check refuses it after), so neither counts.
"""

from __future__ import annotations

import datetime as dt
import ssl
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from cryptography import x509

# ``corda_trio.pki`` (and with it cryptography's x509) is imported where a refusal is described, not
# here: the transport is imported by every process that moves messages, and x509's ~7,000 objects made
# each of their garbage collections longer (an AMQP sender's CPU per message went from ~52 to ~57 us,
# bench.amqp_link).

__all__ = ["describe_tls_failure", "is_certificate_date_failure"]

#: OpenSSL's X509_V_ERR_* codes for a certificate outside its validity period.
_NOT_YET_VALID: Final = 9
_EXPIRED: Final = 10

#: Alerts the peer sends when it refuses our certificate (OpenSSL's reason names for them).
_REFUSED_OURS: Final = {
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "it has expired by the peer's clock (TLS alert certificate_expired)",
    "SSLV3_ALERT_BAD_CERTIFICATE": (
        "TLS alert bad_certificate, which OpenSSL sends for a certificate not valid yet by the peer's clock "
        "(is one of the clocks wrong?), among other faults"
    ),
}


def describe_tls_failure(exc: BaseException, tls: object | None, *, now: dt.datetime) -> str | None:
    """One line for a TLS failure caused by a certificate's dates, or ``None`` for any other failure.

    Args:
        exc: the ``ssl.SSLError`` (or an exception whose ``__cause__`` chain holds one).
        tls: the TLS stream or ``ssl.SSLObject`` the handshake ran on (for the certificates the peer sent), or
            ``None``.
        now: this machine's time (timezone-aware UTC).
    """
    error = _ssl_error(exc)
    if error is None:
        return None
    clock = f"this machine's clock: {now.isoformat(timespec='seconds')}"
    if _verify_code(error) in (_EXPIRED, _NOT_YET_VALID):
        from corda_trio import pki  # (see the top)

        for cert in _presented(tls):
            try:
                pki.check_validity_period(cert, now=now)
            except pki.CertificateValidationError as why:
                hint = "" if why.reason == "expired" else "; is one of the clocks wrong?"
                return f"the peer's {why} ({clock}{hint})"
        if error.verify_code == _EXPIRED:
            return f"a certificate of the peer's chain has expired ({clock})"
        return f"a certificate of the peer's chain is not valid yet ({clock}; is one of the clocks wrong?)"
    why = _REFUSED_OURS.get(getattr(error, "reason", None) or "")
    if why is not None:
        return f"the peer refused our certificate: {why}"
    return None


def is_certificate_date_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or the ``ssl.SSLError`` in its ``__cause__`` chain) is a TLS handshake refused for a
    certificate's dates: the peer's, by our clock, or ours, by the peer's (its alert)."""
    error = _ssl_error(exc)
    if error is None:
        return False
    if isinstance(error, ssl.SSLCertVerificationError):
        return _verify_code(error) in (_EXPIRED, _NOT_YET_VALID)
    return (getattr(error, "reason", None) or "") in _REFUSED_OURS


def _verify_code(error: ssl.SSLError) -> int | None:
    """OpenSSL's verify code of a failed chain verification (``ssl`` sets it on the errors it raises; one
    built by hand has none)."""
    return getattr(error, "verify_code", None) if isinstance(error, ssl.SSLCertVerificationError) else None


def _ssl_error(exc: BaseException | None) -> ssl.SSLError | None:
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ssl.SSLError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _presented(tls: object | None) -> list[x509.Certificate]:
    if tls is None:
        return []
    from corda_trio import pki  # (see the top)

    try:
        return pki.presented_chain(tls)
    except pki.PeerIdentityError:
        return []
