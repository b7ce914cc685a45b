"""Real processes (``networkmap serve`` and two ``node start``): the first flow to a node that joined the map
after the sender's last poll goes within seconds, not at the sender's next poll of the map."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from corda_trio import rpc
from corda_trio.node._processes import open_node_processes

from .netutil import PASSWORD, make_network, open_map_process

pytestmark = pytest.mark.slow

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=Paris,C=FR"
MAX_AGE = 60


async def _names(client: rpc.RpcClient) -> set[str]:
    return {entry["legal_name"].split(",")[0] for entry in await client.network_map()}


async def test_the_first_flow_to_a_node_that_joined_after_the_last_poll_does_not_wait_for_the_next(
    tmp_path: Path,
) -> None:
    """Found running ``network bootstrap``, ``networkmap serve`` and two ``node start`` together: the first
    PingPong took 22 s, because a node learnt of the other only at its next poll of the map (every
    ``max_age_seconds``, 30 s by default), its flow retrying meanwhile. Now a send to a name the node does
    not know asks the map at once (after a second's spacing). Here Bob joins after Alice's first poll, with
    a max-age of 60 s: Alice's PingPong to him finishes within a few seconds."""
    net = tmp_path / "net"
    alice_node, bob_node = make_network(net, [ALICE, BOB], with_map=True)
    async with (
        open_map_process(net, max_age_seconds=MAX_AGE),
        open_node_processes([alice_node]) as (alice,),
        rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
    ):
        with trio.fail_after(30):
            while await _names(a) != {"O=Alice"}:  # noqa: ASYNC110 (another process's state)
                await trio.sleep(0.1)  # (her first poll: her own NodeInfo back from the map)
        async with (
            open_node_processes([bob_node]) as (bob,),
            rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
        ):
            with trio.fail_after(30):
                while await _names(b) != {"O=Alice", "O=Bob"}:  # noqa: ASYNC110 (another process's state)
                    await trio.sleep(0.1)
            assert await _names(a) == {"O=Alice"}  # her next poll is a minute after her first
            started = trio.current_time()
            with trio.fail_after(MAX_AGE / 2):  # (the old code: at her next poll, up to 60 s)
                assert await a.start_flow("PingPong", recipient=BOB, rounds=2) == 2
            took = trio.current_time() - started
            assert took < 15, took
