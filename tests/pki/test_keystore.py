"""Keys and certificates on disk: encryption, permissions, atomic writes, clear errors."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corda_trio import pki


def test_private_key_round_trip_encrypted(tmp_path: Path, alice: pki.NodeCredentials) -> None:
    path = tmp_path / "identity.key.pem"
    pki.write_private_key(path, alice.identity.key, b"correct horse")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "BEGIN ENCRYPTED PRIVATE KEY" in text
    key = pki.read_private_key(path, b"correct horse")
    assert key.public_key() == alice.identity.key.public_key()
    with pytest.raises(pki.KeyStoreError, match="wrong passphrase"):
        pki.read_private_key(path, b"wrong")
    with pytest.raises(pki.KeyStoreError, match=r"identity\.key\.pem"):
        pki.read_private_key(path, None)
    assert [p.name for p in tmp_path.iterdir()] == ["identity.key.pem"]  # no temporary file left behind


def test_unencrypted_key_only_when_asked(tmp_path: Path, alice: pki.NodeCredentials) -> None:
    path = tmp_path / "tls.key.pem"
    pki.write_private_key(path, alice.tls.key, None)
    assert "BEGIN PRIVATE KEY" in path.read_text()
    assert pki.read_private_key(path, None).public_key() == alice.tls.key.public_key()
    with pytest.raises(pki.KeyStoreError, match="empty passphrase"):
        pki.write_private_key(path, alice.tls.key, b"")


def test_group_readable_key_is_refused(tmp_path: Path, alice: pki.NodeCredentials) -> None:
    path = tmp_path / "k.pem"
    pki.write_private_key(path, alice.tls.key, b"pw")
    os.chmod(path, 0o640)
    with pytest.raises(pki.KeyStoreError, match=r"mode 0640.*chmod 600"):
        pki.read_private_key(path, b"pw")


def test_missing_and_garbage_files(tmp_path: Path) -> None:
    with pytest.raises(pki.KeyStoreError, match="No such file"):
        pki.read_private_key(tmp_path / "nope.pem", b"pw")
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"not a key")
    garbage.chmod(0o600)
    with pytest.raises(pki.KeyStoreError, match="cannot be decrypted or parsed"):
        pki.read_private_key(garbage, b"pw")
    with pytest.raises(pki.KeyStoreError, match="does not hold PEM certificates") as info:
        pki.read_certificates(garbage)
    assert "http" not in str(info.value)  # (cryptography's link to its FAQ is not for an operator)


def test_certificates_round_trip(
    tmp_path: Path, alice: pki.NodeCredentials, network: pki.NetworkCredentials
) -> None:
    pki.write_certificates(tmp_path / "chain.pem", alice.tls_chain)
    assert pki.read_certificates(tmp_path / "chain.pem") == alice.tls_chain
    assert stat.S_IMODE((tmp_path / "chain.pem").stat().st_mode) == 0o644
    with pytest.raises(pki.KeyStoreError, match="holds 3 certificates, expected exactly one"):
        pki.read_certificate(tmp_path / "chain.pem")
    pki.write_certificates(tmp_path / "root.pem", [network.root.cert])
    assert pki.read_certificate(tmp_path / "root.pem") == network.root.cert
