"""PySpark reports over benchmark records (``protocol_spec/bench-records.md``).

``build_report(in_dirs, out_html)`` runs one Spark job (``local[*]`` by default, any master via
``SparkSettings``) that computes per run / scenario / link / size class: counts, errors, throughput (overall
and per second), latency percentiles per stage; compares like runs; and writes an offline HTML report with
SVG charts plus the summary tables as CSV and Parquet.
"""

from ._compare import ComparisonRow as ComparisonRow
from ._errors import BadRecordsError as BadRecordsError
from ._errors import ReportEnvironmentError as ReportEnvironmentError
from ._errors import ReportError as ReportError
from ._errors import ReportInputError as ReportInputError
from ._errors import ReportOutputError as ReportOutputError
from ._job import CDF_GRID as CDF_GRID
from ._job import PERCENTILE_ACCURACY as PERCENTILE_ACCURACY
from ._job import PERCENTILES as PERCENTILES
from ._job import GroupStats as GroupStats
from ._job import JobResult as JobResult
from ._job import SeriesPoint as SeriesPoint
from ._job import Sketch as Sketch
from ._job import StageLatency as StageLatency
from ._job import size_class as size_class
from ._report import ReportResult as ReportResult
from ._report import build_report as build_report
from ._report import tables_dir_for as tables_dir_for
from ._session import SparkSettings as SparkSettings
from ._session import find_java as find_java
from ._session import open_spark as open_spark
from ._synthetic import synthetic_records as synthetic_records
from ._synthetic import write_synthetic as write_synthetic

__all__ = [
    "CDF_GRID",
    "PERCENTILES",
    "PERCENTILE_ACCURACY",
    "BadRecordsError",
    "ComparisonRow",
    "GroupStats",
    "JobResult",
    "ReportEnvironmentError",
    "ReportError",
    "ReportInputError",
    "ReportOutputError",
    "ReportResult",
    "SeriesPoint",
    "Sketch",
    "SparkSettings",
    "StageLatency",
    "build_report",
    "find_java",
    "open_spark",
    "size_class",
    "synthetic_records",
    "tables_dir_for",
    "write_synthetic",
]
