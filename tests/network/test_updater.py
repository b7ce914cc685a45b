"""Node-side updater: publish -> poll -> added / changed / removed events across two clients, the persisted
cache, and directory mode."""

from __future__ import annotations

import functools
import logging
import os
import resource
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from corda_trio import network, pki
from corda_trio.network import _codec

from .conftest import ALICE, BOB, NOW, make_service, signed_node_info


def _updater(
    creds: pki.NetworkCredentials,
    db: Path,
    *,
    port: int | None = None,
    directory: Path | None = None,
    own: bytes | None = None,
) -> tuple[network.NetworkMapUpdater, trio.MemoryReceiveChannel[network.MapEvent]]:
    send, receive = trio.open_memory_channel[network.MapEvent](100)
    updater = network.NetworkMapUpdater(
        trust_root=creds.root.cert,
        cache=network.NodeInfoCache(db),
        events=send,
        client=network.NetworkMapClient(f"http://127.0.0.1:{port}") if port else None,
        node_infos_dir=directory,
        own_node_info=own,
    )
    return updater, receive


def _touch(path: Path) -> Path:
    path.touch()
    return path


def _summary(events: list[network.MapEvent]) -> list[tuple[str, str]]:
    out = []
    for e in events:
        if isinstance(e, network.NodeAdded | network.NodeRemoved):
            out.append((type(e).__name__, str(e.node.legal_name)))
        elif isinstance(e, network.NodeChanged):
            out.append(("NodeChanged", str(e.new.legal_name)))
        else:
            out.append((type(e).__name__, e.new_hash[:8]))
    return out


async def test_two_clients_see_each_other_and_changes(
    map_server: tuple[network.NetworkMapService, int],
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tmp_path: Path,
) -> None:
    service, port = map_server
    a, a_events = _updater(creds, tmp_path / "a.db", port=port, own=signed_node_info(alice, 10002, serial=1))
    b, _b_events = _updater(creds, tmp_path / "b.db", port=port, own=signed_node_info(bob, 10003, serial=1))
    await a.publish_own()
    await b.publish_own()
    events, interval = await a.poll_once()
    assert interval == 7.0
    params_hash = service.store.current_parameters_hash()
    assert params_hash is not None
    assert _summary(events) == [
        ("NetworkParametersChanged", params_hash[:8]), ("NodeAdded", str(ALICE)), ("NodeAdded", str(BOB)),
    ]  # fmt: skip
    assert _summary(events) == _summary([a_events.receive_nowait() for _ in events])
    events, _ = await b.poll_once()
    assert {n for _, n in _summary(events)[1:]} == {str(ALICE), str(BOB)}
    assert b.nodes()[str(ALICE)].node_info.addresses[0].port == 10002
    # Nothing new: no events.
    assert (await a.poll_once())[0] == []
    # Bob moves to another port: both see "changed" with new addresses.
    await network.NetworkMapClient(f"http://127.0.0.1:{port}").publish(signed_node_info(bob, 20003, serial=2))
    (changed,), _ = await a.poll_once()
    assert isinstance(changed, network.NodeChanged) and changed.addresses_changed
    assert changed.new.node_info.addresses[0].port == 20003 and changed.old.node_info.serial == 1
    assert _summary((await b.poll_once())[0]) == [("NodeChanged", str(BOB))]
    # The operator removes Alice: both see "removed".
    assert service.store.remove_node(str(ALICE))
    assert _summary((await a.poll_once())[0]) == [("NodeRemoved", str(ALICE))]
    assert _summary((await b.poll_once())[0]) == [("NodeRemoved", str(ALICE))]

    # Restart of A: the persisted cache comes back as NodeAdded events, then polling has nothing new.
    a.cache.close()
    a2, _a2_events = _updater(creds, tmp_path / "a.db", port=port)
    assert _summary(await a2.load_cache()) == [("NodeAdded", str(BOB))]
    assert a2.nodes()[str(BOB)].node_info.addresses[0].port == 20003
    assert (await a2.poll_once())[0] == []


async def test_run_publishes_and_polls(
    map_server: tuple[network.NetworkMapService, int],
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    tmp_path: Path,
    nursery: trio.Nursery,
) -> None:
    _, port = map_server
    a, a_events = _updater(creds, tmp_path / "a.db", port=port, own=signed_node_info(alice, 10002))
    await nursery.start(a.run)
    with trio.fail_after(10):
        seen = []
        while ("NodeAdded", str(ALICE)) not in seen:  # its own NodeInfo comes back from the map
            seen.extend(_summary([await a_events.receive()]))


async def test_bad_entries_are_ignored_and_directory_mode(
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    infos = tmp_path / "additional-node-infos"
    infos.mkdir()
    alice_info = signed_node_info(alice, 10002, serial=1)
    (infos / f"nodeInfo-{network.decode_signed_node_info(alice_info).hash}").write_bytes(alice_info)
    (infos / "nodeInfo-garbage").write_bytes(b"garbage")
    mallory = pki.NetworkCredentials.create(now=NOW).issue_node(BOB, now=NOW)
    (infos / "nodeInfo-mallory").write_bytes(signed_node_info(mallory))
    (infos / "README").write_text("not a node info")
    # sparse: larger than any payload, read no further
    os.truncate(_touch(infos / "nodeInfo-huge"), network.MAX_PAYLOAD_BYTES + 1)
    u, _ = _updater(creds, tmp_path / "c.db", directory=infos)
    assert _summary((await u.poll_once())[0]) == [("NodeAdded", str(ALICE))]
    assert any("nodeInfo-huge" in r.getMessage() and "larger than 64 MiB" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    # A newer serial in another file wins; the old file can stay.
    (infos / "nodeInfo-alice-2").write_bytes(signed_node_info(alice, 10009, serial=2))
    (changed,), _ = await u.poll_once()
    assert isinstance(changed, network.NodeChanged) and changed.new.node_info.addresses[0].port == 10009
    shutil.rmtree(infos)
    assert _summary((await u.poll_once())[0]) == [("NodeRemoved", str(ALICE))]


async def test_run_with_cache_and_unbuffered_channel(
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tmp_path: Path,
    nursery: trio.Nursery,
) -> None:
    """Cached nodes are in ``nodes()`` when start() returns and arrive as events after it (a consumer that
    starts late does not deadlock); directory changes show up at the next poll.  Real time: the updater
    works in threads, and an autojump clock would jump while they run."""
    infos = tmp_path / "infos"
    infos.mkdir()
    cache = network.NodeInfoCache(tmp_path / "cache.db")
    alice_node = network.verify_node_info(
        signed_node_info(alice, serial=1), trust_root=creds.root.cert, now=NOW
    )
    cache.replace_all({str(ALICE): alice_node})
    (infos / "nodeInfo-alice").write_bytes(alice_node.serialize())
    send, receive = trio.open_memory_channel[network.MapEvent](0)
    updater = network.NetworkMapUpdater(
        trust_root=creds.root.cert, cache=cache, events=send, node_infos_dir=infos
    )
    await nursery.start(updater.run)
    assert list(updater.nodes()) == [str(ALICE)]
    with trio.fail_after(10):
        assert _summary([await receive.receive()]) == [("NodeAdded", str(ALICE))]
        (infos / "nodeInfo-bob").write_bytes(signed_node_info(bob, serial=1))
        assert _summary([await receive.receive()]) == [("NodeAdded", str(BOB))]
    assert set(network.NodeInfoCache(tmp_path / "cache.db").load()) == {str(ALICE), str(BOB)}


async def test_the_directory_is_read_while_the_map_cannot_be_reached(
    creds: pki.NetworkCredentials, alice: pki.NodeCredentials, bob: pki.NodeCredentials, tmp_path: Path
) -> None:
    with trio.socket.socket() as s:  # a port where nothing listens
        await s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    infos = tmp_path / "additional-node-infos"
    infos.mkdir()
    u, events = _updater(creds, tmp_path / "d.db", port=dead, directory=infos)
    alice_info = signed_node_info(alice, 10002, serial=1)
    (infos / "nodeInfo-alice").write_bytes(alice_info)
    with pytest.raises((network.NetworkMapError, OSError)):
        await u.poll_once()  # the map's failure is still reported, for the retry ...
    assert sorted(u.nodes()) == [str(ALICE)]  # ... but the directory's node is in the view
    assert _summary([events.receive_nowait()]) == [("NodeAdded", str(ALICE))]
    assert list(network.NodeInfoCache(tmp_path / "d.db").load()) == [str(ALICE)]  # and persisted
    # nothing is removed while the map cannot be asked, even when its file goes
    (infos / "nodeInfo-alice").unlink()
    (infos / "nodeInfo-bob").write_bytes(signed_node_info(bob, 10003, serial=1))
    with pytest.raises((network.NetworkMapError, OSError)):
        await u.poll_once()
    assert sorted(u.nodes()) == sorted([str(ALICE), str(BOB)])
    assert _summary([events.receive_nowait()]) == [("NodeAdded", str(BOB))]


async def test_a_frozen_map_service_is_reported_when_the_first_publish_times_out(
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A SIGSTOP'd map service, as its clients meet it: the kernel completes the TCP handshake (the listen
    # backlog) and nothing ever answers. The first publish times out; it used to be retried at once without a
    # word, so a frozen map was first logged after two request timeouts (a minute, by default).
    timeout = 5.0
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)
        send, _receive = trio.open_memory_channel[network.MapEvent](100)
        updater = network.NetworkMapUpdater(
            trust_root=creds.root.cert,
            cache=network.NodeInfoCache(tmp_path / "frozen.db"),
            events=send,
            client=network.NetworkMapClient(
                f"http://127.0.0.1:{frozen.getsockname()[1]}", timeout_seconds=timeout
            ),
            own_node_info=signed_node_info(alice, 10002),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(updater.run)
            started = trio.current_time()
            while not _failed_publications(caplog):  # noqa: ASYNC110 (log records: no event to wait on)
                await trio.sleep(0.1)
            waited = trio.current_time() - started
            nursery.cancel_scope.cancel()
    assert waited < 2 * timeout, waited
    first = _failed_publications(caplog)[0]
    assert first.levelname == "WARNING"
    assert first.getMessage().endswith(f"/network-map/publish: no answer within {timeout} s"), first.message


def _failed_publications(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "publishing our NodeInfo failed" in r.getMessage()]


def _stored_as_an_older_service_did(service: network.NetworkMapService, data: bytes) -> None:
    """Put ``data`` into the map's store unverified, as a map service of an older build took it."""
    signed = network.decode_signed_node_info(data)
    node_info = network.NodeInfo.from_wire(_codec.decode(signed.raw, what="node info"))
    name = pki.load_der_certificate(node_info.legal_identities[0][0]).subject
    node = network.VerifiedNodeInfo(
        signed=signed, node_info=node_info, legal_name=pki.CordaX500Name.from_x509_name(name),
        identity_key_hash=network.identity_key_hash(signed), hash=signed.hash,
    )  # fmt: skip
    assert service.store.put_node_info(node) == "added"


async def test_a_node_info_with_a_wildcard_address_is_ignored_and_logged_once(
    map_server: tuple[network.NetworkMapService, int],
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A NodeInfo listing 0.0.0.0 (in the map of an older service, or copied into additional-node-infos/)
    was taken, and the bridge dialled 0.0.0.0: the node's own host.  Now it is ignored like any NodeInfo that
    does not verify, and logged once, not at every poll."""
    service, port = map_server
    _stored_as_an_older_service_did(service, signed_node_info(bob, 10003, serial=1, hosts=("::",)))
    infos = tmp_path / "additional-node-infos"
    infos.mkdir()
    (infos / "nodeInfo-alice").write_bytes(signed_node_info(alice, 10002, serial=1, hosts=("0.0.0.0",)))
    u, _ = _updater(creds, tmp_path / "c.db", port=port, directory=infos)
    caplog.set_level(logging.WARNING, logger="corda_trio.network")
    for _ in range(3):
        events, _ = await u.poll_once()
        assert all(isinstance(e, network.NetworkParametersChanged) for e in events), _summary(events)
    assert u.nodes() == {}
    ignored = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignoring ")]
    assert len(ignored) == 2, ignored
    assert any("nodeInfo-alice" in m and "address 0.0.0.0:10002 of 'O=Alice" in m for m in ignored), ignored
    assert any("address [::]:10003 of 'O=Bob" in m for m in ignored), ignored
    assert all("no peer can dial" in m for m in ignored), ignored
    # The same nodes with dialable addresses are taken.
    (infos / "nodeInfo-alice").write_bytes(signed_node_info(alice, 10002, serial=2))
    (infos / "nodeInfo-bob").write_bytes(signed_node_info(bob, 10003, serial=2))
    events, _ = await u.poll_once()
    assert _summary(events) == [("NodeAdded", str(ALICE)), ("NodeAdded", str(BOB))]


OUT_OF_DESCRIPTORS = """
import logging, os, sys, trio
from pathlib import Path
from corda_trio import network, pki
from tests.network.conftest import NOW
logging.basicConfig(level=logging.WARNING, format="%(message)s")
send, _ = trio.open_memory_channel(100)
updater = network.NetworkMapUpdater(
    trust_root=pki.NetworkCredentials.create(now=NOW).root.cert,
    cache=network.NodeInfoCache(Path(sys.argv[2])), events=send, node_infos_dir=Path(sys.argv[1]),
    poll_interval_seconds=0.2,
)
async def main():
    async with trio.open_nursery() as nursery:
        await nursery.start(updater.run)
        held = []
        try:  # every descriptor taken: the next poll cannot open the directory (EMFILE)
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
trio.run(main)
"""


def test_a_poll_without_descriptors_is_logged_as_the_system_says_it_with_the_limit(tmp_path: Path) -> None:
    """The warning read ``[Errno 24] Too many open files: '<dir>'`` under a node out of descriptors (found
    under ulimit -n 64): now as every other one-line OSError, naming the limit (``files.os_error_text``)."""
    infos = tmp_path / "additional-node-infos"
    infos.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS, str(infos), str(tmp_path / "c.db")],
        capture_output=True, text=True, timeout=60, check=False,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)),
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if "network map poll failed" in line]
    assert lines, done.stderr
    assert lines[0] == (
        f"network map poll failed (retry in 1 s): Too many open files (the limit, ulimit -n, is 64): {infos}"
    ), lines


async def test_a_map_outage_of_an_hour_is_logged_as_one_outage(
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node whose map service is down for an hour: the publication and the poll each logged every failed
    attempt (backoff up to 60 s), two lines a minute for as long as the outage lasted. Now the outage is
    logged as a bridge logs a peer's: the first failure with its cause, at most a line a minute for both
    together, and one line when the map answers again, with the count of failed attempts."""
    autojump_clock.autojump_threshold = 0.05  # (real seconds: a refused connect is not a timeout)
    with socket.socket() as closed:  # bound, not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        caplog.set_level(logging.INFO, logger="corda_trio.network")
        updater, events = _updater(creds, tmp_path / "a.db", port=port, own=signed_node_info(alice, 10002))
        async with trio.open_nursery() as nursery:
            await nursery.start(updater.run)
            await trio.sleep(3600)
            during = [r for r in caplog.records if r.name == "corda_trio.network.cache"]
            closed.close()
            service = make_service(creds, tmp_path / "map.db")
            autojump_clock.autojump_threshold = 0.5  # (the map's store works in threads, in real time)
            await nursery.start(functools.partial(network.serve_network_map, service, port))
            with trio.fail_after(300):
                while ("NodeAdded", str(ALICE)) not in _summary([await events.receive()]):
                    pass
            nursery.cancel_scope.cancel()
    first, *rest = during
    assert first.levelname == "WARNING", first.getMessage()
    assert first.getMessage().startswith("publishing our NodeInfo failed (retry in 1 s): "), (
        first.getMessage()
    )
    assert first.getMessage().endswith(
        f"all attempts to connect to 127.0.0.1:{port} failed (Connection refused)"
    )
    name = f"network map http://127.0.0.1:{port}"
    assert all(r.getMessage().startswith(f"{name}: still retrying, ") for r in rest), [
        r.getMessage() for r in rest
    ]
    assert 55 <= len(rest) <= 61, len(rest)  # one a minute for both kinds together
    back = [r.getMessage() for r in caplog.records if "reconnected after" in r.getMessage()]
    assert len(back) == 1, back
    assert back[0].startswith(f"{name}: reconnected after "), back[0]
    failed = int(back[0].split("reconnected after ")[1].split()[0])
    assert failed > 100, back[0]  # the publications' and the polls' failed attempts, counted together


@attrs.define(eq=False)
class _SlowLinkClient(network.NetworkMapClient):
    """The map client over a slow link: a publication takes 0.2 s to reach the map, a map 5 s to come back."""

    async def publish(self, signed_node_info: bytes) -> str:
        await trio.sleep(0.2)
        return await super().publish(signed_node_info)

    async def fetch_map(self) -> network.MapResponse:
        response = await super().fetch_map()
        await trio.sleep(5.0)
        return response


async def test_the_node_info_is_published_once_when_the_map_comes_back_and_again_when_the_map_lost_it(
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After an outage, the node published its NodeInfo twice (the map's log: ``added``, then ``unchanged``
    50 ms later): the publication and the poll retry on the same backoff, so they meet the map as it comes
    back, and the poll had asked for the map before the publication landed, missed the NodeInfo there and
    published again. Now only a poll asked after the publication's answer may publish again: once here; and
    a map that lost its database gets the NodeInfo again at the next poll."""
    autojump_clock.autojump_threshold = 0.05  # (real seconds: a refused connect is not a timeout)
    caplog.set_level(logging.INFO, logger="corda_trio.network")

    def published() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"NodeInfo of {ALICE} ")]

    with socket.socket() as closed:  # bound, not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        send, _events = trio.open_memory_channel[network.MapEvent](1000)
        updater = network.NetworkMapUpdater(
            trust_root=creds.root.cert,
            cache=network.NodeInfoCache(tmp_path / "a.db"),
            events=send,
            client=_SlowLinkClient(f"http://127.0.0.1:{port}"),
            own_node_info=signed_node_info(alice, 10002),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(updater.run)
            await trio.sleep(100)  # both retry every 60 s by now, the poll 0.2 s ahead of the publication
            closed.close()
            autojump_clock.autojump_threshold = 0.5  # (the map's store works in threads, in real time)
            async with trio.open_nursery() as map_nursery:
                service = make_service(creds, tmp_path / "map.db")
                await map_nursery.start(functools.partial(network.serve_network_map, service, port))
                await trio.sleep(120)  # the map back, and polls every 7 + 5 s
                assert [m.split(" (")[0] for m in published()] == [f"NodeInfo of {ALICE} added"]
                map_nursery.cancel_scope.cancel()
            # the map's database lost: a new one on the same port; the next poll misses our NodeInfo
            async with trio.open_nursery() as map_nursery:
                service = make_service(creds, tmp_path / "map2.db")
                await map_nursery.start(functools.partial(network.serve_network_map, service, port))
                await trio.sleep(120)
                map_nursery.cancel_scope.cancel()
            nursery.cancel_scope.cancel()
    assert [m.split(" (")[0] for m in published()] == [f"NodeInfo of {ALICE} added"] * 2
