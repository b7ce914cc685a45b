"""Configuration of the connection engine: one frozen, validated object per connection (h2 ``config.py``).

Every default is the node-to-node wire contract (Corda's P2P AMQP profile: SASL PLAIN as
``SystemUsers/Peer`` over mutual TLS, 128 KiB frames, a 10 s idle timeout advertised as 5 s, links
unsettled / first); the comment beside each default names its source. Nothing here is hard-wired in the
engine: interop tests and benchmarks build other configs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Final

import attrs

__all__ = [
    "DEFAULT_CHANNEL_MAX",
    "DEFAULT_MAX_CREDIT_OVERRUN",
    "DEFAULT_MAX_CREDIT_OVERRUN_BYTES",
    "DEFAULT_MAX_FRAME_SIZE_BYTES",
    "DEFAULT_MAX_MESSAGE_SIZE_BYTES",
    "MAX_MAX_FRAME_SIZE_BYTES",
    "MIN_MAX_FRAME_SIZE_BYTES",
    "ConnectionConfig",
    "default_container_id",
]

# Spec 2.7.1: a peer MUST accept frames of at least 512 bytes (MIN-MAX-FRAME-SIZE).
MIN_MAX_FRAME_SIZE_BYTES: Final = 512
# Corda's P2P bridge uses 128 KiB frames as well.
DEFAULT_MAX_FRAME_SIZE_BYTES: Final = 131_072
# Upper bound on our own max-frame-size: a frame is buffered whole before it is decoded, so this bounds the
# memory one frame can take (the spec allows 4 GiB; Proton uses 32 KiB, RabbitMQ 128 KiB).
MAX_MAX_FRAME_SIZE_BYTES: Final = 16 * 1024 * 1024
# Corda's network parameters default maxMessageSize (10 MiB); a node passes the network's value.
DEFAULT_MAX_MESSAGE_SIZE_BYTES: Final = 10_485_760
# Deliveries a sender may send beyond every credit we granted before we detach its link
# (amqp:link:transfer-limit-exceeded). Some clients send a few times their credit (30 against a grant of 10);
# 1000 absorbs three times the transport's default credit of 100 several times over, and still bounds the
# memory a peer can make us hold (at most this many messages of max_message_size).
DEFAULT_MAX_CREDIT_OVERRUN: Final = 1000
# ... and the bytes those deliveries may carry: the count alone let a client that sent 1,500 x 200 KB beyond
# its credit make a server buffer ~1 GB. 16 MiB is 128 frames of 128 KiB and more than one message of the
# default max-message-size, still absorbs 1000 deliveries of up to 16 KiB, and is far below what the count
# alone allows (1000 messages of max_message_size).
DEFAULT_MAX_CREDIT_OVERRUN_BYTES: Final = 16 * 1024 * 1024
# Spec 2.7.1 default channel-max (65535); we only ever begin one or a few sessions.
DEFAULT_CHANNEL_MAX: Final = 65_535
# Spec 2.7.2 default handle-max.
DEFAULT_HANDLE_MAX: Final = 4_294_967_295
UINT_MAX: Final = 4_294_967_295

SASL_MECHANISMS_KNOWN: Final = frozenset({"PLAIN", "ANONYMOUS", "EXTERNAL"})


def default_container_id() -> str:
    """A fresh ``corda-trio:<uuid>`` container id (unique per connection, as Corda's bridge does)."""
    return f"corda-trio:{uuid.uuid4()}"


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


def _uint(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= UINT_MAX:
        raise ValueError(f"{attribute.name} must fit a uint (0..{UINT_MAX}), got {value}")


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must not be negative, got {value}")


def _mechanisms(
    instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    unknown = [m for m in value if m not in SASL_MECHANISMS_KNOWN]
    if unknown:
        raise ValueError(
            f"{attribute.name}: unsupported SASL mechanism(s) {unknown}; "
            f"supported: {sorted(SASL_MECHANISMS_KNOWN)}"
        )


@attrs.frozen(kw_only=True)
class ConnectionConfig:
    """Everything a :class:`~corda_trio.amqp.Connection` needs to know before the first byte.

    Attributes:
        container_id: our ``open.container-id``.
        hostname: ``open.hostname`` (and the SASL init hostname); ``None`` leaves it out.
        max_frame_size: the largest frame we accept, advertised in ``open`` (512 (spec 2.7.1) up to
            :data:`MAX_MAX_FRAME_SIZE_BYTES`). Checked from each frame's 8-byte header, before its body
            is buffered; SASL frames are held to 512 bytes (spec 5.3.1).
        channel_max: the highest channel number we accept (advertised in ``open``).
        idle_timeout_ms: how long we tolerate silence from the peer before closing with
            ``amqp:resource-limit-exceeded``; ``None`` disables our timeout.
        advertised_idle_timeout_ms: the value we put into ``open.idle-time-out``. The spec (2.4.5) asks for
            half the real threshold so a peer that heartbeats at the advertised value never trips it.
            ``None`` means ``idle_timeout_ms // 2``.
        sasl: use the SASL layer (client: send the SASL header; server: offer SASL).
        sasl_mechanisms: client: mechanisms we are willing to use, best first; server: the ones we offer.
        sasl_username / sasl_password: client credentials for PLAIN (Corda's ``SystemUsers/Peer``).
        sasl_plain_check: server: ``(username, password) -> bool``; ``None`` accepts any PLAIN credentials
            (mutual TLS is the real authentication of a peer node).
        allow_bare_amqp: server: accept a client that skips SASL and sends the AMQP header directly.
        incoming_window: session incoming-window in transfer frames; re-opened when half used.
        outgoing_window: session outgoing-window we advertise (informational in AMQP 1.0).
        handle_max: the highest link handle we accept (advertised in ``begin``).
        snd_settle_mode / rcv_settle_mode: defaults for the links we attach (unsettled / first: every
            message is acknowledged by the receiver once it is stored).
        min_peer_idle_timeout_ms: the smallest ``idle-time-out`` we honour from a peer; below it we close.
        max_message_size: the largest message we accept on a receiving link: advertised in our
            ``attach.max-message-size``; a delivery whose running size passes it detaches that link with
            ``amqp:link:message-size-exceeded`` at once (nothing beyond is buffered). ``None`` = no limit.
            Per link: ``attach(..., Role.RECEIVER, max_message_size=)`` /
            ``accept_link(..., max_message_size=)``.
        max_credit_overrun: deliveries a sender may send beyond every credit we granted (they are accepted
            and counted in ``Link.overrun_total``; the transport then grants less). One more and only
            that link is detached with ``amqp:link:transfer-limit-exceeded``. ``0`` is the strict spec.
        max_credit_overrun_bytes: the bytes those deliveries may carry (counted as their frames arrive, in
            ``Link.overrun_bytes``, from the last limit we granted): a frame that would take a link past it
            detaches that link with ``amqp:link:transfer-limit-exceeded`` before its payload is kept.
        properties: ``open.properties`` (symbol keys).
    """

    container_id: str = attrs.field(factory=default_container_id)
    hostname: str | None = None
    max_frame_size: int = attrs.field(default=DEFAULT_MAX_FRAME_SIZE_BYTES, validator=_uint)
    channel_max: int = attrs.field(default=DEFAULT_CHANNEL_MAX)
    # Real threshold 10 s, advertised as 5 s (spec 2.4.5 asks to advertise half the real threshold).
    idle_timeout_ms: int | None = 10_000
    advertised_idle_timeout_ms: int | None = None
    sasl: bool = True
    # The client uses PLAIN (as Corda does); the server also accepts ANONYMOUS and EXTERNAL.
    sasl_mechanisms: tuple[str, ...] = attrs.field(default=("PLAIN",), converter=tuple, validator=_mechanisms)
    sasl_username: str = "SystemUsers/Peer"
    sasl_password: str = "SystemUsers/Peer"
    sasl_plain_check: Callable[[str, str], bool] | None = None
    allow_bare_amqp: bool = False
    # 2048 frames of up to 128 KiB: enough to keep a loopback link busy, bounded memory per session.
    incoming_window: int = attrs.field(default=2048, validator=[_uint, _positive])
    outgoing_window: int = attrs.field(default=2_147_483_647, validator=_uint)
    handle_max: int = attrs.field(default=DEFAULT_HANDLE_MAX, validator=_uint)
    snd_settle_mode: int = 0  # unsettled (spec 3.8.2)
    rcv_settle_mode: int = 0  # first (spec 3.8.3)
    max_message_size: int | None = DEFAULT_MAX_MESSAGE_SIZE_BYTES
    max_credit_overrun: int = attrs.field(default=DEFAULT_MAX_CREDIT_OVERRUN, validator=_uint)
    max_credit_overrun_bytes: int = attrs.field(
        default=DEFAULT_MAX_CREDIT_OVERRUN_BYTES, validator=_non_negative
    )
    properties: dict[str, object] | None = None
    # A peer asking for heartbeats more often than every 50 ms would make us spin: refuse it (spec 2.4.5
    # allows closing with resource-limit-exceeded when the requested idle-time-out cannot be supported).
    min_peer_idle_timeout_ms: int = 100

    def __attrs_post_init__(self) -> None:
        if self.max_frame_size < MIN_MAX_FRAME_SIZE_BYTES:
            raise ValueError(
                f"max_frame_size must be >= {MIN_MAX_FRAME_SIZE_BYTES} (spec 2.7.1), "
                f"got {self.max_frame_size}"
            )
        if self.max_frame_size > MAX_MAX_FRAME_SIZE_BYTES:
            raise ValueError(
                f"max_frame_size must be <= {MAX_MAX_FRAME_SIZE_BYTES} (a frame is buffered whole), "
                f"got {self.max_frame_size}"
            )
        if self.max_message_size is not None and not 0 < self.max_message_size <= 2**64 - 1:
            raise ValueError(
                f"max_message_size must be a positive ulong or None, got {self.max_message_size}"
            )
        if not 0 <= self.channel_max <= 65_535:
            raise ValueError(f"channel_max must fit a ushort, got {self.channel_max}")
        if self.idle_timeout_ms is not None:
            _uint(self, attrs.fields(ConnectionConfig).idle_timeout_ms, self.idle_timeout_ms)
        if self.snd_settle_mode not in (0, 1, 2):
            raise ValueError(f"snd_settle_mode must be 0, 1 or 2, got {self.snd_settle_mode}")
        if self.rcv_settle_mode not in (0, 1):
            raise ValueError(f"rcv_settle_mode must be 0 or 1, got {self.rcv_settle_mode}")
        if self.sasl and not self.sasl_mechanisms:
            raise ValueError("sasl=True needs at least one mechanism")

    @property
    def idle_time_out_field(self) -> int | None:
        """The value for ``open.idle-time-out`` (milliseconds) or ``None``."""
        if self.advertised_idle_timeout_ms is not None:
            return self.advertised_idle_timeout_ms or None
        if self.idle_timeout_ms:
            return max(1, self.idle_timeout_ms // 2)
        return None
