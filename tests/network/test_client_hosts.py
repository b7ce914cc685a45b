"""The map client against a real HTTP listener on ``[::1]``: what goes on the wire for an IPv6 map URL."""

from __future__ import annotations

import h11
import trio

from corda_trio import network
from tests.ipv6 import needs_ipv6


@needs_ipv6
async def test_an_ipv6_map_url_sends_its_host_header_in_brackets() -> None:
    """``Host: ::1:PORT`` was sent (the host and port joined without the brackets): a server or proxy that
    checks the header (RFC 9110 section 7.2 takes the URL's authority, brackets and all) answers 400."""
    listeners = await trio.open_tcp_listeners(0, host="::1")
    port = listeners[0].socket.getsockname()[1]
    requests: list[h11.Request] = []

    async def answer(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Request):
                requests.append(event)
            elif isinstance(event, h11.EndOfMessage):
                break
        reply = h11.Response(status_code=200, headers=[(b"content-length", b"5"), (b"connection", b"close")])
        await stream.send_all(
            conn.send(reply) + conn.send(h11.Data(data=b"added")) + conn.send(h11.EndOfMessage())
        )
        await stream.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, answer, listeners)
            client = network.NetworkMapClient(f"http://[::1]:{port}/prefix")
            assert await client.publish(b"signed") == "added"
            nursery.cancel_scope.cancel()
    (request,) = requests
    assert request.target == b"/prefix/network-map/publish"
    assert dict(request.headers)[b"host"] == f"[::1]:{port}".encode()
