"""The benchmark record schema: fields, types, value rules and version, in one table (PURE).

Theory of operation
===================

A *record* is one measured operation (``protocol_spec/bench-records.md``). Its fields are listed once, in
:data:`FIELDS`, each a :class:`FieldRule` that says the field's kind (``string`` or ``long``), whether it must
have a value, and the rules its value obeys (minimum, maximum, non-empty, one of a few choices). Two readers
interpret the same table:

* :func:`record_problem` checks one decoded JSON object in Python (the writer's own records, ``read_records``,
  and the report when it explains a bad line); :func:`parse_line` decodes a line for it, strictly: one JSON
  object and nothing after it, no key twice, no ``NaN`` / ``Infinity`` (Python's ``json`` accepts the last
  two and keeps the last of a repeated key);
* the report (``spark_reports``) turns every rule into a Spark column expression and checks all records in
  the cluster, so the driver only ever holds counts and the first few offending lines.

A record line written by :class:`~corda_trio.records.RecordWriter` always has every data field (stages that do
not apply are ``null``); a reader treats an absent optional field as ``null``. The optional
``schema_version`` field, when a producer tags its lines, must be a version this code knows
(:data:`KNOWN_SCHEMA_VERSIONS`); the run's meta file carries the version too.

This module is pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, final

import attrs

__all__ = [
    "DUPLICATE_KEY",
    "FIELDS",
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
    "FieldRule",
    "Record",
    "RecordError",
    "check_run_id",
    "duplicate_problem",
    "error_text",
    "meta_problem",
    "parse_line",
    "record_problem",
    "unknown_fields_problem",
]

#: Version of the record / meta format; bump on an incompatible change and add it to the known versions.
SCHEMA_VERSION: Final = 1
#: Versions a reader accepts.
KNOWN_SCHEMA_VERSIONS: Final = frozenset({1})
#: The optional per-record version field (absent: the version of the run's meta file, i.e. 1 today).
VERSION_FIELD: Final = "schema_version"
#: The stages an operation may pass through, in order. Scenarios stamp the ones they have.
STAGES: Final = ("created", "enqueued", "sent", "accepted", "delivered", "flow_finished")
STAGE_FIELDS: Final = tuple(f"{s}_ns" for s in STAGES)
OUTCOMES: Final = ("ok", "error")
#: Error strings are cut to this many characters (a record is a measurement, not a log).
MAX_ERROR_CHARS: Final = 200
#: A payload larger than 1 TiB is a mistake, not a measurement (it also keeps byte totals within 64 bits).
MAX_SIZE_BYTES: Final = 1 << 40
#: ``run_id`` of every record and meta file (it names files, so no separators); the whole id must match.
RUN_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$"
#: Two records with equal values of these fields are the same operation. A reader keeps one copy of a record
#: repeated with every field equal (counted as a duplicate); records of one operation that differ in any
#: other field are all bad (:func:`duplicate_problem`): which of them is the measurement cannot be told.
#: (``seq`` is unique per run for the harness; the p2p demo numbers each link from 0, hence ``link``.)
DUPLICATE_KEY: Final = ("run_id", "scenario", "link", "seq")


class RecordError(Exception):
    """A record, a run id or a records file breaks the format (the message names the field or line)."""


@final
@attrs.frozen(kw_only=True)
class FieldRule:
    """One field of a record and the rules its value obeys.

    Attributes:
        name: the JSON key / column name.
        kind: ``"string"`` or ``"long"`` (a JSON integer; booleans and floats are not integers).
        required: the field must have a non-null value.
        min_value: ``long`` fields: the smallest allowed value.
        max_value: ``long`` fields: the largest allowed value (``None``: up to 2**63 - 1).
        non_empty: ``string`` fields: the empty string is not allowed.
        max_chars: ``string`` fields: the most characters (code points) a value may have.
        pattern: ``string`` fields: a regular expression the *whole* value must match (Python
            ``re.fullmatch``; the report's Spark check anchors it as ``\\A(?:pattern)\\z``, so a ``$`` in it
            does not let a trailing newline through on either side).
        choices: ``string`` fields: the only allowed values.
    """

    name: str
    kind: Literal["string", "long"]
    required: bool
    min_value: int | None = None
    max_value: int | None = None
    non_empty: bool = False
    max_chars: int | None = None
    pattern: str | None = None
    choices: tuple[str, ...] | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` for this field (``None``: nothing; a ``None`` value is null)."""
        if value is None:
            return f"required field {self.name} is missing or null" if self.required else None
        if self.kind == "string":
            if not isinstance(value, str):
                return f"field {self.name} must be a string, not {_json_type(value)}"
            if self.non_empty and not value:
                return f"field {self.name} must not be empty"
            if self.max_chars is not None and len(value) > self.max_chars:
                return f"field {self.name} must be at most {self.max_chars} characters, not {len(value):,}"
            if self.pattern is not None and re.fullmatch(self.pattern, value) is None:
                return f"field {self.name} must match {self.pattern}, not {_shown(value)}"
            if self.choices is not None and value not in self.choices:
                return f"field {self.name} must be one of {', '.join(self.choices)}, not {_shown(value)}"
            return None
        if not _is_int(value):
            return f"field {self.name} must be an integer, not {_json_type(value)}"
        if self.min_value is not None and value < self.min_value:
            return f"field {self.name} must be >= {self.min_value}, not {value}"
        if self.max_value is not None and value > self.max_value:
            return f"field {self.name} must be <= {self.max_value}, not {value}"
        if not -(2**63) <= value < 2**63:
            return f"field {self.name} does not fit in 64 bits: {value}"
        return None


#: Every data field of a record, in the order of a record line.
FIELDS: Final = (
    FieldRule(name="run_id", kind="string", required=True, non_empty=True, pattern=RUN_ID_PATTERN),
    FieldRule(name="scenario", kind="string", required=True, non_empty=True),
    FieldRule(name="link", kind="string", required=True, non_empty=True),
    FieldRule(name="size_bytes", kind="long", required=True, min_value=0, max_value=MAX_SIZE_BYTES),
    FieldRule(name="seq", kind="long", required=True, min_value=0),
    FieldRule(name="intended_ns", kind="long", required=True, min_value=0),
    *(FieldRule(name=name, kind="long", required=False, min_value=0) for name in STAGE_FIELDS),
    FieldRule(name="outcome", kind="string", required=True, choices=OUTCOMES),
    FieldRule(name="error", kind="string", required=False, max_chars=MAX_ERROR_CHARS),
)
#: Field names in record-line order.
RECORD_FIELDS: Final = tuple(f.name for f in FIELDS)
REQUIRED_FIELDS: Final = tuple(f.name for f in FIELDS if f.required)
#: Every key a record may have: its data fields and the optional version tag. Any other key is refused (a
#: misspelt ``deliverd_ns`` would otherwise leave ``delivered_ns`` null without a word).
KNOWN_FIELDS: Final = (*RECORD_FIELDS, VERSION_FIELD)
_RUN_ID_RULE: Final = next(f for f in FIELDS if f.name == "run_id")


def record_problem(data: object, *, all_present: bool = False) -> str | None:
    """The first thing wrong with one decoded record (``None`` if it is a valid record).

    Args:
        data: the decoded JSON value of one line.
        all_present: also require every field to be present (the writer's form); readers leave it off and
            treat an absent optional field as null.
    """
    if not isinstance(data, Mapping):
        return f"a record must be a JSON object, not {_json_type(data)}"
    unknown = [k for k in data if k not in KNOWN_FIELDS]
    if unknown:
        return unknown_fields_problem(unknown)
    if all_present:
        missing = [f.name for f in FIELDS if f.name not in data]
        if missing:
            return f"record lacks field(s) {', '.join(missing)}"
    version = data.get(VERSION_FIELD)
    if version is not None and not _is_int(version):
        return f"field {VERSION_FIELD} must be an integer, not {_json_type(version)}"
    if version is not None and version not in KNOWN_SCHEMA_VERSIONS:
        known = ", ".join(map(str, sorted(KNOWN_SCHEMA_VERSIONS)))
        return f"unknown {VERSION_FIELD} {_shown(version)} (this reader knows {known})"
    for rule in FIELDS:
        problem = rule.problem(data.get(rule.name))
        if problem is not None:
            return problem
    if (data.get("outcome") == "error") != (data.get("error") is not None):
        return "a record has an error text iff its outcome is error"
    return None


def unknown_fields_problem(names: Iterable[str]) -> str:
    """The problem of a record with keys that are not fields (:data:`KNOWN_FIELDS`): names sorted by code
    point (the order the report's check has them in)."""
    return f"unknown field(s) {', '.join(sorted(names))}"


def duplicate_problem(key: Iterable[Any], others: Iterable[str], more: int = 0) -> str:
    """The problem of a record whose operation (:data:`DUPLICATE_KEY` values ``key``) has other records with
    other values, at ``others`` (``FILE:LINE``), and ``more`` places not named."""
    run_id, scenario, link, seq = key
    places = ", ".join(others) + (f" and {more:,} more" if more else "")
    return (
        f"the same operation (run {_shown(run_id)}, scenario {_shown(scenario)}, link {_shown(link)}, "
        f"seq {seq}) as {places} with other values"
    )


def parse_line(text: str) -> Any:
    """Decode one record line as strictly as the report reads it.

    A byte order mark at the start of the line is ignored (RFC 8259 section 8.1 lets a parser ignore it, and
    Spark's JSON reader does so on every line). Anything else that is not exactly one JSON value is refused:
    text after it (a second object, a trailing comma), a key repeated within an object (which of the two
    values counts would be up to the parser), ``NaN`` / ``Infinity`` (not JSON).

    Raises:
        RecordError: ``not valid JSON: ...`` naming the problem and where it is.
    """
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        value, end = _DECODER.raw_decode(text, _WS.match(text).end())  # type: ignore[union-attr]
    except _StrictnessError as exc:
        raise RecordError(str(exc)) from None
    except ValueError as exc:  # json.JSONDecodeError
        raise RecordError(f"not valid JSON: {exc}") from None
    except RecursionError:  # deeper than Python's (and Spark's JSON reader's) limit
        raise RecordError("the line is nested too deeply to read") from None
    end = _WS.match(text, end).end()  # type: ignore[union-attr]
    if end != len(text):
        raise RecordError(
            f"not valid JSON: text after the end of the record at column {end + 1}: {_shown(text[end:], 30)}"
        )
    return value


class _StrictnessError(ValueError):
    """Valid to Python's ``json``, refused for a record (raised inside the decoder's hooks)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        repeated = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _StrictnessError(f"key {repeated!r} appears twice in one object")
    return data


def _no_constant(name: str) -> Any:
    raise _StrictnessError(f"{name} is not a JSON number")


class _FloatLiteral(float):
    """A JSON number with a fraction or an exponent, and its text (a problem quotes ``1e2``, not 100.0)."""

    __slots__ = ("literal",)
    literal: str


def _float_literal(text: str) -> float:
    value = _FloatLiteral(text)
    value.literal = text
    return value


_DECODER: Final = json.JSONDecoder(
    object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_float_literal
)
_WS: Final = re.compile(r"[ \t\n\r]*")


def meta_problem(meta: object, file_name: str | None = None) -> str | None:
    """The first thing wrong with a run's meta file (``None`` if the report can use it). ``file_name``: the
    file's name; one named ``run-<id>.meta.json`` (as the writer names them) must hold that ``run_id``."""
    if not isinstance(meta, Mapping):
        return "a meta file must hold a JSON object"
    if not isinstance(meta.get("run_id"), str) or not meta["run_id"]:
        return "the meta file has no run_id"
    problem = _RUN_ID_RULE.problem(meta["run_id"])
    if problem is not None:
        return problem
    if file_name is not None and file_name.startswith("run-") and file_name.endswith(META_SUFFIX):
        named = file_name[len("run-") : -len(META_SUFFIX)]
        if named != meta["run_id"]:
            return f"field run_id is {_shown(meta['run_id'])}, but the file is named for run {_shown(named)}"
    version = meta.get(VERSION_FIELD, SCHEMA_VERSION)
    if not _is_int(version) or version not in KNOWN_SCHEMA_VERSIONS:
        known = ", ".join(map(str, sorted(KNOWN_SCHEMA_VERSIONS)))
        return f"unknown {VERSION_FIELD} {_shown(version)} (this reader knows {known})"
    return None


#: How a run's meta file name ends: ``run-<id>.meta.json``.
META_SUFFIX: Final = ".meta.json"


def error_text(error: BaseException | str) -> str:
    """The ``error`` field for a failure: ``"<ExceptionType>: <message>"``, cut to :data:`MAX_ERROR_CHARS`."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return text[:MAX_ERROR_CHARS]


def check_run_id(run_id: str) -> str:
    """``run_id`` if the whole of it matches :data:`RUN_ID_PATTERN` (the rule of a record's ``run_id``);
    raises :class:`RecordError` otherwise."""
    if re.fullmatch(RUN_ID_PATTERN, run_id) is None:
        raise RecordError(f"run id {run_id!r} must match {RUN_ID_PATTERN}")
    return run_id


@final
@attrs.frozen(kw_only=True)
class Record:
    """One measured operation; every field is described in :data:`FIELDS`."""

    run_id: str
    scenario: str
    link: str
    size_bytes: int
    seq: int
    intended_ns: int
    created_ns: int | None = None
    enqueued_ns: int | None = None
    sent_ns: int | None = None
    accepted_ns: int | None = None
    delivered_ns: int | None = None
    flow_finished_ns: int | None = None
    outcome: Literal["ok", "error"] = "ok"
    error: str | None = None

    def values(self) -> tuple[Any, ...]:
        """The field values in :data:`RECORD_FIELDS` order."""
        return tuple(getattr(self, f) for f in RECORD_FIELDS)

    def to_json_line(self) -> str:
        """The record as one JSON line (no trailing newline), fields in :data:`RECORD_FIELDS` order."""
        return json.dumps(attrs.asdict(self, recurse=False), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Record:
        """Validate one decoded record line (in the writer's form: every field present) and build it.

        Stages are not required to be in order: different tasks or processes stamp them (``sent`` is stamped
        when ``send_all`` returns, which can be after the receiver stamped ``delivered``).

        Raises:
            RecordError: naming the missing field or the field whose value breaks its rule.
        """
        problem = record_problem(data, all_present=True)
        if problem is not None:
            raise RecordError(problem)
        return cls(**{f: data[f] for f in RECORD_FIELDS})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):  # (``1e2`` too: JSON has one number type, but a record's are integers)
        return f"a floating-point number ({getattr(value, 'literal', None) or repr(value)})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


#: Characters at most of a value from the input quoted in a problem (:func:`_shown`).
SHOWN_VALUE_CHARS: Final = 40
#: What stands for the rest of a text too long to quote whole, inside its quotes.
SHOWN_ELLIPSIS: Final = "..."


def _shown(value: object, limit: int = SHOWN_VALUE_CHARS) -> str:
    """``value`` as the problem quotes it: its ``repr``, at most ``limit`` characters. A longer text is cut
    at a character, not in its ``repr``, so it keeps both quotes and says it goes on: ``'O=Alice, L=...'``
    (cutting the ``repr`` lost the closing quote, and a reader could not tell where the value ended); a
    longer array or object is named by its type and size."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        keep = limit - len(SHOWN_ELLIPSIS) - 2
        while keep > 0 and len(repr(value[:keep])) + len(SHOWN_ELLIPSIS) > limit:  # escapes take more room
            keep -= 1
        cut = repr(value[:keep])
        return cut[:-1] + SHOWN_ELLIPSIS + cut[-1]
    if isinstance(value, Mapping | list):
        return f"{_json_type(value)} of {len(value):,} {'key' if isinstance(value, Mapping) else 'item'}(s)"
    return text[: limit - len(SHOWN_ELLIPSIS)] + SHOWN_ELLIPSIS
