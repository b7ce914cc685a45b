"""corda_trio.bridge.float: the float, a DMZ listener activated from inside, and the tunnel's inside end.

* :class:`Float`: listens for one control link from the bridge manager (tunnel PKI), opens the public P2P
  port only while activated, forwards each peer delivery inward and settles it with the inside's outcome;
  writes nothing but its :class:`AuditLog`; :func:`install_outbound_guard` forbids outbound connections;
* :class:`FloatTunnel`: the bridge manager's side: activates one float at a time, fails over, validates each
  forwarded delivery again and stores it durably in the node's inbox before it is accepted;
* :class:`TunnelPki` / :class:`TunnelCredentials`: the local-only CA and certificates of the control link;
* the control protocol (``_control``, pure): messages, envelope, the float's state table
  (``protocol_spec/float-control.md``).
"""

from ._audit import DEFAULT_AUDIT_BACKUPS as DEFAULT_AUDIT_BACKUPS
from ._audit import DEFAULT_AUDIT_MAX_BYTES as DEFAULT_AUDIT_MAX_BYTES
from ._audit import LATENCY_BUCKETS as LATENCY_BUCKETS
from ._audit import AuditLog as AuditLog
from ._audit import AuditLogError as AuditLogError
from ._audit import LatencySummary as LatencySummary
from ._control import CONTROL_ADDRESS as CONTROL_ADDRESS
from ._control import EVENTS_ADDRESS as EVENTS_ADDRESS
from ._control import FLOAT_TRANSITIONS as FLOAT_TRANSITIONS
from ._control import INBOUND_ADDRESS as INBOUND_ADDRESS
from ._control import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._control import ActivateFloat as ActivateFloat
from ._control import ControlMessage as ControlMessage
from ._control import ControlProtocolError as ControlProtocolError
from ._control import DeactivateFloat as DeactivateFloat
from ._control import EnvelopeReader as EnvelopeReader
from ._control import FloatActivated as FloatActivated
from ._control import FloatActivationFailed as FloatActivationFailed
from ._control import FloatDeactivated as FloatDeactivated
from ._control import FloatInput as FloatInput
from ._control import FloatState as FloatState
from ._control import ForwardedDelivery as ForwardedDelivery
from ._control import decode_control as decode_control
from ._control import encode_control as encode_control
from ._control import float_transition as float_transition
from ._float import Float as Float
from ._float import FloatConfig as FloatConfig
from ._float import NodeTls as NodeTls
from ._guard import install_outbound_guard as install_outbound_guard
from ._inside import DEFAULT_TUNNEL_HANDSHAKE_TIMEOUT_SECONDS as DEFAULT_TUNNEL_HANDSHAKE_TIMEOUT_SECONDS
from ._inside import TUNNEL_MAX_BACKOFF_SECONDS as TUNNEL_MAX_BACKOFF_SECONDS
from ._inside import FloatActivationError as FloatActivationError
from ._inside import FloatTunnel as FloatTunnel
from ._inside import TunnelConfig as TunnelConfig
from ._tunnel import TunnelCredentials as TunnelCredentials
from ._tunnel import TunnelPki as TunnelPki
from ._tunnel import check_tunnel_peer as check_tunnel_peer

__all__ = [
    "CONTROL_ADDRESS",
    "DEFAULT_AUDIT_BACKUPS",
    "DEFAULT_AUDIT_MAX_BYTES",
    "DEFAULT_TUNNEL_HANDSHAKE_TIMEOUT_SECONDS",
    "EVENTS_ADDRESS",
    "FLOAT_TRANSITIONS",
    "INBOUND_ADDRESS",
    "LATENCY_BUCKETS",
    "PROTOCOL_VERSION",
    "TUNNEL_MAX_BACKOFF_SECONDS",
    "ActivateFloat",
    "AuditLog",
    "AuditLogError",
    "ControlMessage",
    "ControlProtocolError",
    "DeactivateFloat",
    "EnvelopeReader",
    "Float",
    "FloatActivated",
    "FloatActivationError",
    "FloatActivationFailed",
    "FloatConfig",
    "FloatDeactivated",
    "FloatInput",
    "FloatState",
    "FloatTunnel",
    "ForwardedDelivery",
    "LatencySummary",
    "NodeTls",
    "TunnelConfig",
    "TunnelCredentials",
    "TunnelPki",
    "check_tunnel_peer",
    "decode_control",
    "encode_control",
    "float_transition",
    "install_outbound_guard",
]
