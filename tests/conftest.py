"""Shared test configuration: hypothesis profiles and plain tracebacks from pytest-trio."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest
from hypothesis import HealthCheck, settings

# `ci`: deterministic enough for a shared 2-core machine (no deadlines: the machine is never idle).
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("fuzz", max_examples=20_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, None, None]:
    """pytest-trio runs every test in a nursery, so its exception arrives wrapped in an ExceptionGroup.

    Unwrap a group of exactly one leaf so that ``pytest.raises`` in markers and tracebacks read plainly.
    """
    outcome = yield
    exc = outcome.excinfo[1] if outcome.excinfo else None
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if outcome.excinfo and exc is not outcome.excinfo[1]:
        outcome.force_exception(exc)  # type: ignore[arg-type]
