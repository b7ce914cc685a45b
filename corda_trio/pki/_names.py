"""X.500 legal names with Corda's rules (``CordaX500Name``).

Theory of operation
-------------------
A Corda legal name is a distinguished name restricted to six attributes, each at most once and
single-valued: ``CN`` (common name), ``OU`` (organisation unit), ``O`` (organisation), ``L`` (locality),
``ST`` (state) and ``C`` (country).  ``O``, ``L`` and ``C`` are required.  Attribute values follow Corda's
legal-name validator: NFKC-normalised Unicode, no leading or trailing whitespace, no control characters and
none of ``, = $ " ' \\`` (plus ``+ ; < > #`` which RFC 4514 would otherwise have to escape), so the string
form never needs escaping.  Length limits (in characters) are Corda's: O 2..128, L 2..64, ST/OU/CN 1..64,
C exactly two upper-case letters of ISO 3166-1 alpha-2 (or ``ZZ``, Corda's "unspecified").

Values are written in the Latin script, as Corda's legal-name validator requires "to avoid character
confusability attacks": every letter is a Latin letter, every digit an ASCII digit, every combining mark a
generic ``COMBINING …`` mark, the only space U+0020, and punctuation and symbols come from the Latin blocks
(below U+0370) or the general punctuation and symbol blocks (U+2000..U+2BFF).  So ``O=\u0410lice``
(U+0410 CYRILLIC CAPITAL LETTER A, which looks like "A") is refused, not a second "Alice".

The *canonical string form* is Corda's ``toString``: ``"CN=…, OU=…, O=…, L=…, ST=…, C=…"`` with absent
attributes omitted, in that order, separated by comma + space.  Parsing accepts any order, optional spaces
around separators and lower-case attribute keys, and reports the first rule broken.

In certificates the name is encoded as one single-valued RDN per attribute in the order
C, ST, L, O, OU, CN (the order Corda's ``X500NameBuilder`` produces; RFC 4514 prints it reversed, which
gives the canonical form again).  Equality is by attribute values, so two encodings of one name compare equal.

Sameness and confusability
--------------------------
Two spellings are *the same name* when they parse to equal attribute values: attribute order, spaces around
``,`` and ``=`` and the case of the keys do not matter; the values are compared exactly.  ``O=alice`` is
therefore a different name from ``O=Alice``, and a certificate, a NodeInfo or a TLS peer with one is never
taken for the other.  Because people read names, two different names that differ only in letter case or
accents (``O=ALICE`` / ``O=Alice`` / ``O=Alicé``) are *confusable*: they have the same :attr:`confusable_key`
(each value decomposed (NFKD), combining marks dropped, case-folded).  A network holds at most one name per
key: ``network bootstrap`` and the network map service refuse the second (see protocol_spec/network-map.md).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable
from typing import Final, final

import attrs
from cryptography import x509
from cryptography.x509.oid import NameOID

from ._errors import InvalidNameError

__all__ = ["ISO_3166_COUNTRY_CODES", "CordaX500Name", "confusable_names_message", "find_confusable"]

#: ISO 3166-1 alpha-2 officially assigned codes (249), plus ``ZZ`` which Corda accepts as "unspecified".
ISO_3166_COUNTRY_CODES: Final[frozenset[str]] = frozenset(
    """
    AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ
    BR BS BT BV BW BY BZ CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM
    DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS
    GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN
    KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ
    MR MS MT MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM
    PN PR PS PT PW PY QA RE RO RS RU RW SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV
    SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG UM US UY UZ VA VC VE VG VI
    VN VU WF WS YE YT ZA ZM ZW ZZ
    """.split()
)

# attribute key -> (python field, OID, min length, max length); in canonical (printing) order.
_ATTRIBUTES: Final[tuple[tuple[str, str, x509.ObjectIdentifier, int, int], ...]] = (
    ("CN", "common_name", NameOID.COMMON_NAME, 1, 64),
    ("OU", "organisation_unit", NameOID.ORGANIZATIONAL_UNIT_NAME, 1, 64),
    ("O", "organisation", NameOID.ORGANIZATION_NAME, 2, 128),
    ("L", "locality", NameOID.LOCALITY_NAME, 2, 64),
    ("ST", "state", NameOID.STATE_OR_PROVINCE_NAME, 1, 64),
    ("C", "country", NameOID.COUNTRY_NAME, 2, 2),
)
_BY_KEY: Final = {a[0]: a for a in _ATTRIBUTES}
_BY_OID: Final = {a[2]: a for a in _ATTRIBUTES}
_FORBIDDEN_CHARS: Final[str] = ",=$\"'\\+;<>#"
_ESCAPED_OR_QUOTED: Final = re.compile(r'\\|=\s*"')  # a backslash escape, or a value in double quotes
#: Where punctuation and symbols may come from: the Latin blocks (Basic Latin to Spacing Modifier Letters)
#: and General Punctuation .. Miscellaneous Symbols and Arrows (dashes, currency, letterlike, maths).
_SYMBOL_RANGES: Final = ((0x20, 0x36F), (0x2000, 0x2BFF))


def _script_problem(char: str) -> str | None:
    """Why ``char`` is not allowed by the Latin-script rule (see the module docstring), or None."""
    category = unicodedata.category(char)
    name = unicodedata.name(char, "")
    if category[0] == "L":
        ok = name.startswith("LATIN ")
    elif category[0] == "N":
        ok = "0" <= char <= "9"
    elif category[0] == "M":
        ok = name.startswith("COMBINING ")
    elif category[0] == "Z":
        ok = char == " "
    else:
        ok = any(low <= ord(char) <= high for low, high in _SYMBOL_RANGES)
    if ok:
        return None
    return f"{char!r} (U+{ord(char):04X} {name or 'unnamed'}) is not of the Latin script"


def _check_value(key: str, value: str) -> None:
    _, _, _, min_len, max_len = _BY_KEY[key]
    if not isinstance(value, str):
        raise InvalidNameError(f"{key}: value must be a string, not {type(value).__name__}")
    if value != value.strip():
        raise InvalidNameError(f"{key}={value!r}: leading or trailing whitespace is not allowed")
    if len(value) < min_len:
        raise InvalidNameError(
            f"{key}: must not be empty"
            if not value
            else f"{key}: {value!r} is shorter than {min_len} characters"
        )
    if len(value) > max_len:
        raise InvalidNameError(f"{key}: {len(value)} characters, at most {max_len} allowed")
    bad = sorted({c for c in value if c in _FORBIDDEN_CHARS})
    if bad:
        raise InvalidNameError(f"{key}={value!r}: character(s) {' '.join(bad)} not allowed in a legal name")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in value):
        raise InvalidNameError(f"{key}={value!r}: control or unassigned characters are not allowed")
    if "  " in value:
        raise InvalidNameError(f"{key}={value!r}: consecutive spaces are not allowed")
    if unicodedata.normalize("NFKC", value) != value:
        raise InvalidNameError(f"{key}={value!r}: must be in Unicode NFKC normal form")
    problem = next(filter(None, map(_script_problem, value)), None)
    if problem is not None:
        raise InvalidNameError(
            f"{key}={value!r}: {problem}; a legal name uses Latin letters, ASCII digits and common "
            "punctuation only (a letter of another script can look like a Latin one)"
        )
    if key == "C" and value not in ISO_3166_COUNTRY_CODES:
        raise InvalidNameError(f"C={value!r}: not an ISO 3166-1 alpha-2 country code (e.g. GB, US, DE)")


def _validate(instance: CordaX500Name, attribute: attrs.Attribute[object], value: object) -> None:
    key = next(a[0] for a in _ATTRIBUTES if a[1] == attribute.name)
    if value is None:
        if key in ("O", "L", "C"):
            raise InvalidNameError(f"{key} is required (a legal name needs O, L and C)")
        return
    _check_value(key, value)  # type: ignore[arg-type]


@final
@attrs.frozen(kw_only=True, order=False)
class CordaX500Name:
    """A validated Corda legal name.

    Build it with keywords (``CordaX500Name(organisation="Alice", locality="London", country="GB")``) or
    parse it with :meth:`parse`; both raise :class:`InvalidNameError` naming the attribute and the rule.
    ``str(name)`` is the canonical form.
    """

    organisation: str = attrs.field(validator=_validate)
    locality: str = attrs.field(validator=_validate)
    country: str = attrs.field(validator=_validate)
    common_name: str | None = attrs.field(default=None, validator=_validate)
    organisation_unit: str | None = attrs.field(default=None, validator=_validate)
    state: str | None = attrs.field(default=None, validator=_validate)

    @classmethod
    def parse(cls, text: str) -> CordaX500Name:
        """Parse ``"O=Alice, L=London, C=GB"`` (any attribute order, keys case-insensitive).

        Raises:
            InvalidNameError: empty input, a component without ``=``, an unsupported or repeated attribute,
                a missing required attribute, or a value that breaks a rule.
        """
        if not isinstance(text, str):
            raise InvalidNameError(f"a legal name must be a string, not {type(text).__name__}")
        if not text.strip():
            raise InvalidNameError("empty legal name (expected e.g. 'O=Alice, L=London, C=GB')")
        if _ESCAPED_OR_QUOTED.search(text):  # RFC 4514 escapes and quotes carry characters that are refused
            raise InvalidNameError(
                f"{text!r}: escaped or quoted values are not allowed: a legal name may not contain any of "
                f"{' '.join(_FORBIDDEN_CHARS)} (e.g. write O=Alice Inc, not O=Alice\\, Inc)"
            )
        values: dict[str, str] = {}
        for raw_component in text.split(","):
            component = raw_component.strip()
            if not component:
                raise InvalidNameError(f"empty component in {text!r} (stray comma?)")
            key, sep, value = component.partition("=")
            if not sep:
                hint = " (a comma inside a value is not allowed in a legal name)" if values else ""
                raise InvalidNameError(
                    f"component {component!r} in {text!r} is not of the form KEY=VALUE{hint}"
                )
            key = key.strip().upper()
            if key not in _BY_KEY:
                raise InvalidNameError(
                    f"unsupported attribute {key!r} in {text!r}; allowed: CN, OU, O, L, ST, C"
                )
            if key in values:
                raise InvalidNameError(f"attribute {key} appears more than once in {text!r}")
            values[key] = value.strip()
        for required in ("O", "L", "C"):
            if required not in values:
                raise InvalidNameError(f"{required} is required in {text!r} (a legal name needs O, L and C)")
        return cls(**{_BY_KEY[k][1]: v for k, v in values.items()})

    @classmethod
    def from_x509_name(cls, name: x509.Name) -> CordaX500Name:
        """Convert a certificate subject; every RDN must be single-valued and a supported attribute.

        Raises:
            InvalidNameError: an unsupported, multi-valued or repeated attribute, or a bad value.
        """
        values: dict[str, str] = {}
        for rdn in name.rdns:
            if len(rdn) != 1:
                raise InvalidNameError(f"multi-valued RDN {rdn.rfc4514_string()!r} is not allowed")
            (attribute,) = tuple(rdn)
            spec = _BY_OID.get(attribute.oid)
            if spec is None:
                raise InvalidNameError(
                    f"unsupported attribute {attribute.oid.dotted_string} in {name.rfc4514_string()!r}"
                )
            if spec[0] in values:
                raise InvalidNameError(
                    f"attribute {spec[0]} appears more than once in {name.rfc4514_string()!r}"
                )
            if not isinstance(attribute.value, str):
                raise InvalidNameError(f"attribute {spec[0]} has a non-string value")
            values[spec[0]] = attribute.value
        for required in ("O", "L", "C"):
            if required not in values:
                raise InvalidNameError(f"{required} is required but missing from {name.rfc4514_string()!r}")
        return cls(**{_BY_KEY[k][1]: v for k, v in values.items()})

    def to_x509_name(self) -> x509.Name:
        """The certificate form: one RDN per attribute, in the order C, ST, L, O, OU, CN."""
        rdns = [
            x509.RelativeDistinguishedName([x509.NameAttribute(oid, getattr(self, field))])
            for _, field, oid, _, _ in reversed(_ATTRIBUTES)
            if getattr(self, field) is not None
        ]
        return x509.Name(rdns)

    @property
    def confusable_key(self) -> str:
        """The form two confusable names share: canonical attribute order, values decomposed (NFKD) with
        combining marks dropped and case-folded. ``O=ALICE, L=London, C=GB`` and ``O=Alicé, L=london,
        C=GB`` have the key of ``O=Alice, L=London, C=GB``; a network holds at most one name per key.
        """
        return _confusable_key(self)

    def is_confusable_with(self, other: CordaX500Name) -> bool:
        """Whether ``other`` is a *different* name that reads like this one (same :attr:`confusable_key`)."""
        return self != other and self.confusable_key == other.confusable_key

    def __str__(self) -> str:
        return ", ".join(
            f"{key}={getattr(self, field)}" for key, field, _, _, _ in _ATTRIBUTES if getattr(self, field)
        )


def find_confusable(name: CordaX500Name, names: Iterable[CordaX500Name]) -> CordaX500Name | None:
    """The first of ``names`` that is a different name confusable with ``name`` (see the module docstring)."""
    return next((other for other in names if name.is_confusable_with(other)), None)


def confusable_names_message(name: CordaX500Name, existing: CordaX500Name) -> str:
    """The one-line refusal of ``name`` because ``existing`` (a different, confusable name) came first."""
    return (
        f"legal name {str(name)!r} is confusable with {str(existing)!r}: they differ only in letter case or "
        "accents, and a network holds one of them"
    )


def _fold_value(value: str) -> str:
    decomposed = unicodedata.normalize("NFKD", value)
    return "".join(c for c in decomposed if unicodedata.category(c)[0] != "M").casefold()


@functools.lru_cache(maxsize=4096)
def _confusable_key(name: CordaX500Name) -> str:
    return ", ".join(
        f"{key}={_fold_value(getattr(name, field))}"
        for key, field, _, _, _ in _ATTRIBUTES
        if getattr(name, field) is not None
    )
