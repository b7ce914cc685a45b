"""corda_trio.rpc: the node's RPC over websockets (trio-websocket), msgpack frames with request ids.

* ``_protocol`` (pure): frame shapes, methods and the permission each needs, error codes;
* :class:`RpcServer`: login (argon2 password hashes, :class:`UserDatabase`), per-user permissions,
  dispatch to handlers the node provides; bad frames get error replies and the server keeps serving;
* :func:`connect` / :class:`RpcClient`: the Python client (many calls at once over one websocket).

The wire protocol is described in ``protocol_spec/rpc.md``.
"""

from ._auth import MAX_HASH_MEMORY_KIB as MAX_HASH_MEMORY_KIB
from ._auth import MAX_HASH_PARALLELISM as MAX_HASH_PARALLELISM
from ._auth import MAX_HASH_WORK as MAX_HASH_WORK
from ._auth import RpcUser as RpcUser
from ._auth import UserDatabase as UserDatabase
from ._auth import check_password_hash as check_password_hash
from ._auth import hash_password as hash_password
from ._client import RpcClient as RpcClient
from ._client import RpcConnectionError as RpcConnectionError
from ._client import connect as connect
from ._protocol import MAX_REQUEST_BYTES as MAX_REQUEST_BYTES
from ._protocol import METHODS as METHODS
from ._protocol import PERMISSION_ADMIN as PERMISSION_ADMIN
from ._protocol import PERMISSION_READ as PERMISSION_READ
from ._protocol import ErrorCode as ErrorCode
from ._protocol import allowed as allowed
from ._protocol import parse_permission as parse_permission
from ._server import DEFAULT_MAX_CONNECTIONS as DEFAULT_MAX_CONNECTIONS
from ._server import Call as Call
from ._server import Handler as Handler
from ._server import ImmediateHandler as ImmediateHandler
from ._server import RpcError as RpcError
from ._server import RpcServer as RpcServer
from ._server import RpcServerStatistics as RpcServerStatistics

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "MAX_HASH_MEMORY_KIB",
    "MAX_HASH_PARALLELISM",
    "MAX_HASH_WORK",
    "MAX_REQUEST_BYTES",
    "METHODS",
    "PERMISSION_ADMIN",
    "PERMISSION_READ",
    "Call",
    "ErrorCode",
    "Handler",
    "ImmediateHandler",
    "RpcClient",
    "RpcConnectionError",
    "RpcError",
    "RpcServer",
    "RpcServerStatistics",
    "RpcUser",
    "UserDatabase",
    "allowed",
    "check_password_hash",
    "connect",
    "hash_password",
    "parse_permission",
]
