"""The node's plan of its listeners' caps for the open-file limit (``corda_trio.node._descriptors``), in a
child process whose ``RLIMIT_NOFILE`` is set first (the plan may raise the soft limit)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PLAN = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
from corda_trio.node._descriptors import plan_descriptors
caps = plan_descriptors(p2p=True, metrics=True, in_use=int(sys.argv[3]))
print(json.dumps({"p2p": caps.p2p, "rpc": caps.rpc, "rpc_refusing": caps.rpc_refusing,
                  "metrics": caps.metrics, "metrics_refusing": caps.metrics_refusing,
                  "soft_limit": caps.soft_limit, "warning": caps.warning,
                  "soft_after": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
"""


def _plan(soft: int, hard: int, in_use: int = 0) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PLAN, str(soft), str(hard), str(in_use)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize(("limit", "in_use"), [(64, 0), (64, 25), (256, 0), (256, 100)])
def test_a_hard_limit_too_low_shrinks_the_caps_to_leave_half_of_what_is_free_and_warns(
    limit: int, in_use: int
) -> None:
    plan = _plan(limit, limit, in_use)
    held = sum(plan[k] for k in ("p2p", "rpc", "rpc_refusing", "metrics", "metrics_refusing"))  # type: ignore[misc]
    assert held <= (limit - in_use) // 2, plan
    assert plan["rpc_refusing"] == max(1, plan["rpc"] // 8), plan  # type: ignore[operator]
    warning = plan["warning"]
    assert isinstance(warning, str)
    needs = f"below the {in_use + 1120} this node needs ({in_use} open at start"
    assert warning.startswith(f"the open-file limit (ulimit -n) is {limit}, {needs}"), warning
    assert f"p2p {plan['p2p']}, rpc {plan['rpc']}, metrics {plan['metrics']} connections" in warning, warning


def test_a_low_soft_limit_is_raised_to_the_hard_limit_and_the_defaults_kept() -> None:
    plan = _plan(64, 4096)
    assert plan["soft_after"] == 4096, plan
    assert (plan["p2p"], plan["rpc"], plan["metrics"], plan["warning"]) == (512, 256, 32, None), plan
    assert plan["rpc_refusing"] is None  # (the transport's default)


def test_a_hard_limit_just_above_the_soft_one_is_used_and_still_too_low_warns() -> None:
    plan = _plan(64, 200)
    assert plan["soft_after"] == 200, plan
    warning = plan["warning"]
    assert isinstance(warning, str), plan
    assert warning.startswith("the open-file limit (ulimit -n) is 200, below the 1120"), warning


def test_a_store_holding_most_of_the_limit_leaves_the_listeners_half_of_the_rest() -> None:
    """Restarted after sending to 40 peers under ulimit -n 128, a node held 107 descriptors at start (two
    for each of its 42 queues) and its listeners were planned as if it held none: p2p 37, rpc 18: its 40
    peers' connections took the rest, its own bridges got EMFILE and no flow finished in 40 s."""
    plan = _plan(128, 128, 107)
    assert (plan["p2p"], plan["rpc"], plan["metrics"]) == (6, 3, 1), plan  # 21 free: 10 for them
    assert "(107 open at start, its store's among them" in str(plan["warning"]), plan


EXTERNAL = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from corda_trio.node._descriptors import plan_descriptors
node = plan_descriptors(p2p=False, metrics=False, bridge_endpoint=True, in_use=10)
process = plan_descriptors(p2p=True, metrics=False, rpc_listener=False, in_use=10, process="bridge process")
print(json.dumps([[c.p2p, c.rpc, c.bridge_endpoint, c.warning] for c in (node, process)]))
"""


def test_the_bridge_endpoint_and_a_bridge_process_are_planned_as_the_listeners_are() -> None:
    """In ``[bridge] mode = "external"`` the node's bridge endpoint kept the transport's 512 whatever the
    limit, and ``corda-trio bridge start`` planned nothing for its acceptor of peers."""
    done = subprocess.run([sys.executable, "-c", EXTERNAL], capture_output=True, text=True, check=True)
    (p2p, rpc, endpoint, warning), (acceptor, no_rpc, no_endpoint, process_warning) = json.loads(done.stdout)
    assert p2p is None and endpoint is not None and rpc is not None
    assert endpoint + rpc + max(1, rpc // 8) <= (64 - 10) // 2, (endpoint, rpc)
    assert f"bridge {endpoint}, rpc {rpc} connections" in warning, warning
    assert (no_rpc, no_endpoint) == (None, None) and acceptor <= (64 - 10) // 2, acceptor
    needs = f"below the {10 + 512 + 256} this bridge process needs (10 open at start + p2p 512 connections"
    assert needs in process_warning and f"at most p2p {acceptor} connections" in process_warning, (
        process_warning
    )
    assert "store" not in process_warning, process_warning
