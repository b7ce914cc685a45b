"""The README's operator guide names every command the ``corda-trio`` CLI has: a new operator finds each
one there, and ``--help`` (read as a user reads it, from a real process) lists none the guide leaves out."""

from __future__ import annotations

import re
from pathlib import Path

from tests.node.cli_helpers import run_cli

README = Path(__file__).resolve().parents[2] / "README.md"


def _help(*command: str) -> str:
    done = run_cli(*command, "--help", timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _subcommands(help_text: str) -> list[str]:
    """The names argparse lists under "positional arguments" (4 spaces in, one word)."""
    section = help_text.split("positional arguments:", 1)[1].split("\noptions:", 1)[0]
    return re.findall(r"^    ([a-z][a-z-]*)(?:\s|$)", section, flags=re.MULTILINE)


def test_the_readme_names_every_command_and_subcommand() -> None:
    readme = " ".join(README.read_text(encoding="utf-8").split())  # lines joined: names may wrap
    commands = _subcommands(_help())
    assert "node" in commands and "store" in commands, commands
    missing = []
    for command in commands:
        text = _help(command)
        subcommands = _subcommands(text) if "SUBCOMMAND" in text.split("\n\n", 1)[0] else []
        for sub in subcommands or [""]:
            # `corda-trio store list`, or the forms the guide uses for several at once:
            # `corda-trio networkmap list|remove|readmit`, `flow watch ... (also: flow retry | flow kill)`
            shapes = (
                [rf"corda-trio {command} (?:[a-z-]+ ?\| ?)*{sub}\b", rf"\b{command} {sub}\b"]
                if sub
                else [rf"corda-trio {command}\b"]
            )
            if not any(re.search(shape, readme) for shape in shapes):
                missing.append(f"corda-trio {command} {sub}".strip())
    assert missing == [], f"README.md does not name: {missing}"
