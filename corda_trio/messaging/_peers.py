"""Who the peers are and where to reach them: the :class:`PeerResolver` seam and an in-memory directory.

``messaging`` and ``bridge`` do not import ``network``: the node feeds network map events (node added,
removed, addresses changed) into a :class:`PeerDirectory`, and the messaging service and the bridges read it
through the :class:`PeerResolver` protocol. The other way, when they meet a name the directory does not hold
(a recipient, a message's sender), they say so (:meth:`PeerResolver.report_unknown`): the node has its
network map updater poll the map early (``PeerDirectory.on_unknown``), since the node of that name may have
joined the map after the last poll.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import attrs
import trio

from corda_trio import pki

__all__ = ["Peer", "PeerDirectory", "PeerResolver"]


@attrs.frozen(kw_only=True)
class Peer:
    """A peer node: its legal name, the key-hash of its legal identity key and its P2P addresses."""

    legal_name: pki.CordaX500Name
    key_hash: str
    addresses: tuple[tuple[str, int], ...] = attrs.field(converter=lambda a: tuple((h, int(p)) for h, p in a))


@runtime_checkable
class PeerResolver(Protocol):
    """Read access to the network's nodes, with change notification."""

    @property
    def version(self) -> int:
        """Increases on every change."""

    def peer(self, key_hash: str) -> Peer | None:
        """The node whose identity key hashes to ``key_hash``, if known."""

    def peer_named(self, legal_name: pki.CordaX500Name) -> Peer | None:
        """The node with this legal name, if known."""

    def peers(self) -> list[Peer]:
        """Every known node."""

    async def wait_changed(self, since: int) -> int:
        """Wait until :attr:`version` exceeds ``since``; returns the new version."""

    def report_unknown(self) -> None:
        """A name (or key-hash) that is not known here was met: whoever follows the network map may look
        again soon. Cheap and synchronous; call it as often as it happens (the follower coalesces)."""


@attrs.define(eq=False)
class PeerDirectory:
    """An in-memory :class:`PeerResolver`, updated by whoever follows the network map.

    Attributes:
        on_unknown: called by :meth:`report_unknown` (the node: its network map updater's ``poll_soon``);
            ``None``: nothing to tell.
    """

    on_unknown: Callable[[], None] | None = None
    _by_hash: dict[str, Peer] = attrs.field(factory=dict, init=False)
    _version: int = attrs.field(default=0, init=False)
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)

    @classmethod
    def of(cls, peers: Iterable[Peer]) -> PeerDirectory:
        directory = cls()
        for p in peers:
            directory.put(p)
        return directory

    @property
    def version(self) -> int:
        return self._version

    def peer(self, key_hash: str) -> Peer | None:
        return self._by_hash.get(key_hash)

    def peer_named(self, legal_name: pki.CordaX500Name) -> Peer | None:
        for p in self._by_hash.values():
            if p.legal_name == legal_name:
                return p
        return None

    def peers(self) -> list[Peer]:
        return list(self._by_hash.values())

    def put(self, peer: Peer) -> None:
        """Add a node or replace what is known about it (a no-op when nothing changed)."""
        if self._by_hash.get(peer.key_hash) != peer:
            self._by_hash[peer.key_hash] = peer
            self._bump()

    def remove(self, key_hash: str) -> None:
        """Forget a node (a no-op when unknown)."""
        if self._by_hash.pop(key_hash, None) is not None:
            self._bump()

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self, since: int) -> int:
        while self._version <= since:
            await self._changed.wait()
        return self._version

    def report_unknown(self) -> None:
        if self.on_unknown is not None:
            self.on_unknown()
