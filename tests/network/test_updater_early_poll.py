"""``NetworkMapUpdater.poll_soon``: a node that meets a name it does not know asks the map at once (after a
minimum spacing), not at the map's next ``max-age``; requests are coalesced; a failing map's backoff stands.

Against a real map service in-process; the client only records when the map was asked for."""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from corda_trio import network, pki

from .conftest import ALICE, BOB, make_service, signed_node_info

SPACING = network.EARLY_POLL_SPACING_SECONDS
MAX_AGE = 30


@attrs.define(eq=False)
class _RecordingClient(network.NetworkMapClient):
    """The map client, noting the trio time of each request for the map (a poll); ``after_poll`` is called
    as each one has its answer or failure (a request for an early poll made then waits for the next)."""

    polls: list[float] = attrs.field(factory=list, kw_only=True)
    after_poll: Callable[[], None] | None = attrs.field(default=None, kw_only=True)

    async def fetch_map(self) -> network.MapResponse:
        self.polls.append(trio.current_time())
        try:
            return await super().fetch_map()
        finally:
            if self.after_poll is not None:
                self.after_poll()


def _updater(
    creds: pki.NetworkCredentials, tmp_path: Path, port: int, own: bytes
) -> tuple[network.NetworkMapUpdater, _RecordingClient, trio.MemoryReceiveChannel[network.MapEvent]]:
    send, receive = trio.open_memory_channel[network.MapEvent](1000)
    client = _RecordingClient(f"http://127.0.0.1:{port}")
    updater = network.NetworkMapUpdater(
        trust_root=creds.root.cert,
        cache=network.NodeInfoCache(tmp_path / "a.db"),
        events=send,
        client=client,
        own_node_info=own,
    )
    return updater, client, receive


async def _added(events: trio.MemoryReceiveChannel[network.MapEvent], name: pki.CordaX500Name) -> None:
    async for event in events:
        if isinstance(event, network.NodeAdded) and event.node.legal_name == name:
            return


async def _serve_map(
    nursery: trio.Nursery, creds: pki.NetworkCredentials, tmp_path: Path
) -> tuple[network.NetworkMapService, int]:
    service = make_service(creds, tmp_path / "map.db", max_age=MAX_AGE)
    listeners = await nursery.start(network.serve_network_map, service, 0)
    return service, listeners[0].socket.getsockname()[1]


async def test_a_node_published_after_a_poll_is_seen_within_the_spacing_of_poll_soon(
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two nodes started together: Bob publishes after Alice's first poll, and Alice, asked to send to Bob,
    used to learn of him only at her next poll, the map's max-age later (30 s by default). Now she asks the
    map again once the spacing since that poll has passed."""
    autojump_clock.autojump_threshold = 0.5  # (the map's store works in threads, in real time)
    async with trio.open_nursery() as nursery:
        _, port = await _serve_map(nursery, creds, tmp_path)
        updater, client, events = _updater(creds, tmp_path, port, signed_node_info(alice, 10002))
        await nursery.start(updater.run)
        with trio.fail_after(5):
            await _added(events, ALICE)
        assert len(client.polls) == 1
        await network.NetworkMapClient(f"http://127.0.0.1:{port}").publish(signed_node_info(bob, 10003))
        asked = trio.current_time()
        updater.poll_soon()
        with trio.fail_after(MAX_AGE / 2):
            await _added(events, BOB)
        assert trio.current_time() - asked <= SPACING + 0.5
        assert len(client.polls) == 2 and client.polls[1] - client.polls[0] >= SPACING
        nursery.cancel_scope.cancel()


async def test_a_burst_of_requests_is_one_early_poll_and_the_schedule_stands(
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A flow retrying its send, or a peer sending from names the map does not hold, asks for polls as often
    as it likes: 100 requests at once are one early poll; requests without end are one poll per spacing;
    once they stop, the next poll is the map's max-age after the last one."""
    autojump_clock.autojump_threshold = 0.5
    async with trio.open_nursery() as nursery:
        _, port = await _serve_map(nursery, creds, tmp_path)
        updater, client, events = _updater(creds, tmp_path, port, signed_node_info(alice, 10002))
        await nursery.start(updater.run)
        with trio.fail_after(5):
            await _added(events, ALICE)
        first = client.polls[0]
        for _ in range(100):
            updater.poll_soon()
        await trio.sleep(MAX_AGE - 1)  # (up to just before the regular poll)
        assert len(client.polls) == 2, client.polls
        assert SPACING <= client.polls[1] - first <= SPACING + 0.5
        await trio.sleep(3)  # the regular poll, max-age after the early one
        assert len(client.polls) == 3 and client.polls[2] - client.polls[1] == pytest.approx(MAX_AGE, abs=0.5)

        # requests without end (one as each poll has its answer, and more): one poll per spacing, no more
        before = len(client.polls)
        client.after_poll = updater.poll_soon
        updater.poll_soon()
        await trio.sleep(10)
        client.after_poll = None
        during = client.polls[before:]
        assert 10 / (SPACING + 0.5) <= len(during) <= 10 / SPACING + 1, during
        gaps = [b - a for a, b in zip(client.polls[before - 1 :], during, strict=False)]
        assert all(g >= SPACING for g in gaps), gaps
        # they stop (the last one's poll comes within the spacing): the regular schedule again
        await trio.sleep(SPACING + 0.5)
        last = client.polls[-1]
        await trio.sleep(MAX_AGE - 2)
        assert client.polls[-1] == last
        await trio.sleep(3)
        assert client.polls[-1] - last == pytest.approx(MAX_AGE, abs=0.5)
        nursery.cancel_scope.cancel()


async def test_requests_do_not_bypass_the_backoff_of_a_failing_map(
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The map away: polls retry with backoff (1 s doubling to 60 s), and requests for early polls (a flow
    retrying its send all along) change nothing of it; once the map is back, they work again."""
    autojump_clock.autojump_threshold = 0.05  # (real seconds: a refused connect is not a timeout)
    with socket.socket() as closed:  # bound, not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        updater, client, events = _updater(creds, tmp_path, port, signed_node_info(alice, 10002))
        async with trio.open_nursery() as nursery:
            client.after_poll = updater.poll_soon  # (a request always waiting: a flow retrying its send)
            await nursery.start(updater.run)
            await trio.sleep(300)
            client.after_poll = None
            gaps = [b - a for a, b in zip(client.polls, client.polls[1:], strict=False)]
            backoff = [min(2.0**i, 60.0) for i in range(len(gaps))]
            assert all(g >= b - 0.01 for g, b in zip(gaps, backoff, strict=True)), (gaps, backoff)
            assert 8 <= len(gaps) <= 10, gaps  # (1, 2, 4, ... 32, then 60 s: 10 retries in 300 s at most)
            closed.close()
            autojump_clock.autojump_threshold = 0.5  # (the map's store works in threads, in real time)
            service = make_service(creds, tmp_path / "map.db", max_age=MAX_AGE)
            await nursery.start(functools.partial(network.serve_network_map, service, port))
            with trio.fail_after(120):
                await _added(events, ALICE)
            back = len(client.polls)
            await trio.sleep(SPACING + 0.5)
            updater.poll_soon()
            await trio.sleep(0.5)
            assert len(client.polls) == back + 1, client.polls[back - 1 :]
            nursery.cancel_scope.cancel()
