"""``FlowLogic`` and the registration decorators (PURE).

A flow is an attrs class deriving from :class:`FlowLogic`; its fields are its state. ``call(self, ctx)`` is
the first step; every other step is a method ``(self, ctx, result)``. Each returns one request built by the
context (:class:`~._statemachine.FlowContext`), which names the next step::

    @initiating_flow
    @attrs.define
    class Ping(FlowLogic[str]):
        recipient: str

        def call(self, ctx):
            session = ctx.initiate_flow(self.recipient)
            return ctx.send_and_receive(session, "ping", str, then=self.got_pong)

        def got_pong(self, ctx, pong):
            return ctx.finish(pong)

    @initiated_by(Ping)
    @attrs.define
    class Pong(FlowLogic[None]):
        session: FlowSession

        def call(self, ctx):
            return ctx.receive(self.session, str, then=self.got_ping)

        def got_ping(self, ctx, ping):
            return ctx.send(self.session, "pong", then=self.done)

        def done(self, ctx, _):
            return ctx.finish(None)

Rules that make a checkpoint replay do the same thing: steps read the clock and other nodes only through the
context, never do I/O, never use ``random``/``uuid4``/``time``. A flow's fields hold only payload values
(builtins, registered payload types, :class:`FlowSession`); a field that is state rather than input is
declared ``attrs.field(default=..., init=False)``, so that starting the flow by name cannot set it. Version
a flow (``flow_version``) when its fields or steps change: a checkpoint of another version is reported, not
guessed at.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import attrs

from ._registry import registry

__all__ = ["FlowLogic", "initiated_by", "initiating_flow"]

R = TypeVar("R")
F = TypeVar("F", bound=type)


class FlowLogic(Generic[R]):
    """Base class of flows; subclasses are attrs classes (see the module docstring)."""

    #: The name checkpoints and session inits use (default: ``module.QualifiedName``).
    flow_name: ClassVar[str] = "corda_trio.flows.FlowLogic"
    #: Bump when the fields or steps change incompatibly.
    flow_version: ClassVar[int] = 1
    #: Carried in session inits and confirms (Corda's CorDapp name).
    app_name: ClassVar[str] = "corda-trio"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "flow_name" not in cls.__dict__:
            cls.flow_name = f"{cls.__module__}.{cls.__qualname__}"
        old = registry.by_name.get(cls.flow_name)
        registry.add(cls)
        if old is not None:  # attrs' slotted class replaces the class it was built from
            for table in (registry.initiating, registry.responders):
                for key, value in list(table.items()):
                    if value is old:
                        table[key] = cls

    def call(self, ctx: Any) -> Any:
        """The first step."""
        raise NotImplementedError(f"{type(self).__qualname__}.call")


def initiating_flow(cls: F) -> F:
    """Mark a flow as able to open sessions (and to be started by name, e.g. over RPC)."""
    if not (isinstance(cls, type) and issubclass(cls, FlowLogic)) or not attrs.has(cls):
        raise TypeError("@initiating_flow applies to attrs classes deriving from FlowLogic")
    registry.add(cls)
    registry.initiating[cls.flow_name] = cls
    names = registry.short.setdefault(cls.__name__, [])
    if cls.flow_name not in names:
        names.append(cls.flow_name)
    return cls


def initiated_by(initiator: type[FlowLogic[Any]]) -> Callable[[F], F]:
    """Register the decorated flow as the responder to ``initiator``'s sessions. It must have a field
    ``session`` (a :class:`FlowSession`) and defaults for every other field."""

    def register(cls: F) -> F:
        if not (isinstance(cls, type) and issubclass(cls, FlowLogic)) or not attrs.has(cls):
            raise TypeError("@initiated_by applies to attrs classes deriving from FlowLogic")
        if "session" not in attrs.fields_dict(cls):
            raise TypeError(f"responder {cls.__qualname__} needs a field 'session'")
        registry.add(cls)
        registry.responders[initiator.flow_name] = cls
        return cls

    return register
