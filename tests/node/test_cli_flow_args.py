"""``corda-trio flow start NAME=VALUE ...``: how values are read, and each mistake as a one-line error."""

from __future__ import annotations

import pytest

from corda_trio.node._cli import CliError
from corda_trio.node._cli_flow import _flow_line, _print_result, parse_flow_args


def test_values_are_json_where_they_parse_else_text() -> None:
    assert parse_flow_args(["rounds=3", "recipient=O=Bob, L=Paris, C=FR", 'tags=["a", 1]', "ratio=0.5"]) == {
        "rounds": 3,
        "recipient": "O=Bob, L=Paris, C=FR",
        "tags": ["a", 1],
        "ratio": 0.5,
    }
    assert parse_flow_args(["empty=", "word=true", "text=[unclosed"]) == {
        "empty": "",
        "word": True,
        "text": "[unclosed",
    }


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["rounds"], "flow argument 'rounds': expected NAME=VALUE"),
        (["=3"], "flow argument '=3': expected NAME=VALUE"),
        (["not-a-name=3"], "flow argument 'not-a-name=3': expected NAME=VALUE"),
        (["rounds=1", "rounds=2"], "flow argument 'rounds' is given twice"),
        (["deep=" + "[" * 100_000 + "]" * 100_000], "flow argument 'deep': its value is nested too deeply"),
    ],
)
def test_mistakes_are_one_line_errors_with_exit_code_2(items: list[str], message: str) -> None:
    with pytest.raises(CliError) as info:
        parse_flow_args(items)
    assert str(info.value) == message and info.value.exit_code == 2


def test_text_from_the_node_reaches_the_terminal_as_one_line_without_escape_sequences(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A client id is any text but NUL, and a flow's id is made of it (C-<client id>); a flow's error may be a
    peer's text. `flow list` printed them as they came: a user allowed to start a flow could colour or
    move the cursor of an operator's terminal, or forge a line of the listing with a line break."""
    flow = {
        "flow_id": "C-x\x1b[31mRED\x1b[0m\ny  finished  PingPong",
        "state": "failed",
        "flow": "PingPong",
        "started_at": "2026-12-01T00:00:00+00:00",
        "error": "peer says \u202egnp.exe\x07",
    }
    line = _flow_line(flow)
    assert "\x1b" not in line and "\n" not in line and "\u202e" not in line and "\x07" not in line, line
    assert line.startswith("C-x\\x1b[31mRED\\x1b[0m\\ny  finished  PingPong  failed"), line
    assert "peer says \\u202egnp.exe\\x07" in line
    _print_result("C-a\x1b]0;owned\x07", as_json=False)
    assert capsys.readouterr().out == "C-a\\x1b]0;owned\\x07\n"
