"""Load and micro benchmarks for corda-trio; they write records that ``spark_reports`` turns into reports.

The harness (``bench._harness``) defines the record format (``protocol_spec/bench-records.md``), open- and
closed-loop load, run metadata and the writer. Scenarios are listed in ``bench._scenarios.SCENARIOS``.
"""

from ._harness import MAX_PHASE_SECONDS as MAX_PHASE_SECONDS
from ._harness import RECORD_FIELDS as RECORD_FIELDS
from ._harness import SCHEMA_VERSION as SCHEMA_VERSION
from ._harness import STAGES as STAGES
from ._harness import BenchClock as BenchClock
from ._harness import BenchError as BenchError
from ._harness import Clock as Clock
from ._harness import LoadProfile as LoadProfile
from ._harness import Operation as Operation
from ._harness import Record as Record
from ._harness import RecordWriter as RecordWriter
from ._harness import RunConfig as RunConfig
from ._harness import RunSummary as RunSummary
from ._harness import Scenario as Scenario
from ._harness import ScenarioContext as ScenarioContext
from ._harness import ScenarioSession as ScenarioSession
from ._harness import SizeDistribution as SizeDistribution
from ._harness import TrioClock as TrioClock
from ._harness import check_parameters as check_parameters
from ._harness import environment_metadata as environment_metadata
from ._harness import make_record as make_record
from ._harness import new_run_id as new_run_id
from ._harness import read_records as read_records
from ._harness import run_benchmark as run_benchmark
from ._scenarios import SCENARIOS as SCENARIOS
from ._scenarios import load_scenario as load_scenario

__all__ = [
    "MAX_PHASE_SECONDS",
    "RECORD_FIELDS",
    "SCENARIOS",
    "SCHEMA_VERSION",
    "STAGES",
    "BenchClock",
    "BenchError",
    "Clock",
    "LoadProfile",
    "Operation",
    "Record",
    "RecordWriter",
    "RunConfig",
    "RunSummary",
    "Scenario",
    "ScenarioContext",
    "ScenarioSession",
    "SizeDistribution",
    "TrioClock",
    "check_parameters",
    "environment_metadata",
    "load_scenario",
    "make_record",
    "new_run_id",
    "read_records",
    "run_benchmark",
]
