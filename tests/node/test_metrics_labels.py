"""/metrics series of a peer keep one ``peer`` label for the peer's whole life on a node (real processes).

Found with a real Prometheus: a peer's per-peer series were labelled with its key hash while the node did not
have the peer's NodeInfo (it reached the node late, or left the map for a while) and with its legal name
otherwise, so one peer's counters split into two series (a "reset" to a new series; dashboards broke).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import trio

from corda_trio import rpc
from corda_trio.node._processes import open_node_processes

from .netutil import PASSWORD, make_network
from .test_flows_e2e import ALICE, BOB, parse_exposition, scrape_text, wait_for_peers

pytestmark = pytest.mark.slow

BOB_NAME = "O=Bob, L=Paris, C=FR"


def peer_labels(m: dict[str, float]) -> set[str]:
    """Every ``peer`` label value in a parsed exposition (``peer`` sorts first of the labels it has)."""
    return {re.sub(r"(,state=[a-z-]+)?}$", "", k.split("{peer=", 1)[1]) for k in m if "{peer=" in k}


async def test_a_peer_whose_node_info_comes_late_or_goes_keeps_its_legal_name_label(tmp_path: Path) -> None:
    """Alice starts without Bob's NodeInfo; Bob's PingPong reaches her (counted by the name in his TLS
    certificate), his NodeInfo arrives in her additional-node-infos/ and she answers; then it leaves her map
    and comes back. Bob's sent counter was ``peer=<his key hash>`` while he was away from her map (the
    outbound queue stays), a new series beside ``peer=O=Bob, ...``."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB])
    alice_infos = nodes[0][1].additional_node_infos
    (bob_info,) = [
        p for p in alice_infos.iterdir() if p.read_bytes() == _own_info(nodes[1][1].base_directory)
    ]
    aside = tmp_path / bob_info.name
    shutil.move(bob_info, aside)  # Alice starts without Bob's NodeInfo
    async with open_node_processes(nodes) as (alice, bob):
        scrapes = []
        async with (
            rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
            rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
        ):
            await wait_for_peers(b, 2)
            async with trio.open_nursery() as nursery:

                async def ping() -> None:
                    assert await b.start_flow("PingPong", recipient=ALICE, rounds=2) == 2

                nursery.start_soon(ping)
                with trio.fail_after(60):  # Alice has Bob's init, and cannot answer yet
                    while "corda_trio_p2p_messages_received_total{peer=" + BOB_NAME + "}" not in (  # noqa: ASYNC110
                        m := parse_exposition(await scrape_text(alice))
                    ):
                        await trio.sleep(0.1)
                scrapes.append(m)
                shutil.copy(aside, bob_info)  # Bob's NodeInfo reaches Alice late: the flow goes on
            scrapes.append(parse_exposition(await scrape_text(alice)))
            bob_info.unlink()  # Bob leaves Alice's map for a while: its outbound queue stays
            with trio.fail_after(60):
                while len(await a.network_map()) > 1:  # noqa: ASYNC110 (another process's state)
                    await trio.sleep(0.2)
            scrapes.append(parse_exposition(await scrape_text(alice)))
            shutil.copy(aside, bob_info)
            await wait_for_peers(a, 2)
            scrapes.append(parse_exposition(await scrape_text(alice)))
    for i, m in enumerate(scrapes):
        assert peer_labels(m) == {BOB_NAME}, (i, peer_labels(m))
    sent = [m.get(f"corda_trio_p2p_messages_sent_total{{peer={BOB_NAME}}}") for m in scrapes[1:]]
    assert sent == [2.0, 2.0, 2.0], sent  # one series, never reset, for Bob's pongs


def _own_info(base: Path) -> bytes:
    (path,) = base.glob("nodeInfo-*")
    return path.read_bytes()
