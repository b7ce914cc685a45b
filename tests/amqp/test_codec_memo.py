"""The decoder's memo (map entries, shapes, properties tails, transfers, message layouts) never changes what
anything decodes to; nor does the encoder's."""

from __future__ import annotations

import random

import attrs
import pytest

from corda_trio import amqp


def test_maps_whose_values_change_under_the_same_keys_decode_exactly() -> None:
    rng = random.Random(5)
    values = ["a", "b" * 90, 7, amqp.Int(-3), 1 << 40, None, b"\x00bin", amqp.Symbol("s"), "é"]
    for n in range(2000):
        keys = ["platform-topic", "_AMQ_DUPL_ID", "send-seq-no", f"k{n % 3}"]
        if n % 7 == 0:
            rng.shuffle(keys)
        expected = {k: rng.choice(values) for k in keys}
        if n % 5 == 0:
            expected["_AMQ_DUPL_ID"] = f"id-{n}"  # one-off values, as dedup ids are
        message = amqp.Message(application_properties=expected)
        assert amqp.Message.decode(message.encode()).application_properties == expected
        for key, value in expected.items():
            got = amqp.Message.decode(message.encode()).application_properties
            assert got is not None and type(got[key]) is type(value)


def test_a_remembered_leading_run_never_changes_the_result() -> None:
    from corda_trio.amqp import codec

    codec.DECODER_MEMO.clear()
    lead = {"platform-topic": "t", "platform-version": amqp.Int(13), "corda-vendor": "v"}
    for n in range(50):  # the same leading entries, then different tails and lengths
        tail = {f"x{n % 4}": n, "_AMQ_DUPL_ID": f"id-{n}"} if n % 3 else {}
        expected = {**lead, **tail}
        data = amqp.encode_value(expected)
        assert amqp.decode_value(data) == (expected, len(data))
    assert codec.DECODER_MEMO.prefix[2] >= 2  # the leading run is remembered
    # fewer entries than the remembered run, and a tail repeating a leading key
    short = {"platform-topic": "t", "platform-version": amqp.Int(13)}
    assert amqp.decode_value(amqp.encode_value(short))[0] == short
    good = amqp.encode_value({**lead, "zz": 1})
    assert amqp.decode_value(good)[0] == {**lead, "zz": 1}
    twice = bytearray(good)
    i = twice.index(b"zz")
    twice[i - 2 : i + 2] = amqp.encode_value("corda-vendor")  # the tail's key becomes a leading key
    twice[1] += len("corda-vendor") - 2  # map8 size grows with the key
    with pytest.raises(amqp.DecodeError):
        amqp.decode_value(bytes(twice))


def test_the_encoder_memo_never_changes_the_bytes() -> None:
    from corda_trio.amqp import codec

    codec.ENCODER_MEMO.clear()
    values = ["v", "w" * 300, "é", 13, amqp.Int(13), None]
    for n in range(1000):  # past the memo's bound: it is cleared and refilled meanwhile
        props = {"platform-topic": values[n % len(values)], "_AMQ_DUPL_ID": f"id-{n}", "k": values[n % 4]}
        message = amqp.Message(application_properties=props)
        warm = message.encode()
        saved = dict(codec.ENCODER_MEMO.entries)
        codec.ENCODER_MEMO.clear()
        assert message.encode() == warm  # the same bytes with nothing remembered
        codec.ENCODER_MEMO.entries.update(saved)
        decoded = amqp.Message.decode(warm).application_properties
        assert decoded == props and type(decoded["platform-topic"]) is type(props["platform-topic"])


def test_the_remembered_properties_tail_never_changes_the_result() -> None:
    from corda_trio.amqp import codec

    codec.DECODER_MEMO.clear()
    tails = [
        {"to": "p2p.inbound.A"},
        {"to": "p2p.inbound.A", "user_id": b"alice"},
        {"to": "p2p.inbound.B", "subject": "s", "group_sequence": 7},
        {},
    ]
    for n in range(200):
        tail = tails[(n // 3) % len(tails)]
        props = amqp.Properties(message_id="m" * (n % 40) + str(n), **tail)  # type: ignore[arg-type]
        message = amqp.Message(properties=props, body=b"x")
        assert amqp.Message.decode(message.encode()) == message
    # a remembered tail behind a message id that is not UTF-8 still fails, and so does a cut message
    good = amqp.Message(properties=amqp.Properties(message_id="abc", to="p2p.inbound.A"), body=b"x").encode()
    assert amqp.Message.decode(good).properties.message_id == "abc"  # type: ignore[union-attr]
    bad = good.replace(b"abc", b"\xff\xfe\xfd")
    with pytest.raises(amqp.DecodeError):
        amqp.Message.decode(bad)
    boundary = len(good) - len(amqp.Message(body=b"x").encode())  # properties alone: a whole message
    for cut in range(1, len(good)):
        if cut == boundary:
            continue
        try:
            amqp.Message.decode(good[:cut])
        except amqp.DecodeError:
            continue
        raise AssertionError(f"a message cut at {cut} bytes decoded")


def test_the_application_properties_shape_never_changes_the_result() -> None:
    """Maps decoded by a remembered shape (unchanged runs + changing values) equal a full decode."""
    from corda_trio.amqp import codec

    codec.DECODER_MEMO.clear()
    rng = random.Random(11)
    values = ["v", "w" * 90, "é", 7, 1 << 40, -(1 << 40), amqp.Int(-3), None, True, b"\x00b",
              amqp.Symbol("s"), amqp.UInt(5), amqp.ULong(9), [1, 2], {"n": 1}]  # fmt: skip
    keys = ["platform-topic", "platform-version", "_AMQ_DUPL_ID", "sender-uuid", "send-seq-no"]
    base = {k: rng.choice(values) for k in keys}
    hits = 0
    for n in range(3000):
        props = dict(base)
        for k in rng.sample(keys, rng.randrange(0, 3)):  # some values change, some stay
            props[k] = rng.choice(values)
        if n % 97 == 0:
            props[f"extra{n % 2}"] = n  # another shape now and then
        if n % 13 == 0:
            base = dict(props)
        data = amqp.Message(application_properties=props, body=b"x").encode()
        before = codec.DECODER_MEMO.shape[0]
        got = amqp.Message.decode(data).application_properties
        hits += before == 2 * len(props)
        assert got == props and list(got) == list(props)
        assert all(type(got[k]) is type(v) for k, v in props.items())
    assert hits > 1000  # the shape path was taken
    # a map with the remembered shape but a changing value cut short, or a value past the map's end
    good = amqp.Message(application_properties={"a": "x", "b": "yy", "c": "z"}, body=b"x")
    amqp.Message.decode(good.encode())
    amqp.Message.decode(amqp.Message(application_properties={"a": "x", "b": "zz", "c": "z"}).encode())
    data = bytearray(good.encode())
    i = data.index(b"yy")
    data[i - 1] = 0x30  # the changing value claims 48 bytes: past the map
    with pytest.raises(amqp.DecodeError):
        amqp.Message.decode(bytes(data))
    bad_utf8 = good.encode().replace(b"yy", b"\xff\xfe")
    with pytest.raises(amqp.DecodeError):
        amqp.Message.decode(bad_utf8)


def test_the_remembered_transfer_never_changes_the_result() -> None:
    from corda_trio.amqp import codec

    codec.DECODER_MEMO.clear()
    rng = random.Random(3)
    for n in range(2000):
        kw: dict[str, object] = {
            "handle": rng.choice([0, 1, 300]), "delivery_id": rng.choice([n, n + 70000, 0]),
            "delivery_tag": n.to_bytes(4, "big")[-rng.choice([1, 3, 4]) :],
            "message_format": rng.choice([0, None]), "settled": rng.choice([False, True, None]),
        }  # fmt: skip
        if n % 50 == 0:
            kw["more"] = True
        if n % 77 == 0:
            kw["state"] = amqp.Accepted()
        transfer = amqp.Transfer(**kw)  # type: ignore[arg-type]
        frame = amqp.encode_frame(transfer, 1, b"payload")
        got = amqp.decode_frame(frame)
        assert got.performative == transfer and got.payload == b"payload"
        buffer = amqp.codec.FrameBuffer()
        buffer.feed(frame)
        assert buffer.next_frame() == got
    # a remembered head whose tag runs past the list is still refused
    frame = bytearray(amqp.encode_frame(amqp.Transfer(handle=0, delivery_id=9, delivery_tag=b"t" * 8), 0))
    amqp.decode_frame(bytes(frame))
    i = frame.index(b"t" * 8)
    frame[i - 1] = 40
    with pytest.raises(amqp.DecodeError):
        amqp.decode_frame(bytes(frame))


def test_the_encoder_shape_never_changes_the_bytes() -> None:
    """Maps encoded by a learnt shape (unchanged runs + changing values) equal a fresh encoding."""
    from corda_trio.amqp import codec

    codec.ENCODER_MEMO.clear()
    rng = random.Random(7)
    # equal values of different types (13, Int(13), True, 1.0) and equal floats with different bytes
    values = ["v", "é", 13, amqp.Int(13), amqp.Long(13), True, 1, 1.0, 0.0, -0.0, None, b"b",
              amqp.Symbol("v"), [1], [True], {"k": 1}, 1 << 40, "w" * 300]  # fmt: skip
    keys = ["platform-topic", "platform-version", "_AMQ_DUPL_ID", "sender-uuid", "send-seq-no"]
    base = {k: rng.choice(values) for k in keys}
    hits = 0
    for n in range(3000):
        props = dict(base)
        for k in rng.sample(keys, rng.randrange(0, 3)):
            props[k] = rng.choice(values)
        if n % 11 == 0:
            props["_AMQ_DUPL_ID"] = f"id-{n}"
        if n % 89 == 0:
            props = {f"x{n % 3}": n, **props}  # another shape now and then
        if n % 17 == 0:
            base = dict(props)
        message = amqp.Message(application_properties=props)
        shape = codec.ENCODER_MEMO.shape
        values_now = tuple(props.values())
        hits += (tuple(props), tuple(map(type, values_now))) == (shape[0], shape[1]) and shape[2](
            values_now
        ) == shape[3]
        warm = message.encode()
        saved = [list(codec.ENCODER_MEMO.shape), list(codec.ENCODER_MEMO.seen)]
        entries, keys_memo, last = (dict(x) for x in (codec.ENCODER_MEMO.entries, codec.ENCODER_MEMO.keys,
                                                       codec.ENCODER_MEMO.last))  # fmt: skip
        codec.ENCODER_MEMO.clear()
        assert message.encode() == warm, (n, props)  # the same bytes with nothing remembered
        codec.ENCODER_MEMO.shape[:], codec.ENCODER_MEMO.seen[:] = saved
        codec.ENCODER_MEMO.entries.update(entries)
        codec.ENCODER_MEMO.keys.update(keys_memo)
        codec.ENCODER_MEMO.last.update(last)
    assert hits > 300  # the shape path was taken


def test_transfers_that_end_before_or_at_their_delivery_tag_decode_exactly() -> None:
    """Continuation transfers may stop after the handle or the delivery-id (no tag), and the payload that
    follows may start with a byte that looks like a vbin8; the remembered transfer never reads past the
    list, and a delivery-id wider than the remembered one goes to the full decoder."""
    from corda_trio.amqp import codec

    payloads = [b"", b"\xa0", b"\xa0\x05abcde", b"\x70\x00", b"payload"]
    shapes: list[dict[str, object]] = [
        {"handle": 0, "delivery_id": 1, "delivery_tag": b"t"},
        {"handle": 0, "delivery_id": 1},
        {"handle": 0},
        {"handle": 0, "delivery_id": 1 << 20, "delivery_tag": b"t"},
        {"handle": 0, "delivery_id": 1 << 20},
        {"handle": 0, "delivery_id": 0, "delivery_tag": b""},
        {"handle": 0, "delivery_id": 200, "delivery_tag": b"tag"},
    ]
    codec.DECODER_MEMO.clear()
    for first in shapes:
        for second in shapes:
            for payload in payloads:
                for kw in (first, second):
                    transfer = amqp.Transfer(**kw)  # type: ignore[arg-type]
                    frame = amqp.encode_frame(transfer, 0, payload)
                    got = amqp.decode_frame(frame)
                    assert (got.performative, got.payload) == (transfer, payload)
                    buffer = amqp.codec.FrameBuffer()
                    buffer.feed(frame)
                    assert buffer.frames() == [got]


def _typed(value: object) -> object:
    """``value`` with the type of every part, so that ``Int(13)`` and ``13`` compare different."""
    if isinstance(value, dict):
        return {k: (_typed(v), type(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value), [_typed(v) for v in value]
    return value, type(value)


def test_the_remembered_message_layout_never_changes_the_result() -> None:
    """Messages decoded by the remembered layout (header, properties tail, application-properties shape,
    then a final data section) equal a decode from an empty memo, whatever changes from one to the next;
    a message that matches the layout up to a broken part is still refused."""
    from corda_trio.amqp import codec

    codec.DECODER_MEMO.clear()
    headers = [None, amqp.Header(durable=True), amqp.Header(durable=True, priority=9)]
    tails: list[dict[str, object]] = [{"to": "p2p.inbound.A"}, {"to": "p2p.inbound.A", "user_id": b"u"}, {}]
    bodies: list[object] = [b"x" * 16, b"y" * 1024, b"", (b"a", b"b"), amqp.AmqpValue("v"), None]
    base = {"platform-topic": "t", "platform-version": amqp.Int(13), "_AMQ_DUPL_ID": "id", "send-seq-no": 1}
    hits = 0
    for n in range(3000):
        props = dict(base, _AMQ_DUPL_ID=f"id-{n}", **{"send-seq-no": n})
        if n % 41 == 0:
            props[f"extra{n % 2}"] = "e"  # another shape now and then
        message = amqp.Message(
            header=headers[0 if n % 50 == 0 else 1 if n % 23 else 2],
            properties=amqp.Properties(message_id=f"m-{n % 7}{'é' * (n // 200 % 3)}", **tails[(n // 97) % 3]),  # type: ignore[arg-type]
            application_properties=props,
            body=bodies[0 if n % 11 else (n // 11) % len(bodies)],
            footer={amqp.Symbol("f"): 1} if n % 31 == 0 else None,
        )
        data = message.encode()
        layout = codec.DECODER_MEMO.message[0]
        hits += data.startswith(layout)
        got = amqp.Message.decode(data)
        memo = codec.DECODER_MEMO
        saved = list(memo.message), list(memo.shape), list(memo.shape_seen), list(memo.properties_tail)
        memo.clear()
        cold = amqp.Message.decode(data)
        memo.message[:], memo.shape[:], memo.shape_seen[:], memo.properties_tail[:] = saved
        assert got == cold == message, n
        assert _typed(got.application_properties) == _typed(props)
        assert type(got.body) is type(message.body)
    assert hits > 1500  # the layout path was taken
    # the remembered layout up to a message id that is not UTF-8, or a body cut short, is refused
    good = amqp.Message(
        header=amqp.Header(durable=True),
        properties=amqp.Properties(message_id="abc", to="p2p.inbound.A"),
        application_properties={"a": "x", "b": "yy"},
        body=b"z" * 300,
    )
    for body in (b"z" * 300, b"w" * 300):  # two messages with the same map: its shape is learnt
        amqp.Message.decode(attrs.evolve(good, body=body).encode())
    assert amqp.Message.decode(good.encode()) == good
    assert good.encode().startswith(codec.DECODER_MEMO.message[0])
    with pytest.raises(amqp.DecodeError):
        amqp.Message.decode(good.encode().replace(b"abc", b"\xff\xfe\xfd"))
    for cut in range(1, 40):
        with pytest.raises(amqp.DecodeError):
            amqp.Message.decode(good.encode()[:-cut])
    head = attrs.evolve(good, body=None).encode()  # the layout, then a section that may not follow it
    for again in (amqp.Message(application_properties={"c": "w"}), amqp.Message(header=amqp.Header())):
        with pytest.raises(amqp.DecodeError, match="out of order or repeated"):
            amqp.Message.decode(head + again.encode() + amqp.Message(body=b"z").encode())
    longer = bytearray(good.encode())
    longer[-301] += 1  # the data section claims one byte more than there is
    with pytest.raises(amqp.DecodeError):
        amqp.Message.decode(bytes(longer))
