"""The map decoder's per-place memo and its volatile-key fast path never change what a map decodes to."""

from __future__ import annotations

import random

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
