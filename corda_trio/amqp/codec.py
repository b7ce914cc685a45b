"""corda_trio.amqp.codec: the wire-level parts of the codec, for code that handles frames itself.

Applications use :class:`corda_trio.amqp.Message` and the connection engine; the frame layer, the raw value
codec and the performative tables live here (they stay importable from :mod:`corda_trio.amqp` as well).

* frames: :class:`FrameBuffer` (incremental, checks each frame's size on its 8-byte header),
  :func:`encode_frame`, :func:`decode_frame`, :func:`encode_empty_frame`, :class:`Frame`,
  :class:`FrameType`, the protocol headers;
* values: :func:`encode_value`, :func:`decode_value`;
* tables: :data:`PERFORMATIVES`, :data:`SASL_FRAMES`, :data:`DELIVERY_STATES` (descriptor code -> class);
* :class:`DecoderMemo` / :data:`DECODER_MEMO` and :class:`EncoderMemo` / :data:`ENCODER_MEMO`: the codec's
  memory of recurring input (``clear()`` them to start from a known state).
"""

from ._decode import DECODER_MEMO as DECODER_MEMO
from ._decode import MAX_ZERO_WIDTH_ARRAY_COUNT as MAX_ZERO_WIDTH_ARRAY_COUNT
from ._decode import DecoderMemo as DecoderMemo
from ._decode import decode_value as decode_value
from ._encode import encode_value as encode_value
from ._frames import AMQP_HEADER as AMQP_HEADER
from ._frames import EMPTY_FRAME as EMPTY_FRAME
from ._frames import MIN_MAX_FRAME_SIZE as MIN_MAX_FRAME_SIZE
from ._frames import SASL_HEADER as SASL_HEADER
from ._frames import TLS_HEADER as TLS_HEADER
from ._frames import Frame as Frame
from ._frames import FrameBuffer as FrameBuffer
from ._frames import FrameType as FrameType
from ._frames import decode_frame as decode_frame
from ._frames import encode_empty_frame as encode_empty_frame
from ._frames import encode_frame as encode_frame
from ._messages import ENCODER_MEMO as ENCODER_MEMO
from ._messages import EncoderMemo as EncoderMemo
from ._performatives import DELIVERY_STATES as DELIVERY_STATES
from ._performatives import PERFORMATIVES as PERFORMATIVES
from ._performatives import SASL_FRAMES as SASL_FRAMES

__all__ = [
    "AMQP_HEADER",
    "DECODER_MEMO",
    "DELIVERY_STATES",
    "EMPTY_FRAME",
    "ENCODER_MEMO",
    "MAX_ZERO_WIDTH_ARRAY_COUNT",
    "MIN_MAX_FRAME_SIZE",
    "PERFORMATIVES",
    "SASL_FRAMES",
    "SASL_HEADER",
    "TLS_HEADER",
    "DecoderMemo",
    "EncoderMemo",
    "Frame",
    "FrameBuffer",
    "FrameType",
    "decode_frame",
    "decode_value",
    "encode_empty_frame",
    "encode_frame",
    "encode_value",
]
