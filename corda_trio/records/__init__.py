"""Benchmark records: the one definition of the record schema, its writer and its validation.

The format is described for readers in ``protocol_spec/bench-records.md``; this package is its code. Producers
(``bench``, ``corda-trio demo --records``) write with :class:`RecordWriter`; the report (``spark_reports``)
checks records against the same :data:`FIELDS` table. ``_schema`` is pure (no I/O, no clock).
"""

from ._clock import BenchClock as BenchClock
from ._clock import Clock as Clock
from ._clock import TrioClock as TrioClock
from ._environment import environment_metadata as environment_metadata
from ._schema import DUPLICATE_KEY as DUPLICATE_KEY
from ._schema import FIELDS as FIELDS
from ._schema import KNOWN_FIELDS as KNOWN_FIELDS
from ._schema import KNOWN_SCHEMA_VERSIONS as KNOWN_SCHEMA_VERSIONS
from ._schema import MAX_ERROR_CHARS as MAX_ERROR_CHARS
from ._schema import MAX_SIZE_BYTES as MAX_SIZE_BYTES
from ._schema import META_SUFFIX as META_SUFFIX
from ._schema import OUTCOMES as OUTCOMES
from ._schema import RECORD_FIELDS as RECORD_FIELDS
from ._schema import REQUIRED_FIELDS as REQUIRED_FIELDS
from ._schema import RUN_ID_PATTERN as RUN_ID_PATTERN
from ._schema import SCHEMA_VERSION as SCHEMA_VERSION
from ._schema import SHOWN_ELLIPSIS as SHOWN_ELLIPSIS
from ._schema import SHOWN_VALUE_CHARS as SHOWN_VALUE_CHARS
from ._schema import STAGE_FIELDS as STAGE_FIELDS
from ._schema import STAGES as STAGES
from ._schema import VERSION_FIELD as VERSION_FIELD
from ._schema import FieldRule as FieldRule
from ._schema import Record as Record
from ._schema import RecordError as RecordError
from ._schema import check_run_id as check_run_id
from ._schema import duplicate_problem as duplicate_problem
from ._schema import error_text as error_text
from ._schema import meta_problem as meta_problem
from ._schema import parse_line as parse_line
from ._schema import record_problem as record_problem
from ._schema import unknown_fields_problem as unknown_fields_problem
from ._writer import FLUSH_BATCH_RECORDS as FLUSH_BATCH_RECORDS
from ._writer import RecordWriter as RecordWriter
from ._writer import json_line as json_line
from ._writer import make_record as make_record
from ._writer import new_run_id as new_run_id
from ._writer import read_records as read_records

__all__ = [
    "DUPLICATE_KEY",
    "FIELDS",
    "FLUSH_BATCH_RECORDS",
    "KNOWN_FIELDS",
    "KNOWN_SCHEMA_VERSIONS",
    "MAX_ERROR_CHARS",
    "MAX_SIZE_BYTES",
    "META_SUFFIX",
    "OUTCOMES",
    "RECORD_FIELDS",
    "REQUIRED_FIELDS",
    "RUN_ID_PATTERN",
    "SCHEMA_VERSION",
    "SHOWN_ELLIPSIS",
    "SHOWN_VALUE_CHARS",
    "STAGES",
    "STAGE_FIELDS",
    "VERSION_FIELD",
    "BenchClock",
    "Clock",
    "FieldRule",
    "Record",
    "RecordError",
    "RecordWriter",
    "TrioClock",
    "check_run_id",
    "duplicate_problem",
    "environment_metadata",
    "error_text",
    "json_line",
    "make_record",
    "meta_problem",
    "new_run_id",
    "parse_line",
    "read_records",
    "record_problem",
    "unknown_fields_problem",
]
