"""The registry of harness scenarios, loaded lazily (a scenario's dependencies load only when it runs)."""

from __future__ import annotations

import importlib
from typing import Final

from ._harness import BenchError, Scenario

__all__ = ["SCENARIOS", "load_scenario"]

#: scenario name -> ("module:ClassName", one-line description for ``corda-trio bench list``).
SCENARIOS: Final[dict[str, tuple[str, str]]] = {
    "codec": (
        "bench._codec_scenario:CodecScenario",
        "corda_trio.amqp encode + decode of Corda P2P messages (sections, and whole Transfer frames)",
    ),
    "amqp-link": (
        "bench._amqp_link_scenario:AmqpLinkScenario",
        "Corda P2P messages over corda_trio AMQP links with mutual TLS on 127.0.0.1, until accepted",
    ),
    "wal": (
        "bench._wal_scenario:WalScenario",
        "durable enqueue into corda_trio.store WAL queues (group commit + fsync), delivery to a consumer",
    ),
    "loopback": (
        "bench._loopback:LoopbackScenario",
        "length-prefixed frames over Trio TCP loopback sockets (the floor under amqp-link / p2p)",
    ),
}


def load_scenario(name: str) -> Scenario:
    """Instantiate the scenario called ``name``.

    Raises:
        BenchError: unknown name (the message lists the known ones).
    """
    try:
        target, _ = SCENARIOS[name]
    except KeyError:
        raise BenchError(f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}") from None
    module_name, _, class_name = target.partition(":")
    scenario: Scenario = getattr(importlib.import_module(module_name), class_name)()
    return scenario
