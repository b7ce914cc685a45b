"""Starting flows by name with string arguments (what the CLI and RPC do)."""

from __future__ import annotations

import pytest

from corda_trio import flows


def test_names_and_string_arguments_are_converted() -> None:
    flow = flows.build_flow("PingPong", {"recipient": "O=Bob,L=Paris,C=FR", "rounds": "10"})
    assert flow == flows.PingPong(recipient="O=Bob,L=Paris,C=FR", rounds=10)
    assert flows.build_flow("corda_trio.flows.PingPong", {"recipient": "x"}) == flows.PingPong(recipient="x")
    assert flows.build_flow("Broadcast", {"recipients": "O=A,L=B,C=GB; O=C,L=D,C=FR"}).recipients == [
        "O=A,L=B,C=GB",
        "O=C,L=D,C=FR",
    ]


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
        ("PingPong", {}, ValueError, "PingPong: "),
    ],
)
def test_bad_names_and_arguments_say_what_is_wrong(
    name: str, args: dict[str, str], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        flows.build_flow(name, args)
    assert str(info.value).startswith(message)
