"""The summary tables' files: CSV always, Parquet (written by the driver, pyarrow) for tables with rows."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark_reports._tables import PARQUET_PART, write_tables


def _rows() -> list[dict[str, object]]:
    return [
        {"run_id": "a", "link": "O=A->O=B", "count": 3, "p50_ms": 1, "ratio": None, "note_id": None},
        {"run_id": "b", "link": "O=A->O=C", "count": 4, "p50_ms": 2.5, "ratio": math.inf, "note_id": None},
    ]


def test_tables_are_written_as_csv_and_a_parquet_directory_with_the_values_types(tmp_path: Path) -> None:
    out = tmp_path / "report_tables"
    written = write_tables({"groups": _rows(), "errors": []}, out)
    assert sorted(p.name for p in written) == ["errors.csv", "groups.csv", "groups.parquet"]
    # an empty table: its header in CSV, no Parquet (nothing to type its columns from)
    assert (out / "errors.csv").read_text().splitlines() == ["run_id,scenario,link,error,count"]
    assert not (out / "errors.parquet").exists()
    with (out / "groups.csv").open() as f:
        assert [r["count"] for r in csv.DictReader(f)] == ["3", "4"]
    folder = out / "groups.parquet"
    assert sorted(p.name for p in folder.iterdir()) == ["_SUCCESS", PARQUET_PART]
    table = pq.read_table(folder)  # the directory, as Spark and pandas read it
    assert table.schema == pa.schema(
        [("run_id", pa.string()), ("link", pa.string()), ("count", pa.int64()), ("p50_ms", pa.float64()),
         ("ratio", pa.float64()), ("note_id", pa.string())]
    )  # fmt: skip
    assert table.to_pylist() == [
        {"run_id": "a", "link": "O=A->O=B", "count": 3, "p50_ms": 1.0, "ratio": None, "note_id": None},
        {"run_id": "b", "link": "O=A->O=C", "count": 4, "p50_ms": 2.5, "ratio": math.inf, "note_id": None},
    ]


def test_a_table_written_again_replaces_the_old_one_whole(tmp_path: Path) -> None:
    out = tmp_path / "t"
    write_tables({"groups": _rows()}, out)
    stale = out / "groups.parquet" / "part-00001-from-an-older-spark-write.parquet"
    stale.write_bytes(b"not parquet")
    (out / "stages.parquet").write_text("a file where a directory belongs")
    write_tables({"groups": _rows()[:1], "stages": _rows()}, out)
    assert sorted(p.name for p in (out / "groups.parquet").iterdir()) == ["_SUCCESS", PARQUET_PART]
    assert pq.read_table(out / "groups.parquet").num_rows == 1
    assert pq.read_table(out / "stages.parquet").num_rows == 2
