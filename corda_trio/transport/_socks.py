"""Dial through a SOCKS5 or SOCKS4(a) proxy: the bridge's outbound connections from a network that allows
no direct outbound TCP.

Theory of operation
-------------------
The protocol itself is ``socksio`` (sans-IO: requests in, bytes out; bytes in, replies out). socksio parses
whole replies only, so this driver reads exactly one reply's bytes from the stream before handing them over
(SOCKS5: 2-byte method / password replies, then a 4-byte header whose address type fixes the rest; SOCKS4:
8 bytes), and never reads past it: the bytes after the reply are the tunnelled connection (TLS) and belong
to the caller. The host name is passed to the proxy unresolved (SOCKS5 domain name, SOCKS4a), so the
proxy resolves it, as a bridge inside a locked-down network needs.
"""

from __future__ import annotations

import ipaddress
from typing import Final, Literal

import attrs
import trio
from socksio import ProtocolError, socks4, socks5

from corda_trio import hostport

__all__ = ["SocksError", "SocksProxy", "open_socks_stream"]

_VERSIONS: Final = ("socks5", "socks4")


class SocksError(OSError):
    """The proxy refused the connection or broke the SOCKS protocol (a dial failure, like ECONNREFUSED)."""


@attrs.frozen(kw_only=True)
class SocksProxy:
    """A SOCKS proxy to dial through. ``username`` / ``password``: SOCKS5 user/password authentication;
    for SOCKS4 the username is sent as the user id."""

    host: str
    port: int = attrs.field(validator=[attrs.validators.ge(1), attrs.validators.le(65535)])
    version: Literal["socks5", "socks4"] = attrs.field(
        default="socks5", validator=attrs.validators.in_(_VERSIONS)
    )
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)

    @property
    def name(self) -> str:
        """``SOCKS proxy HOST:PORT``, as error lines name it (an IPv6 host in brackets)."""
        return f"SOCKS proxy {hostport.host_port_text(self.host, self.port)}"


async def _exactly(stream: trio.SocketStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        if not chunk:
            raise SocksError("the SOCKS proxy closed the connection during the handshake")
        buf += chunk
    return bytes(buf)


async def open_socks_stream(proxy: SocksProxy, host: str, port: int) -> trio.SocketStream:
    """A TCP stream to ``host:port`` through ``proxy`` (the SOCKS handshake done).

    Raises:
        OSError: the proxy cannot be reached.
        SocksError: the proxy refused (with its reply code) or spoke something else than SOCKS.
    """
    stream = await trio.open_tcp_stream(proxy.host, proxy.port)
    try:
        if proxy.version == "socks5":
            await _socks5(stream, proxy, host, port)
        else:
            await _socks4(stream, proxy, host, port)
    except ProtocolError as exc:
        await trio.aclose_forcefully(stream)
        raise SocksError(f"{proxy.name}: {exc}") from exc
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream


async def _socks5(stream: trio.SocketStream, proxy: SocksProxy, host: str, port: int) -> None:
    conn = socks5.SOCKS5Connection()
    methods = [socks5.SOCKS5AuthMethod.NO_AUTH_REQUIRED]
    if proxy.username is not None:
        methods.append(socks5.SOCKS5AuthMethod.USERNAME_PASSWORD)
    conn.send(socks5.SOCKS5AuthMethodsRequest(methods))
    await stream.send_all(conn.data_to_send())
    auth = conn.receive_data(await _exactly(stream, 2))
    assert isinstance(auth, socks5.SOCKS5AuthReply)
    if auth.method == socks5.SOCKS5AuthMethod.USERNAME_PASSWORD:
        if proxy.username is None:
            raise SocksError(f"{proxy.name} wants a username and password")
        conn.send(
            socks5.SOCKS5UsernamePasswordRequest(proxy.username.encode(), (proxy.password or "").encode())
        )
        await stream.send_all(conn.data_to_send())
        answer = conn.receive_data(await _exactly(stream, 2))
        if not getattr(answer, "success", False):
            raise SocksError(f"{proxy.name} refused the username and password")
    elif auth.method != socks5.SOCKS5AuthMethod.NO_AUTH_REQUIRED:
        raise SocksError(f"{proxy.name} accepts none of our authentication methods")
    conn.send(socks5.SOCKS5CommandRequest.from_address(socks5.SOCKS5Command.CONNECT, (host, port)))
    await stream.send_all(conn.data_to_send())
    head = await _exactly(stream, 4)
    atype = head[3:4]
    if atype == socks5.SOCKS5AType.IPV4_ADDRESS:
        rest = await _exactly(stream, 4 + 2)
    elif atype == socks5.SOCKS5AType.IPV6_ADDRESS:
        rest = await _exactly(stream, 16 + 2)
    elif atype == socks5.SOCKS5AType.DOMAIN_NAME:
        size = await _exactly(stream, 1)
        rest = size + await _exactly(stream, size[0] + 2)
    else:
        raise SocksError(f"{proxy.name} sent address type {atype!r}")
    reply = conn.receive_data(head + rest)
    assert isinstance(reply, socks5.SOCKS5Reply)
    if reply.reply_code != socks5.SOCKS5ReplyCode.SUCCEEDED:
        raise SocksError(
            f"{proxy.name}: no connection to {hostport.host_port_text(host, port)}: {reply.reply_code.name}"
        )


async def _socks4(stream: trio.SocketStream, proxy: SocksProxy, host: str, port: int) -> None:
    conn = socks4.SOCKS4Connection(user_id=(proxy.username or "corda-trio").encode())
    try:
        ipaddress.IPv4Address(host)
        request: socks4.SOCKS4Request | socks4.SOCKS4ARequest = socks4.SOCKS4Request.from_address(
            socks4.SOCKS4Command.CONNECT, (host, port)
        )
    except ValueError:  # a host name: SOCKS4a lets the proxy resolve it
        request = socks4.SOCKS4ARequest.from_address(socks4.SOCKS4Command.CONNECT, (host, port))
    conn.send(request)
    await stream.send_all(conn.data_to_send())
    reply = conn.receive_data(await _exactly(stream, 8))
    if reply.reply_code != socks4.SOCKS4ReplyCode.REQUEST_GRANTED:
        raise SocksError(
            f"{proxy.name}: no connection to {hostport.host_port_text(host, port)}: {reply.reply_code.name}"
        )
