"""The README's operator guide names every command the ``corda-trio`` CLI has: a new operator finds each
one there, and ``--help`` (read as a user reads it, from a real process) lists none the guide leaves out."""

from __future__ import annotations

import re
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from corda_trio import pki, rpc
from corda_trio.node import _cli_bridge, _cli_float, _config
from corda_trio.node._cli import CliError
from corda_trio.node._processes import open_node_processes
from tests.node.cli_helpers import run_cli
from tests.node.netutil import make_network
from tests.node.test_flows_e2e import scrape_text

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


# --- the tables of settings, metrics and RPC methods, against what the program takes and serves ---

ROOT = README.parent
PROBE = "zz_not_a_setting"


def _sample_keys(docstring: str, start: str, end: str) -> dict[str, set[str]]:
    """The settings a docstring's sample file names: ``[table]`` -> keys (``""``: the top level), from its
    lines ``key = ...``, commented-out ``# key = ...`` and ``... or key = ...``."""
    sample = docstring.split(start, 1)[1].split(end, 1)[0]
    tables: dict[str, set[str]] = {"": set()}
    table = ""
    for line in sample.splitlines():
        if header := re.match(r"\s*\[\[?([a-z0-9_.]+)\]\]?", line):
            table = header[1]
            tables.setdefault(table, set())
            continue
        if key := re.match(r"\s*(?:#\s*)?([a-z_]+) = ", line):
            tables[table].add(key[1])
        tables[table].update(re.findall(r"\bor ([a-z_]+) = ", line))
    return tables


def _allowed(message: str) -> set[str]:
    """The names an unknown-setting error lists: ``... unknown setting (allowed: a, b, [c])``."""
    found = re.search(r"unknown setting \(allowed: ([^)]*)\)", message)
    assert found, message
    return set(found[1].split(", "))


def _loader_keys(
    load: Callable[[Path], object], path: Path, tables: set[str], head: str = ""
) -> dict[str, set[str]]:
    """What a configuration loader takes, as its errors tell a user: the top level and each table's keys,
    from the error for an unknown key put there (``rpc.users``: in one ``[[rpc.users]]`` entry); ``head``:
    what the loader reads before the tables (node.toml: ``legal_name``)."""

    def error(text: str) -> str:
        path.write_text(head + text, encoding="utf-8")
        with pytest.raises(Exception) as caught:  # (ConfigError; the float's: CliError)
            load(path)
        return str(caught.value)

    top = _allowed(error(f"{PROBE} = 1\n"))
    found = {"": {name for name in top if not name.startswith("[")}}
    found.update({name.strip("[]"): set() for name in top if name.startswith("[")})
    for table in tables - {""}:
        probe = f"[{table}]\n{PROBE} = 1\n"
        if table == "rpc.users":  # (read once the required addresses are)
            required = '[p2p]\naddress = "127.0.0.1:1"\n[rpc]\naddress = "127.0.0.1:2"\n'
            probe = f"{required}[[rpc.users]]\n{PROBE} = 1\n"
        found[table] = _allowed(error(probe))
    return found


def test_node_toml_settings_in_the_config_docstring_are_the_loaders() -> None:
    """README sends an operator to the top of corda_trio/node/_config.py for every node.toml setting: each one
    shown there is taken by the loader, and each one the loader takes is shown (a table, top-level key or
    key missing from the sample was a setting nobody could find, or one that stopped the start)."""
    documented = _sample_keys(_config.__doc__ or "", "``node.toml``", "Only ``legal_name``")
    with tempfile.TemporaryDirectory() as scratch:
        actual = _loader_keys(
            _config.load_node_config,
            Path(scratch, "node.toml"),
            set(documented),
            'legal_name = "O=Alice,L=London,C=GB"\n',
        )
    documented["rpc"].add("users")  # (the [[rpc.users]] entries)
    assert documented == actual


def test_networkmap_toml_settings_in_the_config_docstring_are_the_loaders() -> None:
    documented = _sample_keys(_config.__doc__ or "", "``networkmap.toml`` (written", "Only ``database``")
    with tempfile.TemporaryDirectory() as scratch:
        actual = _loader_keys(
            _config.load_network_map_config, Path(scratch, "networkmap.toml"), set(documented)
        )
    assert documented == actual


def test_bridge_toml_settings_in_the_bridge_docstring_and_the_readme_are_the_loaders() -> None:
    """``corda-trio bridge start``'s file: its module docstring has every key, README's example some."""
    documented = _sample_keys(_cli_bridge.__doc__ or "", "Configuration (TOML", "With ``[float]``")
    with tempfile.TemporaryDirectory() as scratch:
        actual = _loader_keys(_cli_bridge.load_bridge_config, Path(scratch, "bridge.toml"), set(documented))
    assert documented == actual
    readme = _sample_keys(README.read_text(encoding="utf-8"), "# bridge.toml", "```")
    assert all(keys <= actual.get(table, set()) for table, keys in readme.items()), readme


def test_float_toml_tables_in_float_md_are_the_loaders() -> None:
    """docs/float.md section 3 has a table of keys per float.toml table."""
    text = (ROOT / "docs" / "float.md").read_text(encoding="utf-8")
    section = text.split("## 3.", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, set[str]] = {}
    for table, body in re.findall(r"^### `\[([a-z]+)[^`]*\]`[^\n]*\n(.*?)(?=^### |\Z)", section, re.M | re.S):
        documented[table] = set(re.findall(r"^\| `([a-z_]+)` \|", body, flags=re.M))
    assert set(documented) == {"control", "public", "tls", "audit", "metrics"}, documented

    def load(path: Path) -> object:
        # (a [tls] table's keys are those of each [tls.<ref>]: the probe goes into one of those)
        text = path.read_text(encoding="utf-8").replace("[tls]\n", "[tls.node]\n")
        path.write_text(text, encoding="utf-8")
        return _cli_float.load_float_config(path)

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch, "float.toml")
        actual = {}
        for table in documented:
            path.write_text(f"[{table}]\n{PROBE} = 1\n", encoding="utf-8")
            with pytest.raises(CliError) as caught:
                load(path)
            actual[table] = _allowed(str(caught.value))
    assert documented == actual


def test_the_rpc_method_table_is_the_servers() -> None:
    """protocol_spec/rpc.md "Methods": every method the server answers, with the permission it checks."""
    text = (ROOT / "protocol_spec" / "rpc.md").read_text(encoding="utf-8")
    table = text.split("## Methods", 1)[1].split("\n\n", 2)[1]
    documented: dict[str, str | None] = {}
    names = {
        "login": None,
        "read": rpc.PERMISSION_READ,
        "admin": rpc.PERMISSION_ADMIN,
        "start_flow": "start_flow",
    }
    rows = re.findall(r"^\| ((?:`[a-z_]+`(?: / )?)+) \|[^|]*\| ([a-z_]+) \|", table, flags=re.M)
    for methods, permission in rows:
        for method in re.findall(r"`([a-z_]+)`", methods):
            documented[method] = names[permission]
    assert documented == dict(rpc.METHODS)


async def test_every_metric_in_metrics_md_is_on_a_live_nodes_metrics(tmp_path: Path) -> None:
    """docs/metrics.md's tables against a real node process's /metrics: the same families (the table's
    names without ``corda_trio_``), each of the documented type; an idle node already lists every family."""
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    text = text.split("\n## The bridge process", 1)[0]  # (what follows is a bridge process's, not a node's)
    documented = dict(re.findall(r"^\| `([a-z_0-9]+)` \| ([a-z]+)\b", text, flags=re.M))
    async with open_node_processes(make_network(tmp_path / "net", ["O=Alice,L=London,C=GB"])) as (alice,):
        exposition = await scrape_text(alice)
    served = {
        name.removeprefix("corda_trio_"): kind
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, flags=re.M)
    }
    assert documented == served


def _documented_families(section: str) -> dict[str, str]:
    """The families in the tables of docs/metrics.md's ``## section`` (names without ``corda_trio_``)."""
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([a-z_0-9]+)` \| ([a-z]+)\b", body, flags=re.M))


def _served_families(exposition: str) -> dict[str, str]:
    return {
        name.removeprefix("corda_trio_"): kind
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, flags=re.M)
    }


async def test_every_metric_of_the_float_section_is_on_a_live_floats_metrics(tmp_path: Path) -> None:
    """docs/metrics.md "The float" against a real ``corda-trio float start`` process's /metrics (idle: not
    activated, every family already listed)."""
    from corda_trio.bridge import float as fl
    from tests.float.test_processes import write_float
    from tests.p2p_harness import NOW

    network = pki.NetworkCredentials.create(now=NOW)
    bob = network.issue_node(pki.CordaX500Name.parse("O=Bob,L=Paris,C=FR"), now=NOW)
    flt = write_float(tmp_path, "float-a", fl.TunnelPki.create(now=NOW), bob, network.root.cert)
    config = flt.directory / "float.toml"
    config.write_text(config.read_text(encoding="utf-8") + '[metrics]\naddress = "127.0.0.1:0"\n')
    async with trio.open_nursery() as nursery:
        try:
            await flt.start(nursery)
            line = await flt.wait_line(lambda x: "control port listening" in x)
            exposition = await scrape_text(line.rsplit(" ", 1)[1])
        finally:
            await flt.kill()
            nursery.cancel_scope.cancel()
    documented = _documented_families("The float")
    assert documented and all(name.startswith("float_") for name in documented)
    assert documented == _served_families(exposition)


def test_every_metric_of_the_map_section_is_on_a_live_map_services_metrics(tmp_path: Path) -> None:
    """docs/metrics.md "The network map service" against a real ``corda-trio networkmap serve``'s /metrics."""
    from tests.network.test_metrics import ALICE, add_metrics, bootstrap, serving

    net = tmp_path / "net"
    bootstrap(net, ALICE)
    add_metrics(net, "127.0.0.1:0")
    with serving(net) as (_, metrics), urllib.request.urlopen(metrics, timeout=10) as response:
        exposition = response.read().decode()
    documented = _documented_families("The network map service")
    assert documented and all(name.startswith("networkmap_") for name in documented)
    assert documented == _served_families(exposition)


def test_the_package_maps_name_every_package() -> None:
    """docs/architecture.md's package map names every package and top-level module of ``corda_trio``;
    README's layout names every package (it lacked messaging, bridge, flows, records and testing)."""
    code = ROOT / "corda_trio"
    packages = {p.name for p in code.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.name for p in code.glob("*.py") if not p.name.startswith("_")}
    section = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split("## 5. Package map", 1)[1]
    assert set(re.findall(r"^\| `corda_trio/([a-z_.]+?)/?` \|", section, flags=re.M)) == packages | modules
    layout = README.read_text(encoding="utf-8").split("## Layout", 1)[1]
    assert set(re.findall(r"^\| `corda_trio/([a-z_]+)/` \|", layout, flags=re.M)) == packages


def test_the_float_audit_events_in_float_md_are_the_ones_written() -> None:
    """docs/float.md section 5 lists every event of the float's audit log: the names its code writes."""
    text = (ROOT / "docs" / "float.md").read_text(encoding="utf-8")
    section = text.split("## 5.", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", section, flags=re.M))
    sources = [*(ROOT / "corda_trio/bridge/float").glob("*.py"), ROOT / "corda_trio/node/_cli_float.py"]
    code = "".join(path.read_text(encoding="utf-8") for path in sources)
    assert documented == set(re.findall(r"\bwrite\(\s*\"([a-z-]+)\"", code))
