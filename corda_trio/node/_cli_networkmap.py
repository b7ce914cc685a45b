"""``corda-trio networkmap``: run and administer the network map service.

Examples::

    corda-trio networkmap serve --dir net                 # uses net/network-map/networkmap.toml
    corda-trio networkmap list --dir net
    corda-trio networkmap remove --dir net --node "O=Bob,L=New York,C=US"    # stays out when it republishes
    corda-trio networkmap readmit --dir net --node "O=Bob,L=New York,C=US"   # back at its next poll

``serve`` prints ``corda-trio networkmap: serving http://HOST:PORT (N nodes)``; with ``[metrics] address``
in networkmap.toml the line ends with ``  metrics http://HOST:PORT/metrics`` (series in docs/metrics.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import logging
import stat
from pathlib import Path

import trio
from cryptography import x509

from corda_trio import bridge, network, pki
from corda_trio.files import read_small_file

from ._certificates import (
    OwnCertificate,
    check_own_certificates,
    expiry_warning,
    own_certificates,
    watch_expiry,
)
from ._cli import CliError, path_arg, run_trio
from ._config import ConfigError, NetworkMapServiceConfig, load_network_map_config
from ._metrics import NetworkMapCollector, start_process_metrics

log = logging.getLogger("corda_trio.network.server")

#: What the error line says when the map's signing certificate (or the root) expires while it serves.
MAP_EXPIRED_TEXT = (
    "nodes refuse the network map and the network parameters it signs until it is renewed and the service "
    "restarted"
)

__all__ = ["register"]


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``networkmap serve``, ``list``, ``remove`` and ``readmit``."""
    sub = parser.add_subparsers(dest="networkmap_command", metavar="SUBCOMMAND", required=True)
    for name, func, text in (
        ("serve", _serve, "serve the network map over HTTP until interrupted"),
        ("list", _list, "list the legal names in the map, then the removed ones"),
        (
            "remove",
            _remove,
            "remove a node from the map and deny its identity key: it stays out when it publishes again "
            "(served at once, also while running)",
        ),
        (
            "readmit",
            _readmit,
            "lift a removal: the node is back once it publishes again, which a running node does at its next "
            "poll of the map (no restart)",
        ),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument(
            "--dir", type=path_arg, help="network directory (reads DIR/network-map/networkmap.toml)"
        )
        p.add_argument("--config", type=path_arg, help="path of networkmap.toml (instead of --dir)")
        if name == "serve":
            p.add_argument(
                "--max-connections", type=int, default=network.DEFAULT_MAX_MAP_CONNECTIONS, metavar="N",
                help="clients served at once; one more gets 503 "
                f"(default {network.DEFAULT_MAX_MAP_CONNECTIONS})",
            )  # fmt: skip
        if name in ("remove", "readmit"):
            p.add_argument(
                "--node", required=True, metavar="LEGAL_NAME",
                help=f"legal name to {name} (any spelling; one that breaks a rule newer than its entry: as "
                "`networkmap list` prints it)",
            )  # fmt: skip
        p.set_defaults(func=func)


def _config(args: argparse.Namespace) -> NetworkMapServiceConfig:
    if (args.dir is None) == (args.config is None):
        raise CliError("give exactly one of --dir and --config", 2)
    path = args.config or args.dir / "network-map" / "networkmap.toml"
    if args.config is None and not path.exists():
        _no_map_service(args.dir, args.networkmap_command)
    try:
        return load_network_map_config(path)
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None


#: What each command needs the map for, in the line that says there is none.
_MAP_USE = {
    "serve": "serve",
    "list": "list",
    "remove": "remove a node from",
    "readmit": "readmit a node to",
}


def _no_map_service(directory: Path, command: str) -> None:
    """Say why ``directory`` has no ``networkmap.toml`` (``--dir`` given, the file missing)."""
    map_dir = directory / "network-map"
    if (map_dir / "network-parameters").is_file():  # a network `network bootstrap` made
        raise CliError(
            f"{directory}: no network map service, so no map to {_MAP_USE[command]}: there is no "
            f"{map_dir / 'networkmap.toml'} (a network bootstrapped with --no-map has none; its nodes find "
            "each other through their additional-node-infos/ directories)",
            2,
        )
    try:
        is_dir = stat.S_ISDIR(directory.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        raise CliError(f"--dir {directory}: no such directory", 2) from None
    except OSError as exc:  # (a symlink loop: it said 'no such directory')
        raise CliError(f"--dir {directory}: {exc.strerror}", 2) from None
    if not is_dir:  # (a file: it said 'no such directory')
        raise CliError(f"--dir {directory}: exists and is not a directory", 2)
    if not map_dir.is_dir():
        raise CliError(
            f"{directory}: not a network directory (no network-map/ in it): give the --dir of "
            "`corda-trio network bootstrap`, or --config with the path of a networkmap.toml",
            2,
        )


def _service(cfg: NetworkMapServiceConfig) -> tuple[network.NetworkMapService, tuple[OwnCertificate, ...]]:
    try:
        passphrase = cfg.key_passphrase.read()
        root = pki.read_certificate(cfg.trust_root)
        map_chain = pki.read_certificates(cfg.map_cert_chain)
        map_key = pki.read_private_key(cfg.map_key, passphrase)
        params_bytes = read_small_file(cfg.network_parameters, network.MAX_PAYLOAD_BYTES)
        pki.check_key_pair(map_chain[0], map_key, cert_path=cfg.map_cert_chain, key_path=cfg.map_key)
    except (ConfigError, pki.KeyStoreError) as exc:
        raise CliError(str(exc), 2) from None
    except OSError as exc:
        raise CliError(f"cannot read {cfg.network_parameters}: {exc.strerror}", 2) from None
    now = dt.datetime.now(dt.UTC)
    certificates = own_certificates([(cfg.map_cert_chain, map_chain), (cfg.trust_root, [root])])
    try:  # (first: an expired certificate named with its file, not as a path that does not verify)
        check_own_certificates(certificates, now=now)
    except pki.CertificateValidationError as exc:
        raise CliError(str(exc), 2) from None
    try:
        pki.validate_cert_path(map_chain, trust_root=root, now=now, leaf_role=pki.CertRole.NETWORK_MAP)
    except pki.CertificateValidationError as exc:
        raise CliError(
            f"network map material does not verify: {cfg.map_cert_chain} does not chain to the network root "
            f"{cfg.trust_root}: {exc}",
            2,
        ) from None
    try:
        _, params_hash = network.verify_network_parameters(params_bytes, trust_root=root, now=now)
    except network.NetworkMapError as exc:
        raise CliError(f"network map material does not verify: {cfg.network_parameters}: {exc}", 2) from None
    store = _open_store(cfg)
    _check_stored(store, cfg, root, now)
    if store.current_parameters_hash() != params_hash:
        store.set_current_parameters(params_hash, params_bytes)
    service = network.NetworkMapService(
        store=store,
        trust_root=root,
        map_key=map_key,
        map_cert_path=map_chain,
        max_age_seconds=cfg.max_age_seconds,
    )
    return service, certificates


def _check_stored(
    store: network.NetworkMapStore, cfg: NetworkMapServiceConfig, root: x509.Certificate, now: dt.datetime
) -> None:
    """Refuse a database whose stored NodeInfos or parameters are not the bytes the map accepted (a disk's
    damage SQLite's own check does not see: it checks pages, not the records' contents), before anything is
    written to it and before nodes are served damaged bytes."""
    for kind, name, hash_hex, data in store.stored():
        damage = network.stored_damage(kind, data, hash_hex, trust_root=root, now=now)
        if damage is not None:
            store.close()
            what = f"NodeInfo of {name}" if kind == "node-info" else "network parameters"
            what += f" ({hash_hex}) {'is' if kind == 'node-info' else 'are'}"
            raise CliError(
                f"{cfg.database}: the stored {what} damaged: {damage}; restore the database from a backup",
                1,
            )


def _serve(args: argparse.Namespace) -> int:
    if not 1 <= args.max_connections <= 1_000_000:
        raise CliError(f"--max-connections {args.max_connections}: must be in 1..1000000", 2)
    cfg = _config(args)
    # (SQLite makes a database where there is none, or of an empty file: said, since it is a new map)
    fresh = not cfg.database.exists() or (cfg.database.is_file() and cfg.database.stat().st_size == 0)
    service, certificates = _service(cfg)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if (warning := expiry_warning(certificates, now=dt.datetime.now(dt.UTC))) is not None:
        log.warning(warning)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(watch_expiry, certificates, consequence=MAP_EXPIRED_TEXT, logger=log)
            )
            try:
                listeners = await nursery.start(
                    functools.partial(
                        network.serve_network_map, host=cfg.address.host, max_connections=args.max_connections
                    ),
                    service,
                    cfg.address.port,
                )
            except OSError as exc:
                raise CliError(f"cannot listen on {cfg.address}: {exc.strerror}", 1) from None
            port = listeners[0].socket.getsockname()[1]
            count = len(service.store.legal_names())
            metrics = ""
            if cfg.metrics_address is not None:
                collector = NetworkMapCollector(service)
                try:
                    url = await start_process_metrics(nursery, collector, *cfg.metrics_address)
                except bridge.ListenError as exc:
                    raise CliError(str(exc), 1) from None
                metrics = f"  metrics {url}"
            print(
                f"corda-trio networkmap: serving http://{network.host_port_text(cfg.address.host, port)} "
                f"({count} node{'' if count == 1 else 's'}){metrics}",
                flush=True,
            )
            if fresh:  # (once serving: a refused start stays one line)
                log.info(
                    "%s did not exist or was empty: a new, empty map database was made; it holds what nodes "
                    "publish from now on (a running node publishes again at its next poll). If it replaces a "
                    "lost one, the operator's removals it held are gone: remove those nodes again",
                    cfg.database,
                )
            # Ctrl-C and SIGTERM unwind through main() (one line; 130 or 0); the store closes below.
            await trio.sleep_forever()

    try:
        run_trio(main)
    except BaseExceptionGroup as group:
        leaves = group.subgroup(CliError)
        if leaves is not None:
            raise leaves.exceptions[0] from None
        raise
    finally:
        service.store.close()
    return 0


def _open_store(cfg: NetworkMapServiceConfig) -> network.NetworkMapStore:
    try:
        return network.NetworkMapStore(cfg.database)
    except network.NetworkMapStoreError as exc:
        raise CliError(str(exc), 1) from None


def _list(args: argparse.Namespace) -> int:
    store = _open_store(_config(args))
    try:
        for name in store.legal_names():
            print(name)
        for name, key in store.denied():
            print(f"{name}  (removed; identity key {key}; `corda-trio networkmap readmit` lifts it)")
    finally:
        store.close()
    return 0


def _node_name(args: argparse.Namespace, store: network.NetworkMapStore) -> str:
    """``--node`` in canonical form; or, spelled as ``networkmap list`` prints it, a name the map holds
    that breaks a rule added since an older build admitted it (so the operator can still remove it)."""
    try:
        return str(pki.CordaX500Name.parse(args.node))
    except pki.InvalidNameError as exc:
        if args.node in store.legal_names() or args.node in (n for n, _ in store.denied()):
            return str(args.node)
        raise CliError(f"--node {args.node!r}: {exc}", 2) from None


def _remove(args: argparse.Namespace) -> int:
    store = _open_store(_config(args))
    try:
        name = _node_name(args, store)
        if not store.remove_node(name):
            raise CliError(f"{name} is not in the map", 1)
        serial = store.map_serial()
    finally:
        store.close()
    print(f"removed {name} (map serial {serial}); it stays out until `corda-trio networkmap readmit`")
    return 0


def _readmit(args: argparse.Namespace) -> int:
    store = _open_store(_config(args))
    try:
        name = _node_name(args, store)
        if not store.readmit_node(name):
            raise CliError(f"{name} was not removed from the map", 1)
    finally:
        store.close()
    print(
        f"readmitted {name}: it is back in the map when it publishes its NodeInfo again, which a running "
        "node does at its next poll of the map (no restart needed)"
    )
    return 0
