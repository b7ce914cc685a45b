"""The float: a DMZ listener activated from inside, inbound-only, holding no business data.

Theory of operation
-------------------
:meth:`Float.run` listens on the *control* port only (mutual TLS with tunnel certificates; the peer must hold
a ``bridge`` tunnel certificate). One control connection at a time is served; a second is refused (closed
at once, audited). The state machine is ``_control.FLOAT_TRANSITIONS``; this module performs its side effects.

On :class:`~._control.ActivateFloat` the float builds the node's TLS context from the configuration entry
the command names (``tls_ref``), binds the *public* port and reports :class:`~._control.FloatActivated`.
The public listener runs inside the control connection's nursery: when the control link ends for any reason
(closed, broken, idle timeout), the public listener and every peer connection end with it, and so they do on
:class:`~._control.DeactivateFloat`.

Peers connect to the public port as to a node: TLS with a client certificate anchored in the network root,
``pki.check_peer_is_network_node``; the legal name becomes the sender. Only senders to the activated inboxes
are accepted (anything else: ``amqp:unauthorized-access``; a sender in snd-settle-mode ``settled``, whose
pre-settled messages no outcome would reach: ``amqp:not-implemented``, ``messaging.check_inbox_sender``),
and no message larger than ``max_message_size``
(the link's limit; less if the inside's inbound link would not take the message in its envelope).
A delivery whose transfer message-format is not 0 (the standard AMQP message) is rejected
at once with ``amqp:not-implemented`` (in its turn: the peer's order of outcomes holds) and never forwarded.
Each other delivery is wrapped, unparsed, in a :class:`~._control.ForwardedDelivery` that adds
the peer's validated legal name (``float-source``) and sent over the control connection's inbound link; the
inside decodes and checks it, stamps ``_AMQ_VALIDATED_USER`` and stores it. The inside's outcome
(``accepted`` only once the message is durable in the inbox, or ``rejected`` with its condition) settles
the peer's delivery. Per link, forwarding and settling keep the
peer's order; the one inbound link keeps it across the tunnel.

End-to-end credit: the inside grants ``credit`` on the inbound link, and the float never holds more peer
deliveries than that: each peer link reserves ``2k`` of the window (``k`` credit granted to the peer plus at
most ``k`` deliveries taken and waiting for the inside's outcome), a link for which no window is left is
refused with ``amqp:resource-limit-exceeded``, and so is a member's link past ``max_links_per_member`` (one
member cannot take the whole window), and a peer sending beyond its credit has its link detached
(``max_credit_overrun=0``). Nothing is queued on disk: a delivery the float cannot forward stays unsettled
and the peer sends it again when its link or connection ends.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import functools
import logging
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from corda_trio import amqp, logs, pki, transport
from corda_trio.messaging import (
    DEFAULT_MAX_MESSAGE_SIZE,
    InvalidMessageError,
    check_inbox_sender,
    check_message_format,
)

from .._inbound import ended_links_log
from ._audit import AuditLog, LatencySummary
from ._control import (
    CONTROL_ADDRESS,
    EVENTS_ADDRESS,
    INBOUND_ADDRESS,
    ActivateFloat,
    ControlProtocolError,
    DeactivateFloat,
    FloatActivated,
    FloatActivationFailed,
    FloatDeactivated,
    FloatInput,
    FloatState,
    ForwardedDelivery,
    decode_control,
    encode_control,
    float_transition,
)
from ._tunnel import TunnelCredentials, check_tunnel_peer

__all__ = ["Float", "FloatConfig", "NodeTls"]

log = logging.getLogger("corda_trio.bridge.float")

#: A peer link reserves at most this much of the end-to-end window (half as credit, half in flight): with the
#: inside's default window of 1024, sixteen peer links at once get a full window each.
DEFAULT_PEER_LINK_WINDOW: Final = 64
#: A member's peer links at once (a node's bridge attaches one per connection; more overlap only while it
#: reconnects): a quarter of the links the defaults allow, so one member cannot take the whole window.
DEFAULT_MAX_LINKS_PER_MEMBER: Final = 4
#: How often the per-peer latency summary is written.
LATENCY_SUMMARY_SECONDS: Final = 60.0
_SERVER_SASL: Final = ("PLAIN", "ANONYMOUS", "EXTERNAL")
#: How long detaching a peer's link whose forwarding failed may take (its socket may be full).
_DETACH_SECONDS: Final = 1.0


@attrs.frozen(kw_only=True)
class NodeTls:
    """The node TLS material an activation may name: paths on the float's host."""

    cert_chain: Path
    key: Path
    trust_root: Path
    passphrase: bytes | None = None

    def check_dates(self, now: dt.datetime) -> None:
        """Read the chain and the trust root as they are on disk now and check each certificate's dates.

        Raises:
            pki.CertificateValidationError: one is expired or not valid yet (the message names its file,
                the certificate and the time, as ``float start`` refuses it).
            pki.KeyStoreError: a file cannot be read.
        """
        files = [(path, pki.read_certificates(path)) for path in (self.cert_chain, self.trust_root)]
        pki.check_own_certificates(pki.own_certificates(files), now=now)

    def server_context(self) -> ssl.SSLContext:
        return pki.server_ssl_context(
            cert_chain=self.cert_chain, key=self.key, trust_root=self.trust_root, passphrase=self.passphrase
        )


@attrs.frozen(kw_only=True)
class FloatConfig:
    tunnel: TunnelCredentials
    control_host: str = "127.0.0.1"
    control_port: int = 0
    public_host: str = "0.0.0.0"
    public_port: int = 0
    tls: Mapping[str, NodeTls] = attrs.field(factory=dict)
    max_message_size: int = attrs.field(default=DEFAULT_MAX_MESSAGE_SIZE, validator=attrs.validators.ge(1))
    peer_link_window: int = attrs.field(default=DEFAULT_PEER_LINK_WINDOW, validator=attrs.validators.ge(2))
    #: peer links one member (legal name) may have attached at once, over all its connections: without a
    #: bound, one member could attach links until the end-to-end window is taken and lock every other out
    max_links_per_member: int = attrs.field(
        default=DEFAULT_MAX_LINKS_PER_MEMBER, validator=attrs.validators.ge(1)
    )
    max_connections: int = attrs.field(
        default=transport.DEFAULT_MAX_CONNECTIONS, validator=attrs.validators.ge(1)
    )
    handshake_timeout_seconds: float = transport.DEFAULT_HANDSHAKE_TIMEOUT_SECONDS
    #: float.toml ``[control] idle_timeout_seconds``: how long the inside may send no frame on the control
    #: link before the float gives it up (and closes its public port); advertised to it halved.
    control_idle_timeout_seconds: float = transport.DEFAULT_IDLE_TIMEOUT_SECONDS
    #: float.toml ``[public] idle_timeout_seconds``: the same for each peer's connection.
    public_idle_timeout_seconds: float = transport.DEFAULT_IDLE_TIMEOUT_SECONDS
    #: once half of ``max_connections`` are in their handshake (TLS, AMQP open), an address with this many in
    #: theirs gets no more (``None``: no limit). Idle sockets hold a public slot until the handshake timeout:
    #: without it, one address could take all ``max_connections``.
    max_handshakes_per_address: int | None = attrs.field(
        default=transport.DEFAULT_MAX_HANDSHAKES_PER_ADDRESS,
        validator=attrs.validators.optional(attrs.validators.ge(1)),
    )
    latency_summary_seconds: float = LATENCY_SUMMARY_SECONDS


@attrs.define(eq=False)
class _Activation:
    command: ActivateFloat
    forward: transport.Sender
    window_left: int
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: peer links attached now, by member (legal name): ``max_links_per_member`` bounds each
    member_links: collections.Counter[str] = attrs.field(factory=collections.Counter)

    def take(self, member: str, reserve: int) -> None:
        self.window_left -= reserve
        self.member_links[member] += 1

    def give_back(self, member: str, reserve: int) -> None:
        self.window_left += reserve
        self.member_links[member] -= 1
        if not self.member_links[member]:
            del self.member_links[member]


@attrs.define(eq=False)
class Float:
    """See the module docstring. ``await nursery.start(flt.run)`` returns the control port."""

    config: FloatConfig
    audit: AuditLog = attrs.field(factory=lambda: AuditLog(None))
    state: FloatState = FloatState.IDLE
    control_port: int | None = None
    public_port: int | None = None
    #: Counters: deliveries forwarded inward, settled accepted, settled otherwise; links refused.
    forwarded: int = 0
    accepted: int = 0
    refused_deliveries: int = 0
    refused_links: int = 0
    #: peer links attached (served), and the refused ones by their condition (``refused_links`` in all)
    attached_links: int = 0
    refused_links_by_condition: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: public connections taken past the accept loop's and the per-address handshake limits, and open now
    accepted_connections: int = 0
    open_connections: int = 0
    #: public connections refused, by reason (``transport.InboundRefusals``' reasons: ``capacity``,
    #: ``address_limit``, ``tls``, ``handshake_timeout``; ``amqp``: AMQP protocol violations, which are also
    #: logged per source address at most once a minute). Each is in the audit log too.
    refusals: transport.InboundRefusals = attrs.field(factory=transport.InboundRefusals)
    latency: LatencySummary = attrs.field(factory=LatencySummary)
    #: a member's links that ended with an error: an info line per member a minute (as the acceptor's)
    _ended_log: logs.PeerWarnings = attrs.field(factory=lambda: ended_links_log(log), init=False)
    _control_busy: bool = False
    _activation: _Activation | None = None

    @property
    def control_connected(self) -> bool:
        """Whether a control link from the bridge manager is up now."""
        return self._control_busy

    @property
    def activation(self) -> ActivateFloat | None:
        """The command this float is activated with now (``None``: not activated)."""
        return self._activation.command if self._activation is not None else None

    def _step(self, event: FloatInput) -> str:
        effect, self.state = float_transition(self.state, event)
        return effect

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the control port until cancelled.

        Raises:
            AuditLogError: a line of the audit log could not be written: the float stops (everything it
                serves ends; nothing is held here, so peers send again to whoever serves them next).
        """
        c = self.config
        audit_failed = trio.Event()
        token = trio.lowlevel.current_trio_token()
        # (the outbound guard may write from a worker thread: the event is set on the Trio thread)
        self.audit.on_failure = lambda _error: token.run_sync_soon(audit_failed.set)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._stop_on_audit_failure, audit_failed)
            listeners = await nursery.start(
                lambda task_status: transport.serve_amqp(
                    self._control,
                    c.control_port,
                    host=c.control_host,
                    ssl_context=c.tunnel.server_context(),
                    peer_check=lambda tls: check_tunnel_peer(tls, "bridge"),
                    config=amqp.ConnectionConfig(
                        sasl_mechanisms=_SERVER_SASL,
                        idle_timeout_ms=transport.idle_timeout_ms(c.control_idle_timeout_seconds),
                    ),
                    handshake_timeout=c.handshake_timeout_seconds,
                    max_connections=2,
                    task_status=task_status,
                )
            )
            self.control_port = transport.listener_port(listeners)
            self.audit.write("control-listening", host=c.control_host, port=self.control_port)
            nursery.start_soon(self._summaries)
            task_status.started(self.control_port)

    async def _stop_on_audit_failure(self, failed: trio.Event) -> None:
        await failed.wait()
        assert self.audit.failure is not None
        raise self.audit.failure

    async def _summaries(self) -> None:
        try:
            while True:
                await trio.sleep(self.config.latency_summary_seconds)
                self.audit.write_latency(self.latency)
        finally:  # a stop writes what the interval so far measured: a float stopped within a minute of its
            self.audit.write_latency(self.latency)  # start (or of its last summary) wrote none (never raises)

    # --- the control link ------------------------------------------------------------------------------

    async def _control(self, conn: transport.AmqpConnection) -> None:
        bridge = str(conn.peer_identity)
        if self._control_busy:
            self.audit.write("control-refused", bridge=bridge, reason="another control link is up")
            return
        self._control_busy = True
        self._step(FloatInput.CONTROL_UP)
        self.audit.write("control-up", bridge=bridge)
        reason = "control link closed"
        try:
            async with trio.open_nursery() as nursery:
                links: dict[str, Any] = {}
                ready = trio.Event()
                nursery.start_soon(self._control_links, conn, links, ready)
                nursery.start_soon(self._watch_closed, conn, nursery.cancel_scope)
                await ready.wait()
                await self._commands(conn, links, nursery)
        except Exception as exc:
            reason = logs.failure_text(exc)  # (a nursery's group is named by its cause)
            raise
        finally:
            # why the link ended: the connection's own error (an idle timeout: the inside is silent) first
            why = str(conn.close_error or reason)
            if self.state is FloatState.ACTIVE:
                self.audit.write("public-closed", reason=why)
            self.public_port = None
            self._activation = None
            self._step(FloatInput.CONTROL_DOWN)
            self._control_busy = False
            self.audit.write("control-down", bridge=bridge, reason=why)

    async def _watch_closed(self, conn: transport.AmqpConnection, scope: trio.CancelScope) -> None:
        await conn.wait_closed()
        scope.cancel()

    async def _control_links(
        self, conn: transport.AmqpConnection, links: dict[str, Any], ready: trio.Event
    ) -> None:
        wanted = {(True, CONTROL_ADDRESS), (False, EVENTS_ADDRESS), (False, INBOUND_ADDRESS)}
        async for request in conn.link_requests():
            key = (request.peer_is_sender, request.address)
            if key not in wanted or request.address in links:
                await request.refuse(
                    "amqp:unauthorized-access", f"not a float control link: {request.address!r}"
                )
                continue
            if request.peer_is_sender:
                links[CONTROL_ADDRESS] = await request.accept_receiver(credit=8)
            else:
                links[str(request.address)] = await request.accept_sender()
            if CONTROL_ADDRESS in links and EVENTS_ADDRESS in links:
                ready.set()

    async def _commands(
        self, conn: transport.AmqpConnection, links: dict[str, Any], nursery: trio.Nursery
    ) -> None:
        events: transport.Sender = links[EVENTS_ADDRESS]
        async for delivery in links[CONTROL_ADDRESS]:
            try:
                check_message_format(delivery.message_format)  # (ControlProtocolError is one)
                command = decode_control(amqp.Message.decode(delivery.payload))
            except amqp.DecodeError as exc:
                await delivery.reject("amqp:decode-error", str(exc))
                continue
            except InvalidMessageError as exc:
                await delivery.reject(exc.condition, exc.description)
                continue
            if isinstance(command, ActivateFloat):
                try:
                    self._step(FloatInput.ACTIVATE)
                except ControlProtocolError as exc:  # already active: refuse, and end the control link
                    await delivery.reject(exc.condition, exc.description)
                    self.audit.write("control-error", condition=exc.condition, description=exc.description)
                    nursery.cancel_scope.cancel()
                    return
                await delivery.accept()
                report = await self._activate(command, links, nursery)
                await events.send(encode_control(report))
            elif isinstance(command, DeactivateFloat):
                if self._step(FloatInput.DEACTIVATE) == "close":
                    self._deactivate(command.reason)
                await delivery.accept()
                await events.send(encode_control(FloatDeactivated(reason=command.reason)))
            else:
                await delivery.reject("amqp:not-implemented", f"{command.TYPE} is a report, not a command")

    def _deactivate(self, reason: str) -> None:
        if self._activation is not None:
            self._activation.scope.cancel()
            self._activation = None
        self.public_port = None
        self.audit.write("public-closed", reason=reason)

    async def _activate(
        self, command: ActivateFloat, links: dict[str, Any], nursery: trio.Nursery
    ) -> FloatActivated | FloatActivationFailed:
        def failed(condition: str, description: str) -> FloatActivationFailed:
            self._step(FloatInput.ACTIVATE_FAILED)
            self.audit.write("activation-failed", condition=condition, description=description)
            return FloatActivationFailed(
                activation_id=command.activation_id, condition=condition, description=description
            )

        forward = links.get(INBOUND_ADDRESS)
        if forward is None:
            return failed("amqp:precondition-failed", f"attach a receiver from {INBOUND_ADDRESS} first")
        tls = self.config.tls.get(command.tls_ref)
        if tls is None:
            return failed(
                "amqp:not-found", f"no TLS material {command.tls_ref!r} is configured on this float"
            )
        try:
            # the files are read anew at each activation (they may have been replaced since the start):
            # a chain out of date would be served, and every peer would refuse the handshake
            tls.check_dates(dt.datetime.now(dt.UTC))
            context = tls.server_context()
        except pki.CertificateValidationError as exc:
            return failed("amqp:precondition-failed", f"TLS material {command.tls_ref!r}: {exc}")
        except pki.KeyStoreError as exc:
            return failed("amqp:internal-error", f"TLS material {command.tls_ref!r}: {exc}")
        activation = _Activation(command=command, forward=forward, window_left=command.credit)
        try:
            port = await nursery.start(self._serve_public, activation, context)
        except OSError as exc:
            return failed("amqp:resource-limit-exceeded", f"cannot listen on the public port: {exc}")
        self._activation = activation
        self.public_port = port
        self.audit.write(
            "public-open", host=self.config.public_host, port=port, inboxes=list(command.inboxes),
            credit=command.credit, tls_ref=command.tls_ref,
        )  # fmt: skip
        return FloatActivated(
            activation_id=command.activation_id, public_host=self.config.public_host, public_port=port
        )

    # --- the public side -------------------------------------------------------------------------------

    async def _serve_public(
        self, activation: _Activation, context: ssl.SSLContext, *, task_status: trio.TaskStatus[int]
    ) -> None:
        handshakes = transport.HandshakeLimit(
            self.config.max_handshakes_per_address, free_below=self.config.max_connections // 2
        )

        async def serve_one(stream: trio.abc.Stream) -> None:
            handshake_done = handshakes.admit(stream)
            if handshake_done is None:
                self.refusals.counts["address_limit"] += 1
                self.audit.write(
                    "connection-refused",
                    peer=logs.remote_name(stream),
                    reason="max_handshakes_per_address reached",
                )
                await trio.aclose_forcefully(stream)
                return
            try:
                await self._peer(stream, activation, context, handshake_done)
            finally:
                handshake_done()

        async def refuse(stream: trio.abc.Stream) -> None:
            self.refusals.counts["capacity"] += 1
            self.audit.write(
                "connection-refused", peer=logs.remote_name(stream), reason="max_connections reached"
            )

        with activation.scope:
            listeners = await trio.open_tcp_listeners(self.config.public_port, host=self.config.public_host)
            port = int(listeners[0].socket.getsockname()[1])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.refusals.report_due)
                nursery.start_soon(self._ended_log.report_due)
                await nursery.start(
                    functools.partial(
                        transport.serve_listeners,
                        serve_one,
                        listeners,
                        max_connections=self.config.max_connections,
                        refuse=refuse,
                    )
                )
                task_status.started(port)

    async def _peer(
        self,
        stream: trio.abc.Stream,
        activation: _Activation,
        context: ssl.SSLContext,
        handshake_done: Callable[[], None],
    ) -> None:
        peer = logs.remote_name(stream)
        self.audit.write("connection", peer=peer)
        self.accepted_connections += 1
        self.open_connections += 1
        try:
            await self._serve_peer(stream, peer, activation, context, handshake_done)
        except Exception:  # supervision boundary: one broken peer connection must not close the listener
            log.exception("peer %s: connection failed", peer)
            self.audit.write("close", peer=peer, condition="amqp:internal-error")
        finally:
            self.open_connections -= 1

    async def _serve_peer(
        self,
        stream: trio.abc.Stream,
        peer: str,
        activation: _Activation,
        context: ssl.SSLContext,
        handshake_done: Callable[[], None],
    ) -> None:
        timeout = self.config.handshake_timeout_seconds
        try:
            with trio.fail_after(timeout):
                secured, name = await transport.secure_stream(
                    stream, context, pki.check_peer_is_network_node, server_side=True
                )
        except (transport.HandshakeError, trio.TooSlowError) as exc:
            timed_out = not isinstance(exc, transport.HandshakeError)
            self.refusals.counts["handshake_timeout" if timed_out else "tls"] += 1
            self.audit.write("tls", peer=peer, outcome="refused", reason=str(exc) or "handshake timed out")
            return
        user = str(name)
        self.audit.write("tls", peer=peer, outcome="ok", legal_name=user)
        config = amqp.ConnectionConfig(
            sasl_mechanisms=_SERVER_SASL,
            max_credit_overrun=0,
            idle_timeout_ms=transport.idle_timeout_ms(self.config.public_idle_timeout_seconds),
        )
        condition: str | None = None
        try:
            async with transport.open_amqp_over_stream(
                secured, client=False, config=config, peer_identity=name, handshake_timeout=timeout,
                on_violation=lambda exc: self.refusals.refused(peer, "amqp", f"protocol violation: {exc}"),
            ) as conn:  # fmt: skip
                handshake_done()  # the AMQP open is done: this connection no longer counts as a handshake
                async with trio.open_nursery() as nursery:
                    async for request in conn.link_requests():
                        await self._link(request, activation, user, peer, nursery)
                # (a peer's close without an error is a clean end: no condition, as the audit log documents)
                condition = None if conn.ended_cleanly or conn.close_error is None else str(conn.close_error)
        except transport.AmqpConnectionError as exc:
            condition = str(exc)
        finally:
            self.audit.write("close", peer=peer, legal_name=user, condition=condition)

    async def _link(
        self,
        request: transport.LinkRequest,
        activation: _Activation,
        user: str,
        peer: str,
        nursery: trio.Nursery,
    ) -> None:
        async def refuse(condition: str, description: str) -> None:
            self.refused_links += 1
            self.refused_links_by_condition[condition] += 1
            self.audit.write(
                "link-refused", peer=peer, legal_name=user, address=request.address, condition=condition
            )
            with contextlib.suppress(transport.AmqpTransportError):  # (the connection ended: audited so)
                await request.refuse(condition, description)

        if request.gone:  # detached before our answer (attach and detach pipelined): no window, no audit
            return
        inboxes = activation.command.inboxes
        if not request.peer_is_sender or request.address not in inboxes:
            what = "sender to" if request.peer_is_sender else "receiver from"
            allowed = ", ".join(inboxes)
            await refuse(
                "amqp:unauthorized-access",
                f"peers may only attach a sender to {allowed}, not a {what} {request.address!r}",
            )
            return
        try:
            check_inbox_sender(request.attach.snd_settle_mode)
        except InvalidMessageError as exc:
            await refuse(exc.condition, exc.description)
            return
        most = self.config.max_links_per_member
        if activation.member_links[user] >= most:
            await refuse(
                "amqp:resource-limit-exceeded",
                f"{user} has {most} links attached already (the float's max_links_per_member)",
            )
            return
        reserve = min(self.config.peer_link_window, activation.window_left)
        if reserve < 2:
            await refuse("amqp:resource-limit-exceeded", "the float's end-to-end window is taken")
            return
        activation.take(user, reserve)
        credit = reserve // 2
        # (the envelope's sections before the body: the same for every delivery of the link)
        prefix = ForwardedDelivery.prefix(user, str(request.address), peer)
        try:
            receiver = await request.accept_receiver(
                credit=credit, max_message_size=self._peer_message_limit(activation, prefix)
            )
        except BaseException as exc:
            # not attached: the share goes back (the peer's connection ended before the answer, an attach
            # and a violation in one write; its end is audited as the connection's 'close')
            activation.give_back(user, reserve)
            if isinstance(exc, transport.AmqpTransportError):
                return
            raise
        self.attached_links += 1
        self.audit.write("link-attached", peer=peer, legal_name=user, address=request.address, credit=credit)
        nursery.start_soon(self._pump, receiver, activation, user, peer, reserve, prefix)

    def _peer_message_limit(self, activation: _Activation, prefix: bytes) -> int:
        """A peer link's max-message-size: ours, and no more than leaves the envelope room on the inside's
        inbound link (a message whose envelope the inside would not take could not be forwarded: the link's
        pump ended, and what it had taken was never settled)."""
        limit = self.config.max_message_size
        inside = activation.forward.remote_attach.max_message_size
        if inside:
            envelope = len(ForwardedDelivery.wrap(prefix, b"\x00" * 256))  # the long Data header
            limit = min(limit, max(1, inside - (envelope - 256)))
        return limit

    async def _pump(
        self,
        receiver: transport.Receiver,
        activation: _Activation,
        user: str,
        peer: str,
        reserve: int,
        prefix: bytes,
    ) -> None:
        credit = reserve // 2
        ended: str | None = None  # why the link ended, for its audit line (None: the peer detached it)
        cut_short = True
        slots = trio.Semaphore(credit)  # taken from the link, not yet settled
        # (delivery, its pending forward, or the outcome it was refused with here, time taken from the link)
        send, receive = trio.open_memory_channel[tuple[transport.Delivery, Any, float]](credit)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._settle_in_order, receive, slots, user)
                async with send:
                    while True:
                        await slots.acquire()
                        try:
                            batch = [await receiver.receive()]
                        except trio.EndOfChannel:
                            break
                        except transport.AmqpTransportError as exc:
                            ended = str(exc)
                            break
                        while True:  # and whatever else arrived meanwhile, as far as slots allow
                            try:
                                slots.acquire_nowait()
                            except trio.WouldBlock:
                                break
                            try:
                                batch.append(receiver.receive_nowait())
                            except (trio.WouldBlock, trio.EndOfChannel, transport.AmqpTransportError):
                                slots.release()
                                break
                        started = trio.current_time()
                        for delivery in batch:  # forwarded without a checkpoint while the inside has credit
                            refused = self._refusal(delivery, user, peer)
                            if refused is not None:  # settled in its turn, never forwarded
                                send.send_nowait((delivery, refused, started))
                                continue
                            pending = await self._forward(delivery, activation, prefix)
                            send.send_nowait((delivery, pending, started))  # room: one slot per item
            cut_short = False
        except* (transport.AmqpTransportError, trio.BrokenResourceError, trio.ClosedResourceError) as group:
            failure = logs.failure_text(group)  # (a member whose process dies in a loop: see _ended_log)
            self._ended_log.warning(user, failure, "%s: link %s ended: %s", user, receiver.name, failure)
            ended = ended or failure
            cut_short = False
            # Still attached when the forwarding failed (the inside settled without an outcome, say): a link
            # left attached without its pump would never get credit again. What it has unsettled, its
            # sender sends again.
            with trio.move_on_after(_DETACH_SECONDS, shield=True):
                await receiver.detach("amqp:internal-error", f"the float could not forward: {failure}")
        finally:
            activation.give_back(user, reserve)
            if cut_short:  # (cancelled: the float deactivated, or it stops)
                ended = ended or "the float stopped serving the peer"
            self.audit.write(
                "link-detached", peer=peer, legal_name=user, address=str(receiver.address), condition=ended
            )

    def _refusal(self, delivery: transport.Delivery, user: str, peer: str) -> amqp.Rejected | None:
        """The outcome a delivery gets at the edge without being forwarded, or ``None`` to forward it.

        Only the float sees the peer's transfer: one whose message-format is not 0 (the standard AMQP
        message) is rejected here with ``amqp:not-implemented``. The envelope does not carry the format: the
        inside checks its own link's transfers the same way and the payload as a standard message, and a
        compromised float could state any format it liked (``protocol_spec/float-control.md``).
        """
        try:
            check_message_format(delivery.message_format)
        except InvalidMessageError as exc:
            self.audit.write(
                "delivery-refused", peer=peer, legal_name=user, condition=exc.condition,
                message_format=delivery.message_format,
            )  # fmt: skip
            error = amqp.ErrorCondition(condition=amqp.Symbol(exc.condition), description=exc.description)
            return amqp.Rejected(error=error)
        return None

    async def _forward(
        self, delivery: transport.Delivery, activation: _Activation, prefix: bytes
    ) -> transport.PendingDelivery:
        # The message itself is not parsed here: the inside decodes and checks it anyway (a float stays thin
        # and the DMZ parses as little untrusted input as it can); the link's max-message-size bounds it.
        envelope = ForwardedDelivery.wrap(prefix, delivery.payload)
        forward = activation.forward
        if forward.credit > 0:
            pending = forward.send_nowait(envelope)
        else:
            pending = await forward.start_send(envelope)
        self.forwarded += 1
        assert pending is not None
        return pending

    async def _settle_in_order(
        self,
        receive: trio.MemoryReceiveChannel[tuple[transport.Delivery, Any, float]],
        slots: trio.Semaphore,
        user: str,
    ) -> None:
        while True:
            try:
                batch = [await receive.receive()]
            except trio.EndOfChannel:
                return
            while True:
                try:
                    batch.append(receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            for delivery, pending, started in batch:
                # the control link ending raises here: the peer's delivery stays unsettled (sent again)
                if not isinstance(pending, transport.PendingDelivery):
                    outcome = pending  # refused at the edge (_refusal)
                elif pending.settled and pending.state is not None:
                    outcome = pending.state  # already in: settle without yielding, with the rest of the run
                else:  # waiting lets the dispositions settled so far leave
                    outcome = await pending.outcome()
                delivery.settle_nowait(outcome)
                slots.release()
                if isinstance(outcome, amqp.Accepted):
                    self.accepted += 1
                else:
                    self.refused_deliveries += 1
                self.latency.add(user, trio.current_time() - started)
            await trio.lowlevel.checkpoint()
