"""The inside end of the float tunnel: dial the floats, activate exactly one, store what it forwards.

Theory of operation
-------------------
:meth:`FloatTunnel.run` loops over the configured floats in order (hot-warm: one active at a time keeps
each peer's order). For the current float it dials the control port (mutual TLS with the tunnel
certificates; the float must hold a ``float`` tunnel certificate), attaches the three control links
(``protocol_spec/float-control.md``), sends :class:`~._control.ActivateFloat` with the node's inbox, the
``tls_ref`` and the end-to-end ``credit``, and waits for :class:`~._control.FloatActivated`. From then on
the float is *active* and forwarded deliveries are stored:

* one task takes whatever has arrived on the inbound link (credit ``credit``), in order, and validates
  each one itself (the float is in the DMZ and may be compromised): the envelope decodes; its target is
  exactly this node's inbox (never an outbound queue, a control address or another node's inbox); the
  claimed source is a legal name and, when a resolver is given, a member of the network map; the message
  passes the node's P2P checks, and a ``_AMQ_VALIDATED_USER`` it carries equals the claimed source; then
  it is stamped with it. Bad ones are settled ``rejected`` with the condition (the float passes that
  outcome to the peer); good ones are appended to the inbox in one group commit and settled ``accepted``
  only when that returned, i.e. once durable (the in-node acceptor's writer, ``_inbound.store_checked``,
  with this check).

A claimed source that is a legal name but not (yet) in the network map is not rejected: a node that has
just joined the network knows this node before this node's copy of the map knows it, and a rejection would
send its messages to its dead letters for good. Its deliveries are settled ``released`` instead (the
sender keeps them and sends them again: a bridge ends its session and retries after its backoff), with a
warning at most once a minute per sender. So that none overtakes another, once a delivery of a peer link
(claimed source and peer address) was released, every later delivery of that link is released too, even
when the map has learnt the sender meanwhile; a bridge retries on a new connection, which is a new link.
This is reset at each activation (a new float forwards new links).

Each message is decoded once on this side: the envelope's prefix is the same bytes for every delivery of one
peer link, so :class:`~._control.EnvelopeReader` decodes it once per link; the stamp is added in place
(``messaging.stamped_payload``); and ``on_checked`` (in the node ``MessagingService.remember_received``)
hands the decoded messages to the dispatcher, as the in-node acceptor does.

``inbox`` is the node's store queue in the node, or ``RemoteInbox`` (the node's local endpoint) in a bridge
process (``ExternalBridgeConfig.floats``). Observers count activations (:meth:`FloatTunnel.wait_activation`):
a failover can be over within milliseconds, faster than any poll of ``public_address`` would notice.

When the active float's control link fails (or the float deactivates itself), the tunnel fails over to the
next float at once; after a whole round of floats failed without an activation it waits with a backoff of
1 s doubling to :data:`TUNNEL_MAX_BACKOFF_SECONDS` (5 s), not the peers' 60 s: a float is a host of the
node's own DMZ, a round costs a TCP connect per float, and a float that is ready again (a standby resumed
after a freeze, a float restarted) must not wait out a minute of backoff: with a 60 s cap a standby resumed
30 s after the active float died was activated 11 s after it came back (15 s after 60 s; docs/float.md §4).
Deliveries in flight when a link dies were never settled: the peer sends them again through the next
float, and the node's deduplicator drops what was already stored.
Cancellation at any checkpoint acks nothing that is not durable.
"""

from __future__ import annotations

import logging
import ssl
import uuid
from typing import Any, Final

import attrs
import trio

from corda_trio import amqp, hostport, logs, pki, transport
from corda_trio.messaging import (
    DEFAULT_MAX_MESSAGE_SIZE,
    InvalidMessageError,
    PeerResolver,
    check_message_format,
    check_p2p_message,
    stamped_payload,
)

from .._backoff import INITIAL_BACKOFF_SECONDS, Backoff
from .._inbound import (
    Inbox,
    OnChecked,
    RetryLaterError,
    rejected_messages_log,
    store_checked,
    take_arrivals,
    tally,
)
from .._outbound import _failure_unless_cancelled
from ._control import (
    CONTROL_ADDRESS,
    EVENTS_ADDRESS,
    INBOUND_ADDRESS,
    ActivateFloat,
    ControlProtocolError,
    EnvelopeReader,
    FloatActivated,
    FloatActivationFailed,
    FloatDeactivated,
    decode_control,
    encode_control,
)
from ._tunnel import check_tunnel_peer

__all__ = [
    "DEFAULT_TUNNEL_HANDSHAKE_TIMEOUT_SECONDS",
    "TUNNEL_MAX_BACKOFF_SECONDS",
    "FloatActivationError",
    "FloatTunnel",
    "TunnelConfig",
]

log = logging.getLogger("corda_trio.bridge.float")

#: The end-to-end window: peer deliveries the float may hold (and that are in flight towards the inbox). The
#: float shares it among peer links (64 each by default), so it also bounds concurrent peer links.
DEFAULT_TUNNEL_CREDIT: Final = 1024
#: Room for the envelope's own sections around a message of ``max_message_size``.
ENVELOPE_OVERHEAD_BYTES: Final = 64 * 1024
#: At most this many checked senders and released peer links (module docstring) are remembered.
_REMEMBERED: Final = 4096
#: TCP + TLS + SASL + open of the control link. A frozen standby float's kernel still completes the TCP
#: connect, and nothing answers above it: with the peers' 10 s this delayed every failover past it by 10 s.
#: The tunnel runs between the node's network and its DMZ, where the handshake takes milliseconds.
DEFAULT_TUNNEL_HANDSHAKE_TIMEOUT_SECONDS: Final = 3.0
#: The longest wait between two rounds of floats (module docstring): a float that is ready again is
#: activated at most this long (plus one round) after it is.
TUNNEL_MAX_BACKOFF_SECONDS: Final = 5.0


class FloatActivationError(Exception):
    """The float refused the activation or did not answer it."""


@attrs.frozen(kw_only=True)
class TunnelConfig:
    """The floats to use, in order of preference, and how to activate them."""

    floats: tuple[tuple[str, int], ...] = attrs.field(
        converter=lambda v: tuple((str(h), int(p)) for h, p in v)
    )
    tls_ref: str = "node"
    credit: int = attrs.field(default=DEFAULT_TUNNEL_CREDIT, validator=attrs.validators.ge(2))
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    initial_backoff_seconds: float = INITIAL_BACKOFF_SECONDS
    max_backoff_seconds: float = TUNNEL_MAX_BACKOFF_SECONDS
    backoff_jitter: float = 0.2
    #: ``[float] handshake_timeout_seconds``: how long a float may take to complete the control link's
    #: handshake before the next one is tried.
    handshake_timeout_seconds: float = DEFAULT_TUNNEL_HANDSHAKE_TIMEOUT_SECONDS
    #: ``[float] idle_timeout_seconds``: how long the float may send no frame on the control link before it
    #: is given up (and the next float activated); advertised to it halved.
    idle_timeout_seconds: float = transport.DEFAULT_IDLE_TIMEOUT_SECONDS
    activation_timeout_seconds: float = 10.0

    def __attrs_post_init__(self) -> None:
        if not self.floats:
            raise ValueError("at least one float is needed")


@attrs.define(eq=False)
class FloatTunnel:
    """See the module docstring. ``await nursery.start(tunnel.run)``; :meth:`wait_active` and
    :meth:`wait_activation` for tests and monitoring."""

    #: The node's inbox: its store queue in the node, ``RemoteInbox`` in a bridge process.
    inbox: Inbox
    tunnel_context: ssl.SSLContext
    config: TunnelConfig
    #: When given, a forwarded message must claim a sender that is in the network map.
    resolver: PeerResolver | None = None
    #: In the node: ``MessagingService.remember_received``, told each run of checked messages from one
    #: sender just before they are stored (stamped payloads, the messages as decoded here, the sender), so
    #: that the dispatcher need not decode them again (as with the in-node acceptor).
    on_checked: OnChecked | None = None
    #: The float in use (``(host, port)`` of its control port) and its public address, while active.
    active: tuple[str, int] | None = None
    public_address: tuple[str, int] | None = None
    #: The public address the latest activation reported (kept after that activation ended).
    latest_public_address: tuple[str, int] | None = None
    #: Counters: activations, failovers (a float's control link ended), messages stored, rejected, released
    #: (their sender is not in the network map yet: module docstring).
    activations: int = 0
    failovers: int = 0
    stored: int = 0
    rejected: int = 0
    released: int = 0
    #: Messages stored, by the sender the float authenticated (and this side checked).
    stored_by_peer: dict[str, int] = attrs.field(factory=dict)
    last_error: str | None = None
    _changed: trio.Event = attrs.field(factory=trio.Event)
    #: Senders already checked, with the network map version they were checked against.
    _sources: dict[str, int] = attrs.field(factory=dict)
    #: Peer links (claimed source, peer address) whose deliveries are released (module docstring), oldest
    #: first.
    _held_links: dict[tuple[str, str], None] = attrs.field(factory=dict)
    #: warnings about senders not in the network map, and about rejected deliveries: once a minute per sender
    #: (``logs.PeerWarnings``; every one is counted in ``released`` / ``rejected``)
    _unknown_log: logs.PeerWarnings = attrs.field(
        factory=lambda: logs.PeerWarnings(log, "messages claimed from %s released (not in the network map)"),
        init=False,
    )
    _rejected_log: logs.PeerWarnings = attrs.field(factory=rejected_messages_log, init=False)
    _envelopes: EnvelopeReader = attrs.field(factory=EnvelopeReader)
    #: per float: the lines of its failed attempts while it is away (its first failure, then a line a minute
    #: at most, and one when it is activated again), as a bridge logs its peer's outage
    _outages: dict[tuple[str, int], logs.Outage] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        floats = self.config.floats
        self._outages = {
            a: logs.Outage(log, f"float {hostport.host_port_text(*a)}", level=logging.INFO) for a in floats
        }

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_active(self) -> tuple[str, int]:
        """Wait until a float is active; returns its public address."""
        while self.public_address is None:
            await self._changed.wait()
        return self.public_address

    async def wait_activation(self, after: int = 0) -> tuple[int, tuple[str, int]]:
        """Wait until more than ``after`` activations have happened; returns their number and the public
        address the latest one reported.

        Counting activations is the way to see every failover: one can end and the next float be active
        within milliseconds, so an observer that waits for ``public_address`` to read ``None`` in between
        may never see it do so.
        """
        while self.activations <= after:
            await self._changed.wait()
        assert self.latest_public_address is not None
        return self.activations, self.latest_public_address

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep one float active until cancelled (never returns)."""
        c = self.config
        backoff = Backoff(c.initial_backoff_seconds, c.max_backoff_seconds, c.backoff_jitter)
        task_status.started()
        index, failed_in_round = 0, 0
        while True:
            address = c.floats[index]
            activated = False
            try:
                activated = await self._session(address)
            except BaseException as raised:
                # (the session's tasks fail together: the line names the first failure)
                self.last_error = logs.failure_text(_failure_unless_cancelled(raised))
                if self.active is not None:  # the active float's link ended: said each time
                    log.info("float %s: %s", hostport.host_port_text(*address), self.last_error)
                else:  # an attempt failed: bounded while the float stays away (rounds come every 5 s)
                    outage = self._outages[address]
                    outage.failed(self.last_error, "%s: %s", outage.name, self.last_error)
            finally:
                if self.active is not None:
                    activated = True
                    self.failovers += 1
                self.active = self.public_address = None
                self._notify()
            index = (index + 1) % len(c.floats)
            if activated:
                backoff.reset()
                failed_in_round = 0
                continue  # fail over to the next float at once
            failed_in_round += 1
            if failed_in_round >= len(c.floats):
                failed_in_round = 0
                await trio.sleep(backoff.next_delay())

    async def _session(self, address: tuple[str, int]) -> bool:
        c = self.config
        async with transport.open_amqp_connection(
            address[0],
            address[1],
            ssl_context=self.tunnel_context,
            peer_check=lambda tls: check_tunnel_peer(tls, "float"),
            config=amqp.ConnectionConfig(idle_timeout_ms=transport.idle_timeout_ms(c.idle_timeout_seconds)),
            handshake_timeout=c.handshake_timeout_seconds,
        ) as conn:
            control = await conn.open_sender(CONTROL_ADDRESS)
            events = await conn.open_receiver(EVENTS_ADDRESS, credit=8)
            inbound = await conn.open_receiver(
                INBOUND_ADDRESS,
                credit=c.credit,
                max_message_size=c.max_message_size + ENVELOPE_OVERHEAD_BYTES,
            )
            command = ActivateFloat(
                activation_id=uuid.uuid4().hex, tls_ref=c.tls_ref, inboxes=(self.inbox.name,), credit=c.credit
            )
            with trio.fail_after(c.activation_timeout_seconds):
                outcome = await control.send(encode_control(command))
                if not isinstance(outcome, amqp.Accepted):
                    raise FloatActivationError(f"the float settled the activation with {outcome!r}")
                report = await self._next_report(events)
            if isinstance(report, FloatActivationFailed):
                raise FloatActivationError(f"{report.condition}: {report.description}")
            if not isinstance(report, FloatActivated) or report.activation_id != command.activation_id:
                raise FloatActivationError(f"unexpected answer to the activation: {report!r}")
            self.active = address
            self.public_address = self.latest_public_address = (report.public_host, report.public_port)
            self.activations += 1
            self._held_links.clear()  # links of an earlier activation cannot forward anything any more
            self._outages[address].connected()
            log.info("float %s active, public port %d", hostport.host_port_text(*address), report.public_port)
            self._notify()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_reports, events)
                nursery.start_soon(self._watch_connection, conn)
                await self._store(inbound)
        return True

    async def _next_report(self, events: transport.Receiver) -> Any:
        """The float's next report (one in another message-format is rejected and skipped, never read)."""
        while True:
            delivery = await events.receive()
            try:
                check_message_format(delivery.message_format)
            except InvalidMessageError as exc:
                self._rejected_log.warning(
                    "float tunnel", exc.description, "float tunnel: rejected a report: %s", exc.description
                )
                await delivery.reject(exc.condition, exc.description)
                continue
            await delivery.accept()
            return decode_control(delivery.message)

    async def _watch_reports(self, events: transport.Receiver) -> None:
        while True:
            report = await self._next_report(events)
            if isinstance(report, FloatDeactivated):
                raise FloatActivationError(f"the float deactivated itself: {report.reason}")

    async def _watch_connection(self, conn: transport.AmqpConnection) -> None:
        await conn.wait_closed()
        raise conn.close_error or transport.AmqpConnectionError("the control link ended")

    # --- storing forwarded deliveries -----------------------------------------------------------------

    async def _store(self, inbound: transport.Receiver) -> None:
        while True:
            try:
                batch = await take_arrivals(inbound)
            except trio.EndOfChannel:
                raise transport.AmqpConnectionError("the inbound link ended") from None
            stored, rejected, released = await store_checked(
                inbound, batch, self.inbox, self._check, self.on_checked, "float tunnel", self._rejected_log
            )
            self.rejected += rejected
            self.released += released
            self.stored += tally(stored, self.stored_by_peer)

    def validate(self, data: bytes) -> bytes:
        """Check one forwarded delivery again; returns the message to store in the inbox (stamped).

        Raises:
            ControlProtocolError / InvalidMessageError: with the condition to reject it with.
            RetryLaterError: its sender is not in the network map (yet): release it.
        """
        return self._check(data)[2]

    def _check(self, data: bytes) -> tuple[str, amqp.Message, bytes]:
        """:meth:`validate`, also returning the sender and the message as decoded (unstamped)."""
        envelope = self._envelopes.decode(data)
        if envelope.target != self.inbox.name:
            raise ControlProtocolError(
                "amqp:unauthorized-access",
                f"forwarded to {envelope.target!r}: only this node's inbox {self.inbox.name} is reachable",
            )
        link = (envelope.source, envelope.peer)
        if self._held_links and link in self._held_links:
            raise RetryLaterError(f"an earlier delivery of {envelope.source} on this link was released")
        try:
            self._check_source(envelope.source)
        except RetryLaterError:
            if len(self._held_links) >= _REMEMBERED:
                del self._held_links[next(iter(self._held_links))]
            self._held_links[link] = None
            raise
        try:
            message = amqp.Message.decode(envelope.payload)
        except amqp.DecodeError as exc:
            raise ControlProtocolError("amqp:decode-error", f"malformed message: {exc}") from exc
        check_p2p_message(message, max_size=self.config.max_message_size, encoded_size=len(envelope.payload))
        # a claimed _AMQ_VALIDATED_USER must be the sender the float authenticated (else unauthorized-access)
        return envelope.source, message, stamped_payload(envelope.payload, message, envelope.source)

    def _check_source(self, source: str) -> None:
        known = self._sources.get(source)
        if known is not None and (self.resolver is None or known == self.resolver.version):
            return
        try:
            name = pki.CordaX500Name.parse(source)
        except pki.InvalidNameError as exc:
            raise ControlProtocolError(
                "amqp:unauthorized-access", f"the claimed sender {source!r} is not a legal name: {exc}"
            ) from exc
        if self.resolver is not None and self.resolver.peer_named(name) is None:
            self.resolver.report_unknown()  # (it may have joined the map since the node last polled it)
            self._unknown_log.warning(
                source, "not in the network map",
                "float tunnel: %s is not in the network map (yet): its messages are released, its "
                "bridge sends them again", source,
            )  # fmt: skip
            raise RetryLaterError(f"the claimed sender {source!r} is not in the network map")
        if len(self._sources) > _REMEMBERED:  # bound the cache of recently seen senders
            self._sources.clear()
        self._sources[source] = self.resolver.version if self.resolver is not None else 0
