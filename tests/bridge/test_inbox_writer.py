"""The batch writer shared by the inbound acceptor and the float's tunnel (``bridge._inbound``), over a real
AMQP connection on memory streams: checks, rejects with the condition, stores in order, hands each run of one
sender's messages over, and settles ``accepted`` only once the inbox append returned."""

from __future__ import annotations

from collections.abc import Sequence

import trio
import trio.testing

from corda_trio import amqp, transport
from corda_trio.bridge._inbound import RetryLaterError, rejected_messages_log, store_checked, take_arrivals
from corda_trio.messaging import InvalidMessageError

CFG = amqp.ConnectionConfig(sasl=False, allow_bare_amqp=True)


class SlowInbox:
    """An in-memory inbox whose append takes a while (virtual time), recording what the peer had been told
    by then."""

    name = "p2p.inbound.test"

    def __init__(self, outcomes: list[object]) -> None:
        self.stored: list[bytes] = []
        self.outcomes_at_append: list[int] = []
        self._outcomes = outcomes

    async def enqueue_many(self, payloads: Sequence[bytes]) -> None:
        await trio.sleep(0.5)
        self.outcomes_at_append.append(len(self._outcomes))
        self.stored.extend(payloads)


def check(payload: bytes) -> tuple[str | None, amqp.Message, bytes]:
    sender, _, text = payload.decode().partition(":")
    if text == "bad":
        raise InvalidMessageError("amqp:invalid-field", f"refused {payload!r}")
    if text == "later":
        raise RetryLaterError(f"{sender} is not known yet")
    return sender, amqp.Message(body=payload), b"stored-" + payload


async def test_store_checked_rejects_releases_stores_in_order_hands_over_runs_and_settles_after_the_append(
    nursery: trio.Nursery, autojump_clock: object
) -> None:
    sent = [b"A:1", b"A:2", b"B:3", b"B:bad", b"A:4", b"D:later", b"C:5"]
    outcomes: list[object] = []
    inbox = SlowInbox(outcomes)
    runs: list[tuple[list[bytes], str]] = []
    totals: dict[str | None, int] = {}
    rejected = released = 0

    def on_checked(payloads: Sequence[bytes], messages: Sequence[amqp.Message], sender: str) -> None:
        assert [m.body for m in messages] == [p.removeprefix(b"stored-") for p in payloads]
        runs.append((list(payloads), sender))

    async def serve(conn: transport.AmqpConnection) -> None:
        nonlocal rejected, released
        async for request in conn.link_requests():
            receiver = await request.accept_receiver(credit=100)
            while True:
                try:
                    batch = await take_arrivals(receiver)
                except trio.EndOfChannel:
                    return
                stored, bad, later = await store_checked(
                    receiver, batch, inbox, check, on_checked, "test", rejected_messages_log()
                )
                rejected += bad
                released += later
                for sender, n in stored.items():
                    totals[sender] = totals.get(sender, 0) + n

    client_stream, server_stream = trio.testing.memory_stream_pair()

    async def run_server() -> None:
        async with transport.open_amqp_over_stream(server_stream, client=False, config=CFG) as conn:
            await serve(conn)

    nursery.start_soon(run_server)
    async with transport.open_amqp_over_stream(client_stream, config=CFG) as conn:
        sender = await conn.open_sender(inbox.name)
        await trio.sleep(0.1)  # the credit arrives
        pending = [sender.send_nowait(p) for p in sent]  # one burst: one batch on the other side
        for p in pending:
            assert p is not None
            outcomes.append(await p.outcome())
    good = [p for p in sent if not p.endswith((b"bad", b"later"))]
    assert inbox.stored == [b"stored-" + p for p in good]  # in order, the bad and the later one left out
    assert inbox.outcomes_at_append == [0]  # nothing settled before the append had returned
    assert [type(o) for o in outcomes] == (
        [amqp.Accepted] * 3 + [amqp.Rejected, amqp.Accepted, amqp.Released, amqp.Accepted]
    )
    rejection = outcomes[3]
    assert isinstance(rejection, amqp.Rejected) and rejection.error is not None
    assert rejection.error.condition == "amqp:invalid-field"
    # each hand-over is one sender's consecutive run, in order
    assert [(sender, [p.removeprefix(b"stored-") for p in payloads]) for payloads, sender in runs] == [
        ("A", [b"A:1", b"A:2"]), ("B", [b"B:3"]), ("A", [b"A:4"]), ("C", [b"C:5"])
    ]  # fmt: skip
    assert totals == {"A": 3, "B": 1, "C": 1} and rejected == 1 and released == 1
