"""The SASL layer (spec part 5.3) for both roles: PLAIN, ANONYMOUS and EXTERNAL.

Theory of operation
-------------------
SASL runs between its own protocol header (``AMQP\\x03\\x01\\x00\\x00``) and the AMQP header; it has no
channels and only five frames. The client waits for ``sasl-mechanisms``, picks the first of its configured
mechanisms the server offers and sends ``sasl-init``; the server answers with ``sasl-outcome``. None of our
mechanisms needs a challenge, so a ``sasl-challenge`` fails the exchange. Both classes are pure: they take
decoded frames and return the frames to send plus what happened; ``_connection.py`` owns the bytes.

PLAIN's initial response is ``authzid NUL authcid NUL passwd`` (RFC 4616); EXTERNAL's is the (usually empty)
authorization identity: the TLS client certificate already proved who the peer is.

A failing exchange always ends with a ``sasl-outcome`` from the server before the transport closes (spec
5.3.3.6): ``auth`` for bad credentials, ``sys-perm`` for a mechanism we do not offer (retrying cannot
help), ``sys`` for a malformed or unexpected SASL frame (:meth:`SaslServer.fail`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from . import _performatives as perf
from ._engine_errors import LocalProtocolError
from ._errors import Condition
from ._types import Symbol

__all__ = ["SaslClient", "SaslResult", "SaslServer", "parse_plain_response", "plain_response"]


@attrs.frozen(kw_only=True)
class SaslResult:
    """The end of a SASL exchange: ``ok`` or a failure with a description."""

    ok: bool
    mechanism: str
    username: str | None = None
    code: int = 0
    description: str = ""


def plain_response(username: str, password: str, authzid: str = "") -> bytes:
    """The PLAIN initial response (RFC 4616)."""
    return b"\0".join(s.encode("utf-8") for s in (authzid, username, password))


def parse_plain_response(data: bytes) -> tuple[str, str, str]:
    """Split a PLAIN response into ``(authzid, authcid, password)``.

    Raises:
        LocalProtocolError: the response does not have exactly two NUL separators or is not UTF-8.
    """
    parts = bytes(data).split(b"\0")
    if len(parts) != 3:
        raise LocalProtocolError(
            "SASL PLAIN response must be 'authzid NUL authcid NUL passwd'", condition=Condition.DECODE_ERROR
        )
    try:
        authzid, authcid, passwd = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise LocalProtocolError(
            "SASL PLAIN response is not UTF-8", condition=Condition.DECODE_ERROR
        ) from None
    return authzid, authcid, passwd


class SaslClient:
    """Client side: mechanisms -> init -> outcome."""

    def __init__(
        self, *, mechanisms: tuple[str, ...], username: str, password: str, hostname: str | None
    ) -> None:
        self.mechanisms = mechanisms
        self.username = username
        self.password = password
        self.hostname = hostname
        self.mechanism: str | None = None

    def on_frame(self, frame: Any) -> tuple[list[Any], SaslResult | None]:
        """Process one SASL frame from the server; return (frames to send, result or None)."""
        if isinstance(frame, perf.SaslMechanisms):
            if self.mechanism is not None:
                raise LocalProtocolError("second sasl-mechanisms frame", condition=Condition.ILLEGAL_STATE)
            offered = frame.sasl_server_mechanisms
            if isinstance(offered, str):
                offered = (offered,)
            offered_set = {str(m) for m in (offered or ())}
            for mech in self.mechanisms:
                if mech in offered_set:
                    self.mechanism = mech
                    break
            else:
                return [], SaslResult(
                    ok=False,
                    mechanism="",
                    code=int(perf.SaslCode.SYS_PERM),
                    description=f"server offers SASL mechanisms {sorted(offered_set)}, "
                    f"none of ours {list(self.mechanisms)}",
                )
            response: bytes | None
            if self.mechanism == "PLAIN":
                response = plain_response(self.username, self.password)
            else:
                response = b""
            return [
                perf.SaslInit(
                    mechanism=Symbol(self.mechanism), initial_response=response, hostname=self.hostname
                )
            ], None
        if isinstance(frame, perf.SaslChallenge):
            return [], SaslResult(
                ok=False,
                mechanism=self.mechanism or "",
                code=int(perf.SaslCode.SYS_PERM),
                description=f"unexpected SASL challenge for mechanism {self.mechanism}",
            )
        if isinstance(frame, perf.SaslOutcome):
            if self.mechanism is None:
                raise LocalProtocolError("sasl-outcome before sasl-init", condition=Condition.ILLEGAL_STATE)
            code = int(frame.code)
            if code == perf.SaslCode.OK:
                return [], SaslResult(ok=True, mechanism=self.mechanism)
            name = perf.SaslCode(code).name.lower() if code in iter(perf.SaslCode) else str(code)
            who = f" as {self.username!r}" if self.mechanism == "PLAIN" else ""
            return [], SaslResult(
                ok=False,
                mechanism=self.mechanism,
                code=code,
                description=f"SASL {self.mechanism} authentication{who} failed: outcome {name} ({code})",
            )
        raise LocalProtocolError(
            f"unexpected SASL frame {type(frame).__name__} at the client", condition=Condition.ILLEGAL_STATE
        )


class SaslServer:
    """Server side: offer mechanisms, judge the init, report the outcome."""

    def __init__(
        self, *, mechanisms: tuple[str, ...], plain_check: Callable[[str, str], bool] | None
    ) -> None:
        self.mechanisms = mechanisms
        self.plain_check = plain_check
        self.done = False
        self.outcome_sent = False

    def start(self) -> list[Any]:
        """The frames to send right after the SASL header."""
        return [perf.SaslMechanisms(sasl_server_mechanisms=tuple(Symbol(m) for m in self.mechanisms))]

    def fail(self) -> list[Any]:
        """The ``sasl-outcome`` (``sys``) for a broken exchange, unless an outcome was sent already."""
        if self.outcome_sent:
            return []
        self.outcome_sent = self.done = True
        return [perf.SaslOutcome(code=perf.SaslCode.SYS)]

    def on_frame(self, frame: Any) -> tuple[list[Any], SaslResult | None]:
        """Process one SASL frame from the client; return (frames to send, result or None)."""
        if not isinstance(frame, perf.SaslInit) or self.done:
            raise LocalProtocolError(
                f"unexpected SASL frame {type(frame).__name__} at the server",
                condition=Condition.ILLEGAL_STATE,
            )
        self.done = True
        mech = str(frame.mechanism)
        if mech not in self.mechanisms:
            return self._outcome(
                False,
                mech,
                None,
                f"SASL mechanism {mech!r} is not offered (offered: {list(self.mechanisms)})",
                perf.SaslCode.SYS_PERM,
            )
        if mech == "PLAIN":
            _authzid, user, password = parse_plain_response(frame.initial_response or b"")
            ok = self.plain_check(user, password) if self.plain_check is not None else True
            return self._outcome(ok, mech, user, "" if ok else f"SASL PLAIN: bad credentials for {user!r}")
        return self._outcome(True, mech, None, "")

    def _outcome(
        self, ok: bool, mech: str, user: str | None, why: str, failure: int = perf.SaslCode.AUTH
    ) -> tuple[list[Any], SaslResult]:
        self.outcome_sent = True
        code = perf.SaslCode.OK if ok else failure
        return (
            [perf.SaslOutcome(code=code)],
            SaslResult(ok=ok, mechanism=mech, username=user, code=int(code), description=why),
        )
