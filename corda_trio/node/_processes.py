"""Run ``corda-trio node start`` as child processes and stop them again (the demo, tests, benchmarks).

:func:`open_node_processes` starts one process per ``node.toml``, waits until each printed its ready line,
and on leaving the block (normally, by an error or by cancellation, Ctrl-C included) stops every one of them:
SIGTERM (all at once), then SIGKILL for any that has not exited after ``stop_timeout_seconds``. No child
outlives it.
Each child's stderr goes to ``<base dir>/logs/console.log``, or to the file :func:`start_node_process` is
given.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from ._config import NodeConfig
from ._node import RUNTIME_FILE_NAME

__all__ = ["NodeProcess", "NodeProcessError", "open_node_processes", "start_node_process"]

#: How long a node may take from exec to its ready line (Python start-up, key decryption, store recovery).
READY_TIMEOUT_SECONDS: Final[float] = 60.0
STOP_TIMEOUT_SECONDS: Final[float] = 30.0


class NodeProcessError(Exception):
    """A node process exited or did not become ready; the message holds the end of its console output."""


@attrs.define(eq=False)
class NodeProcess:
    """A running ``corda-trio node start`` child."""

    config: NodeConfig
    process: trio.Process
    #: ``node.json`` of the running node: legal_name, p2p, rpc, metrics, key_hash.
    addresses: dict[str, Any]
    console_log: Path

    @property
    def rpc_url(self) -> str:
        return str(self.addresses["rpc"])

    @property
    def metrics_url(self) -> str | None:
        return self.addresses.get("metrics")

    async def stop(
        self, signum: int = signal.SIGTERM, *, timeout_seconds: float = STOP_TIMEOUT_SECONDS
    ) -> int:
        """Send ``signum``, wait up to ``timeout_seconds``, then SIGKILL; returns the exit code."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)
            with trio.move_on_after(timeout_seconds):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
        with trio.CancelScope(shield=True):
            return await self.process.wait()

    def console_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.console_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


async def start_node_process(
    config_path: Path,
    config: NodeConfig,
    *,
    env: Mapping[str, str] | None = None,
    ready_timeout_seconds: float = READY_TIMEOUT_SECONDS,
    console: Path | None = None,
    open_files_limit: int | None = None,
    command_prefix: Sequence[str] = (),
) -> NodeProcess:
    """Start one node and wait for its ready line.

    Args:
        console: where its stderr goes (appended), default ``console.log`` beside its log file.
        open_files_limit: run it with this soft and hard ``RLIMIT_NOFILE`` (as ``ulimit -n`` would).
        command_prefix: a command that runs the node in turn and execs it, keeping its pid (for example
            ``("ip", "netns", "exec", "ns1")`` to start it in a network namespace).

    Raises:
        NodeProcessError: it exited first, or was not ready in time (it is then killed).
    """
    console = console or config.log_path.parent / "console.log"
    limit = None if open_files_limit is None else functools.partial(_limit_files, open_files_limit)
    console.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "corda_trio", "node", "start", "--config", str(config_path)]
    with open(console, "ab") as err:  # noqa: ASYNC230 (a local file, opened once per process)
        process = await trio.lowlevel.open_process(
            [*command_prefix, *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, **(env or {})},
            preexec_fn=limit,
        )
    node = NodeProcess(config=config, process=process, addresses={}, console_log=console)
    try:
        assert process.stdout is not None
        buffer = b""
        with trio.move_on_after(ready_timeout_seconds) as scope:
            while b"node ready:" not in buffer:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    break
                buffer += chunk
        if b"node ready:" not in buffer:
            why = "was not ready in time" if scope.cancelled_caught else f"exited with {await process.wait()}"
            raise NodeProcessError(f"{config.legal_name} {why}:\n{node.console_tail()}")
        node.addresses = json.loads((config.base_directory / RUNTIME_FILE_NAME).read_text())
        return node
    except BaseException:
        with trio.CancelScope(shield=True):
            await node.stop(signal.SIGKILL, timeout_seconds=5)
        raise


def _limit_files(limit: int) -> None:
    """(In the child, before exec.)"""
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


@contextlib.asynccontextmanager
async def open_node_processes(
    configs: Sequence[tuple[Path, NodeConfig]],
    *,
    env: Mapping[str, str] | None = None,
    stop_timeout_seconds: float = STOP_TIMEOUT_SECONDS,
) -> AsyncIterator[list[NodeProcess]]:
    """Start every node (concurrently), yield them once all are ready, stop them all on exit."""
    started: list[NodeProcess | None] = [None] * len(configs)
    try:
        async with trio.open_nursery() as nursery:

            async def start(i: int, path: Path, config: NodeConfig) -> None:
                started[i] = await start_node_process(path, config, env=env)

            for i, (path, config) in enumerate(configs):
                nursery.start_soon(start, i, path, config)
        yield [n for n in started if n is not None]
    finally:
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for n in started:
                    if n is not None:
                        nursery.start_soon(functools.partial(n.stop, timeout_seconds=stop_timeout_seconds))
