"""Public surface of ``corda_trio.pki`` and ``corda_trio.network``: every name in ``__all__`` exists, is
unique, and nothing public is missing from it."""

from __future__ import annotations

import importlib
import types

import pytest


@pytest.mark.parametrize("name", ["corda_trio.pki", "corda_trio.network"])
def test_all_is_complete_and_real(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported))
    for symbol in exported:
        assert hasattr(module, symbol), f"{name}.{symbol} is in __all__ but missing"
    public = {
        n for n, v in vars(module).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType) and n not in ("annotations",)
    }  # fmt: skip
    assert public <= set(exported), f"public but not exported: {sorted(public - set(exported))}"
