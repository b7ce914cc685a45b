"""An RPC command (`corda-trio node info`, `flow ...`) imports only what it uses: not the AMQP engine, the
store, the transport or the network map, which together took more than half of its start-up."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.node.cli_helpers import CLI
from tests.ports import free_port

HEAVY = ("corda_trio.amqp", "corda_trio.store", "corda_trio.transport", "corda_trio.network")


@pytest.mark.parametrize("command", [["node", "info"], ["flow", "list"], ["flow", "kill", "some-flow-id"]])
def test_rpc_commands_do_not_import_the_engine_or_the_store(command: list[str]) -> None:
    url = f"ws://127.0.0.1:{free_port()}"  # nothing listens there: the command fails as an operator sees it
    env = dict(os.environ, CORDA_TRIO_RPC_PASSWORD="secret", PYTHONPROFILEIMPORTTIME="1")
    proc = subprocess.run(
        [*CLI, *command, "--node", url, "--user", "ops"],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    imported = set(re.findall(r"^import time:.*\|\s*(\S+)$", proc.stderr, re.MULTILINE))
    message = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 1 and len(message) == 1 and url in message[0], proc.stderr[-2000:]
    assert "corda_trio.rpc" in imported  # (the import log is read right)
    loaded = sorted(m for m in imported if m.startswith(HEAVY))
    assert loaded == [], f"{' '.join(command)} imported {loaded}"
