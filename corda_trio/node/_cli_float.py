"""``corda-trio float``: run a float (the DMZ listener) and make the tunnel PKI of its control link.

Examples::

    corda-trio float tunnel-pki --out tunnel --float float-a --float float-b --bridge bridge
    corda-trio float start --config float.toml

``float.toml`` (paths relative to the file)::

    [control]                      # where the bridge manager dials in (mutual TLS, tunnel PKI)
    host = "10.0.0.5"
    port = 10010
    cert = "tunnel/float-a.pem"
    key = "tunnel/float-a.key"
    ca = "tunnel/tunnel-ca.pem"
    idle_timeout_seconds = 10      # optional: an inside silent this long on the control link is given up
                                   # (and the public port closed); 1..3600

    [public]                       # opened only while activated
    host = "0.0.0.0"
    port = 10002
    max_message_size = 10485760    # optional (the network parameter)
    peer_link_window = 64          # optional: share of the end-to-end window one peer link reserves
    max_links_per_member = 4       # optional: peer links one member (legal name) may have attached at once
    max_handshakes_per_address = 16  # optional: peer connections one address may have in their handshake
    idle_timeout_seconds = 10      # optional: a peer's connection that brings nothing this long (no frame,
                                   # nor 8 bytes of a frame still arriving) is closed; 1..3600

    [tls.node]                     # node TLS material an activation may name ("tls_ref" = "node")
    cert_chain = "node/tls.pem"
    key = "node/tls.key"
    trust_root = "node/root.pem"
    passphrase_env = "CORDA_TRIO_KEY_PASSPHRASE"  # an encrypted key: at most one of passphrase_env /
    # passphrase_file = "node/passphrase"          # passphrase_file (0600); never the passphrase itself

    [audit]                        # the only file a float writes
    path = "float-audit.jsonl"
    max_bytes = 10485760           # optional
    backups = 5                    # optional
    latency_summary_seconds = 60   # optional

    [metrics]                      # optional: this process's Prometheus /metrics (docs/metrics.md)
    address = "127.0.0.1:10011"    # HOST:PORT (port 0: any free port); none: no /metrics

With ``[metrics]`` the float's first line, ``float: control port listening on HOST:PORT``, ends with
``  metrics http://HOST:PORT/metrics``; an address that cannot be bound is one line (exit 1).

The float refuses every outbound connection of its own process (a socket-level guard); each refusal is an
``outbound-refused`` audit line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import logging
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from corda_trio import bridge, files, network, pki, transport
from corda_trio.bridge import float as fl

from ._certificates import (
    OwnCertificate,
    check_own_certificates,
    expiry_warning,
    own_certificates,
    watch_expiry,
)
from ._cli import CliError, grouped_error, path_arg, run_trio
from ._config import ConfigError, KeyPassphrase, _read_toml, _Reader, metrics_address, seconds_problem
from ._heap import freeze_startup_heap
from ._metrics import FloatCollector, start_process_metrics

__all__ = ["FloatCertificates", "load_float_config", "register"]

log = logging.getLogger("corda_trio.bridge.float")

#: What the error line says when a certificate of ``[control]`` expires while the float runs (the tunnel
#: context is made once, at start).
CONTROL_EXPIRED_TEXT: Final = (
    "the node's bridge and this float refuse each other's control link until it is renewed and the float "
    "restarted"
)
#: ... and one of a ``[tls.<ref>]`` chain or trust root (read again at each activation).
TLS_EXPIRED_TEXT: Final = (
    "peers refuse this float's TLS handshakes until the file is renewed and the node activates the float "
    "again"
)


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``float start`` and ``float tunnel-pki``."""
    sub = parser.add_subparsers(dest="float_command", metavar="SUBCOMMAND", required=True)
    start = sub.add_parser("start", help="run a float until interrupted", description="run a float")
    start.add_argument("--config", type=path_arg, required=True, help="path of float.toml")
    start.set_defaults(func=_start)
    mk = sub.add_parser(
        "tunnel-pki",
        help="make the tunnel CA and the float and bridge tunnel certificates",
        description="make the local-only tunnel CA and the float / bridge certificates of the control link",
    )
    mk.add_argument("--out", type=path_arg, required=True, help="directory to write into (created)")
    mk.add_argument(
        "--float",
        dest="floats",
        action="append",
        default=[],
        metavar="NAME",
        help="a float's name (repeat for each float)",
    )
    mk.add_argument("--bridge", default="bridge", metavar="NAME", help="the bridge manager (default: bridge)")
    mk.set_defaults(func=_tunnel_pki)


#: What ``float tunnel-pki`` takes as a float's or the bridge's name: it names their files and is their
#: certificate's common name (at most 64 characters).
_TUNNEL_NAME: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")
#: The stem of the tunnel CA's files, which no float or bridge may take.
_TUNNEL_CA: Final = "tunnel-ca"


def _tunnel_pki(args: argparse.Namespace) -> int:
    out: Path = args.out
    floats = args.floats or ["float"]
    names = [*floats, args.bridge]
    for option, name in [*(("--float", n) for n in floats), ("--bridge", args.bridge)]:
        if not _TUNNEL_NAME.fullmatch(name):
            raise CliError(
                f"{option} {name!r}: a name is 1..64 letters, digits, '.', '_' or '-', not starting with '.' "
                "(it names the files NAME.pem and NAME.key and the certificate)",
                2,
            )
        if name == _TUNNEL_CA:
            raise CliError(
                f"{option} {name!r}: the tunnel CA's files are {_TUNNEL_CA}.pem/.key: choose another", 2
            )
    if len(set(names)) != len(names):
        raise CliError(f"float and bridge names must be distinct file names, got {names}", 2)
    try:
        existed = out.exists()
        if existed and not out.is_dir():
            raise CliError(f"--out {out}: exists and is not a directory", 2)
        if existed and any(out.iterdir()):
            raise CliError(f"{out} is not empty: refusing to overwrite tunnel certificates", 2)
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--out {out}: {exc.strerror}", 2) from None
    now = dt.datetime.now(dt.UTC)
    tunnel = fl.TunnelPki.create(now=now)
    try:
        pki.write_certificates(out / f"{_TUNNEL_CA}.pem", [tunnel.ca.cert])
        pki.write_private_key(out / f"{_TUNNEL_CA}.key", tunnel.ca.key, None)
        for name in floats:
            tunnel.issue("float", name, now=now).write(out, name)
        tunnel.issue("bridge", args.bridge, now=now).write(out, args.bridge)
    except OSError as exc:  # (disk full, say): nothing half-written is left behind
        for written in out.iterdir():
            written.unlink(missing_ok=True)
        if not existed:
            out.rmdir()
        raise CliError(f"cannot write the tunnel PKI into {out}: {exc.strerror or exc}", 1) from None
    print(f"tunnel PKI written to {out}: tunnel-ca.pem, {', '.join(f'{n}.pem/.key' for n in names)}")
    print("keep tunnel-ca.key off the floats; it is needed only to issue more tunnel certificates")
    return 0


_KINDS = {int: "an integer", str: "a string", float: "a number", dict: "a table"}

#: float.toml: section -> its keys (``tls``: the keys of each ``[tls.<ref>]``); docs/float.md section 3.
_SECTIONS: Final[Mapping[str, frozenset[str]]] = {
    "control": frozenset({"host", "port", "cert", "key", "ca", "idle_timeout_seconds"}),
    "public": frozenset(
        {
            "host",
            "port",
            "max_message_size",
            "peer_link_window",
            "max_links_per_member",
            "max_handshakes_per_address",
            "idle_timeout_seconds",
        }
    ),
    "tls": frozenset({"cert_chain", "key", "trust_root", "passphrase_env", "passphrase_file"}),
    "audit": frozenset({"path", "max_bytes", "backups", "latency_summary_seconds"}),
    "metrics": frozenset({"address"}),
}


class _Toml:
    """Typed access to a parsed float.toml; every error names the file and the key."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    def _fail(self, key: str, what: str) -> CliError:
        return CliError(f"{self.path}: key {key!r}: {what}", 2)

    def check_keys(self) -> None:
        """Refuse an unknown section or key: a misspelt optional key must not silently fall back to its
        default (``node.toml`` and ``bridge.toml`` refuse them the same way)."""
        for section, value in self.data.items():
            if section not in _SECTIONS:
                raise CliError(f"{self.path}: unknown section [{section}]", 2)
            tables = value.items() if section == "tls" and isinstance(value, dict) else [(None, value)]
            for ref, table in tables:
                name = section if ref is None else f"{section}.{ref}"
                if not isinstance(table, dict):
                    raise self._fail(name, f"must be a table ([{name}])")
                allowed = _SECTIONS[section]
                unknown = sorted(set(table) - allowed)
                if unknown:
                    where, known = f"{name}.{unknown[0]}", ", ".join(sorted(allowed))
                    raise self._fail(where, f"unknown setting (allowed: {known})")

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                if default is ...:
                    raise self._fail(key, "missing")
                return default
            node = node[part]
        if kind is float and isinstance(node, int) and not isinstance(node, bool):
            node = float(node)
        if not isinstance(node, kind) or (kind is int and isinstance(node, bool)):
            raise self._fail(key, f"must be {_KINDS[kind]}, got {type(node).__name__} {node!r}")
        return node

    def file(self, key: str) -> Path:
        path = self.path.parent / self.get(key, str)
        try:
            files.check_regular_file(path)
        except (FileNotFoundError, NotADirectoryError):
            raise self._fail(key, f"file {path} does not exist") from None
        except IsADirectoryError:
            raise self._fail(key, f"{path} is a directory, not a file") from None
        except OSError as exc:  # (a symlink loop, a name too long, a pipe: said as they are)
            raise self._fail(key, f"file {path}: {exc.strerror}") from None
        return path

    def passphrase(self, section: str) -> bytes | None:
        """The passphrase of ``<section>.key``: from ``passphrase_env`` or ``passphrase_file``, or None."""
        env = self.get(f"{section}.passphrase_env", str, None)
        file = self.get(f"{section}.passphrase_file", str, None)
        if env is not None and (not env or not env.replace("_", "").isalnum()):
            raise self._fail(f"{section}.passphrase_env", f"must be a variable name, got {env!r}")
        if file is not None and not file:
            raise self._fail(f"{section}.passphrase_file", "must be a non-empty path")
        if env is not None and file is not None:
            raise self._fail(section, "set at most one of passphrase_env and passphrase_file")
        if env is None and file is None:
            return None
        key = f"{section}.passphrase_env" if env is not None else f"{section}.passphrase_file"
        try:
            return KeyPassphrase(env=env, file=self.path.parent / file if file else None).read()
        except ConfigError as exc:
            raise self._fail(key, str(exc)) from None

    def seconds(self, key: str, bounds: tuple[float, float]) -> float:
        """A number of seconds in ``bounds`` (default: the transport's idle timeout)."""
        value = self.get(key, object, transport.DEFAULT_IDLE_TIMEOUT_SECONDS)
        problem = seconds_problem(value, bounds)
        if problem is not None:
            raise self._fail(key, problem)
        return float(value)

    def host(self, key: str, default: str) -> str:
        """A host to listen on: a name, an IPv4 address or an IPv6 address (with or without brackets)."""
        text = self.get(key, str, default)
        try:
            return network.parse_host(text)
        except ValueError as exc:
            raise self._fail(key, str(exc)) from None

    def port(self, key: str) -> int:
        port = self.get(key, int)
        if not 0 <= port < 65536:
            raise self._fail(key, f"port {port} is out of range")
        return int(port)


@attrs.frozen
class FloatCertificates:
    """The float's own certificates, each once with the file it was read from: the float warns at start about
    one that expires within 30 days and logs one error line when one expires while it runs."""

    #: the ``[control]`` tunnel certificate and CA
    control: tuple[OwnCertificate, ...]
    #: the ``[tls.<ref>]`` chains and trust roots
    tls: tuple[OwnCertificate, ...]


def load_float_config(
    path: Path,
) -> tuple[fl.FloatConfig, dict[str, Any], FloatCertificates, tuple[str, int] | None]:
    """Read float.toml: the float's configuration, the audit settings, its certificates and its ``[metrics]
    address`` (``None``: no /metrics; port 0: any free port).

    Raises:
        CliError: (exit 2) the file is missing or not TOML, or a key is missing or wrong; one line naming it.
    """
    try:
        raw = _read_toml(path, "float.toml")
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    t = _Toml(path, raw)
    t.check_keys()
    try:
        tunnel = fl.TunnelCredentials.read(
            t.file("control.cert"), t.file("control.key"), t.file("control.ca")
        )
        if tunnel.role != "float":
            raise CliError(
                f"{path}: key 'control.cert': a {tunnel.role} tunnel certificate, not a float's", 2
            )
    except pki.KeyStoreError as exc:
        raise CliError(f"{path}: [control]: {exc}", 2) from None
    except pki.PeerIdentityError as exc:
        raise CliError(f"{path}: key 'control.cert': {exc}", 2) from None
    now = dt.datetime.now(dt.UTC)
    control_files = [(t.file("control.cert"), [tunnel.cert]), (t.file("control.ca"), [tunnel.ca])]
    _check_dates(path, "control", control_files, now)
    tls_entries = t.get("tls", dict, {})
    tls = {}
    tls_files = []
    for ref in tls_entries:
        key = t.file(f"tls.{ref}.key")
        passphrase = t.passphrase(f"tls.{ref}")
        try:  # a wrong or missing passphrase shows now, not at the first activation
            pki.read_private_key(key, passphrase)
        except pki.KeyStoreError as exc:
            raise CliError(f"{path}: key 'tls.{ref}.key': {exc}", 2) from None
        files = []
        for name in ("cert_chain", "trust_root"):
            try:
                files.append(
                    (t.file(f"tls.{ref}.{name}"), pki.read_certificates(t.file(f"tls.{ref}.{name}")))
                )
            except pki.KeyStoreError as exc:
                raise CliError(f"{path}: key 'tls.{ref}.{name}': {exc}", 2) from None
        _check_dates(path, f"tls.{ref}", files, now)
        try:  # (what peers check: a chain file that lost its last certificate is read as the ones before it)
            pki.validate_cert_path(
                files[0][1], trust_root=files[1][1][0], now=now, leaf_role=pki.CertRole.TLS
            )
        except pki.CertificateValidationError as exc:
            raise CliError(
                f"{path}: [tls.{ref}]: {files[0][0]} does not chain to the network root {files[1][0]}: {exc}",
                2,
            ) from None
        tls_files += files
        tls[ref] = fl.NodeTls(
            cert_chain=t.file(f"tls.{ref}.cert_chain"),
            key=key,
            trust_root=t.file(f"tls.{ref}.trust_root"),
            passphrase=passphrase,
        )
        try:  # (as each activation will: what OpenSSL refuses shows now, not as every activation failing)
            pki.server_ssl_context(
                cert_chain=tls[ref].cert_chain, key=key, trust_root=tls[ref].trust_root, passphrase=passphrase
            )
        except pki.KeyStoreError as exc:
            raise CliError(f"{path}: [tls.{ref}]: {exc}", 2) from None
    if not tls:
        raise CliError(f"{path}: no [tls.<ref>] section: an activation has no TLS material to name", 2)
    max_size = t.get("public.max_message_size", int, fl.FloatConfig.__attrs_attrs__.max_message_size.default)
    if max_size < 1:
        raise CliError(f"{path}: key 'public.max_message_size': must be at least 1", 2)
    window = t.get("public.peer_link_window", int, fl.FloatConfig.__attrs_attrs__.peer_link_window.default)
    if window < 2:
        raise CliError(f"{path}: key 'public.peer_link_window': must be at least 2", 2)
    per_member = t.get(
        "public.max_links_per_member", int, fl.FloatConfig.__attrs_attrs__.max_links_per_member.default
    )
    if per_member < 1:
        raise CliError(f"{path}: key 'public.max_links_per_member': must be at least 1", 2)
    handshakes = t.get("public.max_handshakes_per_address", int, transport.DEFAULT_MAX_HANDSHAKES_PER_ADDRESS)
    if handshakes < 1:
        raise CliError(f"{path}: key 'public.max_handshakes_per_address': must be at least 1", 2)
    config = fl.FloatConfig(
        tunnel=tunnel,
        control_host=t.host("control.host", "127.0.0.1"),
        control_port=t.port("control.port"),
        public_host=t.host("public.host", "0.0.0.0"),
        public_port=t.port("public.port"),
        tls=tls,
        max_message_size=max_size,
        peer_link_window=window,
        max_links_per_member=per_member,
        max_handshakes_per_address=handshakes,
        control_idle_timeout_seconds=t.seconds(
            "control.idle_timeout_seconds", transport.IDLE_TIMEOUT_RANGE_SECONDS
        ),
        public_idle_timeout_seconds=t.seconds(
            "public.idle_timeout_seconds", transport.IDLE_TIMEOUT_RANGE_SECONDS
        ),
        latency_summary_seconds=t.get("audit.latency_summary_seconds", float, 60.0),
    )
    audit = {
        "path": path.parent / t.get("audit.path", str),
        "max_bytes": t.get("audit.max_bytes", int, fl.DEFAULT_AUDIT_MAX_BYTES),
        "backups": t.get("audit.backups", int, fl.DEFAULT_AUDIT_BACKUPS),
    }
    if audit["max_bytes"] < 256 or audit["backups"] < 0:
        raise CliError(f"{path}: [audit]: max_bytes must be at least 256 and backups at least 0", 2)
    try:  # (the wording of bridge.toml's and networkmap.toml's [metrics])
        metrics = metrics_address(_Reader(path, {}), t.get("metrics", dict, {}))
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    certificates = FloatCertificates(own_certificates(control_files), own_certificates(tls_files))
    return config, audit, certificates, metrics


def _check_dates(path: Path, section: str, files: list[tuple[Path, list[Any]]], now: dt.datetime) -> None:
    """Refuse a certificate of ``files`` that is expired or not valid yet (one line naming the file, the
    certificate and the time): a float would otherwise listen and then fail every handshake with it."""
    try:
        check_own_certificates(own_certificates(files), now=now)
    except pki.CertificateValidationError as exc:
        raise CliError(f"{path}: [{section}]: {exc}", 2) from None


_SHOWN = {
    "control-listening": "control port listening on {address}",
    "control-up": "control link up from {bridge}",
    "control-down": "control link down ({reason})",
    "public-open": "public listener open on {address}",
    "public-closed": "public listener closed ({reason})",
    "activation-failed": "activation failed: {condition}: {description}",
    "outbound-refused": "outbound connection refused: {event} to {destination}",
}


@attrs.define
class _Echo:
    """Prints the audit events of :data:`_SHOWN`; the control port's line ends with ``metrics``."""

    #: ``"  metrics http://HOST:PORT/metrics"`` once /metrics is served
    metrics: str = ""

    def __call__(self, record: dict[str, Any]) -> None:
        template = _SHOWN.get(record["event"])
        if template is not None:
            if "host" in record and "port" in record:
                record = {**record, "address": network.host_port_text(record["host"], record["port"])}
            extra = self.metrics if record["event"] == "control-listening" else ""
            sys.stdout.write("float: " + template.format_map(record) + extra + "\n")
            sys.stdout.flush()


def _start(args: argparse.Namespace) -> int:
    config, audit_settings, certificates, metrics = load_float_config(args.config)
    echo = _Echo()
    try:
        audit = fl.AuditLog(
            audit_settings["path"], audit_settings["max_bytes"], audit_settings["backups"], echo=echo
        )
    except OSError as exc:
        raise CliError(
            f"{args.config}: key 'audit.path': cannot open {audit_settings['path']}: {exc.strerror}", 2
        ) from None
    fl.install_outbound_guard(
        lambda event, where: audit.write("outbound-refused", event=event, destination=where)
    )
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    everything = certificates.control + certificates.tls
    if (warning := expiry_warning(everything, now=dt.datetime.now(dt.UTC))) is not None:
        log.warning(warning)
    try:
        run_trio(_run, config, audit, certificates, metrics, echo)
    except (fl.AuditLogError, OSError, BaseExceptionGroup) as exc:
        audit_error = grouped_error(exc, fl.AuditLogError)
        if audit_error is not None:  # the float does not run without its audit log
            raise CliError(f"{audit_error}; the float stopped") from None
        metrics_error = grouped_error(exc, bridge.ListenError)  # the metrics address cannot be bound
        if metrics_error is not None:
            raise CliError(str(metrics_error)) from None
        error = grouped_error(exc, OSError)  # the control port cannot be bound
        if error is None:
            raise
        where = network.host_port_text(config.control_host, config.control_port)
        raise CliError(f"cannot listen on {where}: {getattr(error, 'strerror', None) or error}") from None
    finally:
        audit.close()
    return 0


async def _run(
    config: fl.FloatConfig,
    audit: fl.AuditLog,
    certificates: FloatCertificates,
    metrics: tuple[str, int] | None,
    echo: _Echo,
) -> None:
    flt = fl.Float(config, audit=audit)
    async with trio.open_nursery() as nursery:
        for certs, consequence in (
            (certificates.control, CONTROL_EXPIRED_TEXT),
            (certificates.tls, TLS_EXPIRED_TEXT),
        ):
            nursery.start_soon(functools.partial(watch_expiry, certs, consequence=consequence, logger=log))
        if metrics is not None:  # (first: a busy address fails before the control port listens)
            echo.metrics = f"  metrics {await start_process_metrics(nursery, FloatCollector(flt), *metrics)}"
        await nursery.start(flt.run)
        freeze_startup_heap()
