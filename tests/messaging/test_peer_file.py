"""testing.write_peer_file / follow_peer_file: the file-based peer directory of the process tests."""

from __future__ import annotations

from pathlib import Path

import trio

from corda_trio import messaging, pki, testing

OWN, BOB, CAROL = "h-own", "h-bob", "h-carol"


def peer(name: str, key_hash: str, *ports: int) -> messaging.Peer:
    legal = pki.CordaX500Name.parse(f"O={name}, L=London, C=GB")
    return messaging.Peer(legal_name=legal, key_hash=key_hash, addresses=[("127.0.0.1", p) for p in ports])


async def test_follow_adds_changes_and_removes_peers_but_never_itself(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "peers.json"
    directory = messaging.PeerDirectory()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: testing.follow_peer_file(path, directory, own_key_hash=OWN))
        await trio.sleep(1)
        assert directory.peers() == []  # no file yet: nobody
        testing.write_peer_file(path, [peer("Own", OWN, 1), peer("Bob", BOB, 2), peer("Carol", CAROL, 3)])
        await trio.sleep(1)
        assert sorted(p.key_hash for p in directory.peers()) == [BOB, CAROL]
        version = directory.version
        testing.write_peer_file(path, [peer("Own", OWN, 1), peer("Bob", BOB, 2), peer("Carol", CAROL, 3)])
        await trio.sleep(1)
        assert directory.version == version  # the same peers again: no change event
        testing.write_peer_file(path, [peer("Bob", BOB, 4, 5)])
        await trio.sleep(1)
        assert directory.peers() == [peer("Bob", BOB, 4, 5)]
        nursery.cancel_scope.cancel()
    assert not (tmp_path / "peers.json.tmp").exists()
