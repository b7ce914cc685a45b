"""``[flows] modules``: a developer's own flows (docs/flows.md, "Writing a flow") run in real node processes,
started by name over RPC and answered by the peer; a module that cannot be imported stops the start in one
line, before anything is written."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import attrs
import pytest

from corda_trio import rpc
from corda_trio.node import _config
from corda_trio.node._processes import open_node_processes

from .cli_helpers import CLI, run_cli
from .netutil import PASSWORD, make_network
from .test_flows_e2e import wait_for_peers

pytestmark = pytest.mark.slow

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"

# The example of docs/flows.md, as a developer would copy it into a module of their own (it was a variant of
# it whose AskPrice returned a str: the doc's returns its Quote, which RPC could not encode).
FLOWS_MD = (Path(__file__).parents[2] / "docs" / "flows.md").read_text(encoding="utf-8")
ASK_PRICE = re.search(r"```python\n(.*?)```", FLOWS_MD.split("## Writing a flow")[1], flags=re.S)[1]  # type: ignore[index]


async def test_a_flow_of_a_module_named_in_node_toml_runs_between_two_node_processes(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "mycorp_flows.py").write_text(ASK_PRICE, encoding="utf-8")
    nodes = make_network(tmp_path / "net", [ALICE, BOB], flows_modules=("mycorp_flows",))
    assert 'modules = ["mycorp_flows"]' in nodes[0][0].read_text(encoding="utf-8")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "code"), os.environ.get("PYTHONPATH", "")])}
    async with open_node_processes(nodes, env=env) as (alice, bob):
        async with (
            rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
            rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
        ):
            await wait_for_peers(a, 2)
            await wait_for_peers(b, 2)
            assert "AskPrice" in await a.registered_flows()
            # the flow's result, a @payload_type value, comes as the map of its fields; and the node still
            # lists its flows (every list_flows answered `internal` while it remembered that result)
            quote = {"symbol": "ACME", "price": 42}
            assert await a.start_flow("AskPrice", seller=BOB, symbol="ACME") == quote
            (listed,) = [f for f in await a.list_flows() if f["flow"] == "AskPrice"]
            assert listed["state"] == "finished" and listed["result"] == quote


@pytest.mark.parametrize(
    ("modules", "line"),
    [
        (
            ("no_such_flows_module",),
            "flows.modules: cannot import 'no_such_flows_module': ModuleNotFoundError: "
            "No module named 'no_such_flows_module'",
        ),
        (
            ("json", "broken_flows"),
            "flows.modules: cannot import 'broken_flows': RuntimeError: no price feed",
        ),
    ],
)
def test_a_flow_module_that_cannot_be_imported_is_one_line_and_nothing_on_disk(
    tmp_path: Path, modules: tuple[str, ...], line: str
) -> None:
    (tmp_path / "code").mkdir()  # the working directory, on the Python path of `python -c`
    (tmp_path / "code" / "broken_flows.py").write_text('raise RuntimeError("no price feed")\n')
    [(path, config)] = make_network(tmp_path / "net", [ALICE])
    path.write_text(
        _config.dump_node_config(attrs.evolve(config, flows_modules=modules), path.parent), encoding="utf-8"
    )
    before = sorted(p.name for p in path.parent.iterdir())
    done = run_cli("node", "start", "--config", str(path), timeout=60, cwd=str(tmp_path / "code"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"corda-trio: error: O=Alice, L=London, C=GB: {line}", done.stderr
    assert done.stdout == ""
    assert sorted(p.name for p in path.parent.iterdir()) == before  # no lock file, log or store


@pytest.mark.parametrize("value", ['"mycorp_flows"', '["my-flows"]', "[1]", '[""]'])
def test_flows_modules_that_are_not_module_names_are_a_config_error(tmp_path: Path, value: str) -> None:
    [(path, _)] = make_network(tmp_path / "net", [ALICE])
    path.write_text(path.read_text(encoding="utf-8") + f"modules = {value}\n", encoding="utf-8")
    assert path.read_text(encoding="utf-8").rstrip().splitlines()[-3] == "[flows]"
    done = run_cli("node", "start", "--config", str(path), timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"corda-trio: error: {path}: flows.modules: must be a list of Python module names (a.b.c), got "
        + repr(_value(value))
    )


def _value(toml: str) -> object:
    import tomllib

    return tomllib.loads(f"v = {toml}")["v"]


@pytest.mark.parametrize(
    ("source", "line"),
    [
        (
            "import time\nwhile True:\n    time.sleep(1)\n",
            "flows.modules: importing 'odd_flows' did not end within 20 s (its top-level code waits for "
            "something)",
        ),
        ("import sys\nsys.exit(3)\n", "flows.modules: cannot import 'odd_flows': SystemExit: 3"),
    ],
    ids=["hangs", "exits"],
)
def test_a_flow_module_that_hangs_or_exits_at_import_is_one_line_in_bounded_time(
    tmp_path: Path, source: str, line: str
) -> None:
    """A module whose top level waited for ever held `node start` for ever (before anything was up); one
    that called sys.exit(3) ended the node with exit code 3 and not a word."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "odd_flows.py").write_text(source)
    [(path, config)] = make_network(tmp_path / "net", [ALICE])
    path.write_text(
        _config.dump_node_config(attrs.evolve(config, flows_modules=("odd_flows",)), path.parent),
        encoding="utf-8",
    )
    before = sorted(p.name for p in path.parent.iterdir())
    done = run_cli("node", "start", "--config", str(path), timeout=60, cwd=str(tmp_path / "code"))
    assert done.stderr == f"corda-trio: error: O=Alice, L=London, C=GB: {line}\n", done.stderr
    assert done.returncode == 1
    assert sorted(p.name for p in path.parent.iterdir()) == before


def test_what_a_flow_module_prints_at_import_goes_to_stderr(tmp_path: Path) -> None:
    """stdout of `node start` is its ready line (scripts read it); a module's print() came first."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "chatty_flows.py").write_text('print("chatty_flows loaded")\n')
    [(path, config)] = make_network(tmp_path / "net", [ALICE])
    path.write_text(
        _config.dump_node_config(attrs.evolve(config, flows_modules=("chatty_flows",)), path.parent),
        encoding="utf-8",
    )
    proc = subprocess.Popen(
        [*CLI, "node", "start", "--config", str(path)], cwd=tmp_path / "code", stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first.startswith("node ready: O=Alice, L=London, C=GB"), first
    assert "chatty_flows loaded" not in first + out
    assert err.splitlines()[0] == "chatty_flows loaded", err
