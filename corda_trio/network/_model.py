"""PURE data model of the network map: NodeInfo, NetworkParameters, NetworkMap and their signed envelopes.

Theory of operation
-------------------
Every object has one *wire form*: a msgpack array whose first two items are a type tag and a format version,
followed by the fields in a fixed order (see ``protocol_spec/network-map.md``).  Arrays rather than maps, and
msgpack's rule of always choosing the shortest encoding, make the bytes canonical: one value has exactly one
encoding, so a hash or signature over the bytes is a hash or signature over the value.  The codec
(``_codec.py``) re-encodes what it decoded and refuses input that is not byte-identical, so a peer cannot
smuggle a second encoding of a signed value past us.

This module only converts between attrs objects and plain Python structures (lists, ints, bytes, str) and
validates field types and ranges; msgpack, hashing of certificates and signature checks live in ``_codec.py``
and ``_signing.py``.  No I/O, no clock: times are integers (milliseconds since the epoch) passed in.
Certificates appear as DER ``bytes``: this module does not parse them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from typing import Any, Final, final

import attrs

from corda_trio.hostport import host_port_text

from ._errors import MalformedPayloadError

__all__ = [
    "MAX_ADDRESSES",
    "MAX_SERIAL",
    "MESSAGE_SIZE_RANGE_BYTES",
    "NETWORK_MAP_TAG",
    "NETWORK_PARAMETERS_TAG",
    "NODE_INFO_TAG",
    "SIGNED_NODE_INFO_TAG",
    "SIGNED_WITH_CERT_TAG",
    "MalformedPayloadError",
    "NetworkHostAndPort",
    "NetworkMap",
    "NetworkParameters",
    "NodeInfo",
    "SignedNodeInfo",
    "SignedWithCert",
    "check_host",
    "host_port_text",
    "next_serial",
    "parse_host",
    "sha256_hex",
    "split_host_port",
]

#: Allowed ``max_message_size`` / ``max_transaction_size`` (bytes): at least one 1 KiB message, at most what
#: a signed 32-bit length can describe.
MESSAGE_SIZE_RANGE_BYTES: Final[tuple[int, int]] = (1024, 2**31 - 1)

NODE_INFO_TAG: Final[str] = "corda-trio/node-info"
SIGNED_NODE_INFO_TAG: Final[str] = "corda-trio/signed-node-info"
NETWORK_PARAMETERS_TAG: Final[str] = "corda-trio/network-parameters"
NETWORK_MAP_TAG: Final[str] = "corda-trio/network-map"
SIGNED_WITH_CERT_TAG: Final[str] = "corda-trio/signed-with-cert"
FORMAT_VERSION: Final[int] = 1

#: Limits on what we accept from the network (a NodeInfo is a few KiB).  ``MAX_ADDRESSES`` also bounds what a
#: node may advertise (``[p2p] advertise`` in ``node.toml``).
MAX_ADDRESSES: Final[int] = 16
MAX_IDENTITIES: Final[int] = 8
MAX_CERT_PATH_LENGTH: Final[int] = 8
MAX_CERT_SIZE_BYTES: Final[int] = 16 * 1024
MAX_HOST_LENGTH: Final[int] = 253  # RFC 1035 name length
MAX_SIGNATURE_SIZE_BYTES: Final[int] = 512
MAX_MAP_ENTRIES: Final[int] = 100_000
#: The highest serial a NodeInfo may carry (a signed 64-bit integer).
MAX_SERIAL: Final[int] = 2**63 - 1


def sha256_hex(data: bytes) -> str:
    """Upper-case hex SHA-256, the form used in URLs and logs (Corda's ``SecureHash.toString``)."""
    return hashlib.sha256(data).hexdigest().upper()


def next_serial(now_ms: int, last: int | None) -> int:
    """The serial of a node's next NodeInfo: the time in milliseconds since the epoch by convention, but
    always above ``last``, the serial of the last one it published, so that a clock stepped back between two
    starts neither makes the map refuse the new NodeInfo (``409 stale-serial``) nor makes peers keep the old
    one (per legal name the highest serial wins).

    Raises:
        ValueError: ``last`` is :data:`MAX_SERIAL` already (no NodeInfo can follow it).
    """
    if last is None:
        return max(now_ms, 0)
    if last >= MAX_SERIAL:
        raise ValueError(f"the last serial is {last}, the highest a NodeInfo may carry")
    return max(now_ms, last + 1)


def _check_header(obj: Any, tag: str, n_fields: int) -> list[Any]:
    if not isinstance(obj, list) or len(obj) < 2:
        raise MalformedPayloadError(f"expected a {tag} array, got {type(obj).__name__}")
    if obj[0] != tag:
        raise MalformedPayloadError(f"expected type tag {tag!r}, got {str(obj[0])[:64]!r}")
    if type(obj[1]) is not int or obj[1] != FORMAT_VERSION:  # True == 1 in Python: refuse bools
        raise MalformedPayloadError(
            f"{tag}: unsupported format version {obj[1]!r} (supported: {FORMAT_VERSION})"
        )
    if len(obj) != 2 + n_fields:
        raise MalformedPayloadError(f"{tag}: expected {n_fields} fields, got {len(obj) - 2}")
    return obj[2:]


def _int(value: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise MalformedPayloadError(f"{what}: expected an integer in [{lo}, {hi}], got {value!r}")
    return value


def _bytes(value: Any, what: str, max_len: int) -> bytes:
    if not isinstance(value, bytes) or not value or len(value) > max_len:
        raise MalformedPayloadError(f"{what}: expected 1..{max_len} bytes")
    return value


def _list(value: Any, what: str, lo: int, hi: int) -> list[Any]:
    if not isinstance(value, list) or not lo <= len(value) <= hi:
        raise MalformedPayloadError(f"{what}: expected a list of {lo}..{hi} items")
    return value


#: ``inet_aton``'s numbers-and-dots form of 0.0.0.0: one to four parts, each a decimal, octal or hex zero.
_ALL_ZERO_IPV4: Final = re.compile(r"(?:0[xX]0+|0+)(?:\.(?:0[xX]0+|0+)){0,3}")


def _valid_port(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"port must be in 1..65535, got {value!r}")


#: One label of a host name (RFC 1123 section 2.1): letters, digits and '-', not at either end, 1..63
#: characters (RFC 1035 section 2.3.4), plus '_', which DNS carries and names in /etc/hosts and container
#: networks (Docker Compose service names) use.  A name is labels joined by '.', with an optional final '.'
#: (a fully qualified name).
_HOST_LABEL: Final = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def check_host(host: object) -> None:
    """Check that ``host`` is an IPv4 address, an IPv6 address (no brackets; a zone such as ``%eth0`` is
    allowed) or an ASCII host name: what a node may bind to, dial and advertise.

    The resolver would refuse the rest only when it is asked (an empty or over-long label fails IDNA
    encoding inside ``getaddrinfo`` with a ``UnicodeError``, not an ``OSError``), or pass it on to DNS.

    Raises:
        ValueError: why not, naming the host.
    """
    if not isinstance(host, str) or not host or len(host) > MAX_HOST_LENGTH:
        raise ValueError(f"host must be 1..{MAX_HOST_LENGTH} characters, got {host!r}")
    if any(c.isspace() or not c.isprintable() for c in host):  # (NUL, other controls)
        raise ValueError(f"host {host!r} contains characters not allowed in a host name or address")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"host {host!r} is not an IPv6 address") from None
        return
    if not host.isascii():
        raise ValueError(f"host {host!r} is not ASCII: write an internationalised name in its xn-- form")
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    bad = next((label for label in labels if not _HOST_LABEL.fullmatch(label)), None)
    if bad is not None:
        raise ValueError(
            f"host {host!r} is not a host name: label {bad!r} must be 1..63 letters, digits, '-' or '_'"
            " and not start or end with '-'"
        )


def parse_host(text: str) -> str:
    """A host given on its own (a command-line option, a ``host`` key): as :func:`check_host`, but an IPv6
    address may also be written in brackets, as in a URL (``[::1]``); returns it without them.

    Raises:
        ValueError: see :func:`check_host`.
    """
    host = text[1:-1] if text.startswith("[") and text.endswith("]") and ":" in text else text
    check_host(host)
    return host


def split_host_port(text: str, *, lowest_port: int = 0) -> tuple[str, int]:
    """Split ``HOST:PORT`` or ``[IPV6]:PORT`` into a checked host (:func:`check_host`, brackets removed)
    and a port in ``lowest_port``..65535 (the default 0, any free port, suits an address to listen on).

    Raises:
        ValueError: no port, a bad port, an IPv6 address without brackets, brackets around something that
            is not an IPv6 address, or a bad host.
    """
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or not rest.startswith(":"):
            raise ValueError(f"expected [IPV6]:PORT, got {text!r}")
        if ":" not in host:
            raise ValueError(f"brackets in {text!r} are only for IPv6 addresses: write HOST:PORT")
        port = rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        if ":" in host:
            raise ValueError(f"IPv6 address in {text!r} must be in brackets: [addr]:port")
    if not (port.isascii() and port.isdigit()):  # (isdigit alone takes '²' and full-width digits)
        raise ValueError(f"port in {text!r} is not a number")
    if not lowest_port <= int(port) <= 65535:
        raise ValueError(f"port must be in {lowest_port}..65535, got {int(port)}")
    check_host(host)
    return host, int(port)


def _valid_host(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    check_host(value)


@final
@attrs.frozen(kw_only=True)
class NetworkHostAndPort:
    """A P2P address.  ``str()`` is ``host:port`` (``[v6]:port`` for IPv6 literals)."""

    host: str = attrs.field(validator=_valid_host)
    port: int = attrs.field(validator=_valid_port)

    @classmethod
    def parse(cls, text: str) -> NetworkHostAndPort:
        """Parse ``host:port`` or ``[ipv6]:port`` (see :func:`split_host_port`; the port is 1..65535).

        Raises:
            ValueError: no port, a port out of range, or a bad host.
        """
        host, port = split_host_port(text, lowest_port=1)
        return cls(host=host, port=port)

    @property
    def is_unspecified(self) -> bool:
        """The host is a wildcard to bind to (``0.0.0.0``, ``::``, ``::ffff:0.0.0.0``, or ``0`` and the other
        all-zero spellings of ``0.0.0.0`` that the C resolver takes, such as ``0.0`` and ``0x0``): a
        socket listens there on every interface, but no peer on another host can dial it, so it is never
        an address to advertise."""
        try:
            address = ipaddress.ip_address(self.host)
        except ValueError:
            return _ALL_ZERO_IPV4.fullmatch(self.host) is not None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.is_unspecified

    def __str__(self) -> str:
        return host_port_text(self.host, self.port)


@final
@attrs.frozen(kw_only=True)
class NodeInfo:
    """What a node publishes about itself.

    Attributes:
        addresses: where peers reach its P2P (AMQP over TLS) endpoint, most preferred first.
        legal_identities: one certificate path per legal identity, each as DER certificates from the
            identity certificate up to (excluding) the network root.  The first is the node's main identity.
        platform_version: the corda-trio platform version the node runs.
        serial: increases with every new version the node publishes (milliseconds since the epoch by
            convention); the map keeps only the highest per legal name.
    """

    addresses: tuple[NetworkHostAndPort, ...]
    legal_identities: tuple[tuple[bytes, ...], ...]
    platform_version: int
    serial: int

    def to_wire(self) -> list[Any]:
        """The msgpack-ready structure (see the module docstring)."""
        return [
            NODE_INFO_TAG,
            FORMAT_VERSION,
            [[a.host, a.port] for a in self.addresses],
            [list(path) for path in self.legal_identities],
            self.platform_version,
            self.serial,
        ]

    @classmethod
    def from_wire(cls, obj: Any) -> NodeInfo:
        """Inverse of :meth:`to_wire`.

        Raises:
            MalformedPayloadError: any deviation from the wire form.
        """
        addresses, identities, platform_version, serial = _check_header(obj, NODE_INFO_TAG, 4)
        parsed_addresses = []
        for item in _list(addresses, "addresses", 1, MAX_ADDRESSES):
            pair = _list(item, "address", 2, 2)
            if not isinstance(pair[0], str):
                raise MalformedPayloadError("address host must be a string")
            try:
                parsed_addresses.append(NetworkHostAndPort(host=pair[0], port=pair[1]))
            except ValueError as exc:
                raise MalformedPayloadError(f"address: {exc}") from None
        paths = []
        for path in _list(identities, "legal identities", 1, MAX_IDENTITIES):
            certs = _list(path, "certificate path", 1, MAX_CERT_PATH_LENGTH)
            paths.append(tuple(_bytes(c, "certificate", MAX_CERT_SIZE_BYTES) for c in certs))
        return cls(
            addresses=tuple(parsed_addresses),
            legal_identities=tuple(paths),
            platform_version=_int(platform_version, "platform version", 1, 2**31 - 1),
            serial=_int(serial, "serial", 0, MAX_SERIAL),
        )


@final
@attrs.frozen(kw_only=True)
class SignedNodeInfo:
    """A serialised :class:`NodeInfo` and one signature per legal identity (same order), each by the
    identity's key over ``raw``.  Its hash (the map's key for it) is :func:`sha256_hex` of ``raw``."""

    raw: bytes
    signatures: tuple[bytes, ...]

    @property
    def hash(self) -> str:
        return sha256_hex(self.raw)

    def to_wire(self) -> list[Any]:
        return [SIGNED_NODE_INFO_TAG, FORMAT_VERSION, self.raw, list(self.signatures)]

    @classmethod
    def from_wire(cls, obj: Any) -> SignedNodeInfo:
        raw, signatures = _check_header(obj, SIGNED_NODE_INFO_TAG, 2)
        return cls(
            raw=_bytes(raw, "raw node info", 2**20),
            signatures=tuple(
                _bytes(s, "signature", MAX_SIGNATURE_SIZE_BYTES)
                for s in _list(signatures, "signatures", 1, MAX_IDENTITIES)
            ),
        )


@final
@attrs.frozen(kw_only=True)
class NetworkParameters:
    """Parameters every node of the network must agree on.

    Attributes:
        minimum_platform_version: nodes below it may not join (publish is refused).
        max_message_size: largest P2P message in bytes (default 10 MiB).
        max_transaction_size: largest transaction in bytes (kept for Corda parity).
        modified_time_ms: when these parameters were made (milliseconds since the epoch).
        epoch: increases with every change of parameters.
        event_horizon_seconds: a node not re-published for this long may be dropped from the map.
    """

    minimum_platform_version: int
    max_message_size: int
    max_transaction_size: int
    modified_time_ms: int
    epoch: int
    event_horizon_seconds: int

    def to_wire(self) -> list[Any]:
        return [
            NETWORK_PARAMETERS_TAG, FORMAT_VERSION, self.minimum_platform_version, self.max_message_size,
            self.max_transaction_size, self.modified_time_ms, self.epoch, self.event_horizon_seconds,
        ]  # fmt: skip

    @classmethod
    def from_wire(cls, obj: Any) -> NetworkParameters:
        mpv, mms, mts, modified, epoch, horizon = _check_header(obj, NETWORK_PARAMETERS_TAG, 6)
        return cls(
            minimum_platform_version=_int(mpv, "minimum platform version", 1, 2**31 - 1),
            max_message_size=_int(mms, "max message size", *MESSAGE_SIZE_RANGE_BYTES),
            max_transaction_size=_int(mts, "max transaction size", *MESSAGE_SIZE_RANGE_BYTES),
            modified_time_ms=_int(modified, "modified time", 0, 2**63 - 1),
            epoch=_int(epoch, "epoch", 1, 2**31 - 1),
            event_horizon_seconds=_int(horizon, "event horizon", 1, 2**40),
        )


@final
@attrs.frozen(kw_only=True)
class NetworkMap:
    """The list of current NodeInfo hashes (sorted, upper-case hex) and the current parameters' hash."""

    node_info_hashes: tuple[str, ...]
    network_parameters_hash: str

    def to_wire(self) -> list[Any]:
        return [
            NETWORK_MAP_TAG,
            FORMAT_VERSION,
            [bytes.fromhex(h) for h in sorted(self.node_info_hashes)],
            bytes.fromhex(self.network_parameters_hash),
        ]

    @classmethod
    def from_wire(cls, obj: Any) -> NetworkMap:
        hashes, params_hash = _check_header(obj, NETWORK_MAP_TAG, 2)
        entries = [
            _bytes(h, "node info hash", 32) for h in _list(hashes, "node info hashes", 0, MAX_MAP_ENTRIES)
        ]
        if any(len(h) != 32 for h in entries) or len(_bytes(params_hash, "parameters hash", 32)) != 32:
            raise MalformedPayloadError("hashes must be 32-byte SHA-256 digests")
        as_hex = [h.hex().upper() for h in entries]
        if as_hex != sorted(set(as_hex)):
            raise MalformedPayloadError("node info hashes must be sorted and unique")
        return cls(node_info_hashes=tuple(as_hex), network_parameters_hash=params_hash.hex().upper())


@final
@attrs.frozen(kw_only=True)
class SignedWithCert:
    """``raw`` signed by the key of ``cert`` (DER): how the map and the network parameters travel.

    ``cert_path`` is the signer's certificate path up to (excluding) the root; its first element signed.
    """

    raw: bytes
    signature: bytes
    cert_path: tuple[bytes, ...]

    def to_wire(self) -> list[Any]:
        return [SIGNED_WITH_CERT_TAG, FORMAT_VERSION, self.raw, self.signature, list(self.cert_path)]

    @classmethod
    def from_wire(cls, obj: Any) -> SignedWithCert:
        raw, signature, path = _check_header(obj, SIGNED_WITH_CERT_TAG, 3)
        return cls(
            raw=_bytes(raw, "raw payload", 64 * 2**20),
            signature=_bytes(signature, "signature", MAX_SIGNATURE_SIZE_BYTES),
            cert_path=tuple(
                _bytes(c, "certificate", MAX_CERT_SIZE_BYTES)
                for c in _list(path, "cert path", 1, MAX_CERT_PATH_LENGTH)
            ),
        )
