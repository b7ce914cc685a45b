"""Writing and reading record files: ``run-<id>.records.jsonl`` plus ``run-<id>.meta.json``.

Theory of operation: records go to ``run-<id>.records.jsonl.part`` in batches; :meth:`RecordWriter.finish`
fsyncs, writes the meta file (``.part`` then rename) and renames the records file into place, so a reader
never sees a run in progress. A line is produced from a template with the field names filled in once, which
is about 3x faster than ``json.dumps`` of a dict and gives the same bytes. :meth:`RecordWriter.add` hands full
batches to a worker thread so that a benchmark's Trio loop is not blocked by disk writes.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, final

import trio

from ._schema import (
    DUPLICATE_KEY,
    MAX_ERROR_CHARS,
    RECORD_FIELDS,
    STAGES,
    Record,
    RecordError,
    check_run_id,
    duplicate_problem,
    error_text,
    parse_line,
)

__all__ = ["FLUSH_BATCH_RECORDS", "RecordWriter", "json_line", "make_record", "new_run_id", "read_records"]

#: Records are flushed to disk (in a worker thread) in batches of this many.
FLUSH_BATCH_RECORDS: Final = 8192

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_LINE_TEMPLATE: Final = "{{" + ",".join(f'"{f}":{{}}' for f in RECORD_FIELDS) + "}}\n"
_ERROR_AT: Final = RECORD_FIELDS.index("error")


def json_line(values: tuple[Any, ...]) -> str:
    """One record line (with its newline) from values in ``RECORD_FIELDS`` order; equals ``json.dumps``.

    An ``error`` text longer than :data:`MAX_ERROR_CHARS` is cut to it (:func:`error_text`), however the
    record came (a :class:`Record` built directly, :meth:`RecordWriter.add_values`): readers refuse longer.
    """
    error = values[_ERROR_AT]
    if error is not None and len(error) > MAX_ERROR_CHARS:
        values = (*values[:_ERROR_AT], error_text(error), *values[_ERROR_AT + 1 :])
    return _LINE_TEMPLATE.format(
        *("null" if v is None else (_dumps(v) if isinstance(v, str) else str(v)) for v in values)
    )


def make_record(
    *,
    run_id: str,
    scenario: str,
    link: str,
    size_bytes: int,
    seq: int,
    intended_ns: int,
    stages: Mapping[str, int | None],
    error: BaseException | str | None = None,
) -> Record:
    """Build a record from a ``{stage: ns}`` mapping (stage names from ``STAGES``).

    ``error`` (an exception or text) marks the operation failed.

    Raises:
        RecordError: an unknown stage name.
    """
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise RecordError(f"unknown stage(s) {sorted(unknown)}; stages are {STAGES}")
    return Record(
        run_id=run_id,
        scenario=scenario,
        link=link,
        size_bytes=size_bytes,
        seq=seq,
        intended_ns=intended_ns,
        **{f"{s}_ns": v for s, v in stages.items()},
        outcome="ok" if error is None else "error",
        error=None if error is None else error_text(error),
    )


def new_run_id(scenario: str, *, now: datetime | None = None) -> str:
    """A sortable, unique run id: ``<UTC yyyymmddThhmmss>-<scenario>-<6 hex>``."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", scenario)[:30]
    return f"{stamp}-{slug}-{uuid.uuid4().hex[:6]}"


@final
class RecordWriter:
    """Writes one run's records (JSON lines) and its meta file into ``out_dir``.

    Use :meth:`add` from a Trio task (it flushes batches in a worker thread), :meth:`add_sync` from plain
    code, :meth:`add_values` on a hot path (a tuple in ``RECORD_FIELDS`` order; flush with
    :meth:`flush_batch` when :meth:`batch_ready`). :meth:`finish` publishes the run; :meth:`abort` removes it.

    Raises:
        RecordError: (constructor) a bad run id, an unwritable directory, or a run that already exists.
    """

    def __init__(self, out_dir: Path, run_id: str) -> None:
        self.run_id = check_run_id(run_id)
        self.out_dir = Path(out_dir)
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = "it is a file" if self.out_dir.is_file() else (exc.strerror or str(exc))
            raise RecordError(f"cannot create output directory {self.out_dir}: {why}") from exc
        self.records_path = self.out_dir / f"run-{run_id}.records.jsonl"
        self.meta_path = self.out_dir / f"run-{run_id}.meta.json"
        if self.records_path.exists() or self.meta_path.exists():
            raise RecordError(f"run {run_id} already exists in {self.out_dir}")
        self._part_path = self.records_path.with_name(self.records_path.name + ".part")
        try:
            self._file = self._part_path.open("w", encoding="utf-8")
        except OSError as exc:
            raise RecordError(f"cannot write {self._part_path}: {exc}") from exc
        self._pending: list[tuple[Any, ...]] = []
        self.count = 0

    async def add(self, record: Record) -> None:
        """Queue a record; every :data:`FLUSH_BATCH_RECORDS` the batch is written in a worker thread."""
        self.add_values(record.values())
        if self.batch_ready():
            await self.flush_batch()

    def add_sync(self, record: Record) -> None:
        """Queue a record from non-async code (written on the next batch boundary or at :meth:`finish`)."""
        self.add_values(record.values())
        if self.batch_ready():
            batch, self._pending = self._pending, []
            self._write(batch)

    def add_values(self, values: tuple[Any, ...]) -> None:
        """Queue one record as a tuple in ``RECORD_FIELDS`` order (the harness's cheap path)."""
        self._pending.append(values)
        self.count += 1

    def batch_ready(self) -> bool:
        """Whether a full batch is waiting to be written."""
        return len(self._pending) >= FLUSH_BATCH_RECORDS

    async def flush_batch(self) -> None:
        """Write what is queued, in a worker thread."""
        batch, self._pending = self._pending, []
        if batch:
            await trio.to_thread.run_sync(self._write, batch)

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        self._file.write("".join(map(json_line, batch)))

    def finish(self, meta: Mapping[str, Any]) -> None:
        """Flush, fsync, write ``run-<id>.meta.json`` and publish the records file.

        Raises:
            OSError: writing failed (a full disk): nothing of the run is left behind, no ``.part`` either.
        """
        tmp = self.meta_path.with_name(self.meta_path.name + ".part")
        try:
            self._write(self._pending)
            self._pending = []
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            meta_text = json.dumps(dict(meta), indent=2, sort_keys=True, default=str) + "\n"
            tmp.write_text(meta_text, encoding="utf-8")
            os.replace(self._part_path, self.records_path)
        except BaseException:
            self.abort()
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.meta_path)

    def abort(self) -> None:
        """Discard the run: close and delete the partial records file."""
        if not self._file.closed:
            try:
                self._file.close()
            except OSError:
                pass  # (a full disk: what it could not flush is discarded with the file)
        self._part_path.unlink(missing_ok=True)


def read_records(path: Path) -> Iterator[Record]:
    """Read and validate a records file (JSON lines, writer's form), each line as the report reads it
    (:func:`~corda_trio.records.parse_line`; lines end at LF, CR or CRLF, as Spark's text reader splits them).

    A record repeated with every field equal is yielded once; one operation (``DUPLICATE_KEY``) recorded
    twice with other values is a bad line (the reader keeps the key of every record it yielded: memory grows
    with the file).

    Raises:
        RecordError: ``FILE:LINE: what is wrong`` for the first bad line.
    """
    seen: dict[tuple[Any, ...], tuple[int, tuple[Any, ...]]] = {}  # key -> (line, values)
    key_at = [RECORD_FIELDS.index(f) for f in DUPLICATE_KEY]
    # surrogateescape: a line that is not UTF-8 is named by its number instead of failing the whole read
    with Path(path).open(encoding="utf-8", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip(" \t\r\n"):
                continue
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:
                raise RecordError(f"{path}:{lineno}: the line is not valid UTF-8") from None
            try:
                record = Record.from_mapping(parse_line(line.rstrip("\r\n")))
            except RecordError as exc:
                raise RecordError(f"{path}:{lineno}: {exc}") from exc
            values = record.values()
            key = tuple(values[i] for i in key_at)
            first = seen.setdefault(key, (lineno, values))
            if first[0] == lineno:
                yield record
            elif first[1] != values:
                raise RecordError(f"{path}:{lineno}: {duplicate_problem(key, [f'{path}:{first[0]}'])}")
