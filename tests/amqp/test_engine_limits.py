"""The engine with peers that bend the rules: credit overrun, illegal order, SASL failures, size limits.

Each test looks at what the engine puts on the wire (decoded frames), not only at its events.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corda_trio import amqp
from corda_trio.testing import ConnectionPair

C = amqp.Condition
SERVER_MECHS = ("PLAIN", "ANONYMOUS", "EXTERNAL")


def cfg(**kw: object) -> amqp.ConnectionConfig:
    return amqp.ConnectionConfig(**kw)  # type: ignore[arg-type]


def of(events: list[amqp.Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def frames_of(raw: bytes, *, sasl: bool = False) -> list[object]:
    """Every performative in ``raw`` (protocol headers skipped)."""
    buf = amqp.FrameBuffer()
    buf.feed(raw)
    out: list[object] = []
    while True:
        try:
            frame = buf.next_frame()
        except amqp.FramingError:
            if buf.next_protocol_header() is None:
                raise
            continue
        if frame is None:
            return out
        out.append(frame.performative)


def split_headers(raw: bytes) -> bytes:
    """``raw`` without the protocol headers it contains (they are always at frame boundaries)."""
    out = bytearray()
    pos = 0
    while pos < len(raw):
        if raw[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        size = int.from_bytes(raw[pos : pos + 4], "big")
        out += raw[pos : pos + size]
        pos += size
    return bytes(out)


def performatives(raw: bytes) -> list[object]:
    return frames_of(split_headers(raw))


def link_pair(
    credit: int,
    server_config: amqp.ConnectionConfig | None = None,
    *,
    links: int = 1,
    client_max_frame_size: int | None = None,
) -> tuple[ConnectionPair, int, int, list[tuple[int, int]]]:
    """An open pair with ``links`` client->server links, each granted ``credit``.

    Returns (pair, client channel, server channel, [(sender handle, receiver handle), ...]).
    """
    client = None if client_max_frame_size is None else cfg(max_frame_size=client_max_frame_size)
    pair = ConnectionPair(client_config=client, server_config=server_config)
    pair.open()
    cch, sch = pair.begin("client")
    handles = [
        pair.attach("client", cch, sch, sender_at="client", address=f"q{i}", credit=credit)
        for i in range(links)
    ]
    return pair, cch, sch, handles


def transfers(handle: int, first_id: int, count: int, payload: bytes = b"x") -> bytes:
    return b"".join(
        amqp.encode_frame(
            amqp.Transfer(handle=handle, delivery_id=i, delivery_tag=i.to_bytes(4, "big")), 0, payload
        )
        for i in range(first_id, first_id + count)
    )


# --- credit overrun ------------------------------------------------------------------------------------


def test_three_times_the_credit_is_absorbed_and_counted() -> None:
    pair, _cch, sch, [(sh, rh)] = link_pair(credit=10)
    events = pair.server.receive_data(transfers(sh, 0, 30))
    assert [d.delivery_id for d in of(events, amqp.DeliveryReceived)] == list(range(30))
    link = pair.server.link(sch, rh)
    assert link.overrun_total == 20 and link.link_credit == 0
    out = performatives(pair.server.data_to_send())
    assert not [p for p in out if isinstance(p, amqp.Close | amqp.Detach)]
    assert pair.server.opened
    # back-pressure: the application grants less (here nothing while the excess is buffered), then more
    pair.server.flow(sch, rh, credit=5)
    flow = [p for p in performatives(pair.server.data_to_send()) if isinstance(p, amqp.Flow)][-1]
    assert (flow.handle, flow.delivery_count, flow.link_credit) == (rh, 30, 5)
    events = pair.server.receive_data(transfers(sh, 30, 5))
    assert len(of(events, amqp.DeliveryReceived)) == 5 and link.overrun_total == 20


def test_overrun_beyond_the_bound_detaches_that_link_only() -> None:
    server = cfg(max_credit_overrun=5, sasl_mechanisms=SERVER_MECHS)
    pair, cch, _sch, [(sh1, _rh1), (sh2, _rh2)] = link_pair(credit=2, server_config=server, links=2)
    events = pair.server.receive_data(transfers(sh1, 0, 10))
    assert len(of(events, amqp.DeliveryReceived)) == 7  # 2 granted + 5 absorbed
    client_ev = pair.client.receive_data(pair.server.data_to_send())
    detached = of(client_ev, amqp.LinkDetached)
    assert len(detached) == 1 and detached[0].handle == sh1
    assert detached[0].error.condition == C.TRANSFER_LIMIT_EXCEEDED
    assert "beyond link credit" in detached[0].error.description
    pair.pump()
    # the other link and the connection carry on
    pair.client.send_transfer(cch, sh2, b"still here")
    _, server_ev = pair.pump()
    assert [d.payload for d in of(server_ev, amqp.DeliveryReceived)] == [b"still here"]
    assert pair.client.opened and pair.server.opened


def test_no_flow_goes_out_for_a_link_the_engine_detached() -> None:
    """A grant the application makes after the engine detached the link for an overrun (it takes the
    deliveries still buffered and tops the credit up) sends nothing: a ``flow`` naming a handle after its
    ``detach`` is one the peer no longer knows (seen from a float, whose links absorb no overrun)."""
    server = cfg(max_credit_overrun=0, sasl_mechanisms=SERVER_MECHS)
    pair, _cch, sch, [(sh, rh)] = link_pair(credit=2, server_config=server)
    pair.server.receive_data(transfers(sh, 0, 3))
    assert [type(p) for p in performatives(pair.server.data_to_send())] == [amqp.Detach]
    pair.server.flow(sch, rh, credit=2)  # the application took the two buffered deliveries
    assert not [p for p in performatives(pair.server.data_to_send()) if isinstance(p, amqp.Flow)]


def test_overrun_beyond_the_byte_bound_detaches_that_link_only() -> None:
    server = cfg(max_credit_overrun=1000, max_credit_overrun_bytes=10_000, sasl_mechanisms=SERVER_MECHS)
    pair, cch, sch, [(sh1, rh1), (sh2, _rh2)] = link_pair(credit=2, server_config=server, links=2)
    events = pair.server.receive_data(transfers(sh1, 0, 30, b"x" * 1000))
    # 2 granted + 10 x 1000 bytes absorbed; the 13th delivery would take the overrun to 11,000 bytes
    assert [d.delivery_id for d in of(events, amqp.DeliveryReceived)] == list(range(12))
    link = pair.server.link(sch, rh1)
    assert link.overrun_total == 10 and link.overrun_bytes == 10_000
    client_ev = pair.client.receive_data(pair.server.data_to_send())
    detached = of(client_ev, amqp.LinkDetached)
    assert len(detached) == 1 and detached[0].handle == sh1
    assert detached[0].error.condition == C.TRANSFER_LIMIT_EXCEEDED
    assert "11000 bytes" in detached[0].error.description
    pair.pump()
    pair.client.send_transfer(cch, sh2, b"still here")
    _, server_ev = pair.pump()
    assert [d.payload for d in of(server_ev, amqp.DeliveryReceived)] == [b"still here"]
    assert pair.client.opened and pair.server.opened


def test_overrun_bytes_are_counted_frame_by_frame_before_they_are_kept() -> None:
    server = cfg(max_credit_overrun_bytes=2500, sasl_mechanisms=SERVER_MECHS)
    pair, _cch, sch, [(sh, rh)] = link_pair(credit=1, server_config=server)
    chunk = b"y" * 1000

    def frame(delivery_id: int | None, more: bool) -> bytes:
        tag = None if delivery_id is None else b"t%d" % delivery_id
        transfer = amqp.Transfer(handle=sh, delivery_id=delivery_id, delivery_tag=tag, more=more)
        return amqp.encode_frame(transfer, 0, chunk)

    # delivery 0 is within the credit; delivery 1 (beyond it) arrives in frames of 1000 bytes
    raw = frame(0, False) + frame(1, True) + frame(None, True) + frame(None, True) + frame(None, False)
    events = pair.server.receive_data(raw)
    assert [d.delivery_id for d in of(events, amqp.DeliveryReceived)] == [0]
    link = pair.server.link(sch, rh)
    assert link.partial_chunks is None  # the two frames absorbed before the third are not kept either
    detached = of(pair.client.receive_data(pair.server.data_to_send()), amqp.LinkDetached)
    assert len(detached) == 1 and detached[0].error.condition == C.TRANSFER_LIMIT_EXCEEDED
    assert "3000 bytes" in detached[0].error.description
    assert pair.server.opened


def test_a_grant_restarts_the_overrun_byte_count() -> None:
    server = cfg(max_credit_overrun_bytes=5000, sasl_mechanisms=SERVER_MECHS)
    pair, _cch, sch, [(sh, rh)] = link_pair(credit=1, server_config=server)
    link = pair.server.link(sch, rh)
    events = pair.server.receive_data(transfers(sh, 0, 6, b"z" * 1000))  # 1 granted + 5000 bytes absorbed
    assert len(of(events, amqp.DeliveryReceived)) == 6 and link.overrun_bytes == 5000
    pair.server.flow(sch, rh, credit=0)  # back-pressure: nothing more, but the excess is forgiven
    pair.server.data_to_send()
    assert link.overrun_bytes == 0
    events = pair.server.receive_data(transfers(sh, 6, 5, b"z" * 1000))
    assert len(of(events, amqp.DeliveryReceived)) == 5 and link.overrun_bytes == 5000
    assert not [p for p in performatives(pair.server.data_to_send()) if isinstance(p, amqp.Detach)]


def test_window_refill_flows_carry_the_link_state() -> None:
    server = cfg(incoming_window=8, sasl_mechanisms=SERVER_MECHS)
    pair, cch, _sch, [(sh, rh)] = link_pair(credit=100, server_config=server)
    for i in range(40):
        pair.client.send_transfer(cch, sh, bytes([i]))
    flows: list[amqp.Flow] = []
    for _ in range(100):
        to_server = pair.client.data_to_send()
        if to_server:
            pair.server.receive_data(to_server)
        to_client = pair.server.data_to_send()
        if not to_server and not to_client:
            break
        flows += [p for p in performatives(to_client) if isinstance(p, amqp.Flow)]
        pair.client.receive_data(to_client)
    assert len(flows) >= 4  # the window of 8 was re-opened several times
    for flow in flows:
        assert flow.handle == rh and flow.delivery_count is not None and flow.link_credit is not None
        assert flow.delivery_count + flow.link_credit == 100  # the same limit, restated


# --- dispositions --------------------------------------------------------------------------------------


def test_thousand_out_of_order_settlements_go_out_in_at_most_ten_frames() -> None:
    pair, cch, sch, [(sh, _rh)] = link_pair(credit=1000)
    for i in range(1000):
        pair.client.send_transfer(cch, sh, i.to_bytes(2, "big"))
    _, server_ev = pair.pump()
    ids = [d.delivery_id for d in of(server_ev, amqp.DeliveryReceived)]
    assert len(ids) == 1000
    random.Random(11).shuffle(ids)
    for did in ids:
        pair.server.settle(sch, did)
    raw = pair.server.data_to_send()
    dispositions = [p for p in performatives(raw) if isinstance(p, amqp.Disposition)]
    assert 1 <= len(dispositions) <= 10
    settled = of(pair.client.receive_data(raw), amqp.DeliverySettled)
    assert sorted(e.delivery_id for e in settled) == sorted(ids)


# --- illegal order -------------------------------------------------------------------------------------


def server_after_sasl() -> tuple[amqp.Connection, bytes]:
    """A server that has finished SASL (ANONYMOUS) and read the client's AMQP header."""
    server = amqp.Connection(cfg(sasl_mechanisms=SERVER_MECHS), client=False)
    init = amqp.encode_frame(amqp.SaslInit(mechanism=amqp.Symbol("ANONYMOUS")))
    server.receive_data(amqp.SASL_HEADER + init + amqp.AMQP_HEADER)
    return server, server.data_to_send()


def close_of(raw: bytes) -> amqp.Close:
    closes = [p for p in performatives(raw) if isinstance(p, amqp.Close)]
    assert len(closes) == 1, performatives(raw)
    return closes[0]


def test_begin_before_open_is_an_illegal_state_close() -> None:
    server, _ = server_after_sasl()
    begin = amqp.encode_frame(amqp.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10))
    with pytest.raises(amqp.RemoteProtocolError):
        server.receive_data(begin)
    close = close_of(server.data_to_send())
    assert close.error.condition == C.ILLEGAL_STATE and "begin" in close.error.description


def test_second_open_is_an_illegal_state_close() -> None:
    pair = ConnectionPair()
    pair.open()
    with pytest.raises(amqp.RemoteProtocolError):
        pair.server.receive_data(amqp.encode_frame(amqp.Open(container_id="again")))
    close = close_of(pair.server.data_to_send())
    assert close.error.condition == C.ILLEGAL_STATE and "open" in close.error.description


def test_attach_on_an_unmapped_channel_is_refused() -> None:
    pair = ConnectionPair()
    pair.open()
    attach = amqp.Attach(name="x", handle=0, role=amqp.Role.SENDER, initial_delivery_count=0)
    with pytest.raises(amqp.RemoteProtocolError):
        pair.server.receive_data(amqp.encode_frame(attach, 3))
    close = close_of(pair.server.data_to_send())
    assert close.error.condition in (C.NOT_ALLOWED, C.ILLEGAL_STATE)
    assert "attach" in close.error.description and "channel 3" in close.error.description


def test_pipelined_open_begin_attach_is_fine() -> None:
    server, _ = server_after_sasl()
    raw = (
        amqp.encode_frame(amqp.Open(container_id="pipe"))
        + amqp.encode_frame(amqp.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10), 5)
        + amqp.encode_frame(
            amqp.Attach(name="l", handle=7, role=amqp.Role.SENDER, initial_delivery_count=0), 5
        )
    )
    events = server.receive_data(raw)
    assert of(events, amqp.ConnectionOpened) and of(events, amqp.SessionBegun)
    assert of(events, amqp.LinkAttachRequested)


# --- SASL failures send an outcome first ---------------------------------------------------------------


def sasl_outcome_after(client_frames: bytes, **server_kw: object) -> amqp.SaslOutcome:
    server = amqp.Connection(cfg(sasl_mechanisms=("PLAIN",), **server_kw), client=False)
    try:
        server.receive_data(amqp.SASL_HEADER + client_frames)
    except amqp.RemoteProtocolError:
        pass
    assert server.closed
    outcomes = [p for p in frames_of(server.data_to_send()[8:]) if isinstance(p, amqp.SaslOutcome)]
    assert len(outcomes) == 1
    return outcomes[0]


def test_sasl_bad_mechanism_gets_sys_perm() -> None:
    init = amqp.encode_frame(amqp.SaslInit(mechanism=amqp.Symbol("CRAM-MD5")))
    assert sasl_outcome_after(init).code == amqp.SaslCode.SYS_PERM


def test_sasl_bad_credentials_get_auth() -> None:
    init = amqp.encode_frame(amqp.SaslInit(mechanism=amqp.Symbol("PLAIN"), initial_response=b"\0u\0wrong"))
    outcome = sasl_outcome_after(init, sasl_plain_check=lambda u, p: p == "right")
    assert outcome.code == amqp.SaslCode.AUTH


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"\x00\x00\x00\x0c\x02\x01\x00\x00\x00\x53\x41\x45", id="truncated-body"),
        pytest.param(amqp.encode_frame(amqp.Open(container_id="x")), id="amqp-frame-in-sasl"),
        pytest.param(
            amqp.encode_frame(amqp.SaslInit(mechanism=amqp.Symbol("PLAIN"), initial_response=b"no-nul")),
            id="malformed-plain",
        ),
        pytest.param((4096).to_bytes(4, "big") + b"\x02\x01\x00\x00", id="oversize-sasl-frame"),
    ],
)
def test_malformed_sasl_gets_sys(garbage: bytes) -> None:
    assert sasl_outcome_after(garbage).code == amqp.SaslCode.SYS


# --- message size --------------------------------------------------------------------------------------


def test_multi_frame_delivery_over_the_limit_buffers_nothing_beyond_and_detaches_the_link() -> None:
    server = cfg(max_message_size=10_000, sasl_mechanisms=SERVER_MECHS)
    pair, cch, sch, [(sh1, rh1), (sh2, _rh2)] = link_pair(credit=10, server_config=server, links=2)
    attach = pair.server.link(sch, rh1)
    assert attach.max_message_size == 10_000
    chunk = b"y" * 4000
    first = amqp.encode_frame(
        amqp.Transfer(handle=sh1, delivery_id=0, delivery_tag=b"t", more=True), 0, chunk
    )
    more = amqp.encode_frame(amqp.Transfer(handle=sh1, more=True), 0, chunk)
    pair.server.receive_data(first + more)
    assert attach.partial_size == 8000
    pair.server.receive_data(more)  # would be 12,000: refused before it is kept
    assert attach.partial_chunks is None and attach.partial_size == 0
    pair.server.receive_data(more * 50)  # the rest of it is dropped, not buffered
    assert attach.partial_chunks is None
    client_ev = pair.client.receive_data(pair.server.data_to_send())
    detached = of(client_ev, amqp.LinkDetached)
    assert [d.handle for d in detached] == [sh1]
    assert detached[0].error.condition == C.MESSAGE_SIZE_EXCEEDED
    pair.pump()
    pair.client.send_transfer(cch, sh2, b"fine")
    _, server_ev = pair.pump()
    assert [d.payload for d in of(server_ev, amqp.DeliveryReceived)] == [b"fine"]


def test_per_link_max_message_size_is_advertised_in_attach() -> None:
    pair = ConnectionPair()
    pair.open()
    cch, _sch = pair.begin("client")
    pair.client.attach(cch, amqp.Role.RECEIVER, name="r", source="q", max_message_size=2048)
    attaches = [p for p in performatives(pair.client.data_to_send()) if isinstance(p, amqp.Attach)]
    assert attaches[0].max_message_size == 2048


def test_default_max_message_size_is_corda_s_ten_mib() -> None:
    assert amqp.ConnectionConfig().max_message_size == 10 * 1024 * 1024


def test_error_frames_fit_the_peer_s_max_frame_size() -> None:
    """A rejection, detach, end or close whose description is longer than the peer's max-frame-size allows
    (it quotes what the peer sent: a claimed ``_AMQ_VALIDATED_USER`` of 40 KB) has its description cut so the
    frame fits; Proton with its 32 KiB frames otherwise fails the whole connection with a framing error."""
    pair, _cch, sch, [(sh, rh)] = link_pair(
        credit=10, links=1, server_config=cfg(sasl_mechanisms=SERVER_MECHS), client_max_frame_size=512
    )
    pair.server.receive_data(transfers(sh, 0, 2))
    pair.server.data_to_send()
    long = "\u00e9" * 20_000  # (two bytes each in UTF-8)
    rejected = amqp.Rejected(error=amqp.ErrorCondition(condition=C.INVALID_FIELD, description=long))
    pair.server.settle(sch, 0, rejected)
    pair.server.settle(sch, 1, amqp.Accepted())
    pair.server.detach(sch, rh, error=amqp.ErrorCondition(condition=C.NOT_ALLOWED, description=long))
    pair.server.end_session(sch, error=amqp.ErrorCondition(condition=C.NOT_ALLOWED, description=long))
    pair.server.close(amqp.ErrorCondition(condition=C.NOT_ALLOWED, description=long))
    raw = split_headers(pair.server.data_to_send())
    sizes = []
    pos = 0
    while pos < len(raw):
        sizes.append(int.from_bytes(raw[pos : pos + 4], "big"))
        pos += sizes[-1]
    assert len(sizes) == 5 and max(sizes) <= 512, sizes
    out = performatives(raw)
    assert out[0].state.error.condition == C.INVALID_FIELD and out[1].state == amqp.Accepted()
    for description in (out[0].state.error.description, out[2].error.description, out[4].error.description):
        assert description.startswith("\u00e9" * 100) and description.endswith("...")


def test_max_frame_size_is_bounded() -> None:
    with pytest.raises(ValueError, match="max_frame_size"):
        cfg(max_frame_size=1 << 30)


# --- opaque described values ---------------------------------------------------------------------------


def test_described_value_with_a_spec_code_in_a_message_is_kept_opaque() -> None:
    message = amqp.Message(
        application_properties={"k": amqp.Described(0x24, 5)},
        body=amqp.AmqpValue(amqp.Described(0x23, "x")),
    )
    assert amqp.Message.decode(message.encode()) == message


def test_performatives_stay_strict() -> None:
    bad = amqp.encode_frame(
        amqp.Disposition(role=amqp.Role.RECEIVER, first=0, settled=True, state=amqp.Described(0x24, "x"))
    )
    buf = amqp.FrameBuffer()
    buf.feed(bad)
    with pytest.raises(amqp.DecodeError):
        buf.next_frame()


# --- message-format (spec 2.7.5) -----------------------------------------------------------------------


def frame_sizes(raw: bytes) -> list[int]:
    """The SIZE of every frame in ``raw`` (protocol headers skipped)."""
    raw = split_headers(raw)
    sizes, pos = [], 0
    while pos < len(raw):
        sizes.append(int.from_bytes(raw[pos : pos + 4], "big"))
        pos += sizes[-1]
    return sizes


@given(
    first=st.sampled_from([0, 1, 0x80013700]),
    continuations=st.lists(st.one_of(st.none(), st.sampled_from([0, 1, 0x80013700])), min_size=1, max_size=4),
)
def test_a_delivery_s_message_format_is_its_first_transfer_s_and_may_not_change(
    first: int, continuations: list[int | None]
) -> None:
    """Continuation transfers may omit message-format or repeat it; one that states another format
    detaches the link with ``amqp:invalid-field`` and nothing of the delivery is kept or reported (the
    engine used to take the first format and ignore the rest). Another link carries on."""
    pair, cch, sch, [(sh1, rh1), (sh2, _rh2)] = link_pair(credit=10, links=2)
    # (pre-settled: the client's engine, which did not send this one, numbers its next delivery 0 as well,
    # and a delivery-id of an unsettled delivery may not be used again)
    head = amqp.Transfer(
        handle=sh1, delivery_id=0, delivery_tag=b"t", message_format=first, settled=True, more=True
    )
    frames = [head]
    for i, fmt in enumerate(continuations):
        frames.append(amqp.Transfer(handle=sh1, message_format=fmt, more=i < len(continuations) - 1))
    events: list[amqp.Event] = []
    for k, transfer in enumerate(frames):
        events += pair.server.receive_data(amqp.encode_frame(transfer, 0, b"%d" % k))
    changed = any(fmt is not None and fmt != first for fmt in continuations)
    if changed:
        assert not of(events, amqp.DeliveryReceived)
        assert pair.server.link(sch, rh1).partial_chunks is None
        detached = of(pair.client.receive_data(pair.server.data_to_send()), amqp.LinkDetached)
        assert [d.handle for d in detached] == [sh1]
        assert detached[0].error.condition == C.INVALID_FIELD
        assert "message-format" in detached[0].error.description
    else:
        [delivery] = of(events, amqp.DeliveryReceived)
        assert delivery.message_format == first
        assert delivery.payload == b"".join(b"%d" % k for k in range(len(frames)))
    pair.pump()
    pair.client.send_transfer(cch, sh2, b"fine", message_format=first)
    _, server_ev = pair.pump()
    assert [(d.payload, d.message_format) for d in of(server_ev, amqp.DeliveryReceived)] == [(b"fine", first)]


# --- our attach fits the peer's max-frame-size ---------------------------------------------------------


def small_frame_peer() -> tuple[ConnectionPair, int, int]:
    """An open pair whose client advertises max-frame-size 512; returns (pair, client ch, server ch)."""
    pair = ConnectionPair(client_config=cfg(max_frame_size=512))
    pair.open()
    cch, sch = pair.begin("client")
    return pair, cch, sch


@settings(max_examples=60)
@given(
    address_len=st.integers(0, 2000),
    name_len=st.integers(1, 700),
    peer_sends=st.booleans(),
    both_termini=st.booleans(),
)
@example(address_len=10, name_len=5, peer_sends=True, both_termini=False)  # answered by the application
@example(address_len=2000, name_len=5, peer_sends=True, both_termini=False)  # refused by the engine
@example(address_len=2000, name_len=5, peer_sends=False, both_termini=True)
@example(address_len=0, name_len=600, peer_sends=False, both_termini=False)  # the connection closes
def test_the_answer_to_a_peer_s_attach_never_exceeds_its_max_frame_size(
    address_len: int, name_len: int, peer_sends: bool, both_termini: bool
) -> None:
    """A peer with max-frame-size 512 attaches with addresses (and names) as large as *our* frame size
    allows. Our answer echoes its source and target; the engine used to send it whatever its size, a framing
    error at the peer that ended the connection. Now every frame we send fits 512: an attach whose echo fits
    goes to the application (and accept_link's answer fits); one whose echo does not is refused by the
    engine with amqp:frame-size-too-small (null termini, a short detach) and never reaches the application;
    a name too long for even the bare refusal closes the connection with that condition."""
    pair, cch, sch = small_frame_peer()
    address = "a" * address_len
    termini = {"target": address} if peer_sends else {"source": address}
    if both_termini:
        termini = {"target": address, "source": address}
    role = amqp.Role.SENDER if peer_sends else amqp.Role.RECEIVER
    pair.client.attach(cch, role, name="n" * name_len, **termini)  # (checked against our 128 KiB frames)
    try:
        events = pair.server.receive_data(pair.client.data_to_send())
    except amqp.RemoteProtocolError as exc:
        assert exc.condition == C.FRAME_SIZE_TOO_SMALL
        out = pair.server.data_to_send()
        assert max(frame_sizes(out)) <= 512
        assert close_of(out).error.condition == C.FRAME_SIZE_TOO_SMALL
        assert name_len > 300  # only a name this long leaves no answer at all
        closed = of(pair.client.receive_data(out), amqp.ConnectionClosed)
        assert closed[0].error.condition == C.FRAME_SIZE_TOO_SMALL
        return
    requested = of(events, amqp.LinkAttachRequested)
    if requested:
        pair.server.accept_link(sch, requested[0].handle)
        out = pair.server.data_to_send()
        [answer] = performatives(out)
        assert answer.source == requested[0].attach.source and answer.target == requested[0].attach.target
    else:
        out = pair.server.data_to_send()
        answer, detach = performatives(out)
        assert (answer.target if peer_sends else answer.source) is None  # a refusal (spec 2.6.3)
        assert detach.error.condition == C.FRAME_SIZE_TOO_SMALL and "512" in detach.error.description
    assert max(frame_sizes(out)) <= 512
    client_events = pair.client.receive_data(out)  # the peer takes it: no framing error
    assert not of(client_events, amqp.ConnectionClosed)
    if not requested:
        [detached] = of(client_events, amqp.LinkDetached)
        assert detached.error.condition == C.FRAME_SIZE_TOO_SMALL


def test_an_attach_larger_than_the_peer_s_max_frame_size_is_not_sent() -> None:
    """The other direction: our own attach to a peer with max-frame-size 512 raises frame-size-too-small
    instead of going out oversize; nothing is sent and the link name stays free."""
    pair = ConnectionPair(server_config=cfg(max_frame_size=512, sasl_mechanisms=SERVER_MECHS))
    pair.open()
    cch, _sch = pair.begin("client")
    with pytest.raises(amqp.LocalProtocolError) as info:
        pair.client.attach(cch, amqp.Role.SENDER, name="s", target="t" * 600)
    assert info.value.condition == C.FRAME_SIZE_TOO_SMALL and "512" in info.value.description
    assert pair.client.data_to_send() == b""
    handle = pair.client.attach(cch, amqp.Role.SENDER, name="s", target="short")
    _, server_events = pair.pump()
    assert [e.handle for e in of(server_events, amqp.LinkAttachRequested)] == [handle]
