"""The /metrics endpoint's own limits (connections at once, 503 beyond; time to send a request) and its
answers (status lines, gzip when the scraper asks for it)."""

from __future__ import annotations

import contextlib
import gzip
import urllib.request
from collections.abc import AsyncIterator, Callable

import pytest
import trio
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from corda_trio.node import _metrics


@contextlib.asynccontextmanager
async def serving(
    monkeypatch: pytest.MonkeyPatch, exposition: Callable[[], bytes] = lambda: b"up 1\n", **limits: float
) -> AsyncIterator[int]:
    """A metrics server of ``exposition`` (``up 1``) with these module limits; yields its port."""
    for name, value in limits.items():
        monkeypatch.setattr(_metrics, name, value)
    async with trio.open_nursery() as nursery:
        yield await nursery.start(_metrics.serve_metrics, exposition, "127.0.0.1", 0)
        nursery.cancel_scope.cancel()


async def _get(port: int, request: bytes = b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n") -> bytes:
    """What the server answers to ``request``, up to its end of file (it closes every connection)."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(request)
        answer = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some():
                answer += chunk
    return answer


async def test_over_the_connection_limit_a_scrape_gets_503_and_the_next_is_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serving(monkeypatch, MAX_CONNECTIONS=2) as port:
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]  # say nothing
        await trio.sleep(0.2)  # (both accepted)
        refused = await _get(port)
        assert refused.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), refused
        for stream in idle:
            await stream.aclose()
        with trio.fail_after(10):
            while True:  # (until the server has seen the idle ones go)
                answer = await _get(port)
                if answer.startswith(b"HTTP/1.1 200"):
                    break
                await trio.sleep(0.05)
        assert answer.endswith(b"up 1\n")


async def test_a_client_that_sends_no_request_is_closed_at_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serving(monkeypatch, REQUEST_TIMEOUT_SECONDS=0.3) as port:
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            with trio.fail_after(10):
                assert await stream.receive_some() == b""


def _head(size: int) -> bytes:
    """A ``GET /metrics`` head of exactly ``size`` bytes, request line to blank line."""
    start = b"GET /metrics HTTP/1.1\r\nhost: x\r\nx: "
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "status", "body"),
    [
        (b"GARBAGE\r\n\r\n", b"400", b"not an HTTP request; see /metrics\n"),
        (
            b"GET /metrics HTTP/1.1\r\nhost: x\r\nx: " + b"a" * 100_000 + b"\r\n\r\n",
            b"431",
            b"request headers too large; see /metrics\n",
        ),
        (
            b"GET /metrics?" + b"q" * 100_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n",
            b"431",
            b"request headers too large; see /metrics\n",
        ),
        (_head(16 * 1024 + 1), b"431", b"request headers too large; see /metrics\n"),
    ],
    ids=["not-http", "huge-header", "huge-target", "limit+1"],
)
async def test_a_malformed_request_gets_its_status_not_a_dropped_connection(
    monkeypatch: pytest.MonkeyPatch, request_bytes: bytes, status: bytes, body: bytes
) -> None:
    """It was closed without a word (a scraper then reports a connection reset, not what was wrong)."""
    async with serving(monkeypatch) as port:
        answer = await _get(port, request_bytes)
        assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer[:100]
        assert answer.endswith(b"\r\n\r\n" + body)
        assert (await _get(port)).endswith(b"up 1\n")  # and the next scrape is served


async def test_a_head_of_exactly_16_kib_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit is on the head, however it arrives: one of 16 KiB + 1 in one write is 431 (above), one of
    16 KiB is served."""
    async with serving(monkeypatch) as port:
        assert (await _get(port, _head(16 * 1024))).endswith(b"up 1\n")


@pytest.mark.parametrize(
    ("request_bytes", "status_line", "extra"),
    [
        (b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n", b"HTTP/1.1 200 OK\r\n", b""),
        (b"GET /nope HTTP/1.1\r\nhost: x\r\n\r\n", b"HTTP/1.1 404 Not Found\r\n", b""),
        (b"POST /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
         b"HTTP/1.1 405 Method Not Allowed\r\n", b"allow: GET, HEAD\r\n"),
        (b"GARBAGE\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\n", b""),
        (_head(16 * 1024 + 1), b"HTTP/1.1 431 Request Header Fields Too Large\r\n", b""),
    ],
    ids=["200", "404", "405", "400", "431"],
)  # fmt: skip
async def test_every_answer_has_its_standard_reason_phrase(
    monkeypatch: pytest.MonkeyPatch, request_bytes: bytes, status_line: bytes, extra: bytes
) -> None:
    """It was ``HTTP/1.1 404 `` (an empty reason): curl -i and proxies' logs showed a bare number."""
    async with serving(monkeypatch) as port:
        answer = await _get(port, request_bytes)
        assert answer.startswith(status_line), answer[:100]
        assert extra in answer.split(b"\r\n\r\n", 1)[0] + b"\r\n"


def _peers_exposition(peers: int = 20) -> bytes:
    """An exposition the size of a node's with ``peers`` peers: per-peer counters and a histogram."""
    registry = CollectorRegistry()
    sent = Counter("corda_trio_p2p_messages_sent", "sent", ["peer"], registry=registry)
    duration = Histogram("corda_trio_flow_duration_seconds", "duration", ["flow"], registry=registry)
    for i in range(peers):
        sent.labels(f"O=Peer {i}, L=London, C=GB").inc(i)
        duration.labels(f"Flow{i}").observe(i / 100)
    return generate_latest(registry)


def _fetch(port: int, method: str = "GET", **headers: str) -> tuple[dict[str, str], bytes]:
    """urllib's answer (lower-cased headers, raw body: urllib decodes no content-encoding)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return {k.lower(): v for k, v in answer.headers.items()}, answer.read()


def _samples(text: bytes) -> list[object]:
    return [s for family in text_string_to_metric_families(text.decode()) for s in family.samples]


async def test_a_scraper_that_accepts_gzip_gets_gzip_and_others_plain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prometheus sends ``Accept-Encoding: gzip``; the node answered uncompressed (13 KB a scrape for a few
    peers, 22 lines more per peer)."""
    text = _peers_exposition()
    async with serving(monkeypatch, lambda: text) as port:
        headers, body = await trio.to_thread.run_sync(
            lambda: _fetch(port, **{"Accept-Encoding": "gzip", "User-Agent": "Prometheus/2.45.0"})
        )
        assert headers["content-encoding"] == "gzip" and headers["vary"] == "accept-encoding", headers
        assert int(headers["content-length"]) == len(body) < len(text) / 4
        assert _samples(gzip.decompress(body)) == _samples(text)
        for asked in ({}, {"Accept-Encoding": "gzip;q=0"}, {"Accept-Encoding": "identity, br"}):
            headers, body = await trio.to_thread.run_sync(lambda: _fetch(port, **asked))  # noqa: B023
            assert "content-encoding" not in headers, (asked, headers)
            assert headers["vary"] == "accept-encoding"
            assert body == text
        star = {"Accept-Encoding": "br;q=1, *;q=0.5"}  # (any coding: gzip is one)
        headers, _ = await trio.to_thread.run_sync(lambda: _fetch(port, **star))
        assert headers["content-encoding"] == "gzip"
        # HEAD: the headers of the GET it stands for, the length of the gzip body, and no body
        get_headers, get_body = await trio.to_thread.run_sync(
            lambda: _fetch(port, **{"Accept-Encoding": "gzip"})
        )
        headers, body = await trio.to_thread.run_sync(
            lambda: _fetch(port, "HEAD", **{"Accept-Encoding": "gzip"})
        )
        assert body == b"" and headers == get_headers and int(headers["content-length"]) == len(get_body)
        # curl --compressed decodes what it asked for
        done = await trio.run_process(
            ["curl", "-sS", "--compressed", "--max-time", "10", f"http://127.0.0.1:{port}/metrics"],
            capture_stdout=True,
            check=False,
        )
        assert done.returncode == 0 and done.stdout == text
