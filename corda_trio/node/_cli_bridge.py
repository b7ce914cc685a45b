"""``corda-trio bridge start --config FILE``: a node's bridges in a process of their own.

The process connects to the node's local endpoint, learns the queues to serve through the bridge control
protocol (``protocol_spec/bridge-control.md``), runs one outbound bridge per peer queue and the inbound
acceptor on the node's P2P address. Configuration (TOML; relative paths are relative to the file)::

    bridge_id = "alice-bridge"                      # optional; names the bridge in the node's log
    [node]                                          # the node's local endpoint
    endpoint = "127.0.0.1:10005"
    username = "bridge"
    password_env = "CORDA_TRIO_BRIDGE_PASSWORD"     # or password_file = "bridge.password" (mode 0600)
    [p2p]
    listen = "0.0.0.0:10002"                        # the node's P2P address as published in the map
    max_message_size = 10485760                     # optional: the network parameter
    idle_timeout_seconds = 10                       # optional: a peer's connection, or the one to the node,
                                                    # that brings nothing this long (no frame, nor 8
                                                    # bytes of a frame still arriving) is closed; 1..3600
    [tls]                                           # the node's TLS material
    cert_chain = "certificates/tls.chain.pem"
    key = "certificates/tls.key.pem"
    trust_root = "certificates/network-root.cert.pem"
    passphrase_env = "CORDA_TRIO_KEY_PASSPHRASE"    # optional; none: the key is not encrypted
    # passphrase_file = "certificates/passphrase"   # instead of passphrase_env (mode 0600)
    [tuning]                                        # optional
    credit = 256
    initial_backoff_seconds = 1.0
    max_backoff_seconds = 60.0                      # (the float tunnel's rounds: at most 5 s)
    [float]                                         # optional: peers reach the node through floats
    control = ["10.0.0.5:10010", "10.0.0.6:10010"]  # their control ports, in order (one active at a time)
    tunnel_cert = "tunnel/bridge.pem"               # `corda-trio float tunnel-pki` makes these three
    tunnel_key = "tunnel/bridge.key"
    tunnel_ca = "tunnel/tunnel-ca.pem"
    tls_ref = "node"                                # which [tls.NAME] of float.toml the float presents
    idle_timeout_seconds = 10                       # optional: a float silent this long is given up; 1..3600
    handshake_timeout_seconds = 3                   # optional: a float not through the control link's
                                                    # handshake by then is skipped; 0.5..300
    [metrics]                                       # optional: this process's Prometheus /metrics
    address = "127.0.0.1:10006"                     # (port 0: any free port); none: no /metrics

With ``[float]`` the bridge listens for no peer (no ``p2p.listen``): it activates a float, as the node's
in-process bridge does (``docs/float.md``), and prints ``corda-trio bridge: float HOST:PORT active, public
port PORT, for INBOX``. Otherwise it prints ``corda-trio bridge: listening on HOST:PORT for INBOX`` once the
acceptor is up; with ``[metrics]`` the line ends with ``  metrics http://HOST:PORT/metrics`` (served by
the node's metrics server, series in ``docs/metrics.md``). SIGTERM stops it
cleanly (``terminated``, exit 0); Ctrl-C prints ``interrupted`` and exits 130. A configuration problem is one
line naming the file and the key (exit 2); a P2P or metrics address that cannot be bound, one line (exit 1).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from corda_trio import __version__, bridge, network, pki, transport
from corda_trio.bridge import float as fl

from ._cli import CliError, grouped_error, path_arg, run_trio
from ._config import (
    FLOAT_KEYS,
    BridgeMode,
    ConfigError,
    FloatSettings,
    KeyPassphrase,
    _float_settings,
    _join,
    _read_toml,
    _Reader,
    metrics_address,
)
from ._descriptors import open_descriptors, plan_descriptors
from ._heap import freeze_startup_heap
from ._metrics import BridgeProcessCollector, start_process_metrics

__all__ = ["BridgeProcessConfig", "load_bridge_config", "register"]

log = logging.getLogger("corda_trio.bridge")


@attrs.frozen(kw_only=True)
class BridgeProcessConfig:
    """A validated ``bridge start`` configuration (paths absolute)."""

    bridge_id: str | None
    endpoint: network.NetworkHostAndPort
    username: str
    password: KeyPassphrase
    #: (host, port); port 0 picks a free port (tests; the printed line names it). ``None`` behind floats.
    p2p_listen: tuple[str, int] | None
    max_message_size: int
    tls_cert_chain: Path
    tls_key: Path
    trust_root: Path
    key_passphrase: KeyPassphrase | None
    credit: int
    initial_backoff_seconds: float
    max_backoff_seconds: float
    #: ``[float]``: the floats this bridge activates instead of listening itself.
    floats: FloatSettings | None = None
    #: ``[p2p] idle_timeout_seconds``: peers' connections and the one to the node.
    idle_timeout_seconds: float = transport.DEFAULT_IDLE_TIMEOUT_SECONDS
    #: ``[metrics] address``: where this process serves its /metrics (port 0: any free port); ``None``: not.
    metrics_address: tuple[str, int] | None = None


#: Upper bounds of the numbers in bridge.toml: beyond them a value is a typo (credit is also what a link
#: holds in memory; max_message_size is the network parameter's range; a back-off past a day never retries).
_MAXIMUM: Final = {
    "tuning.credit": 65_536,
    "p2p.max_message_size": 2_147_483_647,
    "tuning.initial_backoff_seconds": 86_400.0,
    "tuning.max_backoff_seconds": 86_400.0,
}


def _number(r: _Reader, table: dict[str, Any], key: str, where: str, default: float, *, integer: bool) -> Any:
    value = table.get(key, default)
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:  # also refuses nan
        raise r.fail(where, f"must be a positive {'integer' if integer else 'number'}, got {value!r}")
    if value > _MAXIMUM[where]:
        raise r.fail(where, f"must be at most {_MAXIMUM[where]}, got {value!r}")
    return value


def _secret(
    r: _Reader, table: dict[str, Any], where: str, base: Path, *, required: bool
) -> KeyPassphrase | None:
    kind = "passphrase" if where == "tls" else "password"
    env_key, file_key = f"{kind}_env", f"{kind}_file"
    env, file = table.get(env_key), table.get(file_key)
    if env is None and file is None and not required:
        return None
    if env is not None and (not isinstance(env, str) or not env.replace("_", "").isalnum()):
        raise r.fail(f"{where}.{env_key}", f"must be an environment variable name, got {env!r}")
    if file is not None and (not isinstance(file, str) or not file):
        raise r.fail(f"{where}.{file_key}", "must be a non-empty path")
    if (env is None) == (file is None):
        raise r.fail(where, f"exactly one of {where}.{env_key} and {where}.{file_key} must be set")
    what = "key passphrase" if where == "tls" else f"{where} endpoint password"
    return KeyPassphrase(env=env, file=_join(base, file) if file else None, what=what)


def _listen(r: _Reader, table: dict[str, Any]) -> tuple[str, int]:
    text = r.string(table, "listen", "p2p.listen")
    if text.endswith(":0"):  # any free port
        address = r.address({"listen": text[:-2] + ":1"}, "listen", "p2p.listen")
        return (address.host, 0)
    address = r.address(table, "listen", "p2p.listen")
    return (address.host, address.port)


def load_bridge_config(path: str | os.PathLike[str]) -> BridgeProcessConfig:
    """Read and validate a bridge configuration file.

    Raises:
        ConfigError: the first problem found, naming file and key.
    """
    path = Path(path).absolute()
    r = _Reader(path, _read_toml(path, "bridge.toml"))
    base = path.parent
    bridge_id = r.data.pop("bridge_id", None)
    if bridge_id is not None and (not isinstance(bridge_id, str) or not bridge_id):
        raise r.fail("bridge_id", f"must be a non-empty string, got {bridge_id!r}")
    node = r.section("node", {"endpoint", "username", "password_env", "password_file"})
    p2p = r.section("p2p", {"listen", "max_message_size", "idle_timeout_seconds"})
    tls = r.section("tls", {"cert_chain", "key", "trust_root", "passphrase_env", "passphrase_file"})
    tuning = r.section("tuning", {"credit", "initial_backoff_seconds", "max_backoff_seconds"})
    float_table = r.section("float", FLOAT_KEYS)
    metrics = r.section("metrics", {"address"})
    r.finish("bridge_id")
    # the same [float] keys as node.toml's; this process is the bridge manager that dials the floats
    floats = _float_settings(r, float_table, p2p, BridgeMode.IN_PROCESS, base)
    endpoint = r.address(node, "endpoint", "node.endpoint")
    try:
        bridge.EndpointConfig(username="x", password="x", host=endpoint.host)
    except ValueError:
        raise r.fail("node.endpoint", f"must be a loopback address, got {endpoint.host!r}") from None
    password = _secret(r, node, "node", base, required=True)
    assert password is not None
    initial = _number(
        r, tuning, "initial_backoff_seconds", "tuning.initial_backoff_seconds", 1.0, integer=False
    )
    maximum = _number(r, tuning, "max_backoff_seconds", "tuning.max_backoff_seconds", 60.0, integer=False)
    if maximum < initial:
        raise r.fail("tuning.max_backoff_seconds", "must not be below tuning.initial_backoff_seconds")
    return BridgeProcessConfig(
        bridge_id=bridge_id,
        endpoint=endpoint,
        username=r.string(node, "username", "node.username"),
        password=password,
        p2p_listen=_listen(r, p2p) if floats is None else None,
        max_message_size=_number(
            r, p2p, "max_message_size", "p2p.max_message_size", 10 * 1024 * 1024, integer=True
        ),
        tls_cert_chain=_join(base, r.string(tls, "cert_chain", "tls.cert_chain")),
        tls_key=_join(base, r.string(tls, "key", "tls.key")),
        trust_root=_join(base, r.string(tls, "trust_root", "tls.trust_root")),
        key_passphrase=_secret(r, tls, "tls", base, required=False),
        credit=_number(r, tuning, "credit", "tuning.credit", 256, integer=True),
        initial_backoff_seconds=float(initial),
        max_backoff_seconds=float(maximum),
        floats=floats,
        idle_timeout_seconds=r.seconds(
            p2p, "idle_timeout_seconds", "p2p.idle_timeout_seconds", transport.IDLE_TIMEOUT_RANGE_SECONDS
        ),
        metrics_address=metrics_address(r, metrics),
    )


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``bridge start``."""
    sub = parser.add_subparsers(dest="bridge_command", metavar="SUBCOMMAND", required=True)
    text = "run the node's bridges in this process, talking to the node's local endpoint"
    p = sub.add_parser("start", help=text, description=text)
    p.add_argument("--config", type=path_arg, required=True, help="the bridge's TOML configuration")
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="lowest level of the log lines written to stderr (default INFO)",
    )
    p.set_defaults(func=_start)


def _build(
    cfg: BridgeProcessConfig,
    path: Path | None = None,
    *,
    max_connections: int = transport.DEFAULT_MAX_CONNECTIONS,
) -> bridge.ExternalBridge:
    """The bridge of ``cfg`` (read from ``path``), its acceptor taking at most ``max_connections`` peers."""
    key = "node.password_env" if cfg.password.env is not None else "node.password_file"
    key = f"{Path(path).absolute()}: {key}" if path is not None else key
    try:
        password = cfg.password.read_text()
    except ConfigError as exc:
        raise CliError(f"{key}: {exc}", 2) from None
    try:
        passphrase = cfg.key_passphrase.read() if cfg.key_passphrase is not None else None
        tls = {"cert_chain": cfg.tls_cert_chain, "key": cfg.tls_key, "trust_root": cfg.trust_root}
        client = pki.client_ssl_context(**tls, passphrase=passphrase)  # type: ignore[arg-type]
        server = pki.server_ssl_context(**tls, passphrase=passphrase)  # type: ignore[arg-type]
    except (ConfigError, pki.KeyStoreError) as exc:
        raise CliError(str(exc), 2) from None
    bridges = bridge.BridgeConfig(
        credit=cfg.credit,
        initial_backoff_seconds=cfg.initial_backoff_seconds,
        max_backoff_seconds=cfg.max_backoff_seconds,
        idle_timeout_seconds=cfg.idle_timeout_seconds,
    )
    extra: dict[str, Any] = {"bridge_id": cfg.bridge_id} if cfg.bridge_id else {}
    tunnel_context = None
    if cfg.floats is not None:
        tunnel_context, extra["floats"] = _tunnel(cfg, cfg.floats)
    listen = cfg.p2p_listen or ("127.0.0.1", 0)
    config = bridge.ExternalBridgeConfig(
        node_host=cfg.endpoint.host,
        node_port=cfg.endpoint.port,
        username=cfg.username,
        password=password,
        p2p=bridge.AcceptorConfig(
            host=listen[0],
            port=listen[1],
            credit=cfg.credit,
            max_message_size=cfg.max_message_size,
            idle_timeout_seconds=cfg.idle_timeout_seconds,
            max_connections=max_connections,
        ),
        bridges=bridges,
        **extra,
    )
    return bridge.ExternalBridge(
        config=config, client_ssl_context=client, server_ssl_context=server, tunnel_ssl_context=tunnel_context
    )


def _tunnel(cfg: BridgeProcessConfig, floats: FloatSettings) -> tuple[Any, Any]:
    """The tunnel context and ``float.TunnelConfig`` of ``[float]`` (one line, exit 2, if a file is bad)."""
    try:
        creds = fl.TunnelCredentials.read(floats.tunnel_cert, floats.tunnel_key, floats.tunnel_ca)
        role = creds.role
    except (pki.KeyStoreError, pki.PeerIdentityError) as exc:
        raise CliError(f"float tunnel certificates: {exc}", 2) from None
    if role != "bridge":
        raise CliError(f"{floats.tunnel_cert} is a {role!r} tunnel certificate, not a bridge's", 2)
    config = fl.TunnelConfig(
        floats=[(a.host, a.port) for a in floats.control],
        tls_ref=floats.tls_ref,
        max_message_size=cfg.max_message_size,
        initial_backoff_seconds=cfg.initial_backoff_seconds,
        # (a float is a DMZ host of our own: its rounds wait at most 5 s, see corda_trio.bridge.float)
        max_backoff_seconds=min(cfg.max_backoff_seconds, fl.TUNNEL_MAX_BACKOFF_SECONDS),
        idle_timeout_seconds=floats.idle_timeout_seconds,
        handshake_timeout_seconds=floats.handshake_timeout_seconds,
    )
    return creds.client_context(), config


def _start(args: argparse.Namespace) -> int:
    """Run until interrupted: Ctrl-C and SIGTERM unwind through the CLI's common handling (one line; exit
    130 and 0), which cancels the bridge, so every message held is released to the node unacked."""
    try:
        cfg = load_bridge_config(args.config)
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # (before anything listens: the acceptor's cap fits the open-file limit, as a node's listeners do)
    # (with [float], peers reach the float: this process listens to none)
    caps = plan_descriptors(
        p2p=cfg.floats is None,
        metrics=False,
        rpc_listener=False,
        in_use=open_descriptors(),
        process="bridge process",
    )
    if caps.warning is not None:
        log.warning(caps.warning)
    ext = _build(cfg, args.config, max_connections=caps.p2p or transport.DEFAULT_MAX_CONNECTIONS)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            metrics = ""
            if cfg.metrics_address is not None:  # (before the node is dialled: a busy port fails at once)
                collector = BridgeProcessCollector(ext, __version__)
                url = await start_process_metrics(nursery, collector, *cfg.metrics_address)
                metrics = f"  metrics {url}"
            await nursery.start(ext.run)
            port = await ext.wait_serving()
            freeze_startup_heap()
            inbox = ext.inbox.name if ext.inbox is not None else "?"
            if ext.tunnel is not None and ext.tunnel.active is not None:
                host, control = ext.tunnel.active
                print(
                    f"corda-trio bridge: float {network.host_port_text(host, control)} active, "
                    f"public port {port}, for {inbox}{metrics}",
                    flush=True,
                )
            else:
                host = cfg.p2p_listen[0] if cfg.p2p_listen else "?"
                where = network.host_port_text(host, port)
                print(
                    f"corda-trio bridge: listening on {where} for {inbox}{metrics}",
                    flush=True,
                )

    try:
        run_trio(main)
    except BaseExceptionGroup as group:
        fatal = grouped_error(group, (bridge.ListenError, bridge.MultipleInboxesError))
        if fatal is None:
            raise
        raise CliError(str(fatal), 1) from None
    return 0
