"""``corda-trio store``: inspect, check, repair and compact durable queues (offline).

* ``store list DIR`` shows each queue with its depth, bytes, segments and oldest message.
* ``store check DIR`` scans every segment and reports torn tails (harmless: the next open truncates
  them) and corruption (exit code 1, naming file and offset): a corrupt record, a sealed segment that
  was cut, a missing segment, a gap in the record sequence, a damaged manifest. Nothing is changed.
* ``store check DIR --repair`` also fixes what it found: torn tails are truncated, and a damaged queue
  is salvaged: damaged segments are copied to ``<queue>/quarantine/``, every record before the damage is
  kept and the survivors are rebuilt into a new segment; the report lists what was lost (the message ids
  found in the lost part, or how many records a gap or a missing segment held and their id range; lost
  enqueues are lost messages, lost acks mean those messages may be delivered again, which receivers
  deduplicate).
* ``store compact DIR`` rewrites segments that hold acked messages, in the queues and the keyed logs (the
  keyed logs are opened first: a damaged one stops the command before anything is compacted, as it stops
  the node). A queue with nothing to reclaim is left
  as it is, and so is a current segment whose acked messages take less room than sealing it adds (its seal
  record and the next segment's header): compacting never makes a queue larger.

A broker directory's part list (``parts.json``: the queues and keyed logs the store created) is checked too:
a part it names that is gone, or whose directory was emptied, is ``MISSING`` (exit code 1; the node refuses to
start). ``--repair`` takes such parts off the list, reporting everything they held as lost, and writes the
list anew from the parts that are there when it is damaged or missing. That is also how an operator resets a
part on purpose: stop the node, delete the part's directory, ``store check DIR --repair``.

``DIR`` is a broker directory (holding one directory per queue) or a single queue directory. The keyed logs
of a broker directory (``keyed/<name>/``: the flow checkpoints) are laid out like queues and are listed,
checked and repaired with them, named ``keyed/<name>`` (``--queue keyed/flows.checkpoints``); a repair
that drops a damaged record loses the checkpoints it held, and says so. The node must not be running: the
commands take the broker's lock and refuse to run while it is held.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
from collections.abc import Iterator
from typing import Any

from corda_trio import store

from ._cli import CliError, path_text, run_trio

__all__ = ["register"]


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``store`` sub-commands."""
    sub = parser.add_subparsers(dest="store_command", metavar="SUBCOMMAND", required=True)

    check = sub.add_parser(
        "check", help="verify the part list and every segment; --repair salvages damaged queues"
    )
    check.add_argument(
        "directory", metavar="DIR", type=path_text, help="broker directory or one queue's directory"
    )
    check.add_argument(
        "--repair",
        action="store_true",
        help="truncate torn tails, salvage damaged queues, take missing parts off the part list (what they "
        "held is lost), write a damaged or absent part list anew",
    )
    check.add_argument("--queue", help="only this queue (when DIR is a broker directory)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=_check)

    listing = sub.add_parser("list", help="list queues with depth, bytes and oldest message")
    listing.add_argument(
        "directory", metavar="DIR", type=path_text, help="broker directory (of a stopped node)"
    )
    listing.add_argument("--prefix", default="", help="only queues whose name starts with this")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=_list)

    compact = sub.add_parser(
        "compact",
        help="reclaim the space of acked messages (a queue with nothing to reclaim is left as it is)",
    )
    compact.add_argument("directory", metavar="DIR", type=path_text, help="broker directory")
    compact.add_argument("--queue", help="only this queue (a keyed log: keyed/<name>)")
    compact.set_defaults(func=_compact)


def _queue_dirs(directory: str, only: str | None) -> tuple[str, list[tuple[str, str]]]:
    """(broker root, [(queue name, queue dir)]) for DIR, which may be a broker or a queue directory."""
    if not os.path.isdir(directory):
        raise CliError(f"{directory}: {_not_a_directory(directory)}", 2)
    kind = store.store_kind(directory)
    if kind is None:
        raise CliError(
            f"{directory}: not a store directory (no broker.lock and no queue segments in it)"
            f"{_node_store_hint(directory)}",
            1,
        )
    if kind == "queue":
        name = os.path.basename(os.path.normpath(directory))
        if only is not None and only != name:
            raise CliError(f"{directory} is the directory of queue {name!r}, not of {only!r}", 2)
        _refuse_newer_format(lambda: store.check_queue_format(directory))
        return os.path.dirname(os.path.abspath(directory)), [(name, directory)]
    queues = [(name, os.path.join(directory, name)) for name in store.list_root(directory)[0]]
    # the keyed logs (flow checkpoints) are laid out like queues, under keyed/: checked the same way
    queues += [
        (f"{store.KEYED_DIR}/{name}", os.path.join(directory, store.KEYED_DIR, name))
        for name in store.list_keyed(directory)
    ]
    if only is not None:
        queues = [(name, full) for name, full in queues if name == only]
    if only is not None and not queues and not _recorded(directory, only):
        raise CliError(f"{directory}: no queue named {only!r}", 1)
    _refuse_newer_format(lambda: store.check_store_format(directory))
    return directory, queues


def _refuse_newer_format(check: Any) -> None:
    """Run ``check``; a store (or queue) a newer build wrote is one line, exit 1, before anything is read
    further or changed (``--repair`` would take the newer records for damage and drop them)."""
    try:
        check()
    except store.NewerFormatError as exc:
        raise CliError(str(exc), 1) from None


def _recorded(root: str, name: str) -> bool:
    """Whether the part list of broker directory ``root`` names ``name`` (a readable list, that is)."""
    try:
        parts = store.read_part_list(root)
    except store.PartListError:
        return False
    return parts is not None and name in parts.names()


def _check_parts(root: str, only: str | None, *, repair: bool) -> tuple[dict[str, Any], list[str]]:
    """Check (and with ``repair`` mend) the part list of broker directory ``root``: (its JSON report, the
    names of the missing parts, which the queue checks skip)."""
    path = os.path.join(root, store.PARTS_FILE)
    report: dict[str, Any] = {"file": path, "status": "ok", "missing": []}
    try:
        parts = store.read_part_list(root)
    except store.PartListError as exc:
        report.update(status="corrupt", reason=exc.reason)
        parts = None
    else:
        report["status"] = "ok" if parts is not None else "absent"
    missing = [] if parts is None else store.find_missing_parts(root, parts)
    missing = [m for m in missing if only is None or m.name == only]
    report["missing"] = [
        {"part": m.name, "path": m.path, "reason": m.reason, "dropped": repair} for m in missing
    ]
    if repair and missing:
        assert parts is not None
        store.write_part_list(root, parts.without(m.name for m in missing))
    if repair and report["status"] != "ok":
        queues, _strays = store.list_root(root)
        store.write_part_list(
            root, store.PartList(queues=frozenset(queues), keyed=frozenset(store.list_keyed(root)))
        )
        report["status"] = "rebuilt"
    return report, [m.name for m in missing]


def _print_parts(report: dict[str, Any], root: str) -> None:
    for m in report["missing"]:
        if m["dropped"]:
            print(f"DROPPED  {m['part']}: {m['path']}: {m['reason']}")
            print(f"{'':9}LOST: everything it held; taken off the part list (the node starts without it)")
        else:
            print(
                f"MISSING  {m['part']}: {m['path']}: {m['reason']} (the store created it: {report['file']})"
            )
            print(
                f"{'':9}restore it, or run again with --repair to take it off the part list (what it held "
                "is lost)"
            )
    if report["status"] == "corrupt":
        print(f"CORRUPT  {store.PARTS_FILE}: {report['file']}: {report['reason']}")
        print(f"{'':9}run again with --repair to write it anew from the parts that are there")
    elif report["status"] == "absent":
        print(f"{'':9}no part list ({report['file']}): the store is given one when it is next opened")
    elif report["status"] == "rebuilt":
        print(
            f"REBUILT  {store.PARTS_FILE}: {report['file']} now lists the parts in {root} (a part deleted "
            "before cannot be told any more)"
        )


def _unit(name: str) -> str:
    """What a log holds: a queue messages, a keyed log the records that hold its latest entries."""
    return "live records" if name.startswith(f"{store.KEYED_DIR}/") else "messages"


def _node_store_hint(directory: str) -> str:
    """When ``directory`` is a node's base directory (it holds node.toml), where that node's store is: the
    commands take the store directory, and a node's directory is the one an operator has at hand."""
    if not os.path.isfile(os.path.join(directory, "node.toml")):
        return ""
    from ._config import ConfigError, load_node_config

    try:
        store_dir = load_node_config(os.path.join(directory, "node.toml")).store_directory
    except (ConfigError, OSError):
        return "; it is a node's directory: give its store directory ([store] directory in node.toml)"
    return f"; it is a node's directory: its store is {store_dir}"


def _not_a_directory(path: str) -> str:
    return "not a directory (a file)" if os.path.exists(path) else "no such directory"


def _in_use(exc: BaseException) -> CliError:
    """The one line every store command refuses a store another process holds with: the lock's own
    words (the directory and the holder's pid, state and command, when /proc tells them) and what to do."""
    return CliError(f"{exc}: stop it first", 1)


@contextlib.contextmanager
def _offline(root: str, *, write: bool) -> Iterator[None]:
    """Lock the broker directory so that no node opens it meanwhile: shared and read-only to read
    (works for a read-only user), exclusive to change anything."""
    try:
        fd = store.lock_directory(root, exclusive=write)
    except store.BrokerLockedError as exc:
        raise _in_use(exc) from None
    except PermissionError as exc:
        raise CliError(f"{root}: {exc.strerror}", 1) from None
    try:
        yield
    finally:
        os.close(fd)


def _close(recovered: Any) -> None:
    for state in recovered.segments:
        if state.fd >= 0:
            os.close(state.fd)
            state.fd = -1


def _ids(ids: tuple[int, ...]) -> str:
    if not ids:
        return "none"
    shown = ", ".join(str(i) for i in ids[:20])
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > 20 else "")


def _check(args: argparse.Namespace) -> int:
    root, queues = _queue_dirs(args.directory, args.queue)
    mode = store.RecoveryMode.REPAIR if args.repair else store.RecoveryMode.CHECK
    failures = 0
    results: list[dict[str, Any]] = []
    parts: dict[str, Any] | None = None
    with _offline(root, write=args.repair):
        if store.store_kind(root) == "broker" and os.path.abspath(root) == os.path.abspath(args.directory):
            try:
                parts, missing = _check_parts(root, args.queue, repair=args.repair)
            except OSError as exc:
                raise CliError(f"cannot check {exc.filename or root}: {exc.strerror}", 1) from None
            if not args.repair:
                failures += len(missing) + (parts["status"] == "corrupt")
            queues = [(name, qdir) for name, qdir in queues if name not in missing]
            if not args.json:
                _print_parts(parts, root)
        for name, qdir in queues:
            entry: dict[str, Any] = {"queue": name, "directory": qdir}
            try:
                recovered = store.recover_queue(qdir, mode)
            except store.CorruptSegmentError as exc:
                failures += 1
                entry.update(status="corrupt", path=exc.path, offset=exc.offset, reason=exc.reason)
                results.append(entry)
                if not args.json:
                    print(f"CORRUPT  {name}: {exc.path} at offset {exc.offset}: {exc.reason}")
                    print(f"{'':9}run again with --repair to salvage the queue (it reports what is lost)")
                continue
            except OSError as exc:
                raise CliError(f"cannot check {exc.filename or qdir}: {exc.strerror}", 1) from None
            _close(recovered)
            report = recovered.report
            entry.update(
                status="repaired" if report.repairs else "ok",
                messages=report.live_messages,
                bytes=report.live_bytes,
                segments=report.segments,
                next_id=report.next_id,
                stale_acks=report.stale_acks,
                removed_files=list(report.removed_files),
                stray_files=list(report.stray_files),
                format_version=report.found_format,
            )
            if report.torn_tail is not None:
                t = report.torn_tail
                entry["torn_tail"] = {
                    "path": t.path,
                    "offset": t.offset,
                    "bytes": t.dropped_bytes,
                    "reason": t.reason,
                    "claimed_id": t.claimed_id,
                }
            entry["repairs"] = [
                {
                    "path": r.path, "offset": r.offset, "reason": r.reason,
                    "quarantined_as": r.quarantined_as, "kept_bytes": r.kept_bytes,
                    "lost_enqueue_ids": list(r.lost.enqueue_ids),
                    "lost_ack_ids": list(r.lost.ack_ids), "unreadable_bytes": r.lost.unreadable_bytes,
                    "dropped_bytes": r.lost.dropped_bytes, "damaged_record_claims_id": r.lost.damaged_id,
                    "missing_records": r.lost.missing_records,
                    "lost_id_range": list(r.lost.id_range) if r.lost.id_range else None,
                }
                for r in report.repairs
            ]  # fmt: skip
            results.append(entry)
            if args.json:
                continue
            status = "REPAIRED" if report.repairs else "OK"
            print(f"{status:<8} {name}: {report.live_messages} {_unit(name)}, {report.segments} segments")
            if report.found_format == 1:
                verb = "migrated to" if args.repair else "is migrated to"
                print(f"{'':9}written in store format version 1: {verb} version 2 when it is opened")
            if report.torn_tail is not None:
                t = report.torn_tail
                verb = "truncated" if args.repair else "will be truncated on the next open"
                print(f"{'':9}torn tail {verb}: {t.path} at offset {t.offset}, {t.dropped_bytes} bytes")
                print(f"{'':9}({t.reason})")
                if t.claimed_id is not None:
                    claim = f"the cut record claims message id {t.claimed_id}"
                    print(f"{'':9}({claim}: it was never acknowledged; the id is not reused)")
            for path in report.removed_files:
                verb = "removed" if args.repair else "found"
                print(f"{'':9}leftover of an interrupted compaction {verb}: {path}")
            for r in report.repairs:
                if not r.quarantined_as:  # nothing left to quarantine: a gap, a missing file, a cut
                    print(f"{'':9}{r.path} at offset {r.offset}: {r.reason}")
                    if r.lost.missing_records:
                        print(f"{'':9}LOST: {r.lost.missing_records} records (enqueues or acks)")
                    if r.lost.id_range is not None:
                        lo, hi = r.lost.id_range
                        print(f"{'':9}their message ids lie in {lo}..{hi} (messages there may be lost or "
                              "delivered again)")  # fmt: skip
                    continue
                print(f"         corrupt record in {r.path} at offset {r.offset}: {r.reason}")
                print(
                    f"         quarantined a copy as {r.quarantined_as}; kept the first {r.kept_bytes} bytes"
                )
                print(f"{'':9}dropped {r.lost.dropped_bytes} bytes from offset {r.offset}")
                if r.lost.damaged_id is not None:
                    claim = f"the damaged record's header claims message id {r.lost.damaged_id}"
                    print(f"{'':9}{claim} (LOST if it was one)")
                print(f"         LOST messages (enqueues): {_ids(r.lost.enqueue_ids)}")
                print(f"         lost acks (these messages may be delivered again): {_ids(r.lost.ack_ids)}")
                if r.lost.unreadable_bytes:
                    print(f"{'':9}{r.lost.unreadable_bytes} unreadable bytes matched no record")
            for stray in report.stray_files:
                print(f"{'':9}not written by the store, left alone: {os.path.join(qdir, stray)}")
    strays = _strays(args.directory) if args.queue is None else []
    if args.json:
        doc = {"queues": results, "corrupt": failures, "not_queues": strays, "parts": parts}
        print(json.dumps(doc, indent=2))
        return 1 if failures else 0
    for stray in strays:
        print(f"{'':9}not a queue, left alone: {stray}")
    if not queues and not (parts and parts["missing"]):
        print(f"no queues in {args.directory}")
    return 1 if failures else 0


def _strays(directory: str) -> list[str]:
    """Entries of a broker directory that are neither queues nor the store's own files (reported, kept)."""
    if store.store_kind(directory) != "broker":
        return []
    return [os.path.join(directory, entry) for entry in store.list_root(directory)[1]]


def _list(args: argparse.Namespace) -> int:
    root, queues = _queue_dirs(args.directory, None)
    rows = []
    with _offline(root, write=False):
        if store.store_kind(root) == "broker" and os.path.abspath(root) == os.path.abspath(args.directory):
            parts, missing = _check_parts(root, None, repair=False)
            queues = [(name, qdir) for name, qdir in queues if name not in missing]
            if parts["status"] == "corrupt":
                rows.append({"queue": store.PARTS_FILE, "error": f"{parts['file']}: {parts['reason']}"})
            rows += [
                {"queue": m["part"], "error": f"MISSING: {m['path']}: {m['reason']}"}
                for m in parts["missing"]
                if m["part"].startswith(args.prefix)
            ]
        for name, qdir in queues:
            if not name.startswith(args.prefix):
                continue
            try:
                recovered = store.recover_queue(qdir, store.RecoveryMode.CHECK)
            except store.CorruptSegmentError as exc:
                rows.append({"queue": name, "error": str(exc)})
                continue
            except OSError as exc:  # unreadable: say which file, never a traceback
                rows.append({"queue": name, "error": f"cannot read {exc.filename or qdir}: {exc.strerror}"})
                continue
            oldest = None
            if recovered.live:
                first = next(iter(recovered.live.values()))
                ts_ms = store.unpack_location(first)[4]
                oldest = datetime.datetime.fromtimestamp(ts_ms / 1000, datetime.UTC).isoformat()
            disk = sum(s.size for s in recovered.segments)
            rows.append(
                {
                    "queue": name, "messages": recovered.report.live_messages,
                    "bytes": recovered.report.live_bytes, "segments": recovered.report.segments,
                    "disk_bytes": disk, "oldest": oldest,
                    "next_id": recovered.next_id,
                }
            )  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no queues in {args.directory}")
    for row in rows:
        if "error" in row:
            print(f"{row['queue']}: {row['error']}")
            continue
        print(
            f"{row['queue']}: {row['messages']} {_unit(row['queue'])}, {row['bytes']} bytes in "
            f"{row['segments']} segments ({row['disk_bytes']} on disk), oldest {row['oldest'] or '-'}"
        )
    return 1 if any("error" in r for r in rows) else 0


def _compact(args: argparse.Namespace) -> int:

    async def run() -> int:
        try:
            async with store.open_broker(args.directory) as broker:
                # the keyed logs (flow checkpoints) too, opened first: opening one recovers it, so a damaged
                # one is refused before anything is compacted, as the node would refuse it, not passed over
                prefix = f"{store.KEYED_DIR}/"
                keyed = {f"{prefix}{k}": log for k, log in (await broker.open_keyed_logs()).items()}
                names = [args.queue] if args.queue else [*broker.list_queues(), *keyed]
                for name in names:
                    try:  # (not `keyed.get(name) or ...`: a keyed log of no live records is falsy)
                        log: store.Queue | store.KeyedLog = (
                            keyed[name] if name in keyed else broker.get_queue(name)
                        )
                    except store.QueueNotFoundError as exc:
                        raise CliError(str(exc), 1) from None
                    before = log.statistics().disk_bytes
                    reclaimed = await log.compact()
                    after = log.statistics().disk_bytes
                    if reclaimed == 0 and after == before:
                        print(f"{name}: {before} bytes, nothing to reclaim (left as it is)")
                    else:
                        print(f"{name}: {before} -> {after} bytes (reclaimed {reclaimed})")
        except store.BrokerLockedError as exc:
            raise _in_use(exc) from None
        except store.NewerFormatError as exc:
            raise CliError(str(exc), 1) from None
        except (store.CorruptSegmentError, store.MissingPartError, store.PartListError) as exc:
            raise CliError(f"{exc}; run 'corda-trio store check --repair' first", 1) from None
        except store.StoreFailedError as exc:  # (a write failed: a directory where a new segment goes, say)
            raise CliError(f"cannot compact: {exc}", 1) from None
        except OSError as exc:
            raise CliError(f"cannot compact: {exc.filename or args.directory}: {exc.strerror}", 1) from None
        return 0

    if not os.path.isdir(args.directory):
        raise CliError(f"{args.directory}: {_not_a_directory(args.directory)}", 2)
    if store.store_kind(args.directory) != "broker":  # never create a store in the wrong place
        raise CliError(
            f"{args.directory}: not a broker directory (no broker.lock in it)"
            f"{_node_store_hint(args.directory)}",
            1,
        )
    return run_trio(run)
