"""The node's side of the flow framework: runs the flow manager and serves the flow RPC calls.

:class:`FlowHost` owns the :class:`corda_trio.flows.FlowManager` (opened over the node's messaging service, so
checkpoints resume when it starts) and answers ``start_flow``, ``watch_flow``, ``list_flows``, ``retry_flow``,
``kill_flow`` and ``registered_flows``. A flow started over RPC runs in the manager's nursery: the caller may
wait for its result or disconnect, the flow goes on either way. The host remembers when each flow it started
began, for ``list_flows`` and the ``corda_trio_flow_duration_seconds`` histogram.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from corda_trio import flows, messaging, rpc

if TYPE_CHECKING:
    from ._node import Node

__all__ = ["FlowHost", "start_flow_host"]

log = logging.getLogger("corda_trio.node.flows")

#: How many start times of flows started over RPC the host remembers (for listing and latency).
STARTED_RETAIN: Final[int] = 10_000
#: list_flows state filter -> FlowInfo statuses.
STATES: Final[dict[str, tuple[str, ...]]] = {
    "running": ("running", "sleeping", "retrying"),
    "parked": ("parked",),
    "finished": ("completed",),
    "failed": ("failed",),
}
_ENDED: Final = ("completed", "failed")


def _plain(value: Any) -> Any:
    """A flow's result as RPC carries it (``protocol_spec/rpc.md``): a ``@payload_type`` value, an attrs
    class, as the map of its fields, also inside lists and maps; anything else as it is. (Before, a flow
    returning one, as the example of docs/flows.md does, finished, but its result could not be encoded:
    ``start_flow`` answered ``internal``, and so did every ``list_flows`` while the node remembered it.)"""
    if attrs.has(type(value)):
        return {field.name: _plain(getattr(value, field.name)) for field in attrs.fields(type(value))}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _short_name(flow_name: str) -> str:
    """How RPC and /metrics name a flow: the last part of its ``flow_name`` (``PingPong``)."""
    return flow_name.rsplit(".", 1)[-1]


def _state(status: str) -> str:
    for state, statuses in STATES.items():
        if status in statuses:
            return state
    return status


@attrs.define(eq=False)
class FlowHost:
    """See the module docstring."""

    node: Node
    manager: flows.FlowManager
    nursery: trio.Nursery
    #: flow id -> (flow name, wall-clock start, monotonic start) of flows started over RPC
    _started: dict[str, tuple[str, float, float]] = attrs.field(factory=dict)

    # --- lifecycle, for the node -------------------------------------------------------------------

    async def drain(self) -> None:
        """Take no new flows, and wait until running flows have finished (parked or retrying ones do not
        count)."""
        self.manager.drain()
        await self.manager.wait_drained()

    def set_draining(self, draining: bool) -> None:
        if draining:
            self.manager.drain()
        else:
            self.manager.undrain()

    def statistics(self) -> dict[str, int]:
        s = self.manager.statistics()
        return {
            "started": s.started,
            "finished": s.completed,
            "failed": s.failed,
            "running": s.running,
            "parked": s.parked,
            "transitions": s.transitions,
            "checkpoint_writes": s.checkpoint_writes,
            "refused": s.refused,
            "refused_inits": s.refused_inits,
            "responders": s.responders,
            "parked_messages": s.parked_messages,
        }

    def registered(self) -> list[str]:
        return sorted(_short_name(name) for name in flows.registry.initiating)

    def rpc_handlers(self) -> dict[str, rpc.Handler]:
        return {
            "start_flow": self._start_flow,
            "watch_flow": self._watch_flow,
            "retry_flow": self._retry_flow,
            "kill_flow": self._kill_flow,
        }

    def rpc_immediate_handlers(self) -> dict[str, rpc.ImmediateHandler]:
        return {"list_flows": self._list_flows, "registered_flows": self._registered_flows}

    # --- RPC ---------------------------------------------------------------------------------------

    async def _start_flow(self, call: rpc.Call) -> Any:
        # (the server checked the arguments' names and types against the protocol's table)
        args = call.args.get("args", {})
        try:
            # the flow's own short name, however the caller spelled it (its class or full flow_name): the
            # duration histogram's ``flow`` label and ``flow list`` name one flow one way
            name = _short_name(flows.registry.startable(call.args["flow"]).flow_name)
            handle = await self.manager.start_flow(
                call.args["flow"], args, client_id=call.args.get("client_id"), started_by=call.user.username
            )
        except flows.ClientIdTakenError as exc:  # (neither its id nor anything of it goes to this caller)
            log.info("RPC user %s refused a client id: %s", call.user.username, exc)
            raise rpc.RpcError(rpc.ErrorCode.FORBIDDEN, str(exc)) from None
        except flows.FlowManagerDrainingError as exc:
            raise rpc.RpcError(rpc.ErrorCode.DRAINING, str(exc)) from None
        except flows.UnknownFlowError as exc:
            raise rpc.RpcError(rpc.ErrorCode.NOT_FOUND, str(exc)) from None
        except (ValueError, TypeError) as exc:
            raise rpc.RpcError(rpc.ErrorCode.BAD_ARGUMENTS, str(exc)) from None
        except RuntimeError as exc:  # the manager is not running (the node is stopping)
            raise rpc.RpcError(rpc.ErrorCode.UNAVAILABLE, str(exc)) from None
        if handle.started:
            self._remember(handle.flow_id, name)
            # The flow's outcome is observed here, in the node's nursery, whether or not the caller waits.
            self.nursery.start_soon(self._observe, handle.flow_id, name)
            log.info("flow %s %s started by RPC user %s", name, handle.flow_id, call.user.username)
        else:  # its client id named a flow that exists: this call follows it, nothing new starts
            log.info(
                "flow %s: RPC user %s started it again by its client id", handle.flow_id, call.user.username
            )
        # The id goes out only once the start is durable: a client that has it can count on the flow
        # (a crash before then would have lost the start: the client's answer is then the broken call).
        await handle.durable()
        if not call.args.get("wait", True):
            return handle.flow_id
        await call.send_event({"flow_id": handle.flow_id, "state": "running"})
        try:
            return _plain(await handle.result())
        except flows.FlowException as exc:
            raise rpc.RpcError(rpc.ErrorCode.FLOW_FAILED, f"flow {handle.flow_id}: {exc}") from None
        except flows.UnknownFlowError as exc:
            raise rpc.RpcError(rpc.ErrorCode.NOT_FOUND, str(exc)) from None

    def _remember(self, flow_id: str, name: str) -> None:
        self._started[flow_id] = (name, time.time(), time.monotonic())
        while len(self._started) > STARTED_RETAIN:
            self._started.pop(next(iter(self._started)))

    async def _observe(self, flow_id: str, name: str) -> None:
        outcome = "finished"
        try:
            await self.manager.wait_result(flow_id)
        except flows.FlowException:
            outcome = "failed"
        except flows.UnknownFlowError:
            return
        started = self._started.get(flow_id)
        if started is not None and self.node.metrics is not None:
            self.node.metrics.flow_duration.labels(flow=name).observe(time.monotonic() - started[2])
        log.info("flow %s %s %s", name, flow_id, outcome)

    def _info(self, info: flows.FlowInfo) -> dict[str, Any]:
        started = self._started.get(info.flow_id)
        out: dict[str, Any] = {
            "flow_id": info.flow_id,
            "flow": _short_name(info.flow_name),
            "flow_class": info.flow_name,
            "state": _state(info.status),
            "status": info.status,
            "result": _plain(info.result) if info.status == "completed" else None,
            "error": info.error,
            "suspends": info.suspends,
            "initiator": info.initiator,
            "started_by": info.started_by,
        }
        if started is not None:
            at = dt.datetime.fromtimestamp(started[1], dt.UTC)
            out["started_at"] = at.isoformat(timespec="milliseconds")
        return out

    def _find(self, flow_id: str) -> flows.FlowInfo:
        for info in self.manager.flows():
            if info.flow_id == flow_id:
                return info
        raise rpc.RpcError(rpc.ErrorCode.NOT_FOUND, f"no flow {flow_id} (unknown, or finished long ago)")

    async def _watch_flow(self, call: rpc.Call) -> Any:
        flow_id = call.args["flow_id"]
        last: tuple[str, int] | None = None
        while True:
            version = self.manager.version
            info = self._find(flow_id)
            if info.status in _ENDED:
                return self._info(info)
            if (info.status, info.suspends) != last:
                last = (info.status, info.suspends)
                await call.send_event(self._info(info))
            await self.manager.wait_changed(version)

    def _list_flows(self, call: rpc.Call) -> Any:
        state = call.args.get("state")
        if state is not None and state not in STATES:
            raise rpc.RpcError(rpc.ErrorCode.BAD_ARGUMENTS, f"'state' must be one of {', '.join(STATES)}")
        out = [self._info(i) for i in self.manager.flows()]
        return [f for f in out if state is None or f["state"] == state]

    async def _retry_flow(self, call: rpc.Call) -> Any:
        info = self._find(call.args["flow_id"])
        try:
            await self.manager.retry(info.flow_id)
        except flows.UnknownFlowError:
            ended = self._info(self._find(info.flow_id))
            self._refuse_unresumable(ended, "retried")
            raise rpc.RpcError(
                rpc.ErrorCode.NOT_FOUND,
                f"no running flow {info.flow_id}: it has ended ({ended['state']}); only a running or "
                "parked flow can be retried",
            ) from None
        log.info("flow %s retried by RPC user %s", info.flow_id, call.user.username)
        return self._info(self._find(info.flow_id))

    async def _kill_flow(self, call: rpc.Call) -> Any:
        info = self._find(call.args["flow_id"])
        try:
            await self.manager.kill(info.flow_id, f"killed by RPC user {call.user.username}")
        except flows.UnknownFlowError:
            ended = self._info(self._find(info.flow_id))
            self._refuse_unresumable(ended, "killed")
            return ended  # it ended meanwhile or before: left as it is
        log.info("flow %s killed by RPC user %s", info.flow_id, call.user.username)
        with trio.move_on_after(5):
            try:
                await self.manager.wait_result(info.flow_id)
            except (flows.FlowException, flows.UnknownFlowError):
                pass
        return self._info(self._find(info.flow_id))

    def _refuse_unresumable(self, summary: dict[str, Any], what: str) -> None:
        """A flow the manager neither runs nor finished is one whose checkpoint it could not decode at start
        (listed as parked with the reason): say so, instead of answering as if it had ended."""
        if summary["status"] not in _ENDED:
            raise rpc.RpcError(
                rpc.ErrorCode.NOT_FOUND,
                f"flow {summary['flow_id']} cannot be {what}: its checkpoint could not be loaded at start "
                f"({summary['error']}); it is kept as it is",
            )

    def _registered_flows(self, call: rpc.Call) -> Any:
        return self.registered()


async def start_flow_host(node: Node, nursery: trio.Nursery, service: messaging.MessagingService) -> FlowHost:
    """Open the flow manager (loading checkpoints) and start it in ``nursery``: flows resume."""
    config = flows.FlowManagerConfig(max_responders_per_peer=node.config.flows_max_responders_per_peer)
    manager = await flows.FlowManager.open(service, config=config)
    await nursery.start(manager.run)
    return FlowHost(node=node, manager=manager, nursery=nursery)
