"""corda_trio.flows: multi-party protocols as explicit, checkpointed continuations.

Writing flows (see ``_logic`` for an example): a flow is an attrs class deriving from :class:`FlowLogic`,
whose steps return requests built by the :class:`FlowContext` (``send``, ``send_all``, ``receive``,
``receive_all``, ``send_and_receive``, ``sleep``, ``sub_flow``, ``close_sessions``, ``finish``).
:func:`initiating_flow` marks flows that open sessions (and can be started by name), :func:`initiated_by`
registers responders,
:func:`payload_type` registers attrs classes that may travel in payloads (msgpack, never pickle).

The pure core: the session messages (``_messages``), the state machine ``transition(state, event, env)``
(``_statemachine``), and the codecs (``_codec``) for payloads, the session wire format
(``protocol_spec/flow-sessions.md``) and checkpoints.
"""

from ._codec import decode_checkpoint as decode_checkpoint
from ._codec import decode_payload as decode_payload
from ._codec import decode_session_message as decode_session_message
from ._codec import decode_session_messages as decode_session_messages
from ._codec import encode_checkpoint as encode_checkpoint
from ._codec import encode_payload as encode_payload
from ._codec import encode_session_bundle as encode_session_bundle
from ._codec import encode_session_message as encode_session_message
from ._errors import COUNTER_FLOW_ERRORED as COUNTER_FLOW_ERRORED
from ._errors import ClientIdTakenError as ClientIdTakenError
from ._errors import FlowError as FlowError
from ._errors import FlowException as FlowException
from ._errors import FlowKilledError as FlowKilledError
from ._errors import FlowManagerDrainingError as FlowManagerDrainingError
from ._errors import PayloadError as PayloadError
from ._errors import RetryableFlowError as RetryableFlowError
from ._errors import SessionProtocolError as SessionProtocolError
from ._errors import UnexpectedFlowEndError as UnexpectedFlowEndError
from ._errors import UnknownFlowError as UnknownFlowError
from ._examples import MAX_BROADCAST_RECIPIENTS as MAX_BROADCAST_RECIPIENTS
from ._examples import MAX_EXAMPLE_TEXT_CHARS as MAX_EXAMPLE_TEXT_CHARS
from ._examples import MAX_PING_PONG_ROUNDS as MAX_PING_PONG_ROUNDS
from ._examples import Broadcast as Broadcast
from ._examples import BroadcastResponder as BroadcastResponder
from ._examples import FailingFlow as FailingFlow
from ._examples import FailingResponder as FailingResponder
from ._examples import PingPong as PingPong
from ._examples import PingPongResponder as PingPongResponder
from ._logic import FlowLogic as FlowLogic
from ._logic import initiated_by as initiated_by
from ._logic import initiating_flow as initiating_flow
from ._manager import CHECKPOINT_LOG as CHECKPOINT_LOG
from ._manager import DEFAULT_MAX_RESPONDERS_PER_PEER as DEFAULT_MAX_RESPONDERS_PER_PEER
from ._manager import FlowHandle as FlowHandle
from ._manager import FlowInfo as FlowInfo
from ._manager import FlowManager as FlowManager
from ._manager import FlowManagerConfig as FlowManagerConfig
from ._manager import FlowManagerStatistics as FlowManagerStatistics
from ._manager import build_flow as build_flow
from ._manager import checkpoint_records as checkpoint_records
from ._messages import SESSION_TOPIC as SESSION_TOPIC
from ._messages import ConfirmPayload as ConfirmPayload
from ._messages import DataPayload as DataPayload
from ._messages import EndPayload as EndPayload
from ._messages import ErrorPayload as ErrorPayload
from ._messages import ExistingSessionMessage as ExistingSessionMessage
from ._messages import InitialSessionMessage as InitialSessionMessage
from ._messages import RejectPayload as RejectPayload
from ._messages import error_dedup_id as error_dedup_id
from ._messages import normal_dedup_id as normal_dedup_id
from ._registry import payload_type as payload_type
from ._registry import registry as registry
from ._requests import FlowSession as FlowSession
from ._statemachine import Environment as Environment
from ._statemachine import FlowContext as FlowContext
from ._statemachine import FlowState as FlowState
from ._statemachine import Kill as Kill
from ._statemachine import MessageArrived as MessageArrived
from ._statemachine import Start as Start
from ._statemachine import TimerFired as TimerFired
from ._statemachine import Transition as Transition
from ._statemachine import new_initiator as new_initiator
from ._statemachine import new_responder as new_responder
from ._statemachine import transition as transition

__all__ = [
    "CHECKPOINT_LOG",
    "COUNTER_FLOW_ERRORED",
    "DEFAULT_MAX_RESPONDERS_PER_PEER",
    "MAX_BROADCAST_RECIPIENTS",
    "MAX_EXAMPLE_TEXT_CHARS",
    "MAX_PING_PONG_ROUNDS",
    "SESSION_TOPIC",
    "Broadcast",
    "BroadcastResponder",
    "ClientIdTakenError",
    "ConfirmPayload",
    "DataPayload",
    "EndPayload",
    "Environment",
    "ErrorPayload",
    "ExistingSessionMessage",
    "FailingFlow",
    "FailingResponder",
    "FlowContext",
    "FlowError",
    "FlowException",
    "FlowHandle",
    "FlowInfo",
    "FlowKilledError",
    "FlowLogic",
    "FlowManager",
    "FlowManagerConfig",
    "FlowManagerDrainingError",
    "FlowManagerStatistics",
    "FlowSession",
    "FlowState",
    "InitialSessionMessage",
    "Kill",
    "MessageArrived",
    "PayloadError",
    "PingPong",
    "PingPongResponder",
    "RejectPayload",
    "RetryableFlowError",
    "SessionProtocolError",
    "Start",
    "TimerFired",
    "Transition",
    "UnexpectedFlowEndError",
    "UnknownFlowError",
    "build_flow",
    "checkpoint_records",
    "decode_checkpoint",
    "decode_payload",
    "decode_session_message",
    "decode_session_messages",
    "encode_checkpoint",
    "encode_payload",
    "encode_session_bundle",
    "encode_session_message",
    "error_dedup_id",
    "initiated_by",
    "initiating_flow",
    "new_initiator",
    "new_responder",
    "normal_dedup_id",
    "payload_type",
    "registry",
    "transition",
]
