"""A peer directory in a JSON file: what tests and benchmarks give the node processes they start, in place of
a network map. One writer (the test) replaces the file atomically; each node process follows it.

The file holds ``[{"name": legal name, "key_hash": ..., "addresses": [[host, port], ...]}, ...]``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import trio

from corda_trio import messaging, pki

__all__ = ["follow_peer_file", "write_peer_file"]


def write_peer_file(path: Path, peers: Iterable[messaging.Peer]) -> None:
    """Replace ``path`` with ``peers`` in one step (a reader never sees half a file)."""
    entries = [
        {"name": str(p.legal_name), "key_hash": p.key_hash, "addresses": [list(a) for a in p.addresses]}
        for p in peers
    ]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(entries))
    os.replace(tmp, path)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b"[]"  # none yet


def _parse(raw: bytes) -> list[messaging.Peer]:
    return [
        messaging.Peer(
            legal_name=pki.CordaX500Name.parse(e["name"]),
            key_hash=e["key_hash"],
            addresses=[(h, p) for h, p in e["addresses"]],
        )
        for e in json.loads(raw)
    ]


async def follow_peer_file(
    path: Path, directory: messaging.PeerDirectory, *, own_key_hash: str, poll_seconds: float = 0.05
) -> None:
    """Keep ``directory`` equal to the peers in ``path`` other than ``own_key_hash``: added, changed and
    removed as the file changes (polled). Runs until cancelled."""
    last: bytes | None = None
    while True:
        raw = _read(path)
        if raw != last:  # parsed only when the file changed
            last = raw
            wanted = {p.key_hash: p for p in _parse(raw) if p.key_hash != own_key_hash}
            for key_hash, peer in wanted.items():
                if directory.peer(key_hash) != peer:
                    directory.put(peer)
            for known in directory.peers():
                if known.key_hash not in wanted:
                    directory.remove(known.key_hash)
        await trio.sleep(poll_seconds)
