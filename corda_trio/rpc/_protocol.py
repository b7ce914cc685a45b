"""PURE: the RPC wire protocol (frames, methods, permissions, error codes). No I/O, no clock; the
msgpack encoding of frames lives in ``_codec``.

Theory of operation
-------------------
One websocket connection carries binary messages, each one msgpack map (a *frame*). The client speaks first::

    {"id": 0, "method": "login", "args": {"user": "alice", "password": "..."}}

and gets ``{"id": 0, "ok": {"user": "alice", "permissions": [...]}}`` or an error frame. Every later
request is ``{"id": <int>, "method": <str>, "args": <map>}``; ids are chosen by the client and must be
unique among its requests in flight. The server answers each request with exactly one final frame, either
``{"id": N, "ok": <value>}`` or ``{"id": N, "error": {"code": <str>, "message": <str>}}``, optionally preceded
by ``{"id": N, "event": <value>}`` frames (progress of a followed flow). A frame that is not a msgpack map of
that shape gets an error frame with ``id`` null (or its id, if one could be read) and the connection goes on.
A request larger than :data:`MAX_REQUEST_BYTES` closes the connection with websocket close code 1009.

Permissions are strings: ``admin`` (everything), ``read`` (node info, network map, queues, flows),
``start_flow:*`` (any flow) and ``start_flow:<FlowName>`` (that flow, by its class name, e.g. ``PingPong``,
or its full name).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, final

import attrs

__all__ = [
    "ERROR_CODES",
    "MAX_REQUEST_BYTES",
    "METHODS",
    "METHOD_ARGUMENTS",
    "PERMISSION_ADMIN",
    "PERMISSION_READ",
    "ErrorCode",
    "Request",
    "RpcProtocolError",
    "allowed",
    "check_arguments",
    "error_frame",
    "event_frame",
    "ok_frame",
    "parse_permission",
    "parse_request",
    "request_frame",
]

#: Largest request frame a server reads (bytes). Requests are small (a flow name and its arguments);
#: 1 MiB leaves room for large flow arguments while a client cannot make the server buffer much.
MAX_REQUEST_BYTES: Final[int] = 1024 * 1024

PERMISSION_ADMIN: Final[str] = "admin"
PERMISSION_READ: Final[str] = "read"
_START_PREFIX: Final[str] = "start_flow:"
_FLOW_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,99}")


class ErrorCode(enum.Enum):
    """The ``code`` of an error frame."""

    MALFORMED = "malformed"  # not a msgpack map of the request shape
    UNKNOWN_METHOD = "unknown-method"
    UNAUTHENTICATED = "unauthenticated"  # no login yet, or wrong user / password
    ALREADY_AUTHENTICATED = "already-authenticated"  # a second login on a logged-in connection
    FORBIDDEN = "forbidden"  # logged in, but the user lacks the permission
    BAD_ARGUMENTS = "bad-arguments"
    NOT_FOUND = "not-found"  # no such flow
    DRAINING = "draining"  # the node takes no new flows
    FLOW_FAILED = "flow-failed"
    UNAVAILABLE = "unavailable"  # the node is stopping, or the feature is not running
    TOO_LARGE = "too-large"
    INTERNAL = "internal"


ERROR_CODES: Final[frozenset[str]] = frozenset(c.value for c in ErrorCode)

#: method -> the permission it needs (``None``: any logged-in user; ``"start_flow"``: see :func:`allowed`).
METHODS: Final[Mapping[str, str | None]] = {
    "ping": None,
    "whoami": None,
    "node_info": PERMISSION_READ,
    "network_map": PERMISSION_READ,
    "queue_statistics": PERMISSION_READ,
    "list_flows": PERMISSION_READ,
    "watch_flow": PERMISSION_READ,
    "start_flow": "start_flow",
    "registered_flows": PERMISSION_READ,
    "retry_flow": PERMISSION_ADMIN,
    "kill_flow": PERMISSION_ADMIN,
    "drain": PERMISSION_ADMIN,
    "undrain": PERMISSION_ADMIN,
}


#: method -> its arguments: name -> (required, the msgpack types it may have; ``object``: any). Any other
#: argument, a missing required one or a value of another type is ``bad-arguments`` (a misspelt ``wait``
#: must not be ignored). ``login`` declares its two arguments optional and of any type: an unknown one is
#: ``bad-arguments`` like for every method, but a missing or non-string user or password is a failed login
#: (``unauthenticated``), checked by the login itself. An optional argument given as nil is absent (its
#: default), as if left out, except where any value is taken (``object``: ``ping``'s ``echo`` answers nil).
METHOD_ARGUMENTS: Final[Mapping[str, Mapping[str, tuple[bool, tuple[type, ...]]]]] = {
    "login": {"user": (False, (object,)), "password": (False, (object,))},
    "ping": {"echo": (False, (object,))},
    "whoami": {},
    "node_info": {},
    "network_map": {},
    "queue_statistics": {},
    "registered_flows": {},
    "list_flows": {"state": (False, (str,))},
    "watch_flow": {"flow_id": (True, (str,))},
    "start_flow": {
        "flow": (True, (str,)),
        "args": (False, (dict,)),
        "wait": (False, (bool,)),
        "client_id": (False, (str,)),
    },
    "retry_flow": {"flow_id": (True, (str,))},
    "kill_flow": {"flow_id": (True, (str,))},
    "drain": {},
    "undrain": {},
}

_TYPE_NAMES: Final = {str: "a string", dict: "a map", bool: "a boolean", type(None): "nil"}


def check_arguments(method: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments ``method`` runs with: ``args`` without the optional ones given as nil (absent, as if
    left out: ``wait: nil`` waits, as ``list_flows`` with ``state: nil`` lists all), unless they take any
    value (see :data:`METHOD_ARGUMENTS`; a method not in it is not checked here and gets ``args``).

    Raises:
        RpcProtocolError: ``bad-arguments``: ``args`` are not what ``method`` takes.
    """
    spec = METHOD_ARGUMENTS.get(method)
    if spec is None:
        return dict(args)
    for name, value in args.items():
        if name not in spec:
            takes = f"takes {', '.join(repr(n) for n in spec)}" if spec else "takes no arguments"
            message = f"{method} has no argument {name!r} ({method} {takes})"
            raise RpcProtocolError(ErrorCode.BAD_ARGUMENTS, message)
        required, kinds = spec[name]
        if object in kinds or (value is None and not required):
            continue
        if not isinstance(value, kinds):
            allowed_kinds = kinds if required else (*kinds, type(None))
            want = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in allowed_kinds)
            raise RpcProtocolError(
                ErrorCode.BAD_ARGUMENTS, f"{method}: {name!r} must be {want}, got {type(value).__name__}"
            )
    for name, (required, _) in spec.items():
        if required and name not in args:
            raise RpcProtocolError(ErrorCode.BAD_ARGUMENTS, f"{method} needs {name!r}")
    return {k: v for k, v in args.items() if v is not None or object in spec[k][1]}


class RpcProtocolError(Exception):
    """A frame that breaks the protocol; ``code`` is the :class:`ErrorCode` to answer with."""

    def __init__(self, code: ErrorCode, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


def parse_permission(text: object) -> str:
    """Validate a permission string; returns it.

    Raises:
        ValueError: not one of ``admin``, ``read``, ``start_flow:*``, ``start_flow:<FlowName>``.
    """
    if isinstance(text, str):
        if text in (PERMISSION_ADMIN, PERMISSION_READ, _START_PREFIX + "*"):
            return text
        if text.startswith(_START_PREFIX) and _FLOW_NAME.fullmatch(text[len(_START_PREFIX) :]):
            return text
    raise ValueError(
        f"unknown permission {text!r} (allowed: admin, read, start_flow:*, start_flow:<FlowName>)"
    )


def allowed(permissions: Iterable[str], method: str, flow: str | None = None) -> bool:
    """Whether ``permissions`` allow calling ``method`` (for ``start_flow``, of flow ``flow``)."""
    perms = permissions if isinstance(permissions, (set, frozenset)) else frozenset(permissions)
    if PERMISSION_ADMIN in perms:
        return True
    need = METHODS.get(method, PERMISSION_ADMIN)
    if need is None:
        return True
    if need == "start_flow":
        if f"{_START_PREFIX}*" in perms:
            return True
        # A flow is named by its class name or its full name; a permission may use either.
        return flow is not None and (
            f"{_START_PREFIX}{flow}" in perms or f"{_START_PREFIX}{flow.rsplit('.', 1)[-1]}" in perms
        )
    return need in perms


@final
@attrs.frozen(kw_only=True)
class Request:
    """A decoded request frame."""

    id: int
    method: str
    args: dict[str, Any]


def request_frame(request_id: int, method: str, args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"id": request_id, "method": method, "args": dict(args or {})}


def ok_frame(request_id: int | None, value: Any) -> dict[str, Any]:
    return {"id": request_id, "ok": value}


def event_frame(request_id: int, value: Any) -> dict[str, Any]:
    return {"id": request_id, "event": value}


def error_frame(request_id: int | None, code: ErrorCode, message: str) -> dict[str, Any]:
    return {"id": request_id, "error": {"code": code.value, "message": message[:2000]}}


def parse_request(frame: object) -> Request:
    """Shape-check a decoded request frame.

    Raises:
        RpcProtocolError: malformed (``request_id`` is set when the id could be read).
    """
    if not isinstance(frame, dict):
        raise RpcProtocolError(ErrorCode.MALFORMED, f"a frame must be a map, got {type(frame).__name__}")
    request_id = frame.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, int) or not 0 <= request_id < 2**63:
        raise RpcProtocolError(
            ErrorCode.MALFORMED, f"'id' must be an integer in 0..2**63-1, got {request_id!r}"
        )
    method = frame.get("method")
    if not isinstance(method, str):
        raise RpcProtocolError(ErrorCode.MALFORMED, "'method' must be a string", request_id)
    args = frame.get("args", {})
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise RpcProtocolError(ErrorCode.MALFORMED, "'args' must be a map with string keys", request_id)
    unknown = set(frame) - {"id", "method", "args"}
    if unknown:
        raise RpcProtocolError(ErrorCode.MALFORMED, f"unknown frame field {sorted(unknown)[0]!r}", request_id)
    return Request(id=request_id, method=method, args=args)
