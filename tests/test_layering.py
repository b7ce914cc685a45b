"""Architecture rules of DESIGN.md §1 and STYLE.md §2, checked on the source (AST), not by convention.

* ``corda_trio.amqp`` is pure: stdlib (minus I/O, clocks, randomness, logging, threads) and attrs only.
* Imports go down only: node -> rpc -> flows -> {bridge | network} -> messaging -> {transport | store} -> pki
  -> amqp; siblings joined by ``|`` are independent; ``store`` never imports ``amqp``.
* Modules marked PURE elsewhere obey the same stdlib ban as ``amqp``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "corda_trio"

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
    "messaging/_model.py",
    "network/_model.py",
    "flows/_requests.py",
    "flows/_statemachine.py",
    "rpc/_protocol.py",
]


def _imports(path: Path) -> list[tuple[str, int]]:
    """Absolute module names imported by ``path`` (relative imports resolved), with line numbers."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
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
            if mod == "corda_trio":  # from corda_trio import amqp
                found.extend((f"corda_trio.{alias.name}", node.lineno) for alias in node.names)
    return found


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if ".venv" not in p.parts)


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


@pytest.mark.parametrize("rel", [r for r in PURE_MODULES if (PACKAGE / r).exists()])
def test_pure_modules(rel: str) -> None:
    path = PACKAGE / rel
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
            "imports go down only (DESIGN.md §1)"
        )
