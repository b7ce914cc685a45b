"""corda_trio.transport: Trio drivers for the sans-IO AMQP engine, TLS dial / listen, peer checks.

``open_amqp_connection`` (client) and ``serve_amqp`` (server) run ``corda_trio.amqp.Connection`` over TCP,
optionally TLS (contexts and peer checks come from ``corda_trio.pki``); ``open_amqp_over_stream`` runs it over
any trio Stream. The sender/receiver API: ``Sender.send`` returns the peer's outcome only once settled;
``Receiver`` is an async iterator of ``Delivery`` objects that are settled with ``accept()`` and friends.

Limits: ``serve_amqp(..., max_connections=512)`` caps concurrent connections per listener (a client over the
cap gets a closed socket), and, once half the slots are in their handshake, ``max_handshakes_per_address=16``
those of one source address still in their handshake (one more from that address is closed at once).
Descriptor exhaustion is logged rate-limited and accepting resumes when descriptors come back. Connections
refused for a failed TLS handshake, a foreign certificate or an AMQP protocol violation are counted by reason
(``serve_amqp(..., refusals=InboundRefusals())``) and logged per source address at most once a minute: the
first in full, then a summary counting the rest. Per receiving link,
``AmqpConnection.open_receiver(..., max_message_size=)`` and
``LinkRequest.accept_receiver(..., max_message_size=)`` (default: ``ConnectionConfig.max_message_size``,
``None`` = no limit); a larger message detaches that link with ``amqp:link:message-size-exceeded`` and the
receiver raises ``LinkDetachedError``. A peer overrunning its credit is absorbed up to
``ConnectionConfig.max_credit_overrun`` deliveries and ``max_credit_overrun_bytes`` bytes
(``Receiver.overrun_total`` counts them); beyond that the link is detached. To refuse one delivery, settle
it with ``Delivery.reject(condition, description)``; to refuse a link, ``LinkRequest.refuse(condition)``.
Every close we decide on reaches the wire before the socket shuts: a graceful close waits for the peer's at
most ``CLOSE_TIMEOUT_SECONDS``; when the connection's owner is cancelled, the goodbye (our close out, the
peer's read back) takes at most ``CANCELLED_CLOSE_TIMEOUT_SECONDS``; over TLS a ``close_notify`` follows
(``CLOSE_NOTIFY_TIMEOUT_SECONDS``). A peer that our idle timeout found silent is not waited for: our close
goes out if the socket takes it, and the connection ends within ``SILENT_PEER_CLOSE_TIMEOUT_SECONDS``.

For the HTTP servers (network map, ``/metrics``): ``receive_http_event`` reads h11 events with the request
head bounded however it arrives (431 beyond) and ``100 Continue`` sent before a body is read;
``drain_before_close`` lets a refused client read its answer before the socket closes; ``http_response``
writes an answer with its standard reason phrase, and ``protocol_error_text`` says what h11 found wrong.
"""

from ._connect import DEFAULT_HANDSHAKE_TIMEOUT_SECONDS as DEFAULT_HANDSHAKE_TIMEOUT_SECONDS
from ._connect import DEFAULT_IDLE_TIMEOUT_SECONDS as DEFAULT_IDLE_TIMEOUT_SECONDS
from ._connect import HANDSHAKE_TIMEOUT_RANGE_SECONDS as HANDSHAKE_TIMEOUT_RANGE_SECONDS
from ._connect import IDLE_TIMEOUT_RANGE_SECONDS as IDLE_TIMEOUT_RANGE_SECONDS
from ._connect import PeerCheck as PeerCheck
from ._connect import idle_timeout_ms as idle_timeout_ms
from ._connect import open_amqp_connection as open_amqp_connection
from ._connect import open_amqp_over_stream as open_amqp_over_stream
from ._connect import secure_stream as secure_stream
from ._driver import CANCELLED_CLOSE_TIMEOUT_SECONDS as CANCELLED_CLOSE_TIMEOUT_SECONDS
from ._driver import CLOSE_NOTIFY_TIMEOUT_SECONDS as CLOSE_NOTIFY_TIMEOUT_SECONDS
from ._driver import CLOSE_TIMEOUT_SECONDS as CLOSE_TIMEOUT_SECONDS
from ._driver import PRE_OPEN_CLOSE_TIMEOUT_SECONDS as PRE_OPEN_CLOSE_TIMEOUT_SECONDS
from ._driver import SILENT_PEER_CLOSE_TIMEOUT_SECONDS as SILENT_PEER_CLOSE_TIMEOUT_SECONDS
from ._driver import AmqpConnection as AmqpConnection
from ._driver import Delivery as Delivery
from ._driver import LinkRequest as LinkRequest
from ._driver import PendingDelivery as PendingDelivery
from ._driver import Receiver as Receiver
from ._driver import RefillPolicy as RefillPolicy
from ._driver import Sender as Sender
from ._errors import AmqpConnectionError as AmqpConnectionError
from ._errors import AmqpTransportError as AmqpTransportError
from ._errors import AuthenticationError as AuthenticationError
from ._errors import DeliveryUnknownError as DeliveryUnknownError
from ._errors import HandshakeError as HandshakeError
from ._errors import LinkDetachedError as LinkDetachedError
from ._http import drain_before_close as drain_before_close
from ._http import http_response as http_response
from ._http import protocol_error_text as protocol_error_text
from ._http import receive_http_event as receive_http_event
from ._serve import ACCEPT_ERROR_LOG_INTERVAL_SECONDS as ACCEPT_ERROR_LOG_INTERVAL_SECONDS
from ._serve import DEFAULT_MAX_CONNECTIONS as DEFAULT_MAX_CONNECTIONS
from ._serve import DEFAULT_MAX_HANDSHAKES_PER_ADDRESS as DEFAULT_MAX_HANDSHAKES_PER_ADDRESS
from ._serve import MAX_REFUSING as MAX_REFUSING
from ._serve import REFUSE_TIMEOUT_SECONDS as REFUSE_TIMEOUT_SECONDS
from ._serve import SERVER_SASL_MECHANISMS as SERVER_SASL_MECHANISMS
from ._serve import HandshakeLimit as HandshakeLimit
from ._serve import InboundRefusals as InboundRefusals
from ._serve import listener_port as listener_port
from ._serve import refuse_with_http_503 as refuse_with_http_503
from ._serve import serve_amqp as serve_amqp
from ._serve import serve_listeners as serve_listeners
from ._socks import SocksError as SocksError
from ._socks import SocksProxy as SocksProxy
from ._socks import open_socks_stream as open_socks_stream
from ._tls_failures import is_certificate_date_failure as is_certificate_date_failure

__all__ = [
    "ACCEPT_ERROR_LOG_INTERVAL_SECONDS",
    "CANCELLED_CLOSE_TIMEOUT_SECONDS",
    "CLOSE_NOTIFY_TIMEOUT_SECONDS",
    "CLOSE_TIMEOUT_SECONDS",
    "DEFAULT_HANDSHAKE_TIMEOUT_SECONDS",
    "DEFAULT_IDLE_TIMEOUT_SECONDS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_HANDSHAKES_PER_ADDRESS",
    "HANDSHAKE_TIMEOUT_RANGE_SECONDS",
    "IDLE_TIMEOUT_RANGE_SECONDS",
    "MAX_REFUSING",
    "PRE_OPEN_CLOSE_TIMEOUT_SECONDS",
    "REFUSE_TIMEOUT_SECONDS",
    "SERVER_SASL_MECHANISMS",
    "SILENT_PEER_CLOSE_TIMEOUT_SECONDS",
    "AmqpConnection",
    "AmqpConnectionError",
    "AmqpTransportError",
    "AuthenticationError",
    "Delivery",
    "DeliveryUnknownError",
    "HandshakeError",
    "HandshakeLimit",
    "LinkDetachedError",
    "LinkRequest",
    "PeerCheck",
    "PendingDelivery",
    "Receiver",
    "RefillPolicy",
    "Sender",
    "SocksError",
    "SocksProxy",
    "drain_before_close",
    "http_response",
    "idle_timeout_ms",
    "is_certificate_date_failure",
    "listener_port",
    "open_amqp_connection",
    "open_amqp_over_stream",
    "open_socks_stream",
    "protocol_error_text",
    "receive_http_event",
    "refuse_with_http_503",
    "secure_stream",
    "serve_amqp",
    "serve_listeners",
]
