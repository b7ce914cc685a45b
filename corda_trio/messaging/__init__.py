"""corda_trio.messaging: the P2P message model, the messaging service and receive-side deduplication.

* ``_model`` (pure): addresses ``p2p.inbound.<key-hash>`` / ``internal.peers.<key-hash>``, Corda's P2P
  header names, :func:`to_amqp` / :func:`from_amqp` and the receiver's checks;
* :class:`MessagingService`: ``create_message``, ``send`` (durable in the outbound queue, created on demand;
  to itself straight into its inbox), ``add_message_handler`` and the inbox dispatcher;
* :class:`Deduplicator`: ``_AMQ_DUPL_ID`` being processed in memory plus persisted ids, retired in
  generations;
* :class:`PeerResolver` / :class:`PeerDirectory`: who the peers are (fed from the network map by the node).
"""

from ._dedupe import DEFAULT_RETAIN as DEFAULT_RETAIN
from ._dedupe import GENERATION_PREFIX as GENERATION_PREFIX
from ._dedupe import Deduplicator as Deduplicator
from ._dedupe import MalformedDedupRecordError as MalformedDedupRecordError
from ._model import HEADER_DEDUP_ID as HEADER_DEDUP_ID
from ._model import HEADER_MESSAGE_TYPE as HEADER_MESSAGE_TYPE
from ._model import HEADER_PLATFORM_VERSION as HEADER_PLATFORM_VERSION
from ._model import HEADER_RELEASE_VERSION as HEADER_RELEASE_VERSION
from ._model import HEADER_SEND_SEQ_NO as HEADER_SEND_SEQ_NO
from ._model import HEADER_SENDER_UUID as HEADER_SENDER_UUID
from ._model import HEADER_TOPIC as HEADER_TOPIC
from ._model import HEADER_VALIDATED_USER as HEADER_VALIDATED_USER
from ._model import HEADER_VENDOR as HEADER_VENDOR
from ._model import INBOX_PREFIX as INBOX_PREFIX
from ._model import OUTBOUND_PREFIX as OUTBOUND_PREFIX
from ._model import REQUIRED_HEADERS as REQUIRED_HEADERS
from ._model import InvalidMessageError as InvalidMessageError
from ._model import OutgoingMessage as OutgoingMessage
from ._model import ReceivedMessage as ReceivedMessage
from ._model import check_inbox_sender as check_inbox_sender
from ._model import check_message_format as check_message_format
from ._model import check_p2p_message as check_p2p_message
from ._model import from_amqp as from_amqp
from ._model import inbox_address as inbox_address
from ._model import key_hash_of_address as key_hash_of_address
from ._model import outbound_queue as outbound_queue
from ._model import stamp_validated_user as stamp_validated_user
from ._model import stamped_payload as stamped_payload
from ._model import to_amqp as to_amqp
from ._peers import Peer as Peer
from ._peers import PeerDirectory as PeerDirectory
from ._peers import PeerResolver as PeerResolver
from ._service import DEAD_LETTER_QUEUE as DEAD_LETTER_QUEUE
from ._service import DEFAULT_MAX_MESSAGE_SIZE as DEFAULT_MAX_MESSAGE_SIZE
from ._service import DeferredReceipt as DeferredReceipt
from ._service import Handler as Handler
from ._service import HandlerRegistration as HandlerRegistration
from ._service import MessageTooLargeError as MessageTooLargeError
from ._service import MessagingConfig as MessagingConfig
from ._service import MessagingService as MessagingService
from ._service import UnknownRecipientError as UnknownRecipientError

__all__ = [
    "DEAD_LETTER_QUEUE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_RETAIN",
    "GENERATION_PREFIX",
    "HEADER_DEDUP_ID",
    "HEADER_MESSAGE_TYPE",
    "HEADER_PLATFORM_VERSION",
    "HEADER_RELEASE_VERSION",
    "HEADER_SENDER_UUID",
    "HEADER_SEND_SEQ_NO",
    "HEADER_TOPIC",
    "HEADER_VALIDATED_USER",
    "HEADER_VENDOR",
    "INBOX_PREFIX",
    "OUTBOUND_PREFIX",
    "REQUIRED_HEADERS",
    "Deduplicator",
    "DeferredReceipt",
    "Handler",
    "HandlerRegistration",
    "InvalidMessageError",
    "MalformedDedupRecordError",
    "MessageTooLargeError",
    "MessagingConfig",
    "MessagingService",
    "OutgoingMessage",
    "Peer",
    "PeerDirectory",
    "PeerResolver",
    "ReceivedMessage",
    "UnknownRecipientError",
    "check_inbox_sender",
    "check_message_format",
    "check_p2p_message",
    "from_amqp",
    "inbox_address",
    "key_hash_of_address",
    "outbound_queue",
    "stamp_validated_user",
    "stamped_payload",
    "to_amqp",
]
