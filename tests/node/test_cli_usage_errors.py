"""Usage errors are one line on stderr, exit 2: what is wrong and where the options are listed (argparse
printed the whole usage first, five wrapped lines for ``report``). An empty string given as a file or
directory is one of them: ``Path("")`` is the current directory, so ``store check ""`` said ``: no such
directory``, ``network show --dir ""`` looked for ``nodes`` here and ``node start --config ""`` tried to
read the working directory as its config."""

from __future__ import annotations

import pytest

from corda_trio.node._cli import main

CASES = [
    (["store", "check", ""], "DIR"),
    (["store", "list", ""], "DIR"),
    (["store", "compact", ""], "DIR"),
    (["node", "start", "--config", ""], "--config"),
    (["node", "start", "--base-dir", ""], "--base-dir"),
    (["network", "bootstrap", "--dir", ""], "--dir"),
    (["network", "show", "--dir", ""], "--dir"),
    (["networkmap", "list", "--dir", ""], "--dir"),
    (["networkmap", "serve", "--config", ""], "--config"),
    (["report", "--in", "", "--out", "r.html"], "--in"),
    (["report", "--in", "x", "--out", ""], "--out"),
    (["bench", "run", "codec", "--out", ""], "--out"),
    (["bench", "run", "codec", "--out", "x", "--scratch", ""], "--scratch"),
    (["float", "start", "--config", ""], "--config"),
    (["float", "tunnel-pki", "--out", ""], "--out"),
    (["bridge", "start", "--config", ""], "--config"),
    (["demo", "--dir", ""], "--dir"),
    (["demo", "--records", ""], "--records"),
]


@pytest.mark.parametrize(("argv", "option"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_an_empty_path_is_refused_naming_the_argument(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        _one_line_usage_error(argv, capsys) == f"argument {option}: an empty path names no file or directory"
    )


def _one_line_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI on ``argv``: exit 2 with one line, ``<prog>: error: <what> ('<prog> --help' lists the
    options)``; returns ``<what>``."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.endswith("\n"), err
    prog, _, rest = err.partition(": error: ")
    assert prog.startswith("corda-trio") and rest.endswith(f" ('{prog} --help' lists the options)\n"), err
    return rest.removesuffix(f" ('{prog} --help' lists the options)\n")


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["nope"], "argument COMMAND: invalid choice: 'nope' (choose from"),
        (["report", "--in", "x"], "the following arguments are required: --out"),
        (["report", "--in", "x", "--out", "y", "--bogus"], "unrecognized arguments: --bogus"),
        (
            ["flow", "start", "--user", "u", "--node", "ws://h:1"],
            "the following arguments are required: flow",
        ),
        (
            ["flow", "list", "--user", "u", "--node", "ws://h:1", "--state", "odd"],
            "argument --state: invalid",
        ),
        (
            ["bench", "run", "codec", "--out", "x", "--seed", "one"],
            "argument --seed: invalid int value: 'one'",
        ),
        (["store"], "the following arguments are required: SUBCOMMAND"),
    ],
)
def test_a_usage_error_is_one_line(argv: list[str], what: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _one_line_usage_error(argv, capsys).startswith(what)
