"""The ``loopback`` scenario: length-prefixed frames over real Trio TCP sockets on 127.0.0.1.

It is the floor under every networked scenario (amqp link, p2p): the same Trio task structure (a bounded
send channel feeding one writer task per connection, one reader task per connection) with no protocol on top,
so ``amqp-link`` latency minus ``loopback`` latency is what AMQP, TLS and the store add.

Theory of operation: ``peers`` client connections (links ``loopback-0`` ...) each feed a server-side reader.
An operation puts ``(seq, payload)`` into its link's channel (stage *enqueued*), the link's writer task sends
the frame ``u32 length | u64 seq | payload`` with ``send_all`` (stage *sent*), and the server reader parses it
and stamps *delivered*, waking the operation. Parameters: ``peers`` (default 1), ``queue_depth`` (send channel
size per link, default 1024).
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final, final

import attrs
import trio

from ._harness import BenchError, Operation, ScenarioContext

__all__ = ["LoopbackScenario"]

_HEADER: Final = struct.Struct(">IQ")  # frame length (bytes after this field), seq
_READ_CHUNK_BYTES: Final = 256 * 1024


@attrs.define(eq=False)
class _Link:
    name: str
    send: trio.MemorySendChannel[tuple[int, bytes]]
    receive: trio.MemoryReceiveChannel[tuple[int, bytes]]
    stream: trio.SocketStream | None = None


@attrs.define(eq=False)
class _LoopbackSession:
    clock_ops: dict[int, tuple[Operation, trio.Event]]
    link_by_name: dict[str, _Link]
    payload: bytes

    @property
    def links(self) -> list[str]:
        return list(self.link_by_name)

    async def run(self, op: Operation) -> None:
        link = self.link_by_name[op.link]
        done = trio.Event()
        self.clock_ops[op.seq] = (op, done)
        try:
            if op.size_bytes > len(self.payload):
                raise BenchError(f"size {op.size_bytes} exceeds the scenario's max_size_bytes")
            await link.send.send((op.seq, self.payload[: op.size_bytes]))
            op.mark("enqueued")
            await done.wait()
        finally:
            self.clock_ops.pop(op.seq, None)


async def _writer(link: _Link, session: _LoopbackSession) -> None:
    assert link.stream is not None
    async for seq, payload in link.receive:
        try:
            await link.stream.send_all(_HEADER.pack(8 + len(payload), seq) + payload)
        except trio.ClosedResourceError:  # the run ended (open() closes the stream) while the socket was full
            return
        entry = session.clock_ops.get(seq)
        if entry is not None:
            entry[0].mark("sent")


async def _reader(stream: trio.SocketStream, session: _LoopbackSession) -> None:
    buf = bytearray()
    async with stream:
        while True:
            data = await stream.receive_some(_READ_CHUNK_BYTES)
            if not data:
                return
            buf += data
            while len(buf) >= _HEADER.size:
                length, seq = _HEADER.unpack_from(buf)
                if len(buf) < 4 + length:
                    break
                del buf[: 4 + length]
                entry = session.clock_ops.get(seq)
                if entry is not None:
                    entry[0].mark("delivered")
                    entry[1].set()


@final
class LoopbackScenario:
    """Framed messages over TCP loopback sockets (see the module docstring)."""

    name = "loopback"
    description = "length-prefixed frames over Trio TCP sockets on 127.0.0.1 (the floor under amqp-link)"
    parameters: Final = {
        "peers": "number of TCP connections, one link each (default 1)",
        "queue_depth": "send channel size per link (default 1024)",
    }

    @asynccontextmanager
    async def open(self, ctx: ScenarioContext) -> AsyncIterator[_LoopbackSession]:
        peers = ctx.param("peers", 1)
        depth = ctx.param("queue_depth", 1024)
        if peers < 1 or depth < 1:
            raise BenchError("loopback: peers and queue_depth must be at least 1")
        max_size = max(ctx.config.sizes.sizes)
        links: dict[str, _Link] = {}
        for i in range(peers):
            send, receive = trio.open_memory_channel[tuple[int, bytes]](depth)
            links[f"loopback-{i}"] = _Link(name=f"loopback-{i}", send=send, receive=receive)
        session = _LoopbackSession(clock_ops={}, link_by_name=links, payload=bytes(max_size))
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:

            async def accept(stream: trio.SocketStream) -> None:
                await _reader(stream, session)

            await nursery.start(trio.serve_listeners, accept, listeners)
            for link in links.values():
                link.stream = await trio.open_tcp_stream("127.0.0.1", port)
                nursery.start_soon(_writer, link, session)
            try:
                yield session
            finally:
                # Close first, cancel last: an await after the cancel raised Cancelled in place of the
                # error the run ended with, the nursery swallowed it, and the run "finished" unmeasured.
                for link in links.values():
                    link.send.close()
                    if link.stream is not None:
                        await trio.aclose_forcefully(link.stream)
                nursery.cancel_scope.cancel()
