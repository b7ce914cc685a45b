"""Generate the golden base directories of ``test_upgrade.py``: two nodes' directories written by an OLDER
build, with work in flight, for the current build to open, resume and finish.

Run it with the older build on the Python path (a worktree of the commit to test against)::

    git worktree add --detach /tmp/old 86ac193
    PYTHONPATH=/tmp/old python tests/node/make_upgrade_golden.py tests/node/golden/upgrade-86ac193

It uses only what that build has (its ``tests/node/netutil.py``, its node processes, its built-in flows):

* a directory-mode network of Alice and Bob (``network bootstrap --no-map``); Bob is never started;
* Alice runs ``PingPong`` with herself (finished: checkpoints and dedup ids on disk), then starts, with
  client ids, three ``PingPong`` (2 rounds) with Bob, whose first messages wait in her outbound queue for Bob,
  and one of 300 rounds with herself, which is mid-way when she is killed (SIGKILL: a crash, not a stop);
* logs are dropped (size); ``GENERATED.txt`` names the commit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import trio

from corda_trio import rpc
from corda_trio.node._processes import start_node_process
from tests.node.netutil import PASSWORD, make_network

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"
#: client ids of the flows in flight, and the results they must finish with
TO_BOB = {f"to-bob-{i}": 2 for i in range(3)}
SELF_ROUNDS = 300


async def generate(out: Path) -> None:
    nodes = make_network(out / "net", [ALICE, BOB])
    (alice_path, alice_cfg) = nodes[0]
    alice = await start_node_process(alice_path, alice_cfg)
    try:
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as client:
            with trio.fail_after(60):
                assert await client.start_flow("PingPong", recipient=ALICE, rounds=2) == 2
            for client_id in TO_BOB:
                await client.launch_flow("PingPong", client_id=client_id, recipient=BOB, rounds=2)
            await client.launch_flow("PingPong", client_id="self", recipient=ALICE, rounds=SELF_ROUNDS)
            await trio.sleep(0.1)  # (a few rounds: the flow is mid-way, the files stay small)
    finally:
        await alice.stop(signal.SIGKILL)


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # The node processes run `python -m corda_trio`, which imports from the working directory first: run
    # them where no other corda_trio is, so that they are the build on PYTHONPATH, as this script is.
    os.chdir(out)
    trio.run(generate, out)
    net = out / "net"
    for entry in net.iterdir():  # only the nodes' directories are needed (the network's keys are not)
        if entry.name != "nodes":
            shutil.rmtree(entry)
    for node in (net / "nodes").iterdir():
        shutil.rmtree(node / "logs", ignore_errors=True)
        for shm in node.glob("*.db-shm"):  # (SQLite's index of its WAL file, rebuilt when it is missing)
            shm.unlink()
    import corda_trio

    source = Path(corda_trio.__file__).resolve().parents[1]
    commit = subprocess.run(
        ["git", "-C", str(source), "log", "-1", "--format=%H %cd"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (out / "GENERATED.txt").write_text(
        f"written by corda-trio at commit {commit}\n"
        "by tests/node/make_upgrade_golden.py (its docstring says how)\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
