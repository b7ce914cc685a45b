"""``corda-trio bench`` finds the benchmarks as a plugin (entry point group), never by importing bench/."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from corda_trio.node import _cli_bench
from corda_trio.node._cli import main

ROOT = Path(__file__).resolve().parents[2]
OURS = ("bench", "corda_trio", "spark_reports")


def test_the_project_registers_its_bench_harness() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    group = pyproject["project"]["entry-points"][_cli_bench.BENCH_ENTRY_POINT_GROUP]
    assert group == {"harness": "bench"}
    installed = metadata.entry_points(group=_cli_bench.BENCH_ENTRY_POINT_GROUP)
    assert [ep.value for ep in installed] == ["bench"], "reinstall: pip install -e '.[bench]'"


def test_without_a_plugin_bench_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The installed metadata is the environment, not the code under test: hide the group.
    monkeypatch.setattr(_cli_bench.metadata, "entry_points", lambda group: [])
    assert main(["bench", "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no benchmarks installed" in err and ".[bench]" in err


def test_a_broken_plugin_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = metadata.EntryPoint(name="harness", value="no_such_bench_module", group="corda_trio.bench")
    monkeypatch.setattr(_cli_bench.metadata, "entry_points", lambda group: [broken])
    assert main(["bench", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot load the benchmark plugin no_such_bench_module" in err


def test_examples_in_the_bench_help_use_valid_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _cli_bench._harness()
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    shown = capsys.readouterr().out
    examples = [line.strip() for line in shown.splitlines() if "corda-trio bench run" in line]
    assert len(examples) >= 2 and any("--param" in e for e in examples), shown
    for example in examples:
        scenario = example.split("bench run ")[1].split()[0]
        params = dict(p.split("=", 1) for p in re.findall(r"--param (\S+)", example))
        config = bench.RunConfig(
            scenario=scenario, load=bench.LoadProfile(), sizes=bench.SizeDistribution.parse("1024"),
            params=params,
        )  # fmt: skip
        bench.check_parameters(bench.load_scenario(scenario), config)
        for key, value in params.items():
            allowed = bench.load_scenario(scenario).parameters[key]
            assert value in allowed, f"{example}: {key}={value} is not one of {allowed}"


def _third_party_imports(top: Path) -> set[str]:
    found = set()
    for path in top.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            )  # fmt: skip
            for name in names:
                head = name.split(".")[0]
                if head and head not in sys.stdlib_module_names and head not in OURS:
                    found.add(head)
    return found


def test_the_bench_extra_installs_what_bench_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    distributions = {"proton": "python-qpid-proton", "azure": "azure-servicebus"}
    declared = {
        re.split(r"[<>=!\[ ;]", req, maxsplit=1)[0].lower()
        for req in [*project["dependencies"], *project["optional-dependencies"]["bench"]]
    }
    for module in _third_party_imports(ROOT / "bench"):
        assert distributions.get(module, module).replace("_", "-") in declared, (
            f"bench/ imports {module}: add it to the bench extra in pyproject.toml"
        )
