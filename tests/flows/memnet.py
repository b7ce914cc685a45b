"""A synchronous in-memory network of flow state machines (no trio, no store): the pure core end to end.

Each node keeps its flows' latest checkpoint bytes (what the executor writes); messages travel as wire bytes
through per-(sender, recipient) FIFO links, as bridges keep per-sender order. ``crash(node)`` throws the
node's in-memory states away and resumes every flow from its checkpoint, resending the checkpoint's outbox,
exactly as the executor does after a restart.
"""

from __future__ import annotations

import collections
from typing import Any

import attrs

from corda_trio import flows
from corda_trio.flows import _statemachine as sm
from corda_trio.flows._codec import outgoing_wire


@attrs.define(eq=False)
class Node:
    name: str
    checkpoints: dict[str, bytes] = attrs.field(factory=dict)
    states: dict[str, sm.FlowState] = attrs.field(factory=dict)
    #: our session id -> flow id
    sessions: dict[int, str] = attrs.field(factory=dict)
    results: dict[str, Any] = attrs.field(factory=dict)
    refused: list[str] = attrs.field(factory=list)
    #: payloads each flow consumed, by flow id (the exactly-once ledger)
    hospital: list[BaseException] = attrs.field(factory=list)


@attrs.define(eq=False)
class MemNet:
    nodes: dict[str, Node]
    links: dict[tuple[str, str], collections.deque[tuple[str, bytes]]] = attrs.field(
        factory=lambda: collections.defaultdict(collections.deque)
    )
    #: every message ever put on a link, (sender, recipient, dedup id, bytes): for duplicating
    history: list[tuple[str, str, str, bytes]] = attrs.field(factory=list)
    now: float = 0.0
    counter: int = 0
    #: ``Environment`` settings for every node (``max_unconsumed_messages`` ...)
    settings: dict[str, Any] = attrs.field(factory=dict)

    @classmethod
    def of(cls, *names: str) -> MemNet:
        return cls({n: Node(n) for n in names})

    def env(self, name: str) -> sm.Environment:
        return sm.Environment(our_name=name, **self.settings)

    # --- executor --------------------------------------------------------------------------------------

    def _run(self, node: Node, state: sm.FlowState, event: Any) -> None:
        t = sm.transition(state, event, self.env(node.name))
        for action in t.actions:
            if isinstance(action, sm.SendToHospital):
                node.hospital.append(action.error)
                if state.flow_id in node.checkpoints:
                    node.states[state.flow_id] = flows.decode_checkpoint(node.checkpoints[state.flow_id])
                return
        for action in t.actions:
            if isinstance(action, sm.PersistCheckpoint):
                node.checkpoints[state.flow_id] = flows.encode_checkpoint(state)
                for s in state.sessions.values():
                    node.sessions[s.our_id] = state.flow_id
            elif isinstance(action, sm.RefuseMessage):
                node.refused.append(action.reason)
            elif isinstance(action, sm.SendMessages):
                self._send(node.name, action.messages)
            elif isinstance(action, sm.CompleteFlow):
                node.results[state.flow_id] = action.result
            elif isinstance(action, sm.FailFlow):
                node.results[state.flow_id] = flows.FlowException(action.message)
        if state.finished and not state.unflushed:
            node.states.pop(state.flow_id, None)
        else:
            node.states[state.flow_id] = state

    def _send(self, sender: str, messages: tuple[sm.Outgoing, ...]) -> None:
        for o in messages:
            wire = outgoing_wire(o)
            self.links[(sender, o.counterparty)].append((o.dedup_id, wire))
            self.history.append((sender, o.counterparty, o.dedup_id, wire))

    def start(self, name: str, flow: flows.FlowLogic[Any]) -> str:
        self.counter += 1
        flow_id = f"F{self.counter}"
        node = self.nodes[name]
        self._run(node, flows.new_initiator(flow_id, flow), sm.Start(now=self.now))
        return flow_id

    def pending(self) -> list[tuple[str, str]]:
        return [k for k, q in self.links.items() if q]

    def deliver(self, link: tuple[str, str]) -> None:
        _dedup_id, wire = self.links[link].popleft()
        self.receive(link[0], link[1], wire)

    def receive(self, sender: str, recipient: str, wire: bytes) -> None:
        node = self.nodes[recipient]
        try:
            message = flows.decode_session_message(wire)
        except flows.SessionProtocolError as exc:
            node.refused.append(str(exc))
            return
        if isinstance(message, flows.InitialSessionMessage):
            responder = flows.registry.responders.get(message.initiator_flow_class_name)
            if responder is None:
                node.refused.append(f"unknown flow {message.initiator_flow_class_name}")
                return
            flow_id = sm.responder_flow_id(sender, message.initiator_session_id, message.initiation_entropy)
            if flow_id in node.checkpoints:
                return  # a copy of an init already handled
            state = flows.new_responder(sender, message, responder)
            self._run(node, state, sm.Start(now=self.now))
            return
        flow_id = node.sessions.get(message.recipient_session_id)
        state = node.states.get(flow_id) if flow_id is not None else None
        if state is None:
            node.refused.append(f"unknown session {message.recipient_session_id}")
            return
        self._run(node, state, sm.MessageArrived(sender=sender, message=message, token=None, now=self.now))

    def tick(self, seconds: float) -> None:
        self.now += seconds
        for node in self.nodes.values():
            for state in list(node.states.values()):
                if state.wake_at is not None and state.wake_at <= self.now:
                    self._run(node, state, sm.TimerFired(now=self.now))

    def crash(self, name: str) -> None:
        """Lose the node's memory; resume from checkpoints and resend their outboxes."""
        node = self.nodes[name]
        node.states.clear()
        for flow_id, data in node.checkpoints.items():
            state = flows.decode_checkpoint(data)
            self._send(name, tuple(state.outbox))
            if not state.finished or state.unflushed:
                node.states[flow_id] = state

    def run(self, limit: int = 100_000) -> None:
        for _ in range(limit):
            links = self.pending()
            if not links:
                return
            self.deliver(links[0])
        raise AssertionError("still talking")


def snapshot(net: MemNet) -> dict[str, Any]:
    """Every node's checkpoints and every message on the wire, as JSON-able hex."""
    return {
        "checkpoints": {
            n.name: {fid: data.hex() for fid, data in n.checkpoints.items()} for n in net.nodes.values()
        },
        "links": [[s, r, d, w.hex()] for (s, r), q in net.links.items() for d, w in q],
    }


def restore(snap: dict[str, Any]) -> MemNet:
    """A network resumed from ``snapshot``: flows decoded from their checkpoints (their outboxes resent, as
    after a crash), the messages that were on the wire put back."""
    net = MemNet.of(*snap["checkpoints"])
    for s, r, d, w in snap["links"]:
        net.links[(s, r)].append((d, bytes.fromhex(w)))
    for name, cps in snap["checkpoints"].items():
        node = net.nodes[name]
        node.checkpoints = {fid: bytes.fromhex(h) for fid, h in cps.items()}
        for fid, data in node.checkpoints.items():
            state = flows.decode_checkpoint(data)
            for s in state.sessions.values():
                node.sessions[s.our_id] = fid
        net.crash(name)
    return net
