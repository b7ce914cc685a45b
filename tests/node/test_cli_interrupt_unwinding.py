"""What the CLI counts as an interrupt: a Ctrl-C, and also an error that code cut short by one raised on its
way out (py4j does, when Ctrl-C lands in a call into the Spark JVM). In process: the command is a stand-in."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest
import trio

from corda_trio.node import _cli as cli


class Py4JError(Exception):
    """Stands in for ``py4j.protocol.Py4JError`` (the CLI must not depend on what raised it)."""


def _cancel_failed() -> None:
    """Ctrl-C during a call, and the cleanup it starts fails: py4j's "Gateway must be connected to send
    cancel cmd." (seen when the JVM's connection was gone by the time py4j tried to cancel)."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise Py4JError("Gateway must be connected to send cancel cmd.") from None


def _error_from_cancel_failed() -> None:
    try:
        _cancel_failed()
    except Py4JError as exc:  # a layer that turns what failed into the command's own error
        raise cli.CliError(f"the report failed: {exc}", 1) from exc


def _inside_trio() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            _cancel_failed()

    trio.run(main)


def _not_an_interrupt() -> None:
    raise Py4JError("Answer from Java side is empty")


@pytest.fixture
def command(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], None]], None]:
    """Make ``cli.main`` run ``body`` as its command (and stop no child processes: the test runner's own)."""
    monkeypatch.setattr(cli, "_stop_children", lambda: None)

    def install(body: Callable[[], None]) -> None:
        parser = argparse.ArgumentParser()
        parser.set_defaults(func=lambda _args: body())
        monkeypatch.setattr(cli, "_build_parser", lambda _chosen: parser)

    return install


@pytest.mark.parametrize("body", [_cancel_failed, _error_from_cancel_failed, _inside_trio])
def test_an_error_raised_while_an_interrupt_unwinds_is_the_interrupt(
    command: Callable[[Callable[[], None]], None],
    body: Callable[[], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    command(body)
    assert cli.main([]) == cli.INTERRUPTED_EXIT
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["interrupted"]
    assert captured.out == ""


def test_an_error_without_an_interrupt_behind_it_is_not_one(
    command: Callable[[Callable[[], None]], None],
) -> None:
    command(_not_an_interrupt)
    with pytest.raises(Py4JError, match="empty"):
        cli.main([])


def test_an_error_without_an_interrupt_in_its_chain_is_not_one() -> None:
    error = cli.CliError("no such file: x.toml", 2)
    assert not cli._is_interrupt(error)
    looped = Py4JError("a")
    looped.__context__ = Py4JError("b")
    looped.__context__.__context__ = looped  # a cycle ends the walk
    assert not cli._is_interrupt(looped)
