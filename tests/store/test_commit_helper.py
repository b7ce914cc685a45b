"""The commit helper process: its protocol, its failures, and what the broker does when it fails."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest
import trio

from corda_trio import store
from corda_trio.store._committer import CommitHelper
from corda_trio.store._segment import segment_path

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


class _Replies:
    """Collects commit callbacks in the order they were called."""

    def __init__(self) -> None:
        self.results: list[tuple[str, BaseException | None]] = []
        self.changed = trio.Event()

    def callback(self, label: str):  # type: ignore[no-untyped-def]
        def done(error: BaseException | None) -> None:
            self.results.append((label, error))
            self.changed.set()

        return done

    async def wait_for(self, count: int) -> None:
        with trio.fail_after(10):
            while len(self.results) < count:
                self.changed = trio.Event()
                await self.changed.wait()


async def test_writes_are_appended_in_order_and_answered_in_order(tmp_path: Path) -> None:
    target = tmp_path / "log"
    target.write_bytes(b"HEAD")
    helper = await CommitHelper.start()
    replies = _Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(helper.run)
        handle = helper.open(str(target))
        chunks = [bytes([i]) * (1 + 997 * i) for i in range(40)]  # up to 39 KiB: partial sends too
        for i, chunk in enumerate(chunks):
            helper.submit(handle, chunk, sync=i % 3 == 0, done=replies.callback(f"w{i}"))
        await replies.wait_for(len(chunks))
        helper.close(handle)
        await helper.aclose()
    assert replies.results == [(f"w{i}", None) for i in range(len(chunks))]
    assert target.read_bytes() == b"HEAD" + b"".join(chunks)
    assert helper.pid > 0


async def test_a_failed_write_is_reported_and_sticks_to_its_handle_only(tmp_path: Path) -> None:
    helper = await CommitHelper.start()
    replies = _Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(helper.run)
        (tmp_path / "good").write_bytes(b"")
        full = helper.open("/dev/full")  # every write: ENOSPC
        good = helper.open(str(tmp_path / "good"))
        missing = helper.open(str(tmp_path / "no-such-file"))  # the helper never creates files
        helper.submit(full, b"x" * 100, sync=True, done=replies.callback("full"))
        helper.submit(good, b"y", sync=True, done=replies.callback("good"))
        helper.submit(missing, b"z", sync=True, done=replies.callback("missing"))
        helper.submit(full, b"x", sync=False, done=replies.callback("full again"))
        await replies.wait_for(4)
        helper.submit(good, b"z", sync=True, done=replies.callback("good again"))
        await replies.wait_for(5)
        await helper.aclose()
    errors = {label: err.errno if isinstance(err, OSError) else err for label, err in replies.results}
    assert errors == {
        "full": errno.ENOSPC, "good": None, "missing": errno.ENOENT, "full again": errno.ENOSPC,
        "good again": None,
    }  # fmt: skip
    assert isinstance(replies.results[0][1], OSError) and "No space left" in str(replies.results[0][1])
    assert (tmp_path / "good").read_bytes() == b"yz"


async def test_the_helper_ignores_ctrl_c_and_exits_when_its_parent_closes_the_socket(tmp_path: Path) -> None:
    helper = await CommitHelper.start()
    replies = _Replies()
    async with trio.open_nursery() as nursery:
        await nursery.start(helper.run)
        assert os.getpgid(helper.pid) != os.getpgid(0)  # a terminal's Ctrl-C does not reach it
        (tmp_path / "log").touch()
        handle = helper.open(str(tmp_path / "log"))
        helper.submit(handle, b"running, ", sync=True, done=replies.callback("before signals"))
        await replies.wait_for(1)
        os.kill(helper.pid, signal.SIGINT)  # sent to it directly: ignored too
        os.kill(helper.pid, signal.SIGTERM)
        # Both signals are pending before the next request can reach it: answering it proves it survived.
        helper.submit(handle, b"still here", sync=True, done=replies.callback("after signals"))
        await replies.wait_for(2)
        await helper.aclose()
    assert replies.results == [("before signals", None), ("after signals", None)]
    assert (tmp_path / "log").read_bytes() == b"running, still here"
    assert helper._process.returncode == 0


async def test_a_dead_helper_stops_the_queues_and_recovery_keeps_every_acknowledged_message(
    tmp_path: Path,
) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        kept = [await queue.enqueue(b"kept-%d" % i) for i in range(5)]
        helper = broker._helper
        assert helper is not None
        os.kill(helper.pid, signal.SIGKILL)
        with trio.fail_after(10):
            with pytest.raises(store.StoreFailedError, match=r"commit helper process \(pid \d+\) exited"):
                while True:  # the first enqueue may be sent before the death is noticed
                    await queue.enqueue(b"lost?")
        with pytest.raises(store.StoreFailedError):
            await queue.enqueue(b"refused")
        with trio.fail_after(5):  # the broker reports it to its owner (the node stops on it)
            failure = await broker.wait_failed()
        assert f"commit helper process (pid {helper.pid}) exited" in str(failure)
    async with store.open_broker(tmp_path) as broker:
        queue = broker.get_queue("q")
        recovered = [m async for m in queue.browse()]
        # nothing is written once the helper is gone
        assert [m.message_id for m in recovered] == kept
        assert [m.payload for m in recovered] == [b"kept-%d" % i for i in range(5)]
        await queue.enqueue(b"usable again")


async def test_disk_full_fails_that_queue_only_and_loses_nothing_durable(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        full = await broker.declare_queue("full")
        tail = segment_path(str(tmp_path / "full"), 1)
        os.rename(tail, tail + ".real")
        os.symlink("/dev/full", tail)  # the helper opens the tail at the first write: ENOSPC
        with pytest.raises(store.StoreFailedError, match="No space left"):
            await full.enqueue(b"does not fit")
        with pytest.raises(store.StoreFailedError):
            await full.enqueue(b"refused")
        other = await broker.declare_queue("other")
        assert await other.enqueue(b"fine") == 0
    os.unlink(tail)
    os.rename(tail + ".real", tail)
    async with store.open_broker(tmp_path) as broker:
        assert [m async for m in broker.get_queue("full").browse()] == []
        assert [m.payload async for m in broker.get_queue("other").browse()] == [b"fine"]


async def test_the_helper_holds_the_directory_lock_until_it_has_exited(tmp_path: Path) -> None:
    config = store.BrokerConfig(lock_wait_seconds=0.1)
    async with store.open_broker(tmp_path, config=config) as broker:
        helper = broker._helper
        assert helper is not None
        pid = helper.pid
        await (await broker.declare_queue("q")).enqueue(b"x")
    assert helper._process.returncode == 0  # closing the broker waits for it
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    async with store.open_broker(tmp_path, config=config):
        pass
