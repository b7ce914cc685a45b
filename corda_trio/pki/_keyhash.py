"""Key hashes for queue names: ``DL`` + Base58(SHA-256(DER SubjectPublicKeyInfo)), as Corda names its
peer queues (``internal.peers.DL…``, ``p2p.inbound.DL…``)."""

from __future__ import annotations

import hashlib
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

__all__ = ["KEY_HASH_PREFIX", "base58_decode", "base58_encode", "key_hash"]

#: Prefix Corda puts before the Base58 text of a key's SHA-256 ("DL" = "dual-layer" key hash).
KEY_HASH_PREFIX: Final[str] = "DL"
_ALPHABET: Final[str] = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"  # Bitcoin's
_INDEX: Final[dict[str, int]] = {c: i for i, c in enumerate(_ALPHABET)}


def base58_encode(data: bytes) -> str:
    """Bitcoin Base58: big-endian base-58 digits, one ``1`` per leading zero byte."""
    number = int.from_bytes(data, "big")
    digits = []
    while number:
        number, rem = divmod(number, 58)
        digits.append(_ALPHABET[rem])
    zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * zeros + "".join(reversed(digits))


def base58_decode(text: str) -> bytes:
    """Inverse of :func:`base58_encode`.

    Raises:
        ValueError: a character outside the Base58 alphabet.
    """
    number = 0
    for char in text:
        try:
            number = number * 58 + _INDEX[char]
        except KeyError:
            raise ValueError(f"{char!r} is not a Base58 character") from None
    zeros = len(text) - len(text.lstrip("1"))
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    return b"\0" * zeros + body


def key_hash(public_key: PublicKeyTypes) -> str:
    """``DL`` + Base58(SHA-256(DER SubjectPublicKeyInfo of ``public_key``))."""
    spki = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KEY_HASH_PREFIX + base58_encode(hashlib.sha256(spki).digest())
