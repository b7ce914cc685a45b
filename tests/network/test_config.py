"""``node.toml`` / ``networkmap.toml``: round trip through the writer, and clear errors for bad files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corda_trio import network, pki, store
from corda_trio.node import _config

GOOD = """
legal_name = "O=Alice, L=London, C=GB"
base_directory = "alice"

[p2p]
address = "127.0.0.1:40001"

[rpc]
address = "127.0.0.1:40002"

[network]
map_url = "http://127.0.0.1:40000"

[keys]
passphrase_env = "ALICE_PASS"

[store]
fsync = "none"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_and_paths(tmp_path: Path) -> None:
    cfg = _config.load_node_config(_write(tmp_path, GOOD))
    base = (tmp_path / "alice").resolve()
    assert cfg.legal_name == pki.CordaX500Name.parse("O=Alice,L=London,C=GB")
    assert cfg.base_directory == base
    assert cfg.p2p_address == cfg.p2p_listen == network.NetworkHostAndPort(host="127.0.0.1", port=40001)
    assert cfg.rpc_address.port == 40002
    assert cfg.network_map_url == "http://127.0.0.1:40000"
    assert cfg.tls_key == base / "certificates" / "tls.key.pem"
    assert cfg.trust_root == base / "certificates" / "network-root.cert.pem"
    assert cfg.additional_node_infos == base / "additional-node-infos"
    assert cfg.store_directory == base / "store" and cfg.store_fsync is store.FsyncPolicy.NONE
    assert cfg.key_passphrase.read({"ALICE_PASS": "s3cret"}) == b"s3cret"


def test_writer_round_trip(tmp_path: Path) -> None:
    cfg = _config.load_node_config(_write(tmp_path, GOOD))
    text = _config.dump_node_config(cfg, tmp_path)
    (tmp_path / "again.toml").write_text(text, encoding="utf-8")
    assert _config.load_node_config(tmp_path / "again.toml") == cfg


def test_passphrase_file(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace('passphrase_env = "ALICE_PASS"', 'passphrase_file = "pass.txt"'))
    cfg = _config.load_node_config(path)
    secret = tmp_path / "alice" / "pass.txt"
    secret.parent.mkdir()
    secret.write_text("from-a-file\n")
    os.chmod(secret, 0o644)
    with pytest.raises(_config.ConfigError, match="must not be readable by group or others"):
        cfg.key_passphrase.read()
    os.chmod(secret, 0o600)
    assert cfg.key_passphrase.read() == b"from-a-file"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("legal_name = \"O=Alice, L=London, C=GB\"", ""), "legal_name: is required"),
        (("O=Alice, L=London, C=GB", "O=Alice, L=London"), "legal_name: C is required"),
        (("[p2p]\naddress = \"127.0.0.1:40001\"", "[p2p]"), "p2p.address: is required"),
        (("127.0.0.1:40001", "127.0.0.1:99999"), "p2p.address: port must be in 1..65535"),
        (("127.0.0.1:40002", "localhost"), "rpc.address: expected HOST:PORT"),
        (("http://127.0.0.1:40000", "https://map"), "network.map_url: must be an http:// URL"),
        (("fsync = \"none\"", "fsync = \"sometimes\""), "store.fsync: must be \"always\" or \"none\""),
        (("fsync = \"none\"", "fsync = \"none\"\nfsynk = 1"), "store.fsynk: unknown setting"),
        (  # a misspelt table: the error names the tables and top-level keys a node.toml may have
            ("[store]", "[storage]"),
            "storage: unknown setting (allowed: base_directory, legal_name, [bridge], [float], [flows], "
            "[keys], [logging], [metrics], [network], [p2p], [rpc], [shutdown], [store])",
        ),
        (("passphrase_env = \"ALICE_PASS\"", ""), "exactly one of keys.passphrase_env and keys.passphrase_"),
        (("passphrase_env = \"ALICE_PASS\"", "passphrase_env = \"A\"\npassphrase_file = \"f\""), "one of"),
        (("passphrase_env = \"ALICE_PASS\"", "passphrase_env = \"NOT A VAR\""), "environment variable name"),
        (("[rpc]", "[rpc"), "not valid TOML"),
        (("[p2p]", "p2p = 5\n[p2q]"), "p2p: must be a table"),
    ],
)  # fmt: skip
def test_bad_configs(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    old, new = change
    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(_config.ConfigError) as info:
        _config.load_node_config(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(_config.ConfigError, match="configuration file not found"):
        _config.load_node_config(tmp_path / "nope.toml")


def test_toml_string_escaping(tmp_path: Path) -> None:
    cfg = _config.load_node_config(_write(tmp_path, GOOD))
    odd = tmp_path / 'we"ird\\dir'
    import attrs

    cfg2 = attrs.evolve(cfg, store_directory=odd / "store\tx")
    (tmp_path / "odd.toml").write_text(_config.dump_node_config(cfg2, tmp_path), encoding="utf-8")
    assert _config.load_node_config(tmp_path / "odd.toml").store_directory == odd / "store\tx"


def test_direct_construction_is_validated(tmp_path: Path) -> None:
    import attrs

    cfg = _config.load_node_config(_write(tmp_path, GOOD))
    with pytest.raises(_config.ConfigError, match="tls_key must be an absolute path"):
        attrs.evolve(cfg, tls_key=Path("relative/tls.key.pem"))
    with pytest.raises(_config.ConfigError, match="store_fsync"):
        attrs.evolve(cfg, store_fsync="sometimes")  # type: ignore[arg-type]
