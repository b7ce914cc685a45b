"""Architecture rules of ``docs/architecture.md`` (package map), checked on the source (AST).

* ``corda_trio.amqp`` is pure: stdlib (minus I/O, clocks, randomness, logging, threads) and attrs only.
* Imports go down only: node -> rpc -> flows -> {bridge | network} -> messaging -> {transport | store} -> pki
  -> amqp; siblings joined by ``|`` are independent; ``store`` never imports ``amqp``.
* Modules marked PURE elsewhere obey the same stdlib ban as ``amqp``; a listed module that does not exist is
  an error, not a silent skip.
* The product (``corda_trio``) never imports ``bench``; ``bench`` and ``spark_reports`` are checked too.
* Nobody imports another package's private ``_module``: across packages only the public ``__init__`` counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "corda_trio"
#: Top-level packages whose sources the checks below read.
TOP_LEVEL = ("corda_trio", "bench", "spark_reports")

BANNED_IN_PURE = {
    "trio", "ssl", "socket", "os", "time", "random", "logging", "threading", "asyncio", "selectors",
    "subprocess", "secrets", "multiprocessing", "concurrent", "sqlite3", "io", "pathlib", "shutil",
    "cryptography", "msgpack", "h11", "trio_websocket",
}  # fmt: skip
# amqp may use attrs and the pure stdlib; msgpack etc. are not needed there.
AMQP_ALLOWED_THIRD_PARTY = {"attrs", "attr", "typing_extensions"}

LEVEL = {
    "amqp": 0, "pki": 1, "transport": 2, "store": 2, "messaging": 3, "bridge": 4, "network": 4,
    "flows": 5, "rpc": 6, "node": 7, "testing": 7, "records": 0,
}  # fmt: skip
# Pairs that may not import each other although the levels alone would allow it.
FORBIDDEN_EDGES = {("store", "amqp"), ("transport", "store"), ("store", "transport")}

# Modules that must stay pure (no I/O, no clock) outside corda_trio.amqp.
PURE_MODULES = [
    "store/_record.py",
    "store/_record_v1.py",
    "messaging/_model.py",
    "network/_model.py",
    "records/_schema.py",
    "flows/_errors.py",
    "flows/_logic.py",
    "flows/_messages.py",
    "flows/_registry.py",
    "bridge/_control.py",
    "flows/_requests.py",
    "flows/_statemachine.py",
    "flows/_examples.py",
    "rpc/_protocol.py",
    "bridge/float/_control.py",
    "hostport.py",
]

# Product modules that still import bench/, each with the reason; the test fails once one no longer does,
# so the entry must then be removed.
KNOWN_BENCH_IMPORTS: dict[str, str] = {}


def _imports(path: Path) -> list[tuple[str, int]]:
    """Absolute module names imported by ``path`` (relative imports resolved), with line numbers."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        package_parts = parts
    else:
        package_parts = parts[:-1]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
                if node.module is None:  # from . import x  -> corda_trio.pkg.x
                    found.extend((f"{mod}.{alias.name}", node.lineno) for alias in node.names)
                    continue
            else:
                mod = node.module or ""
            found.append((mod, node.lineno))
            if mod in TOP_LEVEL or (mod.startswith("corda_trio.") and mod.count(".") == 1):
                # from corda_trio import amqp / from corda_trio.store import _record / from bench import _x
                found.extend((f"{mod}.{alias.name}", node.lineno) for alias in node.names)
    return found


def _sources(top: str = "corda_trio") -> list[Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if ".venv" not in p.parts)


def _all_sources() -> list[Path]:
    return [p for top in TOP_LEVEL for p in _sources(top)]


def _owner(path: Path) -> str:
    """The package that owns ``path``: ``corda_trio.<sub>`` inside the product, else the top-level name."""
    parts = path.relative_to(ROOT).parts
    if parts[0] == "corda_trio" and len(parts) > 2:
        return f"corda_trio.{parts[1]}"
    return parts[0]


def _private_target(mod: str) -> str | None:
    """The package that owns the private module ``mod`` names (``corda_trio.store._record``: store)."""
    parts = mod.split(".")
    if parts[0] not in TOP_LEVEL:
        return None
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _subpackage(path: Path) -> str | None:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else None


def test_sources_exist() -> None:
    assert any(p.parts[-2] == "amqp" for p in _sources())


@pytest.mark.parametrize("path", [p for p in _sources() if _subpackage(p) == "amqp"], ids=str)
def test_amqp_is_pure(path: Path) -> None:
    for mod, line in _imports(path):
        top = mod.split(".")[0]
        assert top not in BANNED_IN_PURE, f"{path}:{line} imports {mod}: corda_trio.amqp must stay sans-IO"
        if top == "corda_trio":
            assert mod.startswith("corda_trio.amqp"), f"{path}:{line} imports {mod} from outside amqp"
        elif top not in AMQP_ALLOWED_THIRD_PARTY:
            import sys

            assert top in sys.stdlib_module_names or top == "__future__", (
                f"{path}:{line} imports third-party {mod}: amqp allows only attrs"
            )


@pytest.mark.parametrize("rel", PURE_MODULES)
def test_pure_modules(rel: str) -> None:
    path = PACKAGE / rel
    assert path.is_file(), f"{path} is listed in PURE_MODULES but does not exist: fix the list"
    for mod, line in _imports(path):
        top = mod.split(".")[0]
        assert top not in BANNED_IN_PURE, f"{path}:{line} imports {mod}: this module is PURE"


@pytest.mark.parametrize("path", [p for p in _sources() if _subpackage(p)], ids=str)
def test_imports_go_down_only(path: Path) -> None:
    here = _subpackage(path)
    assert here in LEVEL, f"unknown sub-package {here}: give it a level in tests/test_layering.py"
    for mod, line in _imports(path):
        parts = mod.split(".")
        if parts[0] != "corda_trio" or len(parts) < 2 or parts[1] not in LEVEL:
            continue
        there = parts[1]
        if there == here:
            continue
        assert there != "node", f"{path}:{line}: nothing imports corda_trio.node"
        assert (here, there) not in FORBIDDEN_EDGES, f"{path}:{line}: {here} may not import {there}"
        assert LEVEL[there] < LEVEL[here], (
            f"{path}:{line}: {here} (level {LEVEL[here]}) imports {there} (level {LEVEL[there]}); "
            "imports go down only (docs/architecture.md, package map)"
        )


def test_every_top_level_package_is_checked() -> None:
    for top in TOP_LEVEL:
        assert _sources(top), f"{top}/ has no Python sources: fix TOP_LEVEL"
    for rel in KNOWN_BENCH_IMPORTS:
        assert (ROOT / rel).is_file(), f"{rel} is listed in KNOWN_BENCH_IMPORTS but does not exist"


@pytest.mark.parametrize("path", _sources("corda_trio"), ids=str)
def test_product_never_imports_bench(path: Path) -> None:
    rel = path.relative_to(ROOT).as_posix()
    bench_imports = [(mod, line) for mod, line in _imports(path) if mod.split(".")[0] == "bench"]
    if rel in KNOWN_BENCH_IMPORTS:
        assert bench_imports, f"{rel} no longer imports bench: remove it from KNOWN_BENCH_IMPORTS"
        return
    for mod, line in bench_imports:
        pytest.fail(f"{path}:{line} imports {mod}: the product never imports bench/ (it is a plugin)")


@pytest.mark.parametrize("path", _all_sources(), ids=str)
def test_no_private_imports_across_packages(path: Path) -> None:
    here = _owner(path)
    for mod, line in _imports(path):
        target = _private_target(mod)
        if target is None:
            continue
        same = (
            target == here
            or target.startswith(here + ".")
            or (here in TOP_LEVEL and target.split(".")[0] == here and here != "corda_trio")
        )
        assert same, f"{path}:{line} imports {mod}, a private module of {target}: use {target}'s public names"


@pytest.mark.parametrize("path", _sources("bench") + _sources("spark_reports"), ids=str)
def test_bench_and_reports_use_the_product_from_above(path: Path) -> None:
    for mod, line in _imports(path):
        parts = mod.split(".")
        if parts[0] == "corda_trio" and len(parts) > 1:
            assert parts[1] != "node", f"{path}:{line} imports {mod}: the CLI is not a library"
        if _owner(path) == "spark_reports":
            assert parts[0] != "bench", f"{path}:{line} imports {mod}: reports read records, not bench/"


# Project files that still name design notes the project does not ship, each with the reason; the test fails
# once one no longer does, so the entry must then be removed.
KNOWN_PRIVATE_NOTE_REFERENCES: dict[str, str] = {}
_NOTES = ("DESIGN" + ".md", "STACK" + "-NOTES")  # split so that this file does not name them itself


def _project_texts() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for top in (*TOP_LEVEL, "protocol_spec", "tests"):
        found += sorted(
            p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".md", ".toml") and p.is_file()
        )
    return found


def test_docs_stand_alone() -> None:
    """Nothing in the project points at notes a user does not have: docs/architecture.md is the design."""
    assert (ROOT / "docs" / "architecture.md").is_file()
    offenders = []
    for path in _project_texts():
        rel = path.relative_to(ROOT).as_posix()
        named = any(note in path.read_text(encoding="utf-8", errors="replace") for note in _NOTES)
        if rel in KNOWN_PRIVATE_NOTE_REFERENCES:
            assert named, f"{rel} no longer names them: remove it from KNOWN_PRIVATE_NOTE_REFERENCES"
        elif named:
            offenders.append(rel)
    assert offenders == [], f"these files cite design notes that are not in the project: {offenders}"
