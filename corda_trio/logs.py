"""Warnings a remote party can trigger at will, bounded per party.

A member of the network (or anyone who can reach a port) can make a node refuse thousands of messages a
second: a session message for an unknown session, a message without a required header, a topic nobody
handles. One warning line each would let it fill the node's log (and its stderr) and push the operator's
useful lines out of the rotated files. :class:`PeerWarnings` keeps such warnings to at most one line per
party per window:

* the first event of a party (or the first after a quiet window) is logged in full, as a warning;
* further events of that party within ``window_seconds`` of that line are logged at debug only and
  counted; the next event of the party once the window is over writes one summary warning
  (``N more session messages from X refused in the last 61 s, latest: <reason>``, counting that event too)
  and opens the next window. A party that goes quiet after a burst gets its summary with its next event;
* at most ``max_parties`` parties are remembered (least recently reported first out; a party dropped with
  events unreported gets its summary then), so the memory is bounded whoever sends;
* a server that wants the count of a burst written even when the party goes quiet afterwards (failed
  logins, refused connections) runs :meth:`PeerWarnings.report_due` in its nursery: each window that is over
  with events unreported gets its summary then, so the operator sees every party's count within about two
  windows;
* ``distinct_details`` (default 0) makes the summary also quote up to that many distinct details seen in the
  window (the user names a source tried, say), each cut to :data:`MAX_DETAIL_CHARS`, so a line stays bounded;
  a window whose events all had the same detail quotes none, its ``latest`` says it.

Only the log lines are bounded: callers count every event in their statistics and metrics themselves. The
clock is Trio's (``trio.current_time``), so tests run on ``autojump_clock``.

:class:`Outage` is the other bounded pattern: a connection of ours retried with backoff while the other end
is away (a bridge's node or peer, a float, the network map). An attempt per backoff for as long as the
outage lasts would be one line each for ever; an :class:`Outage` logs the first failure with its reason,
then at most one line per :data:`PEER_WARNING_SECONDS` saying it is still retrying (the count of failed
attempts and the latest reason; every failure is at debug), and one info line when an attempt succeeds again
(``... reconnected after 7 failed attempts / 95 s``).

:func:`failure_text` is how a log line names a failure, an exception group included: by its cause, not by
``Exceptions from Trio nursery (1 sub-exception)``. :func:`remote_name` names the other end of a socket as
every address is written (``[::1]:42401``, :func:`corda_trio.hostport.host_port_text`).
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Any, Final

import attrs
import trio

from corda_trio.hostport import host_port_text

__all__ = [
    "FILE_ONLY",
    "PEER_WARNING_SECONDS",
    "Outage",
    "PeerWarnings",
    "error_message",
    "failure_text",
    "remote_host",
    "remote_name",
]

#: A log record's ``extra`` key: the record goes to the log file only, not to the console (stderr), because
#: the failure it records reaches the operator there another way: the command's own last line. The store
#: logs the write that stopped a queue so (``extra={FILE_ONLY: True}``); the node stops on that failure
#: and ``corda-trio node start`` ends with one line saying it, not two.
FILE_ONLY: Final[str] = "corda_trio_file_only"

#: A party gets at most one warning line per this many seconds for each kind of event it can trigger.
PEER_WARNING_SECONDS: Final = 60.0
#: Parties remembered per kind of event: far more than the peers a node talks to (the float's and the
#: bridge's own caches of senders are 4,096 too).
MAX_WARNED_PARTIES: Final = 4096
#: A detail quoted among a summary's ``distinct_details`` is cut to this many characters.
MAX_DETAIL_CHARS: Final = 80


@attrs.define(eq=False)
class _Window:
    started: float
    unreported: int = 0
    latest: str = ""
    #: distinct details of the unreported events (at most ``distinct_details``), in order of appearance
    details: dict[str, None] = attrs.field(factory=dict)
    #: whether a further distinct detail was left out
    more_details: bool = False


@attrs.define(eq=False)
class PeerWarnings:
    """One kind of event a party can trigger, logged to ``logger`` at most once per party per window.

    ``what`` names the events in the summary line, with ``%s`` for the party: ``"session messages from %s
    refused"`` reads ``"12 more session messages from O=Mallory, L=Rome, C=IT refused in the last 60 s,
    latest: unknown session 7"``.
    """

    logger: logging.Logger
    what: str
    window_seconds: float = PEER_WARNING_SECONDS
    #: The level of the full line and of the summary (``logging.INFO`` for events that are not failures of
    #: ours, such as a peer's connection that ended with an error).
    level: int = logging.WARNING
    max_parties: int = MAX_WARNED_PARTIES
    distinct_details: int = 0
    #: per party, oldest window first
    _windows: collections.OrderedDict[str, _Window] = attrs.field(factory=collections.OrderedDict, init=False)

    def warning(self, party: str, detail: str, msg: str, *args: Any) -> None:
        """One event of ``party``: ``msg % args`` is its full line, ``detail`` what the summary quotes."""
        now = trio.current_time()
        window = self._windows.get(party)
        if window is not None and now - window.started >= self.window_seconds:
            if not window.unreported:  # a quiet window: this event starts afresh
                del self._windows[party]
                window = None
            else:
                self._note(window, detail)
                self._summarise(party, window, now)
                self._restart(party, window, now)
                return
        if window is None:
            while len(self._windows) >= self.max_parties:
                old_party, old = self._windows.popitem(last=False)
                if old.unreported:
                    self._summarise(old_party, old, now)
            self._windows[party] = _Window(now)
            self.logger.log(self.level, msg, *args)
            return
        self._note(window, detail)
        self.logger.debug(msg, *args)

    def summarise_due(self) -> None:
        """Write the summary of every window that is over with events unreported; forget the quiet ones."""
        now = trio.current_time()
        while self._windows:
            party, window = next(iter(self._windows.items()))  # the oldest window first
            if now - window.started < self.window_seconds:
                return
            if window.unreported:
                self._summarise(party, window, now)
                self._restart(party, window, now)
            else:
                del self._windows[party]

    async def report_due(self) -> None:
        """Run :meth:`summarise_due` whenever the oldest window is over, until cancelled."""
        while True:
            if self._windows:
                oldest = next(iter(self._windows.values()))
                await trio.sleep_until(oldest.started + self.window_seconds)
            else:
                await trio.sleep(self.window_seconds)
            self.summarise_due()

    def _note(self, window: _Window, detail: str) -> None:
        window.unreported += 1
        window.latest = detail
        if self.distinct_details:
            key = detail[:MAX_DETAIL_CHARS]
            if key in window.details:
                pass
            elif len(window.details) < self.distinct_details:
                window.details[key] = None
            else:
                window.more_details = True

    def _restart(self, party: str, window: _Window, now: float) -> None:
        window.started, window.unreported = now, 0
        window.details.clear()
        window.more_details = False
        self._windows.move_to_end(party)

    def _summarise(self, party: str, window: _Window, now: float) -> None:
        among = ""
        if len(window.details) > 1 or window.more_details:  # (one detail is the latest: not twice)
            more = ", ..." if window.more_details else ""
            among = f" (among them: {', '.join(window.details)}{more})"
        self.logger.log(
            self.level,
            "%d more " + self.what + " in the last %.0f s, latest: %s%s",
            window.unreported, party, now - window.started, window.latest, among,
        )  # fmt: skip

    def parties(self) -> int:
        """Parties remembered now (at most ``max_parties``)."""
        return len(self._windows)


@attrs.define(eq=False)
class Outage:
    """The log lines of one connection retried with backoff: bounded however long the other end is away.

    ``name`` starts every line (``"bridge b1: the node at 127.0.0.1:10005"``); ``level`` is that of the first
    failure and the still-retrying lines (the reconnection is at info). The clock is Trio's.
    """

    logger: logging.Logger
    name: str
    level: int = logging.WARNING
    interval_seconds: float = PEER_WARNING_SECONDS
    #: Failed attempts since the last success (0: connected, or never tried).
    failures: int = 0
    _started: float = 0.0
    _last_line: float = 0.0

    def failed(self, reason: str, msg: str, *args: Any) -> None:
        """One attempt failed for ``reason`` (``logs.failure_text``); ``msg % args`` is the full line of the
        first failure of an outage."""
        now = trio.current_time()
        self.failures += 1
        if self.failures == 1:
            self._started = self._last_line = now
            self.logger.log(self.level, msg, *args)
        elif now - self._last_line >= self.interval_seconds:
            self._last_line = now
            self.logger.log(
                self.level, "%s: still retrying, %d failed attempts in %.0f s, latest: %s",
                self.name, self.failures, now - self._started, reason,
            )  # fmt: skip
        else:
            self.logger.debug(msg, *args)

    def connected(self) -> None:
        """An attempt succeeded: say so if it ends an outage, and start afresh."""
        if self.failures:
            plural = "s" if self.failures > 1 else ""
            elapsed = trio.current_time() - self._started
            self.logger.info(
                "%s: reconnected after %d failed attempt%s / %.0f s",
                self.name,
                self.failures,
                plural,
                elapsed,
            )
        self.failures = 0


def remote_name(stream: trio.abc.Stream) -> str:
    """``host:port`` of the other end of a socket ``stream``, an IPv6 host in brackets (``[::1]:42401``, as
    :func:`~corda_trio.hostport.host_port_text` writes it); ``<unknown peer>`` when it has none."""
    try:
        host, port = stream.socket.getpeername()[:2]  # type: ignore[attr-defined]
        return host_port_text(host, port)
    except (AttributeError, OSError, TypeError, ValueError):
        return "<unknown peer>"


def remote_host(name: str) -> str:
    """The host of a :func:`remote_name` (IPv6 too): the party a server's bounded warnings count by, as a
    client has 60,000 ports to come from."""
    return name.rpartition(":")[0] or name


def failure_text(exc: BaseException) -> str:
    """``exc`` as a log line names a failure: ``Type: message`` (the type alone if it has no message).

    An exception group, as Trio's nurseries raise them (nested, one level per nursery), is named by its
    first leaf that is not ``trio.Cancelled`` (the cause; the cancelled tasks only followed it), with the
    number of the others: ``AmqpTransportError: transport failed: ... (and 1 more error)``. The group's own
    ``str()`` says only ``Exceptions from Trio nursery (2 sub-exceptions)``, which is what the bridges
    logged when a node died under them.
    """
    leaves: list[BaseException] = []
    todo = [exc]
    while todo:  # depth first, in order
        current = todo.pop()
        if isinstance(current, BaseExceptionGroup):
            todo.extend(reversed(current.exceptions))
        else:
            leaves.append(current)
    if not leaves:  # (a group always holds one; for the type checker)
        leaves = [exc]
    cause = next((leaf for leaf in leaves if not isinstance(leaf, trio.Cancelled)), leaves[0])
    message = error_message(cause)
    text = f"{type(cause).__name__}: {message}" if message else type(cause).__name__
    others = len(leaves) - 1
    if others:
        text += f" (and {others} more error{'s' if others > 1 else ''})"
    return text


def error_message(exc: BaseException) -> str:
    """``str(exc)`` on one line, with the reasons of a connection that could not be made.

    ``trio.open_tcp_stream`` fails with ``OSError("all attempts to connect to HOST:PORT failed")`` and keeps
    each attempt's error (one per address the name resolved to) in an exception group as its
    ``__cause__``: the reasons are added, each once (``... failed (Connection refused)``), so a log line
    says why, not only that (trio writes an IPv6 address there in brackets, as we do).
    """
    message = " ".join(str(exc).split())
    cause = exc.__cause__
    if isinstance(exc, OSError) and isinstance(cause, BaseExceptionGroup):
        reasons: dict[str, None] = {}
        for attempt in cause.exceptions:
            if isinstance(attempt, OSError) and attempt.errno:
                reasons[os.strerror(attempt.errno)] = None
            else:
                reasons[" ".join(str(attempt).split()) or type(attempt).__name__] = None
        if reasons:
            message += f" ({'; '.join(reasons)})"
    return message
