"""``logs.PeerWarnings``: what a party can trigger at will is a warning per party at most once a minute."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from corda_trio import logs

log = logging.getLogger("tests.logs")
MALLORY, EVE = "O=Mallory, L=Rome, C=IT", "O=Eve, L=Oslo, C=NO"


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == log.name and r.levelno == logging.WARNING]
    caplog.clear()
    return lines


def refuse(w: logs.PeerWarnings, party: str, reason: str) -> None:
    w.warning(party, reason, "session message from %s refused: %s", party, reason)


async def test_a_minute_of_refusals_is_one_full_line_and_one_summary(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=log.name)
    w = logs.PeerWarnings(log, "session messages from %s refused")
    for i in range(2000):
        refuse(w, MALLORY, f"unknown session {i}")
        await trio.sleep(0.01)  # 20 s of refusals
    assert warnings(caplog) == [f"session message from {MALLORY} refused: unknown session 0"]
    await trio.sleep(40)
    refuse(w, MALLORY, "unknown session 2000")
    assert warnings(caplog) == [
        f"2000 more session messages from {MALLORY} refused in the last 60 s, latest: unknown session 2000"
    ]
    # the flood goes on: one summary a minute, counting everything since the last one
    for _ in range(600):
        refuse(w, MALLORY, "out of sequence")
        await trio.sleep(0.1)
    assert warnings(caplog) == []
    await trio.sleep(1)
    refuse(w, MALLORY, "malformed")
    assert warnings(caplog) == [
        f"601 more session messages from {MALLORY} refused in the last 61 s, latest: malformed",
    ]


async def test_each_party_has_its_own_window_and_a_quiet_one_starts_afresh(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    w = logs.PeerWarnings(log, "session messages from %s refused")
    refuse(w, MALLORY, "a")
    refuse(w, MALLORY, "b")
    refuse(w, EVE, "c")
    assert warnings(caplog) == [
        f"session message from {MALLORY} refused: a",
        f"session message from {EVE} refused: c",
    ]
    await trio.sleep(61)
    refuse(w, EVE, "d")  # Eve's window passed with nothing unreported: a full line again
    refuse(w, MALLORY, "e")
    assert warnings(caplog) == [
        f"session message from {EVE} refused: d",
        f"2 more session messages from {MALLORY} refused in the last 61 s, latest: e",
    ]


async def test_the_parties_remembered_are_bounded(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A party pushed out with events unreported gets its summary then; memory stays at ``max_parties``."""
    w = logs.PeerWarnings(log, "session messages from %s refused", max_parties=3)
    refuse(w, "P0", "x")
    refuse(w, "P0", "y")
    for i in range(1, 10):
        refuse(w, f"P{i}", "z")
        assert w.parties() <= 3
    lines = warnings(caplog)
    assert lines[0] == "session message from P0 refused: x"
    assert lines[1:3] == ["session message from P1 refused: z", "session message from P2 refused: z"]
    assert lines[3] == "1 more session messages from P0 refused in the last 0 s, latest: y"
    assert len(lines) == 1 + 9 + 1


async def test_a_burst_that_goes_quiet_is_summed_up_by_report_due_with_the_details_tried(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, nursery: trio.Nursery
) -> None:
    """Without ``report_due`` the count of a burst that stopped waited for the party's next event (possibly
    never): 2,000 wrong passwords in ten seconds left one line and no count. With it, the summary comes once
    the window is over, quoting at most ``distinct_details`` of the details seen."""
    w = logs.PeerWarnings(log, "failed logins from %s", distinct_details=3)
    nursery.start_soon(w.report_due)
    for i in range(2000):
        w.warning(
            "10.0.0.7", f"user 'u{i % 5}'", "login from %s failed for user %s", "10.0.0.7:4242", f"'u{i}'"
        )
        await trio.sleep(0.005)
    assert warnings(caplog) == ["login from 10.0.0.7:4242 failed for user 'u0'"]
    await trio.sleep(60)
    assert warnings(caplog) == [
        "1999 more failed logins from 10.0.0.7 in the last 60 s, latest: user 'u4' "
        "(among them: user 'u1', user 'u2', user 'u3', ...)"
    ]
    await trio.sleep(300)  # nothing more to report: no more lines, and the party is forgotten
    assert warnings(caplog) == [] and w.parties() == 0


def _nursery_group(*errors: BaseException) -> BaseExceptionGroup[BaseException]:
    return BaseExceptionGroup(f"Exceptions from Trio nursery ({len(errors)} sub-exceptions)", list(errors))


@pytest.mark.parametrize(
    ("raised", "text"),
    [
        (ValueError("bad  value\nhere"), "ValueError: bad value here"),
        (EOFError(), "EOFError"),
        # the bridges logged these as "Exceptions from Trio nursery (1 sub-exception)" / "(2 sub-exceptions)"
        (_nursery_group(_nursery_group(ConnectionResetError("reset by peer"))),
         "ConnectionResetError: reset by peer"),
        (_nursery_group(OSError("first"), _nursery_group(KeyError("k"), RuntimeError("x"))),
         "OSError: first (and 2 more errors)"),
        (_nursery_group(trio.Cancelled._create(), _nursery_group(BrokenPipeError("gone"))),  # type: ignore[attr-defined]
         "BrokenPipeError: gone (and 1 more error)"),
        (_nursery_group(ValueError("v"), trio.Cancelled._create()), "ValueError: v (and 1 more error)"),  # type: ignore[attr-defined]
    ],
)  # fmt: skip
def test_failure_text_names_the_cause_of_a_group(raised: BaseException, text: str) -> None:
    assert logs.failure_text(raised) == text


async def test_a_summary_quotes_no_distinct_details_when_every_event_had_the_same_one(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, nursery: trio.Nursery
) -> None:
    """Ten failed logins for one user read ``latest: user 'ops'`` once, not again as ``(among them: user
    'ops')``; two users tried are both quoted."""
    w = logs.PeerWarnings(log, "failed logins from %s", distinct_details=8)
    nursery.start_soon(w.report_due)
    for user in ["'ops'"] * 10:
        w.warning("10.0.0.7", f"user {user}", "login from %s failed for user %s", "10.0.0.7:4242", user)
    assert warnings(caplog) == ["login from 10.0.0.7:4242 failed for user 'ops'"]
    await trio.sleep(61)
    assert warnings(caplog) == ["9 more failed logins from 10.0.0.7 in the last 60 s, latest: user 'ops'"]
    for user in ["'ops'", "'admin'"]:
        w.warning("10.0.0.7", f"user {user}", "login from %s failed for user %s", "10.0.0.7:4242", user)
    await trio.sleep(61)
    assert warnings(caplog) == [
        "2 more failed logins from 10.0.0.7 in the last 60 s, latest: user 'admin' "
        "(among them: user 'ops', user 'admin')"
    ]
