"""corda_trio.testing: public test helpers: engine pairs without I/O, an in-memory broker."""

from ._broker import QueueBroker as QueueBroker
from ._cpu import MachineCpu as MachineCpu
from ._cpu import cpu_with_helpers as cpu_with_helpers
from ._cpu import load_average as load_average
from ._cpu import reference_cpu_ms as reference_cpu_ms
from ._flows import FlowNetwork as FlowNetwork
from ._flows import FlowNode as FlowNode
from ._flows import open_flow_network as open_flow_network
from ._pair import ConnectionPair as ConnectionPair
from ._peer_file import follow_peer_file as follow_peer_file
from ._peer_file import write_peer_file as write_peer_file

__all__ = [
    "ConnectionPair",
    "FlowNetwork",
    "FlowNode",
    "MachineCpu",
    "QueueBroker",
    "cpu_with_helpers",
    "follow_peer_file",
    "load_average",
    "open_flow_network",
    "reference_cpu_ms",
    "write_peer_file",
]
