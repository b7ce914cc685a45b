"""The store's part list (``parts.json``): a queue or keyed log the store created that is gone or emptied
stops the open, before anything in the directory is changed; crashes between the steps of creating and
deleting a part never do; a store without the list (written before it existed) opens and gets one."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from corda_trio import store
from corda_trio.node._cli import main
from corda_trio.store import _record_v1 as v1
from corda_trio.store._segment import segment_path

INBOX = "p2p.inbound.DLme"
OUTBOUND = "internal.peers.DLpeer"
DEDUP = "internal.p2p.dedup.0"
CHECKPOINTS = "flows.checkpoints"


async def _build(root: Path) -> None:
    """A store like a node's: an inbox, an outbound queue holding unsent messages, a dedup generation and
    the checkpoints' keyed log, each with something in it."""
    async with store.open_broker(root) as broker:
        inbox = await broker.declare_queue(INBOX)
        await inbox.enqueue(b"in")
        outbound = await broker.declare_queue(OUTBOUND)
        await outbound.enqueue_many([b"unsent-1", b"unsent-2"])
        await (await broker.declare_queue(DEDUP)).enqueue(b"", headers=b"dedup-id")
        checkpoints = await broker.open_keyed_log(CHECKPOINTS)
        await checkpoints.put(b"flow-1", b"checkpoint")


def _tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every entry under ``root`` with its mtime and, for a file, its content."""
    out: dict[str, tuple[int, bytes | None]] = {str(root): (root.stat().st_mtime_ns, None)}
    for path in sorted(root.rglob("*")):
        content = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        out[str(path.relative_to(root))] = (path.lstat().st_mtime_ns, content)
    return out


def _parts(root: Path) -> dict[str, object]:
    return json.loads((root / store.PARTS_FILE).read_text())


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _remove_directories(root: Path) -> None:
    for entry in os.listdir(root):
        if os.path.isdir(root / entry):
            shutil.rmtree(root / entry)


def _empty(path: Path) -> None:
    for entry in path.iterdir():
        entry.unlink()


DAMAGE: dict[str, tuple[Callable[[Path], None], str, str]] = {
    # name: (what is done to the store, the part reported, the reason)
    "outbound queue deleted": (lambda r: shutil.rmtree(r / OUTBOUND), OUTBOUND, "its directory is gone"),
    "outbound queue emptied": (lambda r: _empty(r / OUTBOUND), OUTBOUND, "its directory is empty"),
    "inbox deleted": (lambda r: shutil.rmtree(r / INBOX), INBOX, "its directory is gone"),
    "dedup generation emptied": (lambda r: _empty(r / DEDUP), DEDUP, "its directory is empty"),
    "keyed/ deleted": (lambda r: shutil.rmtree(r / store.KEYED_DIR), f"keyed/{CHECKPOINTS}", "is gone"),
    "keyed log emptied": (lambda r: _empty(r / "keyed" / CHECKPOINTS), f"keyed/{CHECKPOINTS}", "is empty"),
    # what a crash between a queue's first segment and its manifest leaves (recovery alone would adopt it),
    # but a recorded queue had its manifest: the rest of it went with it
    "manifest and all but an empty segment deleted": (
        lambda r: [
            os.unlink(r / OUTBOUND / "manifest"),
            os.truncate(segment_path(str(r / OUTBOUND), 1), 48),
        ],
        OUTBOUND,
        "its manifest is gone, and every segment but an empty one",
    ),
    "queue directory replaced by a symbolic link": (
        lambda r: [
            shutil.move(r / OUTBOUND, r.parent / "moved"),
            os.symlink(r.parent / "moved", r / OUTBOUND),
        ],
        OUTBOUND,
        "is a symbolic link",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGE))
async def test_a_part_the_store_created_that_is_gone_stops_the_open_and_nothing_is_changed(
    tmp_path: Path, case: str
) -> None:
    root = tmp_path / "store"
    await _build(root)
    damage, part, reason = DAMAGE[case]
    damage(root)
    os.unlink(root / store.LOCK_FILE)  # (the open would create it: it must not, when it refuses)
    (root / ".deleted-internal.peers.DLold-0").mkdir()  # (nor finish a delete)
    before = _tree(root)
    with pytest.raises(store.MissingPartError) as caught:
        async with store.open_broker(root):
            pass
    assert [(p.name, p.path) for p in caught.value.parts] == [(part, str(root / part))]
    assert reason in caught.value.parts[0].reason and reason in str(caught.value)
    assert _tree(root) == before
    # `store check` says the same (exit 1) and changes nothing either
    assert main(["store", "check", str(root)]) == 1
    assert _tree(root) == before


async def test_several_missing_parts_are_all_named_in_one_error(tmp_path: Path) -> None:
    await _build(tmp_path)
    _remove_directories(tmp_path)  # every one: parts.json and broker.lock are left
    with pytest.raises(store.MissingPartError, match="4 parts it created are missing") as caught:
        async with store.open_broker(tmp_path):
            pass
    assert sorted(p.name for p in caught.value.parts) == sorted(
        [DEDUP, OUTBOUND, INBOX, f"keyed/{CHECKPOINTS}"]
    )
    assert "\n" not in str(caught.value)


async def test_the_part_list_follows_creation_and_deletion(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        assert _parts(tmp_path) == {"format": 1, "queues": [], "keyed": []}
        await broker.declare_queue(OUTBOUND)
        await broker.declare_queue("internal.bridge.control", durable=False)  # (no part: in memory only)
        await broker.open_keyed_log(CHECKPOINTS)
        assert _parts(tmp_path) == {"format": 1, "queues": [OUTBOUND], "keyed": [CHECKPOINTS]}
        before = (tmp_path / store.PARTS_FILE).stat().st_mtime_ns
        queue = await broker.declare_queue(OUTBOUND)
        await queue.enqueue(b"x")  # enqueues and declares of a known queue never rewrite the list
        await (await broker.open_keyed_log(CHECKPOINTS)).put(b"k", b"v")
        assert (tmp_path / store.PARTS_FILE).stat().st_mtime_ns == before
        await broker.delete_queue(OUTBOUND)
        assert _parts(tmp_path) == {"format": 1, "queues": [], "keyed": [CHECKPOINTS]}
        await broker.declare_queue(OUTBOUND)  # the same name again: a new, empty queue, recorded again
    async with store.open_broker(tmp_path) as broker:
        assert broker.list_queues() == [OUTBOUND]
    assert _parts(tmp_path)["queues"] == [OUTBOUND]
    assert sorted(os.listdir(tmp_path)) == [store.LOCK_FILE, OUTBOUND, "keyed", store.PARTS_FILE]


async def test_crashes_between_the_steps_of_creating_or_deleting_a_part_still_open(tmp_path: Path) -> None:
    await _build(tmp_path)
    recorded = store.read_part_list(str(tmp_path))
    assert recorded is not None
    # Created, and the crash came before it was recorded: it is recorded now (with what it holds).
    store.write_part_list(str(tmp_path), recorded.without([OUTBOUND, f"keyed/{CHECKPOINTS}"]))
    # Deleted (renamed away, the delete's commit point), and the crash came before the list was written.
    os.rename(tmp_path / DEDUP, tmp_path / f".deleted-{DEDUP}-0")
    # A replacement of the list cut short leaves its temporary file.
    (tmp_path / f".{store.PARTS_FILE}.tmp-12345").write_text('{"format": 1, "que')
    async with store.open_broker(tmp_path) as broker:
        assert broker.list_queues() == [OUTBOUND, INBOX]
        assert [m.payload async for m in broker.get_queue(OUTBOUND).browse()] == [b"unsent-1", b"unsent-2"]
        assert (await broker.open_keyed_log(CHECKPOINTS)).get(b"flow-1") == b"checkpoint"
    assert _parts(tmp_path) == {"format": 1, "queues": [OUTBOUND, INBOX], "keyed": [CHECKPOINTS]}
    assert sorted(os.listdir(tmp_path)) == sorted(
        [store.LOCK_FILE, OUTBOUND, "keyed", store.PARTS_FILE, INBOX]
    )


async def test_a_store_without_a_part_list_opens_and_gets_one(tmp_path: Path) -> None:
    """A store written before the list existed, with a keyed log in format 1 (no manifest) that is not
    opened: it is recorded, and the next open does not take it for damaged."""
    await _build(tmp_path)
    os.unlink(tmp_path / store.PARTS_FILE)
    v1_log = tmp_path / "keyed" / "old.log"
    v1_log.mkdir()
    buf = bytearray(v1.encode_segment_header(1, 0))
    v1.append_enqueue(buf, 0, 1_700_000_000_000, b"", b"payload")
    _write(segment_path(str(v1_log), 1), bytes(buf))
    for _ in range(2):
        async with store.open_broker(tmp_path) as broker:
            assert broker.list_queues() == [DEDUP, OUTBOUND, INBOX]
        assert _parts(tmp_path) == {
            "format": 1,
            "queues": [DEDUP, OUTBOUND, INBOX],
            "keyed": [CHECKPOINTS, "old.log"],
        }
    # ... unless its owner knows it had one
    os.unlink(tmp_path / store.PARTS_FILE)
    before = _tree(tmp_path)
    with pytest.raises(store.PartListError, match=f"{tmp_path / store.PARTS_FILE}: missing"):
        async with store.open_broker(tmp_path, config=store.BrokerConfig(require_part_list=True)):
            pass
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "Expecting value"),
        ('{"format": 0, "queues": [], "keyed": []}', "not a part list of format 1"),
        ('{"format": true, "queues": [], "keyed": []}', "not a part list of format 1"),  # (format 2: newer)
        ('{"format": 1, "queues": []}', "missing key 'keyed'"),
        ('{"format": 1, "queues": ["../etc"], "keyed": []}', "path separator"),
        ('{"format": 1, "queues": "q", "keyed": []}', "must be lists"),
    ],
)
async def test_a_damaged_part_list_stops_the_open(tmp_path: Path, text: str, reason: str) -> None:
    await _build(tmp_path)
    (tmp_path / store.PARTS_FILE).write_text(text)
    before = _tree(tmp_path)
    with pytest.raises(store.PartListError, match=reason):
        async with store.open_broker(tmp_path):
            pass
    assert _tree(tmp_path) == before
    assert main(["store", "check", str(tmp_path), "--repair"]) == 0
    async with store.open_broker(tmp_path) as broker:
        assert broker.list_queues() == [DEDUP, OUTBOUND, INBOX]


async def test_parts_never_created_are_no_damage(tmp_path: Path) -> None:
    """A queue declared and never written, and no keyed log at all (a node that never ran a flow)."""
    async with store.open_broker(tmp_path) as broker:
        await broker.declare_queue(INBOX)
    async with store.open_broker(tmp_path) as broker:
        assert broker.get_queue(INBOX).statistics().depth == 0
    assert not (tmp_path / "keyed").exists()


def test_parts_json_is_no_queue_name() -> None:
    with pytest.raises(store.InvalidQueueNameError, match="reserved"):
        store.validate_queue_name(store.PARTS_FILE)


async def test_store_check_repair_takes_missing_parts_off_the_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """How an operator resets a part on purpose: delete its directory, ``store check --repair``."""
    await _build(tmp_path)
    shutil.rmtree(tmp_path / "keyed")
    _empty(tmp_path / OUTBOUND)
    assert main(["store", "list", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"keyed/{CHECKPOINTS}: MISSING: {tmp_path / 'keyed' / CHECKPOINTS}: its directory is gone" in out
    assert main(["store", "check", str(tmp_path), "--queue", f"keyed/{CHECKPOINTS}"]) == 1
    out = capsys.readouterr().out
    assert f"MISSING  keyed/{CHECKPOINTS}: " in out and OUTBOUND not in out
    assert await trio.to_thread.run_sync(main, ["store", "compact", str(tmp_path)]) == 1
    assert "2 parts it created are missing" in capsys.readouterr().err
    assert main(["store", "check", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["parts"]
    assert [(m["part"], m["dropped"]) for m in report["missing"]] == [
        (OUTBOUND, False),
        (f"keyed/{CHECKPOINTS}", False),
    ]
    assert main(["store", "check", str(tmp_path), "--repair"]) == 0
    out = capsys.readouterr().out
    assert f"DROPPED  keyed/{CHECKPOINTS}: " in out and f"DROPPED  {OUTBOUND}: " in out and "LOST" in out
    assert main(["store", "check", str(tmp_path)]) == 0
    capsys.readouterr()
    async with store.open_broker(tmp_path) as broker:
        assert broker.get_queue(OUTBOUND).statistics().depth == 0  # a new, empty queue
        assert len(await broker.open_keyed_log(CHECKPOINTS)) == 0
        assert broker.get_queue(INBOX).statistics().depth == 1  # the rest is untouched


async def test_a_recorded_queue_with_records_left_is_salvaged_by_a_repair_not_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its manifest gone (or a directory in its place), a queue whose segments still hold records is
    recovery's to judge: refused as corrupt, and a repair rebuilds it with its messages kept."""
    await _build(tmp_path)
    os.unlink(tmp_path / OUTBOUND / "manifest")
    with pytest.raises(store.CorruptSegmentError, match="manifest missing"):
        async with store.open_broker(tmp_path):
            pass
    assert main(["store", "check", str(tmp_path), "--repair"]) == 0
    assert "DROPPED" not in capsys.readouterr().out
    async with store.open_broker(tmp_path) as broker:
        assert [m.payload async for m in broker.get_queue(OUTBOUND).browse()] == [b"unsent-1", b"unsent-2"]


async def test_a_part_list_of_a_newer_format_is_refused_as_such_and_never_rewritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newer build's part list (format 2) is neither "damaged" nor rebuilt: before, ``store check
    --repair`` wrote a format-1 list over it, and the open refused it as "not the part list the store
    writes"."""
    root = tmp_path / "store"
    await _build(root)
    doc = _parts(root)
    (root / store.PARTS_FILE).write_text(json.dumps({**doc, "format": 2}))
    before = _tree(root)
    expected = (
        f"{root / store.PARTS_FILE}: part list format 2 was written by a newer build of corda-trio (this "
        "build reads format 1 and older); nothing was read or changed: run the newer build on this store"
    )
    with pytest.raises(store.NewerFormatError, match="part list format 2") as caught:
        async with store.open_broker(root):
            pass
    assert str(caught.value) == expected
    capsys.readouterr()
    for args in (["store", "check", str(root), "--repair"], ["store", "list", str(root)]):
        assert main(args) == 1
        assert capsys.readouterr().err == f"corda-trio: error: {expected}\n"
    assert _tree(root) == before
