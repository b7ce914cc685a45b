"""``ConnectionPair``: two sans-IO AMQP engines wired together in memory (h11 ``tests/helpers.py`` style)."""

from __future__ import annotations

from typing import Any

from corda_trio import amqp

__all__ = ["ConnectionPair"]


class ConnectionPair:
    """A client and a server :class:`~corda_trio.amqp.Connection` exchanging bytes without any I/O.

    ``pump()`` moves bytes both ways until neither side has anything to send and returns the events each side
    saw. ``chunk`` splits every transfer of bytes into pieces of that size, to exercise partial input.
    """

    def __init__(
        self,
        client_config: amqp.ConnectionConfig | None = None,
        server_config: amqp.ConnectionConfig | None = None,
        *,
        chunk: int | None = None,
    ) -> None:
        self.client = amqp.Connection(client_config, client=True)
        self.server = amqp.Connection(
            server_config or amqp.ConnectionConfig(sasl_mechanisms=("PLAIN", "ANONYMOUS", "EXTERNAL")),
            client=False,
        )
        self.chunk = chunk
        self.client_events: list[amqp.Event] = []
        self.server_events: list[amqp.Event] = []

    def side(self, name: str) -> amqp.Connection:
        """``"client"`` or ``"server"``."""
        return self.client if name == "client" else self.server

    def other(self, name: str) -> amqp.Connection:
        """The engine opposite ``name``."""
        return self.server if name == "client" else self.client

    def _feed(self, conn: amqp.Connection, data: bytes) -> list[amqp.Event]:
        if self.chunk is None:
            return conn.receive_data(data)
        events: list[amqp.Event] = []
        for i in range(0, len(data), self.chunk):
            events.extend(conn.receive_data(data[i : i + self.chunk]))
        return events

    def pump(self, max_rounds: int = 1000) -> tuple[list[amqp.Event], list[amqp.Event]]:
        """Exchange bytes until both sides are quiet; returns ``(client_events, server_events)`` of this call.

        Raises:
            RuntimeError: still talking after ``max_rounds`` (a ping-pong bug).
        """
        client_events: list[amqp.Event] = []
        server_events: list[amqp.Event] = []
        for _ in range(max_rounds):
            to_server = self.client.data_to_send()
            to_client = self.server.data_to_send()
            if not to_server and not to_client:
                self.client_events += client_events
                self.server_events += server_events
                return client_events, server_events
            if to_server:
                server_events += self._feed(self.server, to_server)
            if to_client:
                client_events += self._feed(self.client, to_client)
        raise RuntimeError("the engines kept talking for max_rounds rounds")

    def open(self) -> None:
        """Run SASL and the open exchange."""
        self.pump()
        assert self.client.opened and self.server.opened, (self.client.state, self.server.state)

    def begin(self, by: str = "client") -> tuple[int, int]:
        """Begin a session from ``by``; returns ``(channel at by, channel at the other side)``."""
        starter = self.side(by)
        channel = starter.begin_session()
        events_c, events_s = self.pump()
        theirs = events_s if by == "client" else events_c
        begun = [e for e in theirs if isinstance(e, amqp.SessionBegun)]
        assert begun, theirs
        return channel, begun[-1].channel

    def attach(
        self,
        by: str,
        by_channel: int,
        other_channel: int,
        *,
        sender_at: str,
        address: str = "q",
        credit: int = 0,
        **kw: Any,
    ) -> tuple[int, int]:
        """Attach a link started by ``by``; the sender is at ``sender_at``. Returns (sender handle, receiver
        handle); grants ``credit`` from the receiver if non-zero."""
        starter = self.side(by)
        answerer = self.other(by)
        name = f"link-{address}"
        if sender_at == by:
            handle = starter.attach(by_channel, amqp.Role.SENDER, name=name, target=address, **kw)
        else:
            handle = starter.attach(by_channel, amqp.Role.RECEIVER, name=name, source=address, **kw)
        events_c, events_s = self.pump()
        theirs = events_s if by == "client" else events_c
        request = [e for e in theirs if isinstance(e, amqp.LinkAttachRequested)][-1]
        answerer.accept_link(other_channel, request.handle)
        self.pump()
        sender_handle, receiver_handle = (
            (handle, request.handle) if sender_at == by else (request.handle, handle)
        )
        if credit:
            receiver = self.other(sender_at)
            receiver_channel = by_channel if sender_at != by else other_channel
            receiver.flow(receiver_channel, receiver_handle, credit=credit)
            self.pump()
        return sender_handle, receiver_handle
