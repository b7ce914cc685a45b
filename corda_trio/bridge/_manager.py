"""The bridge manager: one supervised :class:`Bridge` per outbound queue whose peer is in the network map.

Theory of operation
-------------------
The manager owns one nursery; every bridge runs in it under a supervisor task with its own cancel scope.
It keeps the set of running bridges equal to the *wanted* set: the outbound queues the messaging service
knows (``internal.peers.<key-hash>``, existing at start or declared on a first send) whose key-hash
the :class:`~corda_trio.messaging.PeerResolver` knows. So a node added to the map (or a first message to it)
starts a bridge, a node removed from the map stops its bridge (its queue stays, with whatever it holds), and
an address change is handled by the bridge itself (it reconnects). A bridge that raises is logged and
restarted after a backoff; it never takes the manager, or the node, down. A message a peer *rejects* is
moved to the dead-letter queue (``dead_letter``), so that it does not block the queue behind it. Stopping a
bridge is a cancellation, which is safe at any checkpoint (see ``_outbound``).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import attrs
import trio

from corda_trio.messaging import MessagingService, PeerResolver, key_hash_of_address

from ._backoff import Backoff
from ._outbound import Bridge, BridgeConfig, DeadLetter, OutboundSource

__all__ = ["BridgeManager", "OutboundQueues"]

log = logging.getLogger("corda_trio.bridge.manager")


async def _first_of(waiters: trio.Nursery, wait: Callable[[int], Awaitable[int]], since: int) -> None:
    await wait(since)
    waiters.cancel_scope.cancel()


class OutboundQueues(Protocol):
    """The outbound queues a manager serves: the node's ``MessagingService``, or in a bridge process the
    queues the node announced over the control protocol."""

    @property
    def outbound_version(self) -> int: ...

    def outbound_queues(self) -> Mapping[str, OutboundSource]: ...

    async def wait_outbound_changed(self, since: int) -> int: ...


@attrs.define(eq=False)
class _Slot:
    bridge: Bridge
    scope: trio.CancelScope
    restarts: int = 0
    finished: trio.Event = attrs.field(factory=trio.Event)
    #: The slot this one replaces: it must have finished (released what it held) before this one starts,
    #: or two sessions of one queue would interleave and break the per-sender order.
    previous: _Slot | None = None


@attrs.define(eq=False)
class BridgeManager:
    """See the module docstring. ``await nursery.start(manager.run)``."""

    messaging: OutboundQueues | MessagingService
    resolver: PeerResolver
    ssl_context: ssl.SSLContext | None
    config: BridgeConfig = attrs.field(factory=BridgeConfig)
    #: For messages a peer rejects; default: ``messaging.dead_letter`` of a ``MessagingService``.
    dead_letter: DeadLetter | None = None
    _slots: dict[str, _Slot] = attrs.field(factory=dict)
    _stopping: dict[str, _Slot] = attrs.field(factory=dict)
    _changed: trio.Event = attrs.field(factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        if self.dead_letter is None and isinstance(self.messaging, MessagingService):
            self.dead_letter = self.messaging.dead_letter

    def bridges(self) -> dict[str, Bridge]:
        """Running bridges by queue name."""
        return {name: slot.bridge for name, slot in self._slots.items()}

    def restarts(self, queue_name: str) -> int:
        slot = self._slots.get(queue_name)
        return slot.restarts if slot is not None else 0

    async def wait_bridges_changed(self) -> None:
        await self._changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start, stop and supervise bridges until cancelled."""
        async with trio.open_nursery() as nursery:
            outbound_seen = self.messaging.outbound_version
            peers_seen = self.resolver.version
            self._sync(nursery)
            task_status.started()
            while True:
                async with trio.open_nursery() as waiters:
                    waiters.start_soon(
                        _first_of, waiters, self.messaging.wait_outbound_changed, outbound_seen
                    )
                    waiters.start_soon(_first_of, waiters, self.resolver.wait_changed, peers_seen)
                outbound_seen = self.messaging.outbound_version
                peers_seen = self.resolver.version
                self._sync(nursery)

    def _sync(self, nursery: trio.Nursery) -> None:
        wanted = {
            name: queue
            for name, queue in self.messaging.outbound_queues().items()
            if self.resolver.peer(key_hash_of_address(name)) is not None
        }
        for name in list(self._slots):
            if name not in wanted:
                log.info("bridge %s: peer left the network map, stopping", name)
                slot = self._slots.pop(name)
                slot.scope.cancel()
                self._stopping[name] = slot
        for name, queue in wanted.items():
            if name not in self._slots:
                bridge = Bridge(
                    queue=queue,
                    resolver=self.resolver,
                    ssl_context=self.ssl_context,
                    config=self.config,
                    dead_letter=self.dead_letter,
                )
                slot = _Slot(bridge=bridge, scope=trio.CancelScope(), previous=self._stopping.pop(name, None))
                self._slots[name] = slot
                nursery.start_soon(self._supervise, name, slot)
                log.info("bridge %s: started", name)
        self._changed.set()
        self._changed = trio.Event()

    async def _supervise(self, name: str, slot: _Slot) -> None:
        backoff = Backoff(self.config.initial_backoff_seconds, self.config.max_backoff_seconds)
        try:
            with slot.scope:
                if slot.previous is not None:
                    await slot.previous.finished.wait()
                await self._supervised_loop(name, slot, backoff)
        finally:
            if slot.previous is not None and not slot.previous.finished.is_set():
                with trio.CancelScope(shield=True):  # it was cancelled: it finishes promptly
                    await slot.previous.finished.wait()
            slot.previous = None
            slot.finished.set()
            if self._stopping.get(name) is slot:
                del self._stopping[name]

    async def _supervised_loop(self, name: str, slot: _Slot, backoff: Backoff) -> None:
        while True:
            try:
                await slot.bridge.run()
            except Exception:
                log.exception("bridge %s crashed; restarting", name)
            slot.restarts += 1
            await trio.sleep(backoff.next_delay())
            slot.bridge = Bridge(
                queue=slot.bridge.queue,
                resolver=self.resolver,
                ssl_context=self.ssl_context,
                config=self.config,
                dead_letter=self.dead_letter,
            )
