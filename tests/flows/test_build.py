"""Starting flows by name with string arguments (what the CLI and RPC do)."""

from __future__ import annotations

import attrs
import msgpack
import pytest

from corda_trio import flows
from corda_trio.flows._codec import checkpoint_started_by


def test_names_and_string_arguments_are_converted() -> None:
    flow = flows.build_flow("PingPong", {"recipient": "O=Bob,L=Paris,C=FR", "rounds": "10"})
    assert flow == flows.PingPong(recipient="O=Bob,L=Paris,C=FR", rounds=10)
    assert flows.build_flow("corda_trio.flows.PingPong", {"recipient": "x"}) == flows.PingPong(recipient="x")
    assert flows.build_flow("Broadcast", {"recipients": "O=A,L=B,C=GB; O=C,L=D,C=FR"}).recipients == [
        "O=A,L=B,C=GB",
        "O=C,L=D,C=FR",
    ]
    # values of the declared types pass as they are (what an RPC client sends)
    assert flows.build_flow("PingPong", {"recipient": "x", "rounds": 3}).rounds == 3
    assert type(flows.build_flow("PingPong", {"recipient": "x", "rounds": 3.0}).rounds) is int  # (JSON's 3)
    assert flows.build_flow("Broadcast", {"recipients": ["a", "b"], "message": "m"}).recipients == ["a", "b"]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("PingPong", {"recipient": "x", "done": 5}),
        ("PingPong", {"recipient": "x", "session": {"id": 1}}),
        ("Broadcast", {"recipients": "x", "sessions": []}),
        ("FailingFlow", {"recipient": "x", "session": None}),
    ],
)
def test_a_flows_state_is_not_an_argument(name: str, args: dict[str, object]) -> None:
    """A caller cannot preset what a flow keeps as state (its sessions, its progress): those fields are
    init=False, and the error lists only the real arguments."""
    state = next(k for k in args if k not in ("recipient", "recipients"))
    with pytest.raises(ValueError) as info:
        flows.build_flow(name, args)
    assert str(info.value).startswith(f"{name} has no argument {state!r} (arguments: ")
    listed = str(info.value).split("(arguments: ")[1].rstrip(")").split(", ")
    assert state not in listed and not any(a.startswith("session") or a == "done" for a in listed)


def test_state_fields_start_at_their_defaults_and_survive_a_checkpoint() -> None:
    flow = flows.build_flow("PingPong", {"recipient": "x", "rounds": 3})
    assert (flow.done, flow.session) == (0, None)
    flow.done = 2
    restored = flows.decode_checkpoint(flows.encode_checkpoint(flows.new_initiator("f-1", flow)))
    assert restored.stack[0].flow == flow and restored.stack[0].flow.done == 2


ROUNDS = "PingPong argument rounds must be 1 to 10000"


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("PingPong", {"rounds": 2**63}, f"{ROUNDS}, got 9223372036854775808"),
        ("PingPong", {"rounds": "99999999999999999999"}, f"{ROUNDS}, got 9999"),
        ("PingPong", {"rounds": 10_001}, "PingPong argument rounds must be 1 to 10000, got 10001"),
        ("PingPong", {"rounds": 0}, "PingPong argument rounds must be 1 to 10000, got 0"),
        ("PingPong", {"rounds": -1}, "PingPong argument rounds must be 1 to 10000, got -1"),
        (
            "Broadcast",
            {"recipients": ["O=A,L=B,C=GB"] * 101},
            "Broadcast argument recipients must be at most 100 names, got 101",
        ),
        (
            "Broadcast",
            {"recipients": ";".join(["O=A,L=B,C=GB"] * 101)},
            "Broadcast argument recipients must be at most 100 names, got 101",
        ),
        (
            "Broadcast",
            {"recipients": ["O=A,L=B,C=GB"], "message": "x" * 10_001},
            "Broadcast argument message must be at most 10000 characters, got 10001",
        ),
        (
            "FailingFlow",
            {"reason": "x" * 10_001},
            "FailingFlow argument reason must be at most 10000 characters, got 10001",
        ),
    ],
    ids=(
        "rounds-2**63 rounds-20-digits rounds-10001 rounds-0 rounds--1 recipients-101 "
        "recipients-101-in-a-string message-10001 reason-10001"
    ).split(),
)
def test_example_flow_arguments_are_bounded(name: str, args: dict[str, object], message: str) -> None:
    """``PingPong rounds=2**63`` ran for ever (a round trip each); a megabyte ``reason`` went to the peer and
    back and stayed in the records of finished flows: each argument of the shipped flows has a limit, and a
    value beyond it is refused when the flow is built (over RPC ``bad-arguments``), naming both."""
    if name != "Broadcast":
        args = {"recipient": "O=Bob,L=Paris,C=FR", **args}
    with pytest.raises(ValueError) as info:
        flows.build_flow(name, args)
    assert str(info.value).startswith(message), info.value


def test_an_example_flow_built_in_code_is_bounded_too() -> None:
    with pytest.raises(ValueError, match="PingPong argument rounds must be 1 to 10000"):
        flows.PingPong(recipient="x", rounds=2**63)
    flow = flows.PingPong(recipient="x")
    with pytest.raises(ValueError, match="PingPong argument rounds must be 1 to 10000"):
        flow.rounds = 10_001


def test_example_flow_arguments_at_their_limits_are_taken() -> None:
    top = flows.build_flow("PingPong", {"recipient": "x", "rounds": "10000"})
    assert top.rounds == flows.MAX_PING_PONG_ROUNDS
    many = ["O=A,L=B,C=GB"] * flows.MAX_BROADCAST_RECIPIENTS
    assert len(flows.build_flow("Broadcast", {"recipients": many, "message": "x" * 10_000}).recipients) == 100
    assert flows.build_flow("FailingFlow", {"recipient": "x", "reason": "x" * 10_000}).reason == "x" * 10_000


@pytest.mark.parametrize(
    "ping",
    ["ping 0/" + "9" * 5000, "ping " + "0" * 5000 + "/1", "ping 0/10001", "ping 0/0", "ping 0/²"],
    ids=["rounds-5000-digits", "index-5000-digits", "rounds-10001", "rounds-0", "not-ascii"],
)
def test_the_ping_pong_responder_refuses_a_ping_out_of_bounds(ping: str) -> None:
    """A peer's ``ping 0/<5000 digits>`` made ``int()`` raise ValueError in the responder's validation: a bug
    to the hospital, which parked the responder until an operator killed it. It is refused (FlowException,
    the counterparty told), as is a ping naming more rounds than an initiator may ask for."""
    responder = flows.PingPongResponder(session=flows.FlowSession(0, "O=Bob,L=Paris,C=FR"))
    with pytest.raises(flows.FlowException, match=r"expected 'ping 0/<rounds, at most 10000>', got "):
        responder.check_ping(ping)
    responder.check_ping("ping 0/10000")


def test_a_checkpoint_keeps_its_starter_and_one_without_encodes_as_before() -> None:
    """The starter (who owns a client id) is the checkpoint's 12th element; a flow without one encodes as
    the 11 elements checkpoints had before (those still decode, with no starter). The starter of a checkpoint
    that cannot be decoded (its flow class is unknown here) is still read."""
    flow = flows.PingPong(recipient="O=Bob,L=Paris,C=FR")
    plain = flows.encode_checkpoint(flows.new_initiator("f-1", flow))
    owned = flows.encode_checkpoint(flows.new_initiator("f-1", flow, started_by="app1"))
    assert len(msgpack.unpackb(plain, ext_hook=lambda c, d: None)) == 11
    assert msgpack.unpackb(owned, ext_hook=lambda c, d: None)[11] == "app1"
    assert flows.decode_checkpoint(plain).started_by is None
    assert flows.decode_checkpoint(owned).started_by == "app1"
    assert flows.encode_checkpoint(flows.decode_checkpoint(owned)) == owned
    unknown = owned.replace(b"corda_trio.flows.PingPong", b"corda_trio.flows.PingPonX")
    with pytest.raises(flows.PayloadError, match="not registered"):
        flows.decode_checkpoint(unknown)
    assert (checkpoint_started_by(unknown), checkpoint_started_by(plain)) == ("app1", None)
    assert checkpoint_started_by(b"\xc1 not msgpack") is None
    with pytest.raises(flows.PayloadError, match="its starter is a int"):
        flows.decode_checkpoint(owned[:-5] + msgpack.packb(7))


@pytest.mark.parametrize(
    ("name", "args", "error", "message"),
    [
        ("Nope", {}, flows.UnknownFlowError, "no startable flow named 'Nope' (known: "),
        ("PingPongResponder", {}, flows.UnknownFlowError, "no startable flow named 'PingPongResponder'"),
        (
            "PingPong",
            {"recipient": "x", "round": "1"},
            ValueError,
            "PingPong has no argument 'round' (arguments: ",
        ),
        ("PingPong", {"recipient": "x", "rounds": "ten"}, ValueError, "PingPong argument rounds='ten': "),
        ("PingPong", {}, ValueError, "PingPong needs the argument 'recipient'"),
        # values that are not strings (RPC) must be of the declared type: the flow would fail or be parked
        (
            "PingPong",
            {"recipient": "x", "rounds": 2.5},
            ValueError,
            "PingPong argument rounds: expected int, got float",
        ),
        (
            "PingPong",
            {"recipient": "x", "rounds": [1]},
            ValueError,
            "PingPong argument rounds: expected int, got list",
        ),
        (
            "PingPong",
            {"recipient": "x", "rounds": True},
            ValueError,
            "PingPong argument rounds: expected int, got bool",
        ),
        (
            "PingPong",
            {"recipient": None},
            ValueError,
            "PingPong argument recipient: expected str, got NoneType",
        ),
        (
            "Broadcast",
            {"recipients": ["a", 1]},
            ValueError,
            "Broadcast argument recipients: expected list[str]",
        ),
        (
            "Broadcast",
            {"recipients": "a", "message": b"x"},
            ValueError,
            "Broadcast argument message: expected str",
        ),
    ],
)
def test_bad_names_and_arguments_say_what_is_wrong(
    name: str, args: dict[str, str], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        flows.build_flow(name, args)
    assert str(info.value).startswith(message)


def test_argument_types_are_told_apart_in_containers_and_unions() -> None:
    from typing import Any

    from corda_trio.flows._manager import _is_a

    assert _is_a(1, Any) and _is_a(object(), object)
    assert _is_a({"a": 1}, dict[str, int]) and not _is_a({"a": "x"}, dict[str, int])
    assert _is_a(None, int | None) and _is_a(3, int | None) and not _is_a("3", int | None)
    assert _is_a([1, 2], tuple[int, ...]) and _is_a([1, "a"], tuple[int, str])
    assert not _is_a([1], tuple[int, str])
    assert _is_a(2, float) and not _is_a(True, float) and not _is_a(1, bool)


def test_the_ping_pong_responder_refuses_a_ping_it_cannot_read() -> None:
    """What a peer sends is checked by the responder's ``validate`` (a FlowException: the sender is told); a
    count in digits other than ASCII ones was taken by ``isdigit`` and then failed ``int()`` as a bug."""
    responder = flows.PingPongResponder(session=None)  # type: ignore[arg-type]
    responder.check_ping("ping 0/3")
    for bad in ("ping \u00b2/3", "ping 0/\uff13", "pong 0/3", "ping 1/3", "ping x/y"):
        with pytest.raises(flows.FlowException):
            responder.check_ping(bad)


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (9, "x"),  # the flow's error: a string, not an [error, message] pair
        (9, {}),
        ("peer_error", {}),  # a session's peer error
        ("peer_error", "y"),
        ("wait", []),  # a frame's wait
    ],
)
def test_a_malformed_checkpoint_is_a_payload_error_whatever_field_is_wrong(
    where: object, value: object
) -> None:
    """FlowManager.open lists a checkpoint it cannot decode and goes on (PayloadError); a KeyError or an
    IndexError from a malformed field escaped instead and stopped the node with a traceback."""
    from corda_trio.flows import _codec

    state = flows.new_initiator("f-1", flows.build_flow("PingPong", {"recipient": "O=Bob,L=Paris,C=FR"}))
    fields = _codec._unpack(flows.encode_checkpoint(state), True)
    if where == "peer_error":
        fields[6] = [[0, "O=Bob, L=Paris, C=FR", 1, True, 2, 3, "f", 1, "a", None, False, 0, 0, 0, [], False,
                      value, False]]  # fmt: skip
    elif where == "wait":
        fields[5][0][2] = value
    else:
        fields[where] = value
    with pytest.raises(flows.PayloadError, match="malformed flow checkpoint"):
        flows.decode_checkpoint(_codec._pack(fields, True))


@flows.initiating_flow
@attrs.define
class _UsersFlow(flows.FlowLogic[None]):
    flow_name = "tests.build.UsersFlow"
    account: str
    amount: int
    memo: str = ""

    def call(self, ctx: object) -> None:
        raise AssertionError("never started")


@flows.initiating_flow
@attrs.define
class _NoArguments(flows.FlowLogic[None]):
    flow_name = "tests.build.NoArguments"

    def call(self, ctx: object) -> None:
        raise AssertionError("never started")


@pytest.mark.parametrize(
    ("flow", "args", "message"),
    [
        ("tests.build.UsersFlow", {}, "_UsersFlow needs the arguments 'account' and 'amount'"),
        ("tests.build.UsersFlow", {"memo": "m", "amount": "3"}, "_UsersFlow needs the argument 'account'"),
        (
            "tests.build.UsersFlow",
            {"account": "a", "amount": 1, "colour": 2},
            "_UsersFlow has no argument 'colour' (arguments: account, amount, memo)",
        ),
        ("tests.build.NoArguments", {"x": 1}, "_NoArguments has no argument 'x' (it takes none)"),
    ],
)
def test_missing_and_unknown_arguments_are_named_in_the_flows_terms(
    flow: str, args: dict[str, object], message: str
) -> None:
    """Any startable flow, a user's too: the error names the flow's missing or unknown arguments, not
    Python's ``__init__() missing 1 required positional argument`` (what RPC answered before)."""
    with pytest.raises(ValueError) as info:
        flows.build_flow(flow, args)
    assert str(info.value) == message
