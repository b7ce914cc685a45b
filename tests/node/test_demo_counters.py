"""``corda-trio demo``'s P2P summary reads the nodes' counters once the traffic has settled.

The nodes here are HTTP servers on real sockets answering ``GET /metrics`` in the node's text format with
the counters a node showed one read after another: the demo's reader meets them as it meets a node's."""

from __future__ import annotations

import functools
import io

import pytest
import trio
from rich.console import Console

from corda_trio.node import _cli_demo
from corda_trio.node._metrics import serve_metrics
from tests.ipv6 import needs_ipv6

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"


def _metrics(sent: int, received: int, pending: int) -> bytes:
    body = (
        "# TYPE corda_trio_p2p_messages_sent counter\n"
        f'corda_trio_p2p_messages_sent_total{{peer="x"}} {sent}.0\n'
        "# TYPE corda_trio_p2p_messages_pending gauge\n"
        f'corda_trio_p2p_messages_pending{{peer="x"}} {pending}.0\n'
        "# TYPE corda_trio_p2p_messages_received counter\n"
        f'corda_trio_p2p_messages_received_total{{peer="x"}} {received}.0\n'
    ).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n" + body


async def _serve(nursery: trio.Nursery, reads: list[bytes]) -> str:
    """A /metrics endpoint answering ``reads`` one after another (the last one from then on)."""
    left = list(reads)

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                request += await stream.receive_some(4096)
            await stream.send_all(left.pop(0) if len(left) > 1 else left[0])

    (listener,) = await nursery.start(functools.partial(trio.serve_tcp, answer, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listener.socket.getsockname()[1]}/metrics"


def _summary(counters: dict[str, dict[str, float]], *, settled: bool) -> str:
    """What the demo's summary prints for these counters."""
    out = io.StringIO()
    result = _cli_demo.DemoResult(
        runs=(),
        elapsed_seconds=1.0,
        started_at=None,
        finished_at=None,
        counters=counters,
        counters_settled=settled,
    )  # type: ignore[arg-type]
    _cli_demo._print(Console(file=out, width=200), result, 3)
    return out.getvalue()


async def test_the_summary_waits_for_the_acknowledgements_in_flight() -> None:
    """Read at once, Alice showed 'sent 425, received 423' while Bob's acknowledgements of her last
    messages and his last two messages were in flight; the summary now waits until no message is pending,
    all sent equals all received, and two reads agree."""
    async with trio.open_nursery() as nursery:
        alice = await _serve(nursery, [_metrics(425, 423, 1), _metrics(426, 425, 0), _metrics(426, 426, 0)])
        bob = await _serve(nursery, [_metrics(423, 426, 2), _metrics(425, 426, 0), _metrics(426, 426, 0)])
        with trio.fail_after(10):
            counters, settled = await _cli_demo._settled_counters({ALICE: alice, BOB: bob})
        nursery.cancel_scope.cancel()
    assert settled
    for name in (ALICE, BOB):
        assert counters[name]["corda_trio_p2p_messages_sent_total"] == 426, counters
        assert counters[name]["corda_trio_p2p_messages_received_total"] == 426, counters
    text = _summary(counters, settled=True)
    assert "P2P counters read once settled: 852 messages sent and 852 received across the 2 nodes" in text
    assert "Alice /metrics: P2P messages sent 426, received 426" in text, text


async def test_the_summary_says_when_the_counters_did_not_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer that never acknowledges: after the bound the summary prints the last read and says that
    sent and received may differ, rather than waiting for ever or presenting them as final."""
    monkeypatch.setattr(_cli_demo, "SETTLE_TIMEOUT_SECONDS", 0.5)
    async with trio.open_nursery() as nursery:
        alice = await _serve(nursery, [_metrics(425, 426, 1)])
        bob = await _serve(nursery, [_metrics(426, 425, 0)])
        with trio.fail_after(10):
            counters, settled = await _cli_demo._settled_counters({ALICE: alice, BOB: bob})
        nursery.cancel_scope.cancel()
    assert not settled
    assert counters[ALICE]["corda_trio_p2p_messages_pending"] == 1
    text = _summary(counters, settled=False)
    assert "P2P counters still moving 0.5 s after the last flow" in text, text
    assert "read once settled" not in text and "sent and received may differ" in text, text


@needs_ipv6
async def test_a_node_whose_metrics_are_on_the_ipv6_loopback_is_read() -> None:
    """A demo network's node with ``metrics.address = "[::1]:0"`` (as ``network bootstrap --host ::1``
    writes it): its /metrics URL ``http://[::1]:PORT/metrics`` was split at the first colon (host ``[``,
    then ``int(":1]")``), a ValueError out of the demo's summary. Read from the node's own metrics server."""
    exposition = (
        b'# TYPE corda_trio_p2p_messages_sent counter\ncorda_trio_p2p_messages_sent_total{peer="x"} 7.0\n'
    )
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_metrics, lambda: exposition, "::1", 0)
        with trio.fail_after(10):
            counters = await _cli_demo._scrape(f"http://[::1]:{port}/metrics")
        nursery.cancel_scope.cancel()
    assert counters == {"corda_trio_p2p_messages_sent_total": 7.0}
