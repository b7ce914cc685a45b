"""An empty string given as a file or directory is refused by name, before anything runs: ``Path("")`` is
the current directory, so ``store check ""`` said ``: no such directory``, ``network show --dir ""`` looked
for ``nodes`` here and ``node start --config ""`` tried to read the working directory as its config."""

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
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(f": error: argument {option}: an empty path names no file or directory"), last
