"""Node and network-map-service configuration: TOML files read with ``tomllib`` into frozen, validated
objects.

Theory of operation
-------------------
``node.toml`` (written by ``corda-trio network bootstrap``, read by the node)::

    legal_name = "O=Alice, L=London, C=GB"
    base_directory = "."                 # relative to this file; every other path is relative to it

    [p2p]
    address = "127.0.0.1:40001"          # advertised in the NodeInfo; also where the node listens
    # listen = "0.0.0.0:40001"           # optional: a different bind address

    [rpc]
    address = "127.0.0.1:40002"

    [network]
    map_url = "http://127.0.0.1:40000"   # omit for a network without a map service (directory mode)
    trust_root = "certificates/network-root.cert.pem"
    network_parameters = "network-parameters"
    additional_node_infos = "additional-node-infos"
    node_info_cache = "network-map-cache.db"

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
    directory = "store"
    fsync = "always"                     # "always" | "none" (none: benchmarks only, loses data on crash)

Only ``legal_name``, ``p2p.address``, ``rpc.address`` and ``keys.passphrase_*`` are required; the rest
default to the values shown.  Unknown sections or keys are errors (a typo must not silently fall back to a
default), and every error names the file, the key and what is wrong.  Paths in the loaded object are
absolute.  ``networkmap.toml`` works the same way for ``corda-trio networkmap serve``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, final

import attrs

from corda_trio import network, pki, store

__all__ = [
    "ConfigError",
    "KeyPassphrase",
    "NetworkMapServiceConfig",
    "NodeConfig",
    "dump_network_map_config",
    "dump_node_config",
    "load_network_map_config",
    "load_node_config",
]

#: Default environment variable holding the key passphrase.
DEFAULT_PASSPHRASE_ENV: Final[str] = "CORDA_TRIO_KEY_PASSPHRASE"


class ConfigError(Exception):
    """A configuration file is missing, not TOML, or has a missing, unknown or invalid setting."""


@final
@attrs.frozen(kw_only=True)
class KeyPassphrase:
    """Where the passphrase of the private keys comes from: an environment variable or a file."""

    env: str | None = None
    file: Path | None = None

    def __attrs_post_init__(self) -> None:
        if (self.env is None) == (self.file is None):
            raise ConfigError("exactly one of keys.passphrase_env and keys.passphrase_file must be set")

    def read(self, environ: Mapping[str, str] | None = None) -> bytes:
        """The passphrase (from ``environ``, default ``os.environ``, or the file).

        Raises:
            ConfigError: the variable is unset or empty, or the file is unreadable, empty or readable by
                group or others.
        """
        if self.env is not None:
            value = (os.environ if environ is None else environ).get(self.env, "")
            if not value:
                raise ConfigError(f"environment variable {self.env} (the key passphrase) is not set")
            return value.encode()
        assert self.file is not None
        try:
            mode = self.file.stat().st_mode
            value = self.file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"cannot read passphrase file {str(self.file)!r}: {exc.strerror}") from None
        if mode & 0o077:
            raise ConfigError(f"passphrase file {str(self.file)!r} must not be readable by group or others")
        if not value:
            raise ConfigError(f"passphrase file {str(self.file)!r} is empty")
        return value.encode()


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

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {message}")

    def section(self, name: str, allowed: set[str]) -> dict[str, Any]:
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
        return value

    def address(
        self, table: dict[str, Any], key: str, where: str, default: str | None = None
    ) -> network.NetworkHostAndPort:
        text = self.string(table, key, where, default)
        try:
            return network.NetworkHostAndPort.parse(text)
        except ValueError as exc:
            raise self.fail(where, str(exc)) from None

    def finish(self) -> None:
        if self.data:
            raise self.fail(sorted(self.data)[0], "unknown setting")


def _join(base: Path, relative: str) -> Path:
    """``base / relative`` with ``..`` and ``.`` folded (symlinks are left alone, unlike ``resolve``)."""
    return Path(os.path.normpath(base / relative))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


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
    r = _Reader(path, _read_toml(path))
    legal_name_text = r.string(r.data, "legal_name", "legal_name")
    r.data.pop("legal_name")
    try:
        legal_name = pki.CordaX500Name.parse(legal_name_text)
    except pki.InvalidNameError as exc:
        raise r.fail("legal_name", str(exc)) from None
    base_text = r.data.pop("base_directory", ".")
    if not isinstance(base_text, str) or not base_text:
        raise r.fail("base_directory", "must be a non-empty path")
    base = (path.parent / base_text).resolve()
    p2p = r.section("p2p", {"address", "listen"})
    rpc = r.section("rpc", {"address"})
    net = r.section(
        "network", {"map_url", "trust_root", "network_parameters", "additional_node_infos", "node_info_cache"}
    )
    keys = r.section(
        "keys",
        {"node_ca_cert_chain", "node_ca_key", "tls_cert_chain", "tls_key", "identity_cert_chain",
         "identity_key", "passphrase_env", "passphrase_file"},
    )  # fmt: skip
    store_table = r.section("store", {"directory", "fsync"})
    r.finish()
    p2p_address = r.address(p2p, "address", "p2p.address")
    map_url = net.get("map_url")
    if map_url is not None:
        if not isinstance(map_url, str) or not map_url.startswith("http://"):
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

    return NodeConfig(
        legal_name=legal_name,
        base_directory=base,
        p2p_address=p2p_address,
        p2p_listen=r.address(p2p, "listen", "p2p.listen", str(p2p_address)),
        rpc_address=r.address(rpc, "address", "rpc.address"),
        network_map_url=map_url,
        trust_root=p(net, "trust_root", "network.trust_root", "certificates/network-root.cert.pem"),
        network_parameters=p(net, "network_parameters", "network.network_parameters", "network-parameters"),
        additional_node_infos=p(
            net, "additional_node_infos", "network.additional_node_infos", "additional-node-infos"
        ),
        node_info_cache=p(net, "node_info_cache", "network.node_info_cache", "network-map-cache.db"),
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
        store_directory=p(store_table, "directory", "store.directory", "store"),
        store_fsync=fsync,
    )


def load_network_map_config(path: str | os.PathLike[str]) -> NetworkMapServiceConfig:
    """Read and validate a ``networkmap.toml``.

    Raises:
        ConfigError: the first problem found, naming file and key.
    """
    path = Path(path).absolute()
    r = _Reader(path, _read_toml(path))
    base = path.parent
    service = r.section("service", {"address", "max_age_seconds", "database"})
    files = r.section("files", {"trust_root", "map_cert_chain", "map_key", "network_parameters"})
    keys = r.section("keys", {"passphrase_env", "passphrase_file"})
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
    lines += ["", "[rpc]", f"address = {_toml_str(str(config.rpc_address))}", "", "[network]"]
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
        "",
    ]
    return "\n".join(lines)


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
