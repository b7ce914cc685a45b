"""Two real node processes (``corda-trio node start``) in two network namespaces, the link between them made
slow, lossy, reordering, narrow or cut (``netns.py``, ``tunlink.py``): what a user on a bad network meets.

Alice runs ``stream_flows.Stream`` flows over RPC; Bob's responders are the ledger (each number once, in
order, or the flow fails), so ``count`` back from every flow means exactly once, in order. Skipped, with the
reason, where namespaces or TUN devices cannot be made (not root, no ``/dev/net/tun``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from corda_trio import rpc

from .netns import BOB, NetnsNodes, netns_pair, netns_unavailable, open_netns_nodes
from .netutil import PASSWORD
from .test_flows_e2e import scrape

_why = netns_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why is not None, reason=_why or "")]

CONNECTS = "corda_trio_bridge_connects_total{peer=O=Bob, L=Paris, C=FR}"


async def stream(nodes: NetnsNodes, flows: int, count: int, **args: object) -> list[int]:
    """``flows`` Stream flows of ``count`` messages each (one P2P message each) at once; their results."""
    results: list[int] = []
    async with rpc.connect(nodes.node(0).rpc_url, "ops", PASSWORD) as client:

        async def one() -> None:
            results.append(
                await client.start_flow("Stream", {"recipient": BOB, "count": count, "batch": 1, **args})
            )

        async with trio.open_nursery() as nursery:
            for _ in range(flows):
                nursery.start_soon(one)
    return results


async def test_exactly_once_in_order_under_delay_loss_and_reordering_with_a_short_idle_timeout(
    tmp_path: Path,
) -> None:
    """100 ms round trips, 2 % loss each way, jittered and reordered packets, a 2 s idle timeout: 1,000
    messages handled once each, in order, over the one connection (no spurious idle-timeout close)."""
    with netns_pair() as pair:
        async with open_netns_nodes(tmp_path / "net", pair, p2p_idle_timeout_seconds=2.0) as nodes:
            pair.shape(delay=0.05, jitter=0.02, loss=0.02, reorder=0.05)
            with trio.fail_after(90):
                assert await stream(nodes, flows=20, count=50) == [50] * 20
            assert (await scrape(nodes.node(0)))[CONNECTS] == 1
    for i in (0, 1):
        assert "no frame received" not in nodes.log(i)


@pytest.mark.parametrize(
    ("rate", "pad"),
    [
        # a 128 KiB transfer frame takes 2.6 s to cross: the receiver counted whole frames only
        pytest.param(400_000, 400_000, id="400kbit-frames"),
        # a 16 KiB TLS record takes 2.6 s to cross, and TLS hands over whole records only: the node counted
        # none of its bytes until the record was whole
        pytest.param(50_000, 40_000, id="50kbit-tls-records"),
    ],
)
async def test_large_messages_over_a_narrow_link_are_not_cut_by_the_peers_idle_timeout(
    tmp_path: Path, rate: int, pad: int
) -> None:
    """A narrow link, a 2 s idle timeout, a message whose frames (or TLS records) take longer than that to
    cross; no keep-alive can overtake them. The receiver used to close the connection in the middle of every
    such message, and the bridge sent it again, for ever."""
    with netns_pair() as pair:
        async with open_netns_nodes(tmp_path / "net", pair, p2p_idle_timeout_seconds=2.0) as nodes:
            pair.shape(rate=rate, queue=1.0, delay=0.01)
            with trio.fail_after(30):  # (8 s, 6.4 s on the wire)
                assert await stream(nodes, flows=1, count=1, pad=pad) == [1]
            assert (await scrape(nodes.node(0)))[CONNECTS] == 1
    for i in (0, 1):
        assert "no frame received" not in nodes.log(i)
