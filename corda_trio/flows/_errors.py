"""The flow framework's exceptions (PURE).

Which side is at fault:

* :class:`FlowException` and its subclasses are *application* errors. Raised by a step, they end the flow and
  reach every counterparty with their message (the counterparty's waiting step fails with a
  :class:`FlowException` carrying it).
* :class:`RetryableFlowError`, raised by a step, asks the hospital to retry the flow from its last checkpoint.
* Any other exception in a step is a bug: the flow is parked in the hospital (not propagated) until an
  operator retries or kills it; killed, its counterparties see "counter-flow errored".
* :class:`PayloadError` and :class:`SessionProtocolError` describe what a (possibly malicious) peer sent.
"""

from __future__ import annotations

__all__ = [
    "COUNTER_FLOW_ERRORED",
    "ClientIdTakenError",
    "FlowError",
    "FlowException",
    "FlowKilledError",
    "FlowManagerDrainingError",
    "PayloadError",
    "RetryableFlowError",
    "SessionProtocolError",
    "UnexpectedFlowEndError",
    "UnknownFlowError",
]

#: What a counterparty is told when a flow failed with something other than a FlowException.
COUNTER_FLOW_ERRORED = "counter-flow errored"


class FlowError(Exception):
    """Root of the flow framework's own errors (not raised at application code on purpose)."""


class FlowException(Exception):
    """An application error that propagates to the counterparties with its message."""


class UnexpectedFlowEndError(FlowException):
    """The counterparty ended its session while this flow waited for data from it."""


class FlowKilledError(FlowException):
    """The flow was killed by an operator."""


class RetryableFlowError(FlowError):
    """Raised by a step: a transient condition; the hospital retries the flow from its last checkpoint."""


class UnknownFlowError(FlowError, LookupError):
    """No flow class is registered under that name (or it cannot be started that way)."""


class FlowManagerDrainingError(FlowError):
    """The flow manager is draining: it finishes running flows and refuses new ones."""


class ClientIdTakenError(FlowError):
    """A client id names a flow that someone else started: a client id belongs to the flow's starter."""


class PayloadError(FlowError, ValueError):
    """A payload or checkpoint cannot be encoded or decoded (unknown type, bad version, malformed bytes)."""


class SessionProtocolError(FlowError, ValueError):
    """A session message breaks the flow session protocol (``protocol_spec/flow-sessions.md``)."""
