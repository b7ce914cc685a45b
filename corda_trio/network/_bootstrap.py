"""Create a development network on disk: CAs, per-node keys and certificates, signed network parameters
and signed NodeInfos (``corda-trio network bootstrap``).

Theory of operation
-------------------
Layout of the network directory ``D``::

    D/network-root/root.cert.pem         the trust root every node pins (public)
    D/network-root/root.key.pem          root key (encrypted); needed only while bootstrapping
    D/network-root/passphrase            (only if generated) passphrase of the root key, 0600
    D/doorman/doorman.{cert,key}.pem     doorman CA (issues node CAs)
    D/doorman/passphrase                 (only if generated) passphrase of the doorman key, 0600
    D/network-map/map.{chain,key}.pem    network map signing certificate and key
    D/network-map/network-parameters     signed network parameters
    D/network-map/passphrase             (only if generated) passphrase of the map key, 0600
    D/nodes/<slug>/certificates/         network-root.cert.pem, node-ca.chain.pem, node-ca.key.pem,
                                         tls.chain.pem, tls.key.pem, identity.chain.pem, identity.key.pem,
                                         passphrase (only if generated, 0600)
    D/nodes/<slug>/network-parameters    copy of the signed parameters
    D/nodes/<slug>/nodeInfo-<HASH>       this node's signed NodeInfo (HASH: of its legal name, see
                                         ``node_info_file_name``); the node replaces it at each start
    D/nodes/<slug>/additional-node-infos/nodeInfo-<HASH>   every node's signed NodeInfo, under the same
                                         name (directory mode; with a map service the directory is left
                                         empty: see below)

With a map service the nodes learn of each other from the map alone.  A NodeInfo in
``additional-node-infos/`` is a second source that the map cannot take away (the node keeps it in its view
whatever the map lists), so copies written here would keep a node in every peer's view after the operator
removed it from the map (``corda-trio networkmap remove``).

Configuration files (``node.toml``, ``networkmap.toml``) are written by the caller (the CLI, which owns
the configuration schema) from the returned :class:`BootstrappedNetwork`.

Passphrases: if the operator passes one (from an environment variable) every private key is encrypted
with it; otherwise a random 192-bit passphrase is generated for each CA key (root, doorman, map) and for
each node and stored next to the keys in a 0600 file, which is what a development network needs (see
``pki.write_private_key`` for the cost and strength of the encryption).  Nothing at runtime reads the root
key: the map service reads the map key, nodes their own keys.  After bootstrapping, move
``network-root/root.key.pem`` and its passphrase off the machine (keep ``root.cert.pem``); the doorman key
is needed only to issue more nodes.  Ports are chosen by binding port 0 on the host and releasing the
socket, so another process could take one before the node starts; that is acceptable for a dev network.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Final, final

import attrs
from cryptography.hazmat.primitives import serialization

from corda_trio import pki

from . import _codec
from ._cache import node_info_file_name
from ._errors import NetworkMapError
from ._model import (
    MESSAGE_SIZE_RANGE_BYTES,
    NetworkHostAndPort,
    NetworkParameters,
    NodeInfo,
    check_host,
    sha256_hex,
)
from ._ports import free_ports
from ._signing import sign_network_parameters, sign_node_info

__all__ = [
    "NODE_VALIDITY_RANGE",
    "PLATFORM_VERSION",
    "BootstrapError",
    "BootstrappedNetwork",
    "BootstrappedNode",
    "bootstrap_network",
]

#: The platform version corda-trio nodes advertise.
PLATFORM_VERSION: Final[int] = 1
#: Default maximum P2P message size (network parameter ``max_message_size``; Corda's default too).
DEFAULT_MAX_MESSAGE_SIZE_BYTES: Final[int] = 10 * 1024 * 1024
#: What a node's certificates may be valid for: at least a day (a node refuses to start with an expired
#: certificate, and warns when one expires within 30 days), at most as long as the network's CAs, which
#: issue them.
NODE_VALIDITY_RANGE: Final[tuple[dt.timedelta, dt.timedelta]] = (dt.timedelta(days=1), pki.DEFAULT_VALIDITY)
#: Corda's default event horizon: 30 days.
DEFAULT_EVENT_HORIZON_SECONDS: Final[int] = 30 * 86400


class BootstrapError(NetworkMapError):
    """The network cannot be created (directory not empty, duplicate names, ...)."""


@final
@attrs.frozen(kw_only=True)
class BootstrappedNode:
    """Where one node's material was written (absolute paths) and its chosen addresses."""

    legal_name: pki.CordaX500Name
    directory: Path
    p2p_address: NetworkHostAndPort
    rpc_address: NetworkHostAndPort
    node_info_hash: str
    identity_key_hash: str
    passphrase_file: Path | None

    @property
    def certificates(self) -> Path:
        return self.directory / "certificates"


@final
@attrs.frozen(kw_only=True)
class BootstrappedNetwork:
    """The result of :func:`bootstrap_network`."""

    directory: Path
    root_cert: Path
    map_address: NetworkHostAndPort | None
    map_directory: Path
    map_passphrase_file: Path | None
    passphrase_env: str | None
    network_parameters_hash: str
    nodes: tuple[BootstrappedNode, ...]

    @property
    def map_url(self) -> str | None:
        return None if self.map_address is None else f"http://{self.map_address}"


def _slug(name: pki.CordaX500Name, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", name.organisation.lower()).strip("-") or "node"
    slug, n = base, 2
    while slug in taken:
        slug, n = f"{base}-{n}", n + 1
    taken.add(slug)
    return slug


def _write_private_text(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text + "\n")


def _der(certs: Sequence[object]) -> tuple[bytes, ...]:
    return tuple(c.public_bytes(serialization.Encoding.DER) for c in certs)  # type: ignore[attr-defined]


def bootstrap_network(
    directory: str | os.PathLike[str],
    legal_names: Sequence[pki.CordaX500Name],
    *,
    now: dt.datetime,
    host: str = "127.0.0.1",
    map_port: int | None = 0,
    passphrase: bytes | None = None,
    passphrase_env: str | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE_BYTES,
    node_validity: dt.timedelta = pki.DEFAULT_VALIDITY,
) -> BootstrappedNetwork:
    """Create a network with one node per legal name in ``directory`` (which must not exist or be empty).

    Args:
        directory: the network directory ``D``.
        legal_names: the nodes, at least one, all different.
        now: issue time of certificates and parameters (timezone-aware UTC).
        host: the host nodes and the map listen on and advertise (not a wildcard such as ``0.0.0.0``).
        map_port: port of the map service (0: a free port); ``None``: no map service (directory mode).
        passphrase: encrypt every key with this (its source, ``passphrase_env``, is recorded); ``None``:
            generate random passphrases stored in 0600 files.
        passphrase_env: name of the environment variable ``passphrase`` came from.
        max_message_size: network parameter ``max_message_size``.
        node_validity: how long each node's certificates (node CA, TLS, legal identity) are valid from
            ``now``: :data:`NODE_VALIDITY_RANGE` (the network's CAs are valid for ``pki.DEFAULT_VALIDITY``,
            ten years, and a node's certificates never outlive them).

    Raises:
        BootstrapError: no names, duplicate or confusable names, a non-empty directory, a host this machine
            cannot listen on or that no peer can dial (``0.0.0.0``, ``::``), a message size outside
            :data:`MESSAGE_SIZE_RANGE_BYTES`, or a ``node_validity`` outside :data:`NODE_VALIDITY_RANGE`.
    """
    root_dir = Path(directory).absolute()
    if not legal_names:
        raise BootstrapError("a network needs at least one node (--node)")
    if len(set(legal_names)) != len(legal_names):
        dup = next(str(n) for n in legal_names if legal_names.count(n) > 1)
        raise BootstrapError(f"legal name {dup!r} is given more than once")
    for i, name in enumerate(legal_names):
        earlier = pki.find_confusable(name, legal_names[:i])
        if earlier is not None:
            raise BootstrapError(pki.confusable_names_message(name, earlier))
    if (passphrase is None) != (passphrase_env is None):
        raise ValueError("give both passphrase and passphrase_env, or neither")
    low, high = MESSAGE_SIZE_RANGE_BYTES
    if not low <= max_message_size <= high:
        raise BootstrapError(f"max message size {max_message_size} is outside {low}..{high} bytes")
    if not NODE_VALIDITY_RANGE[0] <= node_validity <= NODE_VALIDITY_RANGE[1]:
        raise BootstrapError(
            f"node certificate validity {node_validity} is outside {NODE_VALIDITY_RANGE[0].days}.."
            f"{NODE_VALIDITY_RANGE[1].days} days"
        )
    if root_dir.exists() and (not root_dir.is_dir() or any(root_dir.iterdir())):
        raise BootstrapError(f"{root_dir} exists and is not an empty directory")
    try:
        check_host(host)
    except ValueError as exc:
        raise BootstrapError(str(exc)) from None
    if NetworkHostAndPort(host=host, port=1).is_unspecified:  # (every NodeInfo and the map URL carry it)
        raise BootstrapError(
            f"host {host!r} is not an address peers can dial (it goes into every NodeInfo and the map URL): "
            "give the host they reach; to listen on every interface, set p2p.listen in each node.toml "
            "afterwards"
        )
    try:  # before anything is written: the host must be one this machine can listen on
        ports = free_ports(host, 2 * len(legal_names) + (1 if map_port == 0 else 0))
    except OSError as exc:
        raise BootstrapError(f"host {host!r} cannot be listened on here: {exc.strerror or exc}") from None
    for sub in ("network-root", "doorman", "network-map", "nodes"):
        (root_dir / sub).mkdir(parents=True, exist_ok=True)

    def new_passphrase(where: Path) -> tuple[bytes, Path | None]:
        if passphrase is not None:
            return passphrase, None
        value = secrets.token_urlsafe(24)  # 192 bits
        _write_private_text(where, value)
        return value.encode(), where

    creds = pki.NetworkCredentials.create(now=now)
    # Each CA key in its own file under its own passphrase: the root key is needed only here (move it and
    # its passphrase off the machine afterwards), the doorman key only to issue nodes, the map key at runtime.
    root_pass, _ = new_passphrase(root_dir / "network-root" / "passphrase")
    root_cert_path = root_dir / "network-root" / "root.cert.pem"
    pki.write_certificates(root_cert_path, [creds.root.cert])
    pki.write_private_key(root_dir / "network-root" / "root.key.pem", creds.root.key, root_pass)
    doorman_pass, _ = new_passphrase(root_dir / "doorman" / "passphrase")
    pki.write_certificates(root_dir / "doorman" / "doorman.cert.pem", [creds.doorman.cert])
    pki.write_private_key(root_dir / "doorman" / "doorman.key.pem", creds.doorman.key, doorman_pass)
    map_dir = root_dir / "network-map"
    map_pass, map_pass_file = new_passphrase(map_dir / "passphrase")
    pki.write_certificates(map_dir / "map.chain.pem", [creds.network_map.cert])
    pki.write_private_key(map_dir / "map.key.pem", creds.network_map.key, map_pass)

    params = NetworkParameters(
        minimum_platform_version=PLATFORM_VERSION,
        max_message_size=max_message_size,
        max_transaction_size=max_message_size,
        modified_time_ms=int(now.timestamp() * 1000),
        epoch=1,
        event_horizon_seconds=DEFAULT_EVENT_HORIZON_SECONDS,
    )
    signed_params = sign_network_parameters(params, creds.network_map.key, [creds.network_map.cert])
    params_bytes = _codec.encode(signed_params.to_wire())
    (map_dir / "network-parameters").write_bytes(params_bytes)

    map_address = None
    if map_port is not None:
        map_address = NetworkHostAndPort(host=host, port=map_port or ports.pop())

    taken: set[str] = set()
    nodes: list[BootstrappedNode] = []
    infos: list[tuple[str, bytes]] = []
    for name in legal_names:
        node_dir = root_dir / "nodes" / _slug(name, taken)
        certs_dir = node_dir / "certificates"
        certs_dir.mkdir(parents=True)
        node_pass, pass_file = new_passphrase(certs_dir / "passphrase")
        node = creds.issue_node(name, now=now, validity=node_validity)
        pki.write_certificates(certs_dir / "network-root.cert.pem", [creds.root.cert])
        pki.write_certificates(certs_dir / "node-ca.chain.pem", [node.node_ca.cert, creds.doorman.cert])
        pki.write_private_key(certs_dir / "node-ca.key.pem", node.node_ca.key, node_pass)
        pki.write_certificates(certs_dir / "tls.chain.pem", node.tls_chain)
        pki.write_private_key(certs_dir / "tls.key.pem", node.tls.key, node_pass)
        pki.write_certificates(certs_dir / "identity.chain.pem", node.identity_chain)
        pki.write_private_key(certs_dir / "identity.key.pem", node.identity.key, node_pass)
        (node_dir / "network-parameters").write_bytes(params_bytes)
        p2p = NetworkHostAndPort(host=host, port=ports.pop())
        rpc = NetworkHostAndPort(host=host, port=ports.pop())
        info = NodeInfo(
            addresses=(p2p,),
            legal_identities=(_der(node.identity_chain),),
            platform_version=PLATFORM_VERSION,
            serial=int(now.timestamp() * 1000),
        )
        signed = sign_node_info(info, [node.identity.key])
        data = _codec.encode(signed.to_wire())
        (node_dir / node_info_file_name(name)).write_bytes(data)
        infos.append((node_info_file_name(name), data))
        nodes.append(
            BootstrappedNode(
                legal_name=name, directory=node_dir, p2p_address=p2p, rpc_address=rpc,
                node_info_hash=signed.hash, identity_key_hash=pki.key_hash(node.identity.key.public_key()),
                passphrase_file=pass_file,
            )
        )  # fmt: skip
    for node in nodes:
        additional = node.directory / "additional-node-infos"
        additional.mkdir()
        if map_address is not None:
            continue  # the map is the source: a copy here would keep a node the operator removed
        for file_name, data in infos:
            (additional / file_name).write_bytes(data)
    return BootstrappedNetwork(
        directory=root_dir,
        root_cert=root_cert_path,
        map_address=map_address,
        map_directory=map_dir,
        map_passphrase_file=map_pass_file,
        passphrase_env=passphrase_env,
        network_parameters_hash=sha256_hex(signed_params.raw),
        nodes=tuple(nodes),
    )
