"""TLS over a TCP socket with one scheduling point per operation: the AMQP driver's stream.

Theory of operation
-------------------
``trio.SSLStream`` works over any trio stream, so every ``send_all`` and ``receive_some`` goes through its
general machinery: two locks (each acquisition a checkpoint), the inner stream's own checkpoint, a retry loop
that re-checks cancellation and renegotiation, and one TLS record (at most 16 KiB) per ``receive_some``.
Measured on the CI machine, a 1.2 KiB send and its receive cost 170-220 us of CPU through it against
65-72 us here (both sides, loopback, the same schedule); the driver does one of each per batch of frames,
so at light load, where a batch is one message, that overhead was most of a message's cost.

:class:`TlsStream` runs the same ``ssl.SSLObject`` over memory BIOs, but straight over the socket's
descriptor, the way trio's own socket methods do: try the system call, and only if it would block wait for
the descriptor (a checkpoint); otherwise one ``cancel_shielded_checkpoint`` per operation, so that a
busy connection still lets the other tasks run. ``receive_some`` returns every TLS record already at hand
(up to ``max_bytes``) instead of one, and reads the socket into one reused buffer.

The contract is trio's ``Stream``'s: ``BusyResourceError`` for two concurrent senders (or receivers),
``BrokenResourceError`` (with the ``ssl`` or ``OSError`` cause) once the TLS session or the socket failed,
``ClosedResourceError`` after :meth:`aclose`; ``receive_some`` returns ``b""`` after the peer's
``close_notify``; a TCP end of file without one is a ``BrokenResourceError`` (a truncation attack looks the
same); a send cancelled half-way leaves the stream broken (part of a record may be on the wire).
:meth:`aclose` sends ``close_notify`` (best effort) and closes the socket. Bytes the TLS library produces
while reading (post-handshake messages) are sent in order with everything else: one task at a time pushes
the outgoing buffer, and a sender whose bytes another task is pushing waits until they are out.
:meth:`send_all_nowait` is ``send_all`` without its scheduling point, for a caller that has just passed one
(the driver's writer task yields once before it gathers a batch of frames, so a second yield in the send
was one more task step per write, which at light load is per message).

:func:`tls_over` picks it for a ``trio.SocketStream`` and falls back to ``trio.SSLStream`` for any other
stream (memory streams in tests).
"""

from __future__ import annotations

import os
import ssl
from typing import Any, Final

import trio

__all__ = ["TlsStream", "tls_over"]

#: Ciphertext read from the socket at once (below the allocator's mmap threshold; reused).
_RAW_READ_BYTES: Final = 64 * 1024
#: ``receive_some()`` without a size.
_DEFAULT_RECEIVE_BYTES: Final = 256 * 1024


def tls_over(
    stream: trio.abc.Stream, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None
) -> TlsStream | trio.SSLStream[trio.abc.Stream]:
    """A TLS stream over ``stream`` (handshake not done yet): :class:`TlsStream` over a TCP socket stream,
    ``trio.SSLStream`` over anything else."""
    if type(stream) is trio.SocketStream:
        return TlsStream(stream, context, server_side=server_side, server_hostname=server_hostname)
    return trio.SSLStream(stream, context, server_side=server_side, server_hostname=server_hostname)


class TlsStream(trio.abc.Stream):
    """TLS over a connected ``trio.SocketStream`` (see the module docstring). Unknown attributes are the
    ``ssl.SSLObject``'s (``getpeercert``, ``version``, ``cipher``, ...), as with ``trio.SSLStream``."""

    def __init__(
        self,
        transport_stream: trio.SocketStream,
        context: ssl.SSLContext,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
    ) -> None:
        self.transport_stream = transport_stream
        self._fd = transport_stream.socket.fileno()
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.ssl_object: ssl.SSLObject = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        self._raw = bytearray(_RAW_READ_BYTES)
        #: bytes read from the socket so far (records, whole or not): a record still arriving is progress
        self.bytes_received = 0
        self._handshook = False
        self._broken: BaseException | None = None
        self._closed = False
        self._sending = False
        self._receiving = False
        self._pushing = False
        self._pushed: trio.Event | None = None

    def __getattr__(self, name: str) -> Any:
        if name == "ssl_object":  # not set yet: a failed __init__
            raise AttributeError(name)
        return getattr(self.ssl_object, name)

    # --- state --------------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        if self._broken is not None:
            raise trio.BrokenResourceError(f"the TLS stream is broken: {self._broken!r}") from self._broken

    def _break(self, cause: BaseException) -> trio.BrokenResourceError:
        if self._broken is None:
            self._broken = cause
        error = trio.BrokenResourceError(f"TLS stream failed: {cause!r}")
        error.__cause__ = cause
        return error

    def pending_output(self) -> bytes:
        """Take what the TLS library has queued for the peer and not sent yet (say, the alert it wrote when a
        handshake failed): the caller sends it (best effort) before closing."""
        return self._outgoing.read()

    # --- the socket ---------------------------------------------------------------------------------

    async def _push(self) -> bool:
        """Send the outgoing buffer, in order; returns whether it waited (a checkpoint happened).

        One task pushes at a time; another one that needs its bytes out waits until that push is done (the
        pushing task sends whatever the buffer holds when it gets there, its bytes included).
        """
        waited = False
        while self._pushing:
            if self._pushed is None:
                self._pushed = trio.Event()
            await self._pushed.wait()
            waited = True
        outgoing = self._outgoing
        if not outgoing.pending:
            return waited
        self._pushing = True
        fd = self._fd
        try:
            while outgoing.pending:
                view = memoryview(outgoing.read())
                while view:
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:
                        try:
                            await trio.lowlevel.wait_writable(fd)
                        except BaseException as exc:
                            # part of a record may be out: nothing more can follow it
                            self._break(exc)
                            raise
                        waited = True
                    except OSError as exc:
                        raise self._break(exc) from exc
        finally:
            self._pushing = False
            if self._pushed is not None:
                self._pushed.set()
                self._pushed = None
        return waited

    async def _pull(self) -> bool:
        """Read what the socket has into the incoming buffer (waiting for it if it has nothing); at the end of
        file, mark the incoming buffer's end. Returns whether it waited."""
        raw = self._raw
        fd = self._fd
        waited = False
        while True:
            try:
                n = os.readv(fd, (raw,))
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                waited = True
                continue
            except OSError as exc:
                raise self._break(exc) from exc
            if n:
                self.bytes_received += n
                self._incoming.write(memoryview(raw)[:n])
            else:
                self._incoming.write_eof()
            return waited

    # --- handshake ----------------------------------------------------------------------------------

    async def do_handshake(self) -> None:
        """Run the TLS handshake (once; later calls return at once). On failure the stream is broken and the
        alert the TLS library wrote for the peer is in :meth:`pending_output`."""
        self._check_usable()
        if self._handshook:
            await trio.lowlevel.checkpoint()
            return
        if self._receiving or self._sending:
            raise trio.BusyResourceError("another task is using this TLS stream")
        self._receiving = self._sending = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            waited = False
            while True:
                try:
                    self.ssl_object.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    waited = await self._push() or waited
                    waited = await self._pull() or waited
                except ssl.SSLError as exc:
                    raise self._break(exc) from exc
            self._handshook = True
            waited = await self._push() or waited
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._receiving = self._sending = False

    # --- trio.abc.Stream ----------------------------------------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this TLS stream")
        self._check_usable()
        if not self._handshook:
            await self.do_handshake()
        self._sending = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            if data:
                try:
                    self.ssl_object.write(data)
                except ssl.SSLError as exc:
                    raise self._break(exc) from exc
            if not await self._push():
                await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._sending = False

    def send_all_nowait(self, data: bytes | bytearray | memoryview) -> bool:
        """Send ``data`` without a scheduling point, for a caller that has just passed one (the AMQP driver's
        writer task). ``True``: every byte is on the socket. ``False``: ``data`` is taken, but the socket
        would not take all of it now (or another task's push is under way, which sends it after its own):
        ``await send_all(b"")`` finishes the send.

        Raises:
            trio.WouldBlock: the handshake is not done (nothing was taken: ``send_all(data)`` does it).
            trio.BusyResourceError, trio.ClosedResourceError, trio.BrokenResourceError: as :meth:`send_all`.
        """
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this TLS stream")
        self._check_usable()
        if not self._handshook:
            raise trio.WouldBlock
        if data:
            try:
                self.ssl_object.write(data)
            except ssl.SSLError as exc:
                raise self._break(exc) from exc
        if self._pushing:
            return False
        outgoing = self._outgoing
        while outgoing.pending:
            chunk = outgoing.read()
            try:
                sent = os.write(self._fd, chunk)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise self._break(exc) from exc
            if sent < len(chunk):
                outgoing.write(chunk[sent:])  # the buffer was emptied: the rest stays first in line
                return False
        return True

    async def wait_send_all_might_not_block(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this TLS stream")
        self._check_usable()
        await trio.lowlevel.wait_writable(self._fd)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Decrypted bytes: every record at hand up to ``max_bytes`` (at least one byte), or ``b""`` once the
        peer sent ``close_notify``."""
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this TLS stream")
        self._check_usable()
        if not self._handshook:
            await self.do_handshake()
        limit = _DEFAULT_RECEIVE_BYTES if max_bytes is None else max_bytes
        if limit < 1:
            raise ValueError("max_bytes must be >= 1")
        self._receiving = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            read = self.ssl_object.read
            waited = False
            chunks: list[bytes] = []
            size = 0
            while True:
                try:
                    chunk = read(limit - size)
                    if not chunk:  # a clean close: OpenSSL read the peer's close_notify
                        raise ssl.SSLZeroReturnError
                except ssl.SSLWantReadError:
                    if chunks:
                        break
                    if self._outgoing.pending:  # what reading produced for the peer (post-handshake)
                        waited = await self._push() or waited
                    waited = await self._pull() or waited
                    continue
                except ssl.SSLZeroReturnError:  # the peer's close_notify
                    if chunks:
                        break
                    if not waited:
                        await trio.lowlevel.cancel_shielded_checkpoint()
                    return b""
                except ssl.SSLError as exc:
                    if chunks:  # hand over what came before the failure; the next call raises
                        self._break(exc)
                        break
                    raise self._break(exc) from exc
                chunks.append(chunk)
                size += len(chunk)
                if size >= limit:
                    break
            if self._outgoing.pending:
                waited = await self._push() or waited
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            self._receiving = False

    async def aclose(self) -> None:
        """Send ``close_notify`` (if the session is intact; best effort) and close the socket."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            if self._handshook and self._broken is None and not self._pushing:
                try:
                    self.ssl_object.unwrap()
                except ssl.SSLError:
                    pass  # SSLWantReadError: the peer's close_notify is not in (and is not waited for)
                try:
                    await self._push()
                except (trio.BrokenResourceError, OSError):
                    pass
        finally:
            await self.transport_stream.aclose()
