"""``corda-trio network``: create and inspect development networks.

Examples::

    corda-trio network bootstrap --dir net --node "O=Alice,L=London,C=GB" --node "O=Bob,L=New York,C=US"
    corda-trio network bootstrap --dir net --node "O=Alice,L=London,C=GB" --no-map   # directory mode
    corda-trio network show --dir net
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Final

import attrs

from corda_trio import network, pki

from ._cli import CliError, path_arg
from ._config import (
    DEFAULT_PASSPHRASE_ENV,
    ConfigError,
    KeyPassphrase,
    NetworkMapServiceConfig,
    NodeConfig,
    dump_network_map_config,
    dump_node_config,
    load_node_config,
)

__all__ = ["register"]


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``network bootstrap`` and ``network show``."""
    sub = parser.add_subparsers(dest="network_command", metavar="SUBCOMMAND", required=True)
    boot = sub.add_parser(
        "bootstrap",
        help="create a network: CAs, node keys and certificates, node.toml files, network parameters",
        description="Create a development network in --dir (which must not exist or be empty). It is written "
        "into a temporary sibling .DIR.partial-PID-* and renamed into place when complete; one left by a "
        "bootstrap killed before it could clean up is removed by the next bootstrap into DIR (a warning line "
        "names it), and one whose process still runs makes this bootstrap stop.",
    )
    boot.add_argument("--dir", type=path_arg, required=True, help="network directory to create")
    boot.add_argument(
        "--node", action="append", required=True, metavar="LEGAL_NAME",
        help='legal name of a node, e.g. "O=Alice,L=London,C=GB" (repeat for each node; Latin script; no two '
        "may differ only in letter case or accents)",
    )  # fmt: skip
    where = boot.add_mutually_exclusive_group()
    where.add_argument(
        "--map-port", type=int, default=0, help="port of the network map service (default: free)"
    )
    where.add_argument(
        "--no-map", action="store_true", help="no map service: nodes use additional-node-infos/ only"
    )
    boot.add_argument(
        "--host",
        default="127.0.0.1",
        help="host the nodes and the map listen on and peers dial (it is in every NodeInfo and the map URL; "
        "default 127.0.0.1): a name or an IPv4 or IPv6 address, an IPv6 one with or without brackets (::1 "
        "or [::1]); not a wildcard such as 0.0.0.0: to listen on every interface, set p2p.listen in each "
        "node.toml afterwards",
    )
    boot.add_argument(
        "--passphrase-env", metavar="VAR",
        help="encrypt keys with the passphrase in this environment variable, which must then be set "
        f"(default {DEFAULT_PASSPHRASE_ENV}, if set; if it is not, random passphrases are generated "
        "and stored in 0600 files beside the keys)",
    )  # fmt: skip
    boot.add_argument(
        "--max-message-size",
        type=int,
        default=network.DEFAULT_MAX_MESSAGE_SIZE_BYTES,
        help="network parameter (bytes, 1024..2147483647, default 10 MiB)",
    )
    boot.add_argument(
        "--node-cert-days",
        type=int,
        default=network.NODE_VALIDITY_RANGE[1].days,
        metavar="DAYS",
        help="how long each node's certificates (node CA, TLS, legal identity) are valid, in days "
        f"({network.NODE_VALIDITY_RANGE[0].days}..{network.NODE_VALIDITY_RANGE[1].days}, default "
        f"{network.NODE_VALIDITY_RANGE[1].days}: as long as the network's CAs); a node refuses to start "
        "with an expired certificate and warns when one expires within 30 days",
    )
    boot.set_defaults(func=_bootstrap)

    show = sub.add_parser("show", help="list the nodes of a bootstrapped network")
    show.add_argument("--dir", type=path_arg, required=True, help="network directory")
    show.set_defaults(func=_show)


#: The longest passphrase a PEM key is encrypted with (OpenSSL's; cryptography refuses a longer one with
#: 'Passwords longer than 1023 bytes are not supported by this backend', which names no option).
MAX_KEY_PASSPHRASE_BYTES: Final = 1023


def _bootstrap(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    names = []
    for text in args.node:
        try:
            names.append(pki.CordaX500Name.parse(text))
        except pki.InvalidNameError as exc:
            raise CliError(f"--node {text!r}: {exc}", 2) from None
    if args.map_port is not None and not 0 <= args.map_port <= 65535:
        raise CliError(f"--map-port {args.map_port}: must be in 0..65535", 2)
    low, high = network.MESSAGE_SIZE_RANGE_BYTES
    if not low <= args.max_message_size <= high:
        raise CliError(f"--max-message-size {args.max_message_size}: must be in {low}..{high} bytes", 2)
    low_days, high_days = (d.days for d in network.NODE_VALIDITY_RANGE)
    if not low_days <= args.node_cert_days <= high_days:
        raise CliError(f"--node-cert-days {args.node_cert_days}: must be in {low_days}..{high_days}", 2)
    # A variable named on the command line must be set: one that is not (a typo, a missing `export`) left
    # the keys under generated passphrases, stored on disk beside them, where the operator asked for theirs.
    if args.passphrase_env is not None and not os.environ.get(args.passphrase_env):
        raise CliError(
            f"--passphrase-env {args.passphrase_env}: ${args.passphrase_env} is not set (or empty): "
            "export it, or leave the option out to have passphrases generated",
            2,
        )
    if args.passphrase_env is None:
        args.passphrase_env = DEFAULT_PASSPHRASE_ENV
    env_value = os.environ.get(args.passphrase_env, "")
    passphrase = env_value.encode() if env_value else None
    if passphrase is not None and len(passphrase) > MAX_KEY_PASSPHRASE_BYTES:
        raise CliError(
            f"--passphrase-env {args.passphrase_env}: the passphrase is {len(passphrase):,} bytes; a key's "
            f"passphrase is at most {MAX_KEY_PASSPHRASE_BYTES:,}",
            2,
        )
    try:
        host = network.parse_host(args.host)
    except ValueError as exc:
        raise CliError(f"--host {args.host!r}: {exc}", 2) from None
    result = create_network(
        args.dir,
        names,
        host=host,
        map_port=None if args.no_map else args.map_port,
        passphrase=passphrase,
        passphrase_env=args.passphrase_env if passphrase else None,
        max_message_size=args.max_message_size,
        node_validity=dt.timedelta(days=args.node_cert_days),
    )
    elapsed = time.perf_counter() - started
    print(f"created network in {result.directory} ({len(result.nodes)} nodes, {elapsed:.2f} s)")
    print(f"  network map: {result.map_url or 'none (directory mode: additional-node-infos/)'}")
    for node in result.nodes:
        print(
            f"  {node.legal_name}: {node.directory / 'node.toml'}  "
            f"p2p {node.p2p_address}  rpc {node.rpc_address}"
        )
    if result.passphrase_env:
        print(f"  keys are encrypted with the passphrase in ${result.passphrase_env}")
    else:
        print("  keys are encrypted with generated passphrases (0600 'passphrase' files beside them)")
    return 0


def create_network(
    directory: Path,
    names: list[pki.CordaX500Name],
    *,
    host: str = "127.0.0.1",
    map_port: int | None = 0,
    passphrase: bytes | None = None,
    passphrase_env: str | None = None,
    max_message_size: int = network.DEFAULT_MAX_MESSAGE_SIZE_BYTES,
    node_validity: dt.timedelta = pki.DEFAULT_VALIDITY,
) -> network.BootstrappedNetwork:
    """``network.bootstrap_network`` plus the ``node.toml`` files and the map's ``networkmap.toml``.

    Raises:
        CliError: the network cannot be created (exit code 2).
    """
    final = Path(directory).absolute()
    parent = final.parent
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise CliError(f"{final} exists and is not an empty directory", 2)
    blocker = next((p for p in (final, *final.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise CliError(f"cannot create the network directory {final}: {blocker} is a file", 2)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create the network directory {final}: {exc.strerror} ({parent})", 2) from None
    # Everything is written into a temporary sibling, renamed into place when complete: an error or an
    # interrupt leaves no half-written network behind.
    try:
        _clear_leftovers(final)
        work = Path(tempfile.mkdtemp(prefix=f"{_partial_prefix(final)}{os.getpid()}-", dir=parent))
    except OSError as exc:
        raise CliError(f"cannot write in {parent}: {exc.strerror}", 2) from None
    try:
        try:
            built = network.bootstrap_network(
                work,
                names,
                now=dt.datetime.now(dt.UTC),
                host=host,
                map_port=map_port,
                passphrase=passphrase,
                passphrase_env=passphrase_env,
                max_message_size=max_message_size,
                node_validity=node_validity,
            )
        except (network.BootstrapError, ValueError) as exc:
            raise CliError(str(exc).replace(str(work), str(final)), 2) from None
        for node in built.nodes:
            _write_node_config(built, node)
        if built.map_address is not None:
            map_config = NetworkMapServiceConfig(
                address=built.map_address,
                max_age_seconds=30,
                trust_root=built.root_cert,
                map_cert_chain=built.map_directory / "map.chain.pem",
                map_key=built.map_directory / "map.key.pem",
                network_parameters=built.map_directory / "network-parameters",
                database=built.map_directory / "networkmap.db",
                key_passphrase=_passphrase_source(built, built.map_passphrase_file),
            )
            (built.map_directory / "networkmap.toml").write_text(
                dump_network_map_config(map_config, built.map_directory), encoding="utf-8"
            )
            _create_map_database(map_config.database, map_config.network_parameters, built.root_cert)
        if final.exists():
            final.rmdir()  # the empty directory we were given
        os.rename(work, final)
    except OSError as exc:  # the disk, not the request: full, read-only, gone
        shutil.rmtree(work, ignore_errors=True)
        raise CliError(f"cannot write the network into {parent}: {exc.strerror or exc}", 1) from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return _moved(built, work, final)


def _create_map_database(database: Path, parameters: Path, root: Path) -> None:
    """The map's (empty) database, holding the network parameters: ``networkmap serve`` then says so when it
    finds none (a lost database is a new, empty map, without the operator's removals)."""
    data = parameters.read_bytes()
    _, params_hash = network.verify_network_parameters(
        data, trust_root=pki.read_certificate(root), now=dt.datetime.now(dt.UTC)
    )
    store = network.NetworkMapStore(database)
    try:
        store.set_current_parameters(params_hash, data)
    finally:
        store.close()


def _partial_prefix(final: Path) -> str:
    """How the temporary sibling a bootstrap into ``final`` writes begins (its pid follows, then ``-``)."""
    return f".{final.name}.partial-"


def _clear_leftovers(final: Path) -> None:
    """Remove the temporary siblings that bootstraps into ``final`` killed before they could clean up
    (``kill -9``, a power cut) left behind: keys and passphrases of a network that never was, which nothing
    else would ever remove. One whose bootstrap still runs is another bootstrap into the same directory.

    Raises:
        CliError: another bootstrap into ``final`` is running (exit code 1).
        OSError: a leftover cannot be removed.
    """
    prefix = _partial_prefix(final)
    for entry in sorted(final.parent.iterdir()):
        if not entry.name.startswith(prefix):
            continue
        pid = entry.name.removeprefix(prefix).partition("-")[0]
        if pid.isdigit() and _is_running(int(pid)):
            raise CliError(f"another bootstrap (pid {pid}) is writing {final} (into {entry})", 1)
        shutil.rmtree(entry)
        logging.getLogger(__name__).warning("removed %s, left by a bootstrap that was interrupted", entry)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process)
        return True
    except OverflowError:  # (no pid is that large)
        return False
    return True


def _moved(built: network.BootstrappedNetwork, old: Path, new: Path) -> network.BootstrappedNetwork:
    """``built`` with every path under ``old`` now under ``new`` (configs hold relative paths only)."""

    def move(path: Path | None) -> Path | None:
        return None if path is None else new / path.relative_to(old)

    nodes = tuple(
        attrs.evolve(n, directory=move(n.directory), passphrase_file=move(n.passphrase_file))
        for n in built.nodes
    )
    return attrs.evolve(
        built,
        directory=new,
        root_cert=move(built.root_cert),
        map_directory=move(built.map_directory),
        map_passphrase_file=move(built.map_passphrase_file),
        nodes=nodes,
    )


def _passphrase_source(result: network.BootstrappedNetwork, file: Path | None) -> KeyPassphrase:
    if result.passphrase_env is not None:
        return KeyPassphrase(env=result.passphrase_env)
    return KeyPassphrase(file=file)


def _write_node_config(result: network.BootstrappedNetwork, node: network.BootstrappedNode) -> None:
    d, certs = node.directory, node.certificates
    config = NodeConfig(
        legal_name=node.legal_name,
        base_directory=d,
        p2p_address=node.p2p_address,
        p2p_listen=node.p2p_address,
        rpc_address=node.rpc_address,
        network_map_url=result.map_url,
        trust_root=certs / "network-root.cert.pem",
        network_parameters=d / "network-parameters",
        additional_node_infos=d / "additional-node-infos",
        node_info_cache=d / "network-map-cache.db",
        node_ca_cert_chain=certs / "node-ca.chain.pem",
        node_ca_key=certs / "node-ca.key.pem",
        tls_cert_chain=certs / "tls.chain.pem",
        tls_key=certs / "tls.key.pem",
        identity_cert_chain=certs / "identity.chain.pem",
        identity_key=certs / "identity.key.pem",
        key_passphrase=_passphrase_source(result, node.passphrase_file),
        store_directory=d / "store",
        metrics_address=(_loopback(node), 0),
        bridge_endpoint=(_loopback(node), 0),
    )
    (d / "node.toml").write_text(dump_node_config(config, d), encoding="utf-8")


def _loopback(node: network.BootstrappedNode) -> str:
    """Where a node's listeners for local processes only go (/metrics; the local endpoint of an external
    bridge): the loopback of the family the network was bootstrapped on, so that a network bootstrapped on
    ``::1`` runs on a host without IPv4 (``127.0.0.1`` cannot be bound there)."""
    return "::1" if ":" in node.p2p_address.host else "127.0.0.1"


def _show(args: argparse.Namespace) -> int:
    configs = sorted((args.dir / "nodes").glob("*/node.toml"))
    if not configs:
        raise CliError(f"no nodes found under {args.dir / 'nodes'} (is this a bootstrapped network?)", 2)
    for path in configs:
        try:
            cfg = load_node_config(path)
        except ConfigError as exc:
            raise CliError(str(exc), 2) from None
        try:
            identity = pki.read_certificates(cfg.identity_cert_chain)[0]
        except pki.KeyStoreError as exc:
            raise CliError(str(exc), 1) from None
        print(f"{cfg.legal_name}")
        print(f"  config     {path}")
        print(f"  p2p        {cfg.p2p_address}   rpc {cfg.rpc_address}")
        print(f"  map        {cfg.network_map_url or 'none (directory mode)'}")
        print(f"  key hash   {pki.key_hash(identity.public_key())}")
        print(f"  valid to   {identity.not_valid_after_utc.isoformat()}")
    return 0
