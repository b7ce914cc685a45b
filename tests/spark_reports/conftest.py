"""One local Spark session for every Spark test (start-up costs 5-15 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import spark_reports


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    with spark_reports.open_spark(
        spark_reports.SparkSettings(master="local[2]", driver_memory="1g", shuffle_partitions=4)
    ) as session:
        yield session
