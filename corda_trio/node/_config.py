"""Node and network-map-service configuration: TOML files read with ``tomllib`` into frozen, validated
objects.

Theory of operation
-------------------
``node.toml`` (written by ``corda-trio network bootstrap``, read by the node)::

    legal_name = "O=Alice, L=London, C=GB"
    base_directory = "."                 # relative to this file; every other path is relative to it

    [p2p]
    address = "127.0.0.1:40001"          # what peers dial: advertised in the NodeInfo (unless `advertise`
                                         # is given); also where the node listens unless `listen` is. Not
                                         # 0.0.0.0 / [::] / 0 (nobody can dial a wildcard: bind it with
                                         # `listen` and put the host peers reach here)
    # listen = "0.0.0.0:40001"           # optional: a different bind address (a wildcard is fine here)
    # advertise = ["float-a.example.com:10002", "float-b.example.com:10002"]
                                         # optional: what the NodeInfo lists instead of `address`, in this
                                         # order (peers' bridges dial them round-robin); 1..16 "HOST:PORT",
                                         # no duplicates, no 0.0.0.0 / [::]. Default: [address]
    idle_timeout_seconds = 10            # a peer's connection (or a bridge process's) that brings nothing
                                         # this long (no frame, nor 8 bytes of a frame still arriving) is
                                         # closed (advertised to it as half); 1..3600

    [rpc]
    address = "127.0.0.1:40002"          # the RPC websocket (ws://HOST:PORT); port 0: any free port

    [[rpc.users]]                        # repeat for each user
    username = "ops"
    password_hash = "$argon2id$v=19$..." # `corda-trio node hash-password` prints one
    permissions = ["admin"]              # admin | read | start_flow:* | start_flow:<FlowName>

    [metrics]
    address = "127.0.0.1:0"              # Prometheus /metrics over HTTP; port 0: any free port
    enabled = true

    [network]
    map_url = "http://127.0.0.1:40000"   # omit for a network without a map service (directory mode)
    trust_root = "certificates/network-root.cert.pem"
    network_parameters = "network-parameters"
    additional_node_infos = "additional-node-infos"  # a directory (it need not exist; a file is refused)
                                         # of peers' nodeInfo-* files, read at start and at each poll
                                         # (every 2 s without map_url): copy a peer's new one in while
                                         # this node runs. This node writes its own, at each start, to
                                         # <base_directory>/nodeInfo-<HASH> for the operator to copy
    node_info_cache = "network-map-cache.db"         # a file (a directory there is refused)

    [keys]
    node_ca_cert_chain = "certificates/node-ca.chain.pem"
    node_ca_key = "certificates/node-ca.key.pem"
    tls_cert_chain = "certificates/tls.chain.pem"
    tls_key = "certificates/tls.key.pem"
    identity_cert_chain = "certificates/identity.chain.pem"
    identity_key = "certificates/identity.key.pem"
    passphrase_env = "CORDA_TRIO_KEY_PASSPHRASE"   # exactly one of passphrase_env / passphrase_file
    # passphrase_file = "certificates/passphrase"

    [store]
    directory = "store"                  # recorded in <base>/store.json at the first start: a store missing
                                         # later, or another directory here, stops the start (one line)
    fsync = "always"                     # "always" | "none" (none: benchmarks only, loses data on crash)
    commit_process = true                # group commits in a helper process (false: worker threads)

    [bridge]
    mode = "in-process"                  # "in-process" | "external" (a separate `corda-trio bridge start`)
    # external only: the node's local endpoint the bridge process connects to (loopback), and its login
    # endpoint = "127.0.0.1:10005"
    # username = "bridge"
    # password_env = "CORDA_TRIO_BRIDGE_PASSWORD"   # or password_file = "bridge.password" (mode 0600)
    # in-process only: dial peers through a SOCKS proxy (socks5:// or socks4://, optional USER@; the
    # SOCKS5 password from proxy_password_env or proxy_password_file, never in the URL)
    # proxy = "socks5://corda@10.0.0.9:1080"
    # proxy_password_env = "CORDA_TRIO_PROXY_PASSWORD"   # or proxy_password_file = "proxy.password" (0600)

    [float]                              # optional (in-process bridge): peers reach us through floats
    control = ["10.0.0.5:10010", "10.0.0.6:10010"]  # their control ports, in order (one active at a time)
    tunnel_cert = "tunnel/bridge.pem"    # `corda-trio float tunnel-pki` makes these three
    tunnel_key = "tunnel/bridge.key"
    tunnel_ca = "tunnel/tunnel-ca.pem"
    tls_ref = "node"                     # which [tls.NAME] of float.toml the float presents to peers
    idle_timeout_seconds = 10            # the control link's idle timeout: a float silent this long (frozen,
                                         # cut off) is given up for the next; 1..3600
    handshake_timeout_seconds = 3        # a float that has not completed the control link's TLS and AMQP
                                         # handshake by then is skipped (a frozen one's kernel still
                                         # completes the TCP connect); 0.5..300
    # With [float] the node opens no p2p listener of its own: p2p.address must be the floats' public
    # address (what peers dial; it is advertised in the NodeInfo) and p2p.listen is not allowed. Floats on
    # two hosts with two public addresses and no DNS name / virtual IP that follows the active one: list
    # both in p2p.advertise (a standby float's port is closed, so a peer's dial there fails fast and its
    # bridge tries the next address).

    [logging]
    format = "text"                      # "text" (one line per record: control characters in messages,
                                         # such as a newline in a client id, escaped as \\x0a) | "json"
                                         # (one JSON object per line)
    level = "info"                       # "debug" | "info" | "warning" | "error"
    file = "logs/node.log"

    [shutdown]
    timeout_seconds = 10                 # how long SIGTERM / Ctrl-C waits for running flows to finish;
                                         # then closing the store waits as long again (at least 1 s) for
                                         # the commit helper process: one that answers nothing (frozen)
                                         # is killed and the node exits 1 (`fatal store error`)

    [flows]
    max_responders_per_peer = 10000      # flows one peer may have started here and not finished; its
                                         # session inits beyond are rejected with the reason (its flow
                                         # fails at once), counted in /metrics, warned about once a minute
    modules = ["mycorp.flows"]           # Python modules imported at start (from the node's Python path:
                                         # installed, or PYTHONPATH), before any checkpoint is loaded: their
                                         # @initiating_flow classes can be started by name, their
                                         # @initiated_by classes answer peers (default: none; the example
                                         # flows PingPong, Broadcast and FailingFlow are always there)

Only ``legal_name``, ``p2p.address``, ``rpc.address`` and ``keys.passphrase_*`` are required; the rest
default to the values shown.  Unknown sections or keys are errors (a typo must not silently fall back to a
default), and every error names the file, the key and what is wrong.  Paths in the loaded object are
absolute.

``networkmap.toml`` (written by ``corda-trio network bootstrap`` into ``<dir>/network-map/``, read by
``corda-trio networkmap serve``) works the same way; its paths are relative to the file::

    [service]
    address = "127.0.0.1:40000"          # where the map serves HTTP: the nodes' network.map_url
    max_age_seconds = 30                 # the max-age of the map it serves, so how often nodes poll it
                                         # (a new or removed node reaches its peers within it); 1..86400
    database = "networkmap.db"           # the published NodeInfos and the removed names (SQLite)

    [files]
    trust_root = "../network-root/root.cert.pem"
    map_cert_chain = "map.chain.pem"     # the map's signing certificate, issued by the network root
    map_key = "map.key.pem"
    network_parameters = "network-parameters"   # the signed network parameters it serves

    [keys]
    passphrase_file = "passphrase"       # of map_key; or passphrase_env = "VAR" (exactly one of the two)

    [metrics]                            # optional: the service's Prometheus /metrics (docs/metrics.md)
    address = "127.0.0.1:40001"          # HOST:PORT (port 0: any free port); none: no /metrics

Only ``database`` and ``max_age_seconds`` have defaults (shown); without ``[metrics]`` the service serves no
/metrics.
"""

from __future__ import annotations

import enum
import ipaddress
import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TypeVar, final

import attrs

from corda_trio import flows, network, pki, rpc, store, transport
from corda_trio.bridge import float as float_
from corda_trio.files import read_small_file

__all__ = [
    "BridgeMode",
    "ConfigError",
    "FloatSettings",
    "KeyPassphrase",
    "LogFormat",
    "NetworkMapServiceConfig",
    "NodeConfig",
    "dump_network_map_config",
    "dump_node_config",
    "load_network_map_config",
    "load_node_config",
]

E = TypeVar("E", bound=enum.Enum)

#: Default environment variable holding the key passphrase.
DEFAULT_PASSPHRASE_ENV: Final[str] = "CORDA_TRIO_KEY_PASSPHRASE"


class ConfigError(Exception):
    """A configuration file is missing, not TOML, or has a missing, unknown or invalid setting."""


@final
@attrs.frozen(kw_only=True)
class KeyPassphrase:
    """Where a secret comes from, an environment variable or a file: the passphrase of the private keys, or
    (``what``) a password the node or bridge process needs, which its errors then name."""

    env: str | None = None
    file: Path | None = None
    #: What the secret is, as its errors say it; the last word also names its file ("password file ...").
    what: str = "key passphrase"

    def __attrs_post_init__(self) -> None:
        if (self.env is None) == (self.file is None):
            raise ConfigError("exactly one of keys.passphrase_env and keys.passphrase_file must be set")

    def read(self, environ: Mapping[str, str] | None = None) -> bytes:
        """The passphrase (from ``environ``, default ``os.environ``, or the file).

        Raises:
            ConfigError: the variable is unset or empty, or the file is unreadable, empty or readable by
                group or others.
        """
        noun = self.what.rsplit(" ", 1)[-1]
        if self.env is not None:
            value = (os.environ if environ is None else environ).get(self.env)
            if not value:
                state = "empty" if value == "" else "not set"
                raise ConfigError(f"environment variable {self.env} (the {self.what}) is {state}")
            # (bytes that are not UTF-8 reach os.environ as surrogate escapes: the passphrase's own bytes)
            return value.encode("utf-8", "surrogateescape")
        assert self.file is not None
        try:
            mode = self.file.stat().st_mode
            value = read_small_file(self.file).decode("utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {noun} file {str(self.file)!r}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{noun} file {str(self.file)!r} is not UTF-8 text (byte {exc.start})"
            ) from None
        except ValueError:  # a NUL in the path (open() and stat() raise ValueError, not OSError)
            raise ConfigError(f"{noun} file {str(self.file)!r}: a path cannot hold a NUL character") from None
        if mode & 0o077:
            raise ConfigError(f"{noun} file {str(self.file)!r} must not be readable by group or others")
        if not value:
            raise ConfigError(f"{noun} file {str(self.file)!r} is empty")
        return value.encode()

    def read_text(self, environ: Mapping[str, str] | None = None) -> str:
        """The secret as text (a password), as :meth:`read` reads it.

        Raises:
            ConfigError: as :meth:`read`, or the variable's bytes are not UTF-8.
        """
        try:
            return self.read(environ).decode()
        except UnicodeDecodeError as exc:  # (a file's text is checked when read; a variable's is not)
            raise ConfigError(
                f"environment variable {self.env} (the {self.what}) is not UTF-8 text (byte {exc.start})"
            ) from None


class BridgeMode(enum.Enum):
    """Where the node's bridges run."""

    IN_PROCESS = "in-process"
    EXTERNAL = "external"


@final
@attrs.frozen(kw_only=True)
class FloatSettings:
    """``[float]``: the floats' control ports (in order of preference) and this end's tunnel files."""

    control: tuple[network.NetworkHostAndPort, ...]
    tunnel_cert: Path
    tunnel_key: Path
    tunnel_ca: Path
    tls_ref: str = "node"
    #: ``[float] idle_timeout_seconds``: a float silent this long on the control link is given up.
    idle_timeout_seconds: float = transport.DEFAULT_IDLE_TIMEOUT_SECONDS
    #: ``[float] handshake_timeout_seconds``: a float that has not completed the control link's handshake
    #: within this is skipped for the next (a frozen standby's kernel completes the TCP connect).
    handshake_timeout_seconds: float = float_.DEFAULT_TUNNEL_HANDSHAKE_TIMEOUT_SECONDS


class LogFormat(enum.Enum):
    TEXT = "text"
    JSON = "json"


LOG_LEVELS: Final[tuple[str, ...]] = ("debug", "info", "warning", "error")
#: Default of ``[shutdown] timeout_seconds``: long enough for short flows to finish, short enough that an
#: operator's SIGTERM is not ignored (a service manager usually escalates to SIGKILL after 30 to 90 s).
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS: Final[float] = 10.0
#: Allowed ``[flows] max_responders_per_peer`` (the default is ``flows.DEFAULT_MAX_RESPONDERS_PER_PEER``).
MAX_RESPONDERS_PER_PEER_RANGE: Final[tuple[int, int]] = (1, 1_000_000)
#: Default of ``[bridge] endpoint`` (``network bootstrap --host`` an IPv6 address writes ``[::1]:0``).
DEFAULT_BRIDGE_ENDPOINT: Final[tuple[str, int]] = ("127.0.0.1", 0)


@final
@attrs.frozen(kw_only=True)
class NodeConfig:
    """A validated node configuration (all paths absolute)."""

    legal_name: pki.CordaX500Name
    base_directory: Path
    p2p_address: network.NetworkHostAndPort
    p2p_listen: network.NetworkHostAndPort
    rpc_address: network.NetworkHostAndPort
    network_map_url: str | None
    trust_root: Path
    network_parameters: Path
    additional_node_infos: Path
    node_info_cache: Path
    node_ca_cert_chain: Path
    node_ca_key: Path
    tls_cert_chain: Path
    tls_key: Path
    identity_cert_chain: Path
    identity_key: Path
    key_passphrase: KeyPassphrase
    store_directory: Path
    store_fsync: store.FsyncPolicy = store.FsyncPolicy.ALWAYS
    store_commit_process: bool = True
    rpc_users: tuple[rpc.RpcUser, ...] = ()
    #: ``None``: no /metrics endpoint.
    metrics_address: tuple[str, int] | None = ("127.0.0.1", 0)
    bridge_mode: BridgeMode = BridgeMode.IN_PROCESS
    #: External mode: where the local endpoint listens (loopback; port 0: any), its user and password source.
    bridge_endpoint: tuple[str, int] = DEFAULT_BRIDGE_ENDPOINT
    bridge_username: str = "bridge"
    bridge_password: KeyPassphrase | None = None
    #: In-process bridges dial peers through this SOCKS proxy (its password, if any, from
    #: ``bridge_proxy_password``); ``None``: directly.
    bridge_proxy: transport.SocksProxy | None = None
    bridge_proxy_password: KeyPassphrase | None = None
    #: ``None``: the node listens for peers itself; else peers reach it through these floats.
    floats: FloatSettings | None = None
    #: ``[p2p] idle_timeout_seconds``: a peer (or a bridge process) silent this long is given up.
    p2p_idle_timeout_seconds: float = transport.DEFAULT_IDLE_TIMEOUT_SECONDS
    #: ``[p2p] advertise``: the addresses the NodeInfo lists, in order; ``()``: ``(p2p_address,)``.
    p2p_advertise: tuple[network.NetworkHostAndPort, ...] = ()
    log_format: LogFormat = LogFormat.TEXT
    log_level: str = "info"
    #: ``None``: ``<base_directory>/logs/node.log``.
    log_file: Path | None = None
    shutdown_timeout_seconds: float = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS
    #: ``[flows] max_responders_per_peer``: live flows one peer may have started on this node.
    flows_max_responders_per_peer: int = flows.DEFAULT_MAX_RESPONDERS_PER_PEER
    #: ``[flows] modules``: Python modules the node imports at start, for the flows they register.
    flows_modules: tuple[str, ...] = ()

    @property
    def advertised_addresses(self) -> tuple[network.NetworkHostAndPort, ...]:
        """What this node's NodeInfo lists (peers dial them round-robin): ``p2p.advertise``, else
        ``p2p.address``."""
        return self.p2p_advertise or (self.p2p_address,)

    @property
    def log_path(self) -> Path:
        return self.log_file if self.log_file is not None else self.base_directory / "logs" / "node.log"

    def __attrs_post_init__(self) -> None:
        _check_absolute(self)
        if not isinstance(self.store_fsync, store.FsyncPolicy):
            raise ConfigError(f"store_fsync must be a store.FsyncPolicy, got {self.store_fsync!r}")
        if self.network_map_url is not None and not self.network_map_url.startswith("http://"):
            raise ConfigError(f"network_map_url must be an http:// URL, got {self.network_map_url!r}")


@final
@attrs.frozen(kw_only=True)
class NetworkMapServiceConfig:
    """A validated ``networkmap.toml`` (all paths absolute)."""

    address: network.NetworkHostAndPort
    max_age_seconds: int
    trust_root: Path
    map_cert_chain: Path
    map_key: Path
    network_parameters: Path
    database: Path
    key_passphrase: KeyPassphrase
    #: ``[metrics] address``: where the service serves its /metrics (port 0: any free port); ``None``: not.
    metrics_address: tuple[str, int] | None = None

    def __attrs_post_init__(self) -> None:
        _check_absolute(self)


def _check_absolute(config: object) -> None:
    for field in attrs.fields(type(config)):
        value = getattr(config, field.name)
        if isinstance(value, Path) and not value.is_absolute():
            raise ConfigError(f"{field.name} must be an absolute path, got {str(value)!r}")


class _Reader:
    """Pops settings out of a parsed TOML table and reports problems with the file and key in the message."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self._sections: list[str] = []  # (named in the unknown-setting error of :meth:`finish`)

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {message}")

    def section(self, name: str, allowed: set[str]) -> dict[str, Any]:
        self._sections.append(name)
        value = self.data.pop(name, {})
        if not isinstance(value, dict):
            raise self.fail(name, "must be a table ([" + name + "])")
        unknown = set(value) - allowed
        if unknown:
            raise self.fail(
                f"{name}.{sorted(unknown)[0]}", f"unknown setting (allowed: {', '.join(sorted(allowed))})"
            )
        return value

    def string(self, table: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
        value = table.get(key, default)
        if value is None:
            raise self.fail(where, "is required")
        if not isinstance(value, str) or not value:
            raise self.fail(where, f"must be a non-empty string, got {value!r}")
        if "\x00" in value:  # no path, name or address holds one (open() would raise ValueError)
            raise self.fail(where, f"must not contain a NUL character, got {value!r}")
        return value

    def address(
        self, table: dict[str, Any], key: str, where: str, default: str | None = None
    ) -> network.NetworkHostAndPort:
        text = self.string(table, key, where, default)
        try:
            return network.NetworkHostAndPort.parse(text)
        except ValueError as exc:
            raise self.fail(where, str(exc)) from None

    def choice(self, table: dict[str, Any], key: str, where: str, kind: type[E], default: E) -> E:
        value = table.get(key, default.value)
        try:
            return kind(value)
        except ValueError:
            choices = " or ".join(f'"{member.value}"' for member in kind)  # type: ignore[attr-defined]
            raise self.fail(where, f"must be {choices}, got {value!r}") from None

    def seconds(
        self,
        table: dict[str, Any],
        key: str,
        where: str,
        bounds: tuple[float, float],
        default: float | None = None,
    ) -> float:
        """A number of seconds within ``bounds`` (``default``: the transport's idle timeout if omitted)."""
        if default is None:
            default = transport.DEFAULT_IDLE_TIMEOUT_SECONDS
        value = table.get(key, default)
        problem = seconds_problem(value, bounds)
        if problem is not None:
            raise self.fail(where, problem)
        return float(value)

    def finish(self, *top_level: str) -> None:
        """Refuse what is left at the top level, naming what the file may hold there: the ``top_level``
        keys and the tables read with :meth:`section` (a misspelt ``[metric]`` names ``[metrics]``)."""
        if self.data:
            allowed = [*sorted(top_level), *(f"[{name}]" for name in sorted(self._sections))]
            raise self.fail(sorted(self.data)[0], f"unknown setting (allowed: {', '.join(allowed)})")


def seconds_problem(value: object, bounds: tuple[float, float]) -> str | None:
    """What is wrong with ``value`` as a number of seconds in ``bounds`` (``None``: nothing); the one wording
    of node.toml, bridge.toml and float.toml."""
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        return f"must be a number of seconds in {low:g}..{high:g}, got {value!r}"
    return None


#: ``[float]`` of node.toml and bridge.toml.
FLOAT_KEYS: Final = frozenset(
    {"control", "tunnel_cert", "tunnel_key", "tunnel_ca", "tls_ref", "idle_timeout_seconds",
     "handshake_timeout_seconds"}
)  # fmt: skip


def _join(base: Path, relative: str) -> Path:
    """``base / relative`` with ``..`` and ``.`` folded (symlinks are left alone, unlike ``resolve``)."""
    return Path(os.path.normpath(base / relative))


#: What tells the configuration files apart (their required tables or keys), to say which one was given
#: where another was expected: node.toml's ``legal_name`` was 'keys.identity_cert_chain: unknown setting'
#: to ``networkmap serve --config``, 'unknown section [legal_name]' to ``float start``.
_KIND_MARKS: Final[dict[str, tuple[str, ...]]] = {
    "node.toml": ("legal_name",),
    "networkmap.toml": ("service", "files"),
    "float.toml": ("control", "public"),
    "bridge.toml": ("node", "tls"),
}


def _read_toml(path: Path, kind: str | None = None) -> dict[str, Any]:
    """The TOML document of ``path``; with ``kind`` (``"node.toml"`` ...), one that is plainly another kind
    of configuration file is refused, saying which."""
    data = _parse_toml(path)
    if kind is not None:
        other = next(
            (k for k, marks in _KIND_MARKS.items() if k != kind and all(m in data for m in marks)), None
        )
        if other is not None and not all(m in data for m in _KIND_MARKS[kind]):
            raise ConfigError(f"{path}: this is a {other}, not a {kind}")
    return data


def _parse_toml(path: Path) -> dict[str, Any]:
    try:
        # (utf-8-sig: a byte order mark before the first line, as Windows editors save UTF-8, is passed over;
        # tomllib took it for a key and said 'Invalid statement (at line 1, column 1)')
        return tomllib.loads(read_small_file(path).decode("utf-8-sig"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # (decoded here, before tomllib: not a TOMLDecodeError)
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:  # (tomllib parses arrays and inline tables recursively: a ten-line traceback)
        raise ConfigError(f"{path}: not valid TOML: nested too deeply to read") from None


def _passphrase(r: _Reader, keys: dict[str, Any], base: Path) -> KeyPassphrase:
    env = keys.get("passphrase_env")
    file = keys.get("passphrase_file")
    if env is not None and (not isinstance(env, str) or not env.replace("_", "").isalnum()):
        raise r.fail("keys.passphrase_env", f"must be an environment variable name, got {env!r}")
    if file is not None and (not isinstance(file, str) or not file):
        raise r.fail("keys.passphrase_file", "must be a non-empty path")
    try:
        return KeyPassphrase(env=env, file=_join(base, file) if file else None)
    except ConfigError as exc:
        raise r.fail("keys", str(exc)) from None


def load_node_config(path: str | os.PathLike[str]) -> NodeConfig:
    """Read and validate a ``node.toml``.

    Raises:
        ConfigError: the first problem found, naming file and key.
    """
    path = Path(path).absolute()
    r = _Reader(path, _read_toml(path, "node.toml"))
    legal_name_text = r.string(r.data, "legal_name", "legal_name")
    r.data.pop("legal_name")
    try:
        legal_name = pki.CordaX500Name.parse(legal_name_text)
    except pki.InvalidNameError as exc:
        raise r.fail("legal_name", str(exc)) from None
    base_text = r.data.pop("base_directory", ".")
    if not isinstance(base_text, str) or not base_text or "\x00" in base_text:
        raise r.fail("base_directory", f"must be a non-empty path without NUL characters, got {base_text!r}")
    base = (path.parent / base_text).resolve()
    p2p = r.section("p2p", {"address", "listen", "advertise", "idle_timeout_seconds"})
    rpc = r.section("rpc", {"address", "users"})
    metrics = r.section("metrics", {"address", "enabled"})
    bridge_table = r.section(
        "bridge",
        {"mode", "endpoint", "username", "password_env", "password_file", "proxy", "proxy_password_env",
         "proxy_password_file"},
    )  # fmt: skip
    float_table = r.section("float", FLOAT_KEYS)
    logging_table = r.section("logging", {"format", "level", "file"})
    shutdown = r.section("shutdown", {"timeout_seconds"})
    flows_table = r.section("flows", {"max_responders_per_peer", "modules"})
    net = r.section(
        "network", {"map_url", "trust_root", "network_parameters", "additional_node_infos", "node_info_cache"}
    )
    keys = r.section(
        "keys",
        {"node_ca_cert_chain", "node_ca_key", "tls_cert_chain", "tls_key", "identity_cert_chain",
         "identity_key", "passphrase_env", "passphrase_file"},
    )  # fmt: skip
    store_table = r.section("store", {"directory", "fsync", "commit_process"})
    r.finish("legal_name", "base_directory")
    p2p_address = r.address(p2p, "address", "p2p.address")
    if p2p_address.is_unspecified:  # (what the NodeInfo advertises unless p2p.advertise is given)
        bind = "" if float_table else f'; to listen on every interface, set p2p.listen = "{p2p_address}"'
        raise r.fail(
            "p2p.address",
            f"{p2p_address} is not an address peers can dial: set the host:port they reach{bind}",
        )
    advertise: tuple[network.NetworkHostAndPort, ...] = ()
    if "advertise" in p2p:
        advertise = _address_list(
            r, p2p["advertise"], "p2p.advertise", "the addresses peers dial", limit=network.MAX_ADDRESSES
        )  # (a NodeInfo lists at most MAX_ADDRESSES: one more and no peer would take it)
        for i, address in enumerate(advertise):
            if address.is_unspecified:
                raise r.fail(
                    f"p2p.advertise[{i}]",
                    f"{address} is not an address peers can dial (advertise the host they reach)",
                )
    map_url = net.get("map_url")
    if map_url is not None:
        if not isinstance(map_url, str) or not map_url.startswith("http://") or "\x00" in map_url:
            raise r.fail("network.map_url", f"must be an http:// URL, got {map_url!r}")
        try:
            network.NetworkMapClient(map_url)
        except ValueError as exc:
            raise r.fail("network.map_url", str(exc)) from None
    try:
        fsync = store.FsyncPolicy(store_table.get("fsync", store.FsyncPolicy.ALWAYS.value))
    except ValueError:
        choices = " or ".join(f'"{policy.value}"' for policy in store.FsyncPolicy)
        raise r.fail("store.fsync", f"must be {choices}, got {store_table.get('fsync')!r}") from None

    def p(table: dict[str, Any], key: str, where: str, default: str) -> Path:
        return _join(base, r.string(table, key, where, default))

    commit_process = store_table.get("commit_process", True)
    if not isinstance(commit_process, bool):
        raise r.fail("store.commit_process", f"must be true or false, got {commit_process!r}")
    metrics_enabled = metrics.get("enabled", True)
    if not isinstance(metrics_enabled, bool):
        raise r.fail("metrics.enabled", f"must be true or false, got {metrics_enabled!r}")
    metrics_address = _listen_address(r, metrics, "address", "metrics.address", "127.0.0.1:0")
    bridge_mode = r.choice(bridge_table, "mode", "bridge.mode", BridgeMode, BridgeMode.IN_PROCESS)
    default_endpoint = network.host_port_text(*DEFAULT_BRIDGE_ENDPOINT)
    bridge_endpoint = _listen_address(r, bridge_table, "endpoint", "bridge.endpoint", default_endpoint)
    if bridge_endpoint[0] != "localhost" and not _is_loopback(bridge_endpoint[0]):
        raise r.fail("bridge.endpoint", f"must be a loopback address, got {bridge_endpoint[0]!r}")
    bridge_username = r.string(bridge_table, "username", "bridge.username", "bridge")
    bridge_password = None
    if "password_env" in bridge_table or "password_file" in bridge_table:
        bridge_password = _secret_source(r, bridge_table, "bridge", base)
    elif bridge_mode is BridgeMode.EXTERNAL:
        raise r.fail("bridge", 'mode = "external" needs password_env or password_file (endpoint password)')
    proxy, proxy_password = _proxy_settings(r, bridge_table, bridge_mode, base)
    floats = _float_settings(r, float_table, p2p, bridge_mode, base)
    log_format = r.choice(logging_table, "format", "logging.format", LogFormat, LogFormat.TEXT)
    log_level = logging_table.get("level", "info")
    if log_level not in LOG_LEVELS:
        choices = " or ".join(f'"{level}"' for level in LOG_LEVELS)
        raise r.fail("logging.level", f"must be {choices}, got {log_level!r}")
    log_file = _join(base, r.string(logging_table, "file", "logging.file", "logs/node.log"))
    timeout = shutdown.get("timeout_seconds", DEFAULT_SHUTDOWN_TIMEOUT_SECONDS)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout <= 3600:
        raise r.fail("shutdown.timeout_seconds", f"must be a number of seconds in 0..3600, got {timeout!r}")
    responders = flows_table.get("max_responders_per_peer", flows.DEFAULT_MAX_RESPONDERS_PER_PEER)
    low, high = MAX_RESPONDERS_PER_PEER_RANGE
    if isinstance(responders, bool) or not isinstance(responders, int) or not low <= responders <= high:
        raise r.fail(
            "flows.max_responders_per_peer", f"must be an integer in {low}..{high}, got {responders!r}"
        )
    modules = flows_table.get("modules", [])
    if not isinstance(modules, list) or not all(
        isinstance(m, str) and all(part.isidentifier() for part in m.split(".")) for m in modules
    ):
        raise r.fail("flows.modules", f"must be a list of Python module names (a.b.c), got {modules!r}")

    return NodeConfig(
        legal_name=legal_name,
        base_directory=base,
        p2p_address=p2p_address,
        p2p_listen=r.address(p2p, "listen", "p2p.listen", str(p2p_address)),
        rpc_address=r.address(rpc, "address", "rpc.address"),
        rpc_users=_rpc_users(r, rpc.get("users", [])),
        metrics_address=metrics_address if metrics_enabled else None,
        bridge_mode=bridge_mode,
        bridge_endpoint=bridge_endpoint,
        bridge_username=bridge_username,
        bridge_password=bridge_password,
        bridge_proxy=proxy,
        bridge_proxy_password=proxy_password,
        floats=floats,
        p2p_advertise=advertise,
        p2p_idle_timeout_seconds=r.seconds(
            p2p, "idle_timeout_seconds", "p2p.idle_timeout_seconds", transport.IDLE_TIMEOUT_RANGE_SECONDS
        ),
        log_format=log_format,
        log_level=log_level,
        log_file=log_file,
        shutdown_timeout_seconds=float(timeout),
        flows_max_responders_per_peer=responders,
        flows_modules=tuple(modules),
        network_map_url=map_url,
        trust_root=p(net, "trust_root", "network.trust_root", "certificates/network-root.cert.pem"),
        network_parameters=p(net, "network_parameters", "network.network_parameters", "network-parameters"),
        additional_node_infos=_kind_checked(
            r,
            p(net, "additional_node_infos", "network.additional_node_infos", "additional-node-infos"),
            "network.additional_node_infos",
            directory=True,
        ),
        node_info_cache=_kind_checked(
            r,
            p(net, "node_info_cache", "network.node_info_cache", "network-map-cache.db"),
            "network.node_info_cache",
            directory=False,
        ),
        node_ca_cert_chain=p(
            keys, "node_ca_cert_chain", "keys.node_ca_cert_chain", "certificates/node-ca.chain.pem"
        ),
        node_ca_key=p(keys, "node_ca_key", "keys.node_ca_key", "certificates/node-ca.key.pem"),
        tls_cert_chain=p(keys, "tls_cert_chain", "keys.tls_cert_chain", "certificates/tls.chain.pem"),
        tls_key=p(keys, "tls_key", "keys.tls_key", "certificates/tls.key.pem"),
        identity_cert_chain=p(
            keys, "identity_cert_chain", "keys.identity_cert_chain", "certificates/identity.chain.pem"
        ),
        identity_key=p(keys, "identity_key", "keys.identity_key", "certificates/identity.key.pem"),
        key_passphrase=_passphrase(r, keys, base),
        store_directory=_reachable(
            r, p(store_table, "directory", "store.directory", "store"), "store.directory"
        ),
        store_fsync=fsync,
        store_commit_process=commit_process,
    )


def _kind_checked(r: _Reader, path: Path, where: str, *, directory: bool) -> Path:
    """``path``, which names a directory (or a file) the node uses and may not exist yet: one that exists as
    something else is refused here, in one line naming the file and key, before the node creates anything
    (a file named as the node-info directory was read as an empty directory; a directory named as the map
    cache failed the start only after the store and the log were created)."""
    mode = _mode(r, path, where)
    if mode is None:
        return path
    if directory and not stat.S_ISDIR(mode):
        raise r.fail(where, f"{path} is not a directory")
    if not directory and stat.S_ISDIR(mode):
        raise r.fail(where, f"{path} is a directory, not a file")
    return path


def _reachable(r: _Reader, path: Path, where: str) -> Path:
    """``path``, once :func:`_mode` found nothing wrong with its name (what is there is checked later)."""
    _mode(r, path, where)
    return path


def _mode(r: _Reader, path: Path, where: str) -> int | None:
    """The mode of what ``path`` names, None when nothing is there yet (the node makes it when it starts; a
    file in the way of a parent is found then). A name too long or a symlink loop is refused here, naming
    the key: ``Path.exists()`` raised the first (a traceback) and took the second for a missing file, and
    ``Path.resolve()`` raises RuntimeError on it."""
    try:
        return path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise r.fail(where, f"{path}: {exc.strerror}") from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _address_list(
    r: _Reader, value: object, where: str, what: str, *, limit: int | None = None
) -> tuple[network.NetworkHostAndPort, ...]:
    """A non-empty array of distinct ``"HOST:PORT"`` (one string is taken as an array of one); each problem
    names the entry (``where[i]``). Two entries are the same when they differ only in the case of the host
    (a DNS name is case-insensitive)."""
    entries = [value] if isinstance(value, str) else value
    if not isinstance(entries, list) or not entries:
        raise r.fail(where, f'must be a non-empty array of "HOST:PORT" ({what})')
    if limit is not None and len(entries) > limit:
        raise r.fail(where, f"at most {limit} addresses, got {len(entries)}")
    addresses: list[network.NetworkHostAndPort] = []
    seen: set[tuple[str, int]] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, str):
            raise r.fail(f"{where}[{i}]", f'must be a "HOST:PORT" string, got {entry!r}')
        try:
            address = network.NetworkHostAndPort.parse(entry)
        except ValueError as exc:
            raise r.fail(f"{where}[{i}]", str(exc)) from None
        if (address.host.lower(), address.port) in seen:
            raise r.fail(f"{where}[{i}]", f"{entry} is listed twice")
        seen.add((address.host.lower(), address.port))
        addresses.append(address)
    return tuple(addresses)


def _secret_source(r: _Reader, table: dict[str, Any], section: str, base: Path) -> KeyPassphrase:
    env, file = table.get("password_env"), table.get("password_file")
    if env is not None and (not isinstance(env, str) or not env.replace("_", "").isalnum()):
        raise r.fail(f"{section}.password_env", f"must be an environment variable name, got {env!r}")
    if file is not None and (not isinstance(file, str) or not file):
        raise r.fail(f"{section}.password_file", "must be a non-empty path")
    try:
        return KeyPassphrase(
            env=env, file=_join(base, file) if file else None, what=f"{section} endpoint password"
        )
    except ConfigError:
        raise r.fail(section, "give exactly one of password_env and password_file") from None


def _proxy_settings(
    r: _Reader, table: dict[str, Any], mode: BridgeMode, base: Path
) -> tuple[transport.SocksProxy | None, KeyPassphrase | None]:
    """``bridge.proxy`` (``socks5://[USER@]HOST:PORT`` or ``socks4://...``) and its password source."""
    has_password = "proxy_password_env" in table or "proxy_password_file" in table
    if "proxy" not in table:
        if has_password:
            raise r.fail("bridge", "proxy_password_env / proxy_password_file need bridge.proxy")
        return None, None
    text = r.string(table, "proxy", "bridge.proxy")
    if mode is BridgeMode.EXTERNAL:
        raise r.fail("bridge.proxy", 'applies to mode = "in-process" (an external bridge has its own)')
    shape = f"must be socks5://[USER@]HOST:PORT or socks4://[USER@]HOST:PORT, got {text!r}"
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("socks5", "socks4") or not rest or any(c in rest for c in "/?#"):
        raise r.fail("bridge.proxy", shape)
    user, at, host_port = rest.rpartition("@")
    if ":" in user:
        raise r.fail(
            "bridge.proxy", "write no password in the URL: use proxy_password_env or proxy_password_file"
        )
    if at and not user:
        raise r.fail("bridge.proxy", shape)
    try:
        address = network.NetworkHostAndPort.parse(host_port)
    except ValueError as exc:
        raise r.fail("bridge.proxy", f"{exc} ({shape})") from None
    password = None
    if has_password:
        if scheme != "socks5" or not user:
            raise r.fail("bridge", "a proxy password needs a socks5:// proxy with a USER@")
        env, file = table.get("proxy_password_env"), table.get("proxy_password_file")
        if env is not None and (not isinstance(env, str) or not env.replace("_", "").isalnum()):
            raise r.fail("bridge.proxy_password_env", f"must be an environment variable name, got {env!r}")
        if file is not None and (not isinstance(file, str) or not file):
            raise r.fail("bridge.proxy_password_file", "must be a non-empty path")
        try:
            password = KeyPassphrase(
                env=env, file=_join(base, file) if file else None, what="SOCKS proxy password"
            )
        except ConfigError:
            raise r.fail("bridge", "give exactly one of proxy_password_env and proxy_password_file") from None
    proxy = transport.SocksProxy(
        host=address.host,
        port=address.port,
        version=scheme,  # type: ignore[arg-type]
        username=user or None,
    )
    return proxy, password


def _float_settings(
    r: _Reader, table: dict[str, Any], p2p: dict[str, Any], mode: BridgeMode, base: Path
) -> FloatSettings | None:
    """``[float]``: validated control addresses and tunnel files (``None`` when the section is absent)."""
    if not table:
        return None
    if mode is BridgeMode.EXTERNAL:
        raise r.fail(
            "float", 'needs bridge.mode = "in-process" (the node\'s bridge manager dials the floats)'
        )
    if "listen" in p2p:
        raise r.fail("p2p.listen", "not used behind a float (the float listens; p2p.address is its address)")
    return FloatSettings(
        control=_address_list(r, table.get("control"), "float.control", "the floats' control ports"),
        tunnel_cert=_join(base, r.string(table, "tunnel_cert", "float.tunnel_cert")),
        tunnel_key=_join(base, r.string(table, "tunnel_key", "float.tunnel_key")),
        tunnel_ca=_join(base, r.string(table, "tunnel_ca", "float.tunnel_ca")),
        tls_ref=r.string(table, "tls_ref", "float.tls_ref", "node"),
        idle_timeout_seconds=r.seconds(
            table, "idle_timeout_seconds", "float.idle_timeout_seconds", transport.IDLE_TIMEOUT_RANGE_SECONDS
        ),
        handshake_timeout_seconds=r.seconds(
            table,
            "handshake_timeout_seconds",
            "float.handshake_timeout_seconds",
            transport.HANDSHAKE_TIMEOUT_RANGE_SECONDS,
            float_.DEFAULT_TUNNEL_HANDSHAKE_TIMEOUT_SECONDS,
        ),
    )


def metrics_address(r: _Reader, table: dict[str, Any]) -> tuple[str, int] | None:
    """``[metrics] address`` of a process that serves /metrics only when it is set (bridge.toml,
    networkmap.toml, float.toml): ``HOST:PORT`` (port 0: any free port), or ``None``."""
    return _listen_address(r, table, "address", "metrics.address", "") if "address" in table else None


def _listen_address(r: _Reader, table: dict[str, Any], key: str, where: str, default: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` where port 0 (any free port) is allowed."""
    text = r.string(table, key, where, default)
    try:
        return network.split_host_port(text)
    except ValueError as exc:
        raise r.fail(where, str(exc)) from None


def _rpc_users(r: _Reader, users: object) -> tuple[rpc.RpcUser, ...]:
    if not isinstance(users, list):
        raise r.fail("rpc.users", "must be an array of tables ([[rpc.users]])")
    found: dict[str, rpc.RpcUser] = {}
    for i, entry in enumerate(users):
        where = f"rpc.users[{i}]"
        if not isinstance(entry, dict):
            raise r.fail(where, "must be a table with username, password_hash and permissions")
        unknown = set(entry) - {"username", "password_hash", "permissions"}
        if unknown:
            raise r.fail(
                f"{where}.{sorted(unknown)[0]}",
                "unknown setting (allowed: password_hash, permissions, username)",
            )
        name = r.string(entry, "username", f"{where}.username")
        if name in found:
            raise r.fail(f"{where}.username", f"user {name!r} is defined twice")
        password_hash = r.string(entry, "password_hash", f"{where}.password_hash")
        try:
            rpc.check_password_hash(password_hash)
        except ValueError as exc:
            raise r.fail(f"{where}.password_hash", str(exc)) from None
        perms = entry.get("permissions")
        if not isinstance(perms, list) or not perms:
            raise r.fail(f"{where}.permissions", "must be a non-empty array of permission strings")
        try:
            checked = frozenset(rpc.parse_permission(p) for p in perms)
        except ValueError as exc:
            raise r.fail(f"{where}.permissions", str(exc)) from None
        found[name] = rpc.RpcUser(username=name, password_hash=password_hash, permissions=checked)
    return tuple(found.values())


def load_network_map_config(path: str | os.PathLike[str]) -> NetworkMapServiceConfig:
    """Read and validate a ``networkmap.toml``.

    Raises:
        ConfigError: the first problem found, naming file and key.
    """
    path = Path(path).absolute()
    r = _Reader(path, _read_toml(path, "networkmap.toml"))
    base = path.parent
    service = r.section("service", {"address", "max_age_seconds", "database"})
    files = r.section("files", {"trust_root", "map_cert_chain", "map_key", "network_parameters"})
    keys = r.section("keys", {"passphrase_env", "passphrase_file"})
    metrics = r.section("metrics", {"address"})
    r.finish()
    max_age = service.get("max_age_seconds", 30)
    if isinstance(max_age, bool) or not isinstance(max_age, int) or not 1 <= max_age <= 86400:
        raise r.fail("service.max_age_seconds", f"must be an integer in 1..86400, got {max_age!r}")
    return NetworkMapServiceConfig(
        address=r.address(service, "address", "service.address"),
        max_age_seconds=max_age,
        database=_join(base, r.string(service, "database", "service.database", "networkmap.db")),
        trust_root=_join(base, r.string(files, "trust_root", "files.trust_root")),
        map_cert_chain=_join(base, r.string(files, "map_cert_chain", "files.map_cert_chain")),
        map_key=_join(base, r.string(files, "map_key", "files.map_key")),
        network_parameters=_join(base, r.string(files, "network_parameters", "files.network_parameters")),
        key_passphrase=_passphrase(r, keys, base),
        metrics_address=metrics_address(r, metrics),
    )


def _toml_str(value: str) -> str:
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _rel(path: Path, base: Path) -> str:
    return os.path.relpath(path, base)


def _passphrase_lines(source: KeyPassphrase, base: Path) -> list[str]:
    if source.env is not None:
        return [f"passphrase_env = {_toml_str(source.env)}"]
    assert source.file is not None
    return [f"passphrase_file = {_toml_str(_rel(source.file, base))}"]


def dump_node_config(config: NodeConfig, config_dir: Path) -> str:
    """TOML text for ``config``, to be written in ``config_dir`` (paths are made relative to it)."""
    base = config.base_directory
    lines = [
        "# corda-trio node configuration (see corda_trio/node/_config.py for every setting)",
        f"legal_name = {_toml_str(str(config.legal_name))}",
        f"base_directory = {_toml_str(_rel(base, config_dir))}",
        "",
        "[p2p]",
        f"address = {_toml_str(str(config.p2p_address))}",
    ]
    if config.p2p_listen != config.p2p_address:
        lines.append(f"listen = {_toml_str(str(config.p2p_listen))}")
    if config.p2p_advertise:
        lines.append(f"advertise = [{', '.join(_toml_str(str(a)) for a in config.p2p_advertise)}]")
    if config.p2p_idle_timeout_seconds != transport.DEFAULT_IDLE_TIMEOUT_SECONDS:
        lines.append(f"idle_timeout_seconds = {config.p2p_idle_timeout_seconds:g}")
    lines += ["", "[rpc]", f"address = {_toml_str(str(config.rpc_address))}"]
    for user in config.rpc_users:
        perms = ", ".join(_toml_str(p) for p in sorted(user.permissions))
        lines += [
            "",
            "[[rpc.users]]",
            f"username = {_toml_str(user.username)}",
            f"password_hash = {_toml_str(user.password_hash)}",
            f"permissions = [{perms}]",
        ]
    lines += ["", "[metrics]"]
    if config.metrics_address is None:
        lines.append("enabled = false")
    else:
        host, port = config.metrics_address
        lines.append(f"address = {_toml_str(network.host_port_text(host, port))}")
    lines += ["", "[network]"]
    if config.network_map_url is not None:
        lines.append(f"map_url = {_toml_str(config.network_map_url)}")
    for key in ("trust_root", "network_parameters", "additional_node_infos", "node_info_cache"):
        lines.append(f"{key} = {_toml_str(_rel(getattr(config, key), base))}")
    lines += ["", "[keys]"]
    for key in ("node_ca_cert_chain", "node_ca_key", "tls_cert_chain", "tls_key", "identity_cert_chain",
                "identity_key"):  # fmt: skip
        lines.append(f"{key} = {_toml_str(_rel(getattr(config, key), base))}")
    lines += _passphrase_lines(config.key_passphrase, base)
    lines += [
        "",
        "[store]",
        f"directory = {_toml_str(_rel(config.store_directory, base))}",
        f"fsync = {_toml_str(config.store_fsync.value)}",
        f"commit_process = {'true' if config.store_commit_process else 'false'}",
        "",
        "[bridge]",
        f"mode = {_toml_str(config.bridge_mode.value)}",
        *_bridge_lines(config, base),
        *_proxy_lines(config, base),
        *_float_lines(config, base),
        "",
        "[logging]",
        f"format = {_toml_str(config.log_format.value)}",
        f"level = {_toml_str(config.log_level)}",
        f"file = {_toml_str(_rel(config.log_path, base))}",
        "",
        "[shutdown]",
        f"timeout_seconds = {config.shutdown_timeout_seconds:g}",
        "",
        "[flows]",
        f"max_responders_per_peer = {config.flows_max_responders_per_peer}",
        *(
            [f"modules = [{', '.join(_toml_str(m) for m in config.flows_modules)}]"]
            if config.flows_modules
            else []
        ),
        "",
    ]
    return "\n".join(lines)


def _bridge_lines(config: NodeConfig, base: Path) -> list[str]:
    host, port = config.bridge_endpoint
    endpoint = f"endpoint = {_toml_str(network.host_port_text(host, port))}"
    if config.bridge_mode is BridgeMode.IN_PROCESS and config.bridge_password is None:
        # (unused in this mode, but kept when it is not the default: an IPv6 network's, for mode = "external")
        return [] if config.bridge_endpoint == DEFAULT_BRIDGE_ENDPOINT else [endpoint]
    lines = [endpoint, f"username = {_toml_str(config.bridge_username)}"]
    source = config.bridge_password
    if source is not None and source.env is not None:
        lines.append(f"password_env = {_toml_str(source.env)}")
    elif source is not None and source.file is not None:
        lines.append(f"password_file = {_toml_str(_rel(source.file, base))}")
    return lines


def _proxy_lines(config: NodeConfig, base: Path) -> list[str]:
    proxy = config.bridge_proxy
    if proxy is None:
        return []
    user = f"{proxy.username}@" if proxy.username else ""
    where = network.host_port_text(proxy.host, proxy.port)
    lines = [f"proxy = {_toml_str(f'{proxy.version}://{user}{where}')}"]
    source = config.bridge_proxy_password
    if source is not None and source.env is not None:
        lines.append(f"proxy_password_env = {_toml_str(source.env)}")
    elif source is not None and source.file is not None:
        lines.append(f"proxy_password_file = {_toml_str(_rel(source.file, base))}")
    return lines


def _float_lines(config: NodeConfig, base: Path) -> list[str]:
    f = config.floats
    if f is None:
        return []
    return [
        "",
        "[float]",
        f"control = [{', '.join(_toml_str(str(a)) for a in f.control)}]",
        f"tunnel_cert = {_toml_str(_rel(f.tunnel_cert, base))}",
        f"tunnel_key = {_toml_str(_rel(f.tunnel_key, base))}",
        f"tunnel_ca = {_toml_str(_rel(f.tunnel_ca, base))}",
        f"tls_ref = {_toml_str(f.tls_ref)}",
        f"idle_timeout_seconds = {f.idle_timeout_seconds:g}",
        f"handshake_timeout_seconds = {f.handshake_timeout_seconds:g}",
    ]


def dump_network_map_config(config: NetworkMapServiceConfig, config_dir: Path) -> str:
    """TOML text for a ``networkmap.toml`` written in ``config_dir``."""
    lines = [
        "# corda-trio network map service configuration",
        "[service]",
        f"address = {_toml_str(str(config.address))}",
        f"max_age_seconds = {config.max_age_seconds}",
        f"database = {_toml_str(_rel(config.database, config_dir))}",
        "",
        "[files]",
    ]
    for key in ("trust_root", "map_cert_chain", "map_key", "network_parameters"):
        lines.append(f"{key} = {_toml_str(_rel(getattr(config, key), config_dir))}")
    lines += ["", "[keys]", *_passphrase_lines(config.key_passphrase, config_dir), ""]
    return "\n".join(lines)
