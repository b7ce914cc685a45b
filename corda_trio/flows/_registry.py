"""Registries (PURE): payload types (attrs classes allowed on the wire and in checkpoints) and flow classes.

Nothing is ever resolved by importing a module a peer names: a peer's bytes can only select a class that
this process registered explicitly. Payload types are registered with a wire name and a version
(:func:`payload_type`); flow classes register themselves when defined (every :class:`FlowLogic` subclass,
under ``flow_name``), and :func:`initiating_flow` / :func:`initiated_by` add them to the session registries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

import attrs

from ._errors import PayloadError, UnknownFlowError

__all__ = [
    "BUILTIN_TYPES",
    "FlowRegistry",
    "PayloadRegistry",
    "payload_type",
    "payloads",
    "registry",
    "type_name",
    "type_named",
]

T = TypeVar("T")

#: Types a receive may name besides registered payload types.
BUILTIN_TYPES: Final[dict[str, type]] = {
    "object": object, "none": type(None), "bool": bool, "int": int, "float": float, "str": str,
    "bytes": bytes, "list": list, "dict": dict,
}  # fmt: skip
_BUILTIN_NAMES: Final = {v: k for k, v in BUILTIN_TYPES.items()}


@attrs.define(eq=False)
class PayloadRegistry:
    """Wire name -> (class, version) and back."""

    _by_name: dict[str, tuple[type, int]] = attrs.field(factory=dict)
    _by_class: dict[type, tuple[str, int]] = attrs.field(factory=dict)

    def register(self, cls: type[T], *, name: str | None = None, version: int = 1) -> type[T]:
        """Allow ``cls`` (an attrs class) in payloads as ``name`` (default: its qualified name).

        Raises:
            TypeError: ``cls`` is not an attrs class.
            ValueError: ``name`` is taken by another class.
        """
        if not attrs.has(cls):
            raise TypeError(f"{cls.__qualname__} is not an attrs class; only attrs classes can be payloads")
        wire = name or f"{cls.__module__}.{cls.__qualname__}"
        old = self._by_name.get(wire)
        if old is not None and old[0].__qualname__ != cls.__qualname__:
            raise ValueError(f"payload type name {wire!r} is already registered for {old[0].__qualname__}")
        self._by_name[wire] = (cls, version)
        self._by_class[cls] = (wire, version)
        return cls

    def name_of(self, cls: type) -> tuple[str, int] | None:
        return self._by_class.get(cls)

    def lookup(self, name: str, version: int) -> type:
        """The class registered as ``name`` at ``version``.

        Raises:
            PayloadError: unknown name, or a version other than the registered one.
        """
        entry = self._by_name.get(name)
        if entry is None:
            raise PayloadError(f"payload type {name!r} is not registered")
        cls, registered = entry
        if version != registered:
            raise PayloadError(
                f"payload type {name!r} version {version} is not the registered version {registered}"
            )
        return cls

    def class_named(self, name: str) -> type | None:
        entry = self._by_name.get(name)
        return None if entry is None else entry[0]


def type_name(cls: type) -> str:
    """The name a typed receive records in a checkpoint for ``cls``.

    Raises:
        PayloadError: ``cls`` is neither a builtin payload type nor registered.
    """
    builtin = _BUILTIN_NAMES.get(cls)
    if builtin is not None:
        return builtin
    entry = payloads.name_of(cls)
    if entry is None:
        raise PayloadError(f"{cls.__qualname__} is not a registered payload type (use @payload_type)")
    return entry[0]


def type_named(name: str) -> type:
    """Inverse of :func:`type_name`.

    Raises:
        PayloadError: unknown name.
    """
    builtin = BUILTIN_TYPES.get(name)
    if builtin is not None:
        return builtin
    cls = payloads.class_named(name)
    if cls is None:
        raise PayloadError(f"payload type {name!r} is not registered")
    return cls


@attrs.define(eq=False)
class FlowRegistry:
    """Flow classes by name; which are initiating, which respond to which, which may be started by name."""

    by_name: dict[str, type] = attrs.field(factory=dict)
    initiating: dict[str, type] = attrs.field(factory=dict)
    #: initiating flow name -> responder class
    responders: dict[str, type] = attrs.field(factory=dict)
    #: short names (class name) -> full names of startable flows
    short: dict[str, list[str]] = attrs.field(factory=dict)

    def add(self, cls: type) -> None:
        self.by_name[cls.flow_name] = cls  # type: ignore[attr-defined]

    def flow_class(self, name: str) -> type:
        """The flow class registered as ``name``.

        Raises:
            UnknownFlowError: no such class (a checkpoint naming it cannot be resumed by this code).
        """
        cls = self.by_name.get(name)
        if cls is None:
            raise UnknownFlowError(f"no flow class {name!r} is registered")
        return cls

    def startable(self, name: str) -> type:
        """An initiating (startable) flow by its full ``flow_name`` or its class name.

        Raises:
            UnknownFlowError: none, or the class name is ambiguous.
        """
        cls = self.initiating.get(name)
        if cls is not None:
            return cls
        full = self.short.get(name, [])
        if len(full) == 1:
            return self.initiating[full[0]]
        if len(full) > 1:
            raise UnknownFlowError(f"flow name {name!r} is ambiguous: {', '.join(sorted(full))}")
        known = ", ".join(sorted({n.rsplit(".", 1)[-1] for n in self.initiating})) or "none"
        raise UnknownFlowError(f"no startable flow named {name!r} (known: {known})")


#: The process-wide registries the decorators fill.
payloads: Final = PayloadRegistry()
registry: Final = FlowRegistry()


def payload_type(*, name: str | None = None, version: int = 1) -> Callable[[type[T]], type[T]]:
    """Class decorator: allow this attrs class in session payloads and checkpoints as ``name`` / ``version``.

    Decoding checks the version: bytes naming another version are a :class:`PayloadError`, never guessed at.
    """

    def register(cls: type[T]) -> type[T]:
        return payloads.register(cls, name=name, version=version)

    return register
