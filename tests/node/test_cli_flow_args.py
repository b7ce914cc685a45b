"""``corda-trio flow start NAME=VALUE ...``: how values are read, and each mistake as a one-line error."""

from __future__ import annotations

import pytest

from corda_trio.node._cli import CliError
from corda_trio.node._cli_flow import parse_flow_args


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
