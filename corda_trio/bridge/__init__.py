"""corda_trio.bridge: per-peer bridges under one supervising manager, and the inbound acceptor.

* :class:`Bridge`: one peer's outbound queue -> its inbox over AMQP 1.0 / mutual TLS (round-robin addresses,
  backoff, parking of addresses failing the identity check, ack only on ``accepted``);
* :class:`BridgeManager`: one bridge per outbound queue whose peer is in the map, restarted if it crashes;
* :class:`InboundAcceptor`: the node's P2P server (own inbox only, validated user stamped, checks, accept once
  durable).
"""

from ._backoff import INITIAL_BACKOFF_SECONDS as INITIAL_BACKOFF_SECONDS
from ._backoff import MAX_BACKOFF_SECONDS as MAX_BACKOFF_SECONDS
from ._backoff import Backoff as Backoff
from ._inbound import AcceptorConfig as AcceptorConfig
from ._inbound import InboundAcceptor as InboundAcceptor
from ._manager import BridgeManager as BridgeManager
from ._outbound import Bridge as Bridge
from ._outbound import BridgeConfig as BridgeConfig
from ._outbound import BridgeState as BridgeState
from ._outbound import DeliveryRefusedError as DeliveryRefusedError
from ._outbound import PeerChangedError as PeerChangedError

__all__ = [
    "INITIAL_BACKOFF_SECONDS",
    "MAX_BACKOFF_SECONDS",
    "AcceptorConfig",
    "Backoff",
    "Bridge",
    "BridgeConfig",
    "BridgeManager",
    "BridgeState",
    "DeliveryRefusedError",
    "InboundAcceptor",
    "PeerChangedError",
]
