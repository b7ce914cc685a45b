"""The ``codec`` scenario: real ``corda_trio.amqp`` encoding and decoding of Corda-shaped P2P messages.

Each operation builds the message a bridge sends (header durable, properties with a message id,
application-properties with Corda's P2P header names, one Data body section of ``size_bytes``), encodes it,
and decodes it again, on one of two links:

``message``
    ``Message.encode()`` then ``Message.decode()`` (the message sections only).
``transfer-frame``
    the whole wire path: message sections inside a ``Transfer`` frame (``encode_frame``), fed to a
    ``FrameBuffer`` as a peer's bytes would be, the frame taken out and the message decoded.

Stages: *sent* = encoded (bytes ready for the socket); *delivered* = decoded and checked (the body must
equal what was sent, or the operation is an error). The work is pure CPU on the Trio thread; run it closed
loop with concurrency 1 for codec throughput, or open loop to see how codec time queues up at a given rate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final, final

import attrs

from corda_trio import amqp

from ._harness import BenchError, Operation, ScenarioContext

__all__ = ["CodecScenario", "p2p_message"]

LINKS: Final = ("message", "transfer-frame")
#: Frame size limit for the transfer path: the node's max-frame-size is 128 KiB, but a benchmark may ask
#: for bigger messages in one frame; this keeps the buffer's own check out of the way.
_MAX_FRAME_BYTES: Final = 1 << 30


def p2p_message(seq: int, body: bytes) -> amqp.Message:
    """The message a bridge sends: header, properties, Corda P2P application-properties, one Data body."""
    return amqp.Message(
        header=amqp.Header(durable=True),
        properties=amqp.Properties(message_id=f"N-bench-{seq}", to="p2p.inbound.DLbench"),
        application_properties={
            "platform-topic": "platform.session",
            "platform-version": 4,
            "corda-vendor": "corda-trio",
            "release-version": "0.1.0",
            "sender-uuid": "00000000-0000-0000-0000-00000000beef",
            "send-seq-no": seq,
            "corda_p2p_message_type": "SessionData",
            "_AMQ_DUPL_ID": f"N-bench-{seq}-0-0",
        },
        body=body,
    )


@attrs.define(eq=False)
class _CodecSession:
    payload: bytes
    frames: amqp.FrameBuffer = attrs.field(factory=lambda: amqp.FrameBuffer(_MAX_FRAME_BYTES))

    @property
    def links(self) -> tuple[str, ...]:
        return LINKS

    async def run(self, op: Operation) -> None:
        if op.size_bytes > len(self.payload):
            raise BenchError(f"size {op.size_bytes} exceeds the scenario's largest size")
        body = self.payload[: op.size_bytes]
        message = p2p_message(op.seq, body)
        decoded: Any
        if op.link == "message":
            wire = message.encode()
            op.mark("sent")
            decoded = amqp.Message.decode(wire)
        else:
            transfer = amqp.Transfer(
                handle=0, delivery_id=op.seq & 0xFFFFFFFF, delivery_tag=op.seq.to_bytes(8, "big"),
                message_format=0, settled=False,
            )  # fmt: skip
            wire = amqp.encode_frame(transfer, 0, message.encode())
            op.mark("sent")
            self.frames.feed(wire)
            frame = self.frames.next_frame()
            if frame is None:
                raise BenchError("frame buffer returned no frame for a whole frame")
            decoded = amqp.Message.decode(frame.payload)
        if decoded.body != body or decoded.application_properties["send-seq-no"] != op.seq:
            raise BenchError("decoded message differs from the encoded one")
        op.mark("delivered")


@final
class CodecScenario:
    """Encode + decode of P2P messages with ``corda_trio.amqp`` (see the module docstring)."""

    name = "codec"
    description = "corda_trio.amqp: encode + decode a Corda P2P message (sections; whole Transfer frame)"
    parameters: Final[dict[str, str]] = {}

    @asynccontextmanager
    async def open(self, ctx: ScenarioContext) -> AsyncIterator[_CodecSession]:
        yield _CodecSession(payload=bytes(range(256)) * (max(ctx.config.sizes.sizes) // 256 + 1))
