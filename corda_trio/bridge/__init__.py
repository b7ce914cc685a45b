"""corda_trio.bridge: per-peer bridges under one supervising manager, the inbound acceptor, the bridge control
protocol and the node's local endpoint for a bridge in its own process.

* :class:`Bridge`: one peer's outbound queue -> its inbox over AMQP 1.0 / mutual TLS (round-robin addresses,
  backoff, parking of addresses failing the identity check, ack only on ``accepted``);
* :class:`BridgeManager`: one bridge per outbound queue whose peer is in the map, restarted if it crashes;
* :class:`InboundAcceptor`: the node's P2P server (own inbox only, validated user stamped, checks, accept once
  durable);
* control protocol (``protocol_spec/bridge-control.md``): :func:`encode_control` / :func:`decode_control`,
  :class:`QueueQuery`, :class:`QueueSnapshot`, :class:`BridgeRequest`, :class:`BridgeDelete`, the bridge
  side's :class:`ControlClient` and the node side's :func:`diff_entries`;
* :class:`LocalEndpoint`: the node's broker as a loopback AMQP server (SASL PLAIN) serving outbound queues,
  the inbox and the control addresses; :class:`ExternalBridge`: the same manager and acceptor in another
  process, fed through that endpoint (``corda-trio bridge start --config FILE``).

Running the bridges from a node (the two modes behave the same; pick one per node)::

    # in-node: the acceptor and the manager read the messaging service and the peer directory directly
    acceptor = bridge.InboundAcceptor(inbox=service.inbox, ssl_context=server_ctx,
                                      config=bridge.AcceptorConfig(host=..., port=..., max_message_size=...))
    manager = bridge.BridgeManager(messaging=service, resolver=peers, ssl_context=client_ctx)
    await nursery.start(acceptor.run); await nursery.start(manager.run)

    # external: the node serves its local endpoint; `corda-trio bridge start --config bridge.toml` (or an
    # ExternalBridge in-process) connects to it with the same credentials and serves the P2P address
    endpoint = bridge.LocalEndpoint(messaging=service, resolver=peers,
                                    config=bridge.EndpointConfig(username=..., password=..., port=...))
    port = await nursery.start(endpoint.run)
"""

from ._backoff import INITIAL_BACKOFF_SECONDS as INITIAL_BACKOFF_SECONDS
from ._backoff import MAX_BACKOFF_SECONDS as MAX_BACKOFF_SECONDS
from ._backoff import Backoff as Backoff
from ._control import CONTROL_ADDRESS as CONTROL_ADDRESS
from ._control import NOTIFY_ADDRESS as NOTIFY_ADDRESS
from ._control import QUERY_INTERVAL_SECONDS as QUERY_INTERVAL_SECONDS
from ._control import BridgeDelete as BridgeDelete
from ._control import BridgeEntry as BridgeEntry
from ._control import BridgeRequest as BridgeRequest
from ._control import ControlClient as ControlClient
from ._control import ControlProtocolError as ControlProtocolError
from ._control import ControlState as ControlState
from ._control import QueueEntry as QueueEntry
from ._control import QueueQuery as QueueQuery
from ._control import QueueSnapshot as QueueSnapshot
from ._control import UnknownControlMessage as UnknownControlMessage
from ._control import decode_control as decode_control
from ._control import diff_entries as diff_entries
from ._control import encode_control as encode_control
from ._endpoint import EndpointConfig as EndpointConfig
from ._endpoint import LocalEndpoint as LocalEndpoint
from ._endpoint import wanted_bridges as wanted_bridges
from ._external import AnnouncedQueues as AnnouncedQueues
from ._external import ExternalBridge as ExternalBridge
from ._external import ExternalBridgeConfig as ExternalBridgeConfig
from ._external import ListenError as ListenError
from ._external import MultipleInboxesError as MultipleInboxesError
from ._external import RemoteInbox as RemoteInbox
from ._external import RemoteQueue as RemoteQueue
from ._inbound import AcceptorConfig as AcceptorConfig
from ._inbound import InboundAcceptor as InboundAcceptor
from ._inbound import Inbox as Inbox
from ._inbound import RetryLaterError as RetryLaterError
from ._manager import BridgeManager as BridgeManager
from ._manager import OutboundQueues as OutboundQueues
from ._outbound import Bridge as Bridge
from ._outbound import BridgeConfig as BridgeConfig
from ._outbound import BridgeState as BridgeState
from ._outbound import DeliveryRefusedError as DeliveryRefusedError
from ._outbound import OutboundConsumer as OutboundConsumer
from ._outbound import OutboundSource as OutboundSource
from ._outbound import PeerChangedError as PeerChangedError
from ._outbound import stream_queue as stream_queue

__all__ = [
    "CONTROL_ADDRESS",
    "INITIAL_BACKOFF_SECONDS",
    "MAX_BACKOFF_SECONDS",
    "NOTIFY_ADDRESS",
    "QUERY_INTERVAL_SECONDS",
    "AcceptorConfig",
    "AnnouncedQueues",
    "Backoff",
    "Bridge",
    "BridgeConfig",
    "BridgeDelete",
    "BridgeEntry",
    "BridgeManager",
    "BridgeRequest",
    "BridgeState",
    "ControlClient",
    "ControlProtocolError",
    "ControlState",
    "DeliveryRefusedError",
    "EndpointConfig",
    "ExternalBridge",
    "ExternalBridgeConfig",
    "InboundAcceptor",
    "Inbox",
    "ListenError",
    "LocalEndpoint",
    "MultipleInboxesError",
    "OutboundConsumer",
    "OutboundQueues",
    "OutboundSource",
    "PeerChangedError",
    "QueueEntry",
    "QueueQuery",
    "QueueSnapshot",
    "RemoteInbox",
    "RemoteQueue",
    "RetryLaterError",
    "UnknownControlMessage",
    "decode_control",
    "diff_entries",
    "encode_control",
    "stream_queue",
    "wanted_bridges",
]
