"""Legal name parsing and validation: a table of good and bad names with the reason each is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corda_trio import pki
from corda_trio.pki import CordaX500Name

GOOD = [
    ("O=Alice,L=London,C=GB", "O=Alice, L=London, C=GB"),
    ("  O = Alice Corp ,  L=London , C=GB ", "O=Alice Corp, L=London, C=GB"),
    ("C=US, L=New York, O=Bank of Corda", "O=Bank of Corda, L=New York, C=US"),
    ("cn=Notary Service, ou=Ops, o=R3 HoldCo LLC, l=New York, st=NY, c=US",
     "CN=Notary Service, OU=Ops, O=R3 HoldCo LLC, L=New York, ST=NY, C=US"),
    ("O=Zürich Versicherung, L=Zürich, C=CH", "O=Zürich Versicherung, L=Zürich, C=CH"),
    ("O=Ålesund Øl & Co (Norge) – 2€, L=Tromsø, C=NO", "O=Ålesund Øl & Co (Norge) – 2€, L=Tromsø, C=NO"),
    ("O=Unspecified Land, L=Nowhere, C=ZZ", "O=Unspecified Land, L=Nowhere, C=ZZ"),
    ("O=" + "x" * 128 + ", L=" + "y" * 64 + ", C=GB", "O=" + "x" * 128 + ", L=" + "y" * 64 + ", C=GB"),
]  # fmt: skip

BAD = [
    ("", "empty legal name"),
    ("   ", "empty legal name"),
    ("O=Alice, L=London", "C is required"),
    ("L=London, C=GB", "O is required"),
    ("O=Alice, C=GB", "L is required"),
    ("O=Alice, L=London, C=XX", "not an ISO 3166-1 alpha-2 country code"),
    ("O=Alice, L=London, C=gb", "not an ISO 3166-1 alpha-2 country code"),
    ("O=Alice, L=London, C=GBR", "at most 2 allowed"),
    ("O=A, L=London, C=GB", "O: 'A' is shorter than 2 characters"),
    ("O=Alice, L=L, C=GB", "L: 'L' is shorter than 2 characters"),
    ("O=" + "x" * 129 + ", L=London, C=GB", "O: 129 characters, at most 128 allowed"),
    ("O=Alice, L=" + "y" * 65 + ", C=GB", "L: 65 characters, at most 64 allowed"),
    ("CN=" + "c" * 65 + ", O=Alice, L=London, C=GB", "CN: 65 characters, at most 64 allowed"),
    ("O=Alice, O=Bob, L=London, C=GB", "attribute O appears more than once"),
    ("O=Alice, L=London, C=GB, SERIALNUMBER=1", "unsupported attribute 'SERIALNUMBER'"),
    ("O=Alice, L=London, C=GB, DC=example", "unsupported attribute 'DC'"),
    ("O=Alice,, L=London, C=GB", "empty component"),
    ("O=Alice, London, C=GB", "is not of the form KEY=VALUE"),
    ("O=Alice, Inc, L=London, C=GB", "KEY=VALUE (a comma inside a value is not allowed in a legal name)"),
    ("O=Alice\\, Inc, L=London, C=GB", "escaped or quoted values are not allowed"),
    ('O="Alice, Inc", L=London, C=GB', "escaped or quoted values are not allowed"),
    ('O= "Alice", L=London, C=GB', "escaped or quoted values are not allowed"),
    ("O=Ali$ce, L=London, C=GB", "character(s) $ not allowed"),
    ('O=Ali"ce, L=London, C=GB', 'character(s) " not allowed'),
    ("O=Alice=Bob, L=London, C=GB", "character(s) = not allowed"),
    ("O=Ali\\ce, L=London, C=GB", "not allowed"),
    ("O=Alice  Corp, L=London, C=GB", "consecutive spaces"),
    ("O=Alice\x00, L=London, C=GB", "control or unassigned characters"),
    ("O=Alice\u200b, L=London, C=GB", "control or unassigned characters"),
    ("O=Ａlice, L=London, C=GB", "NFKC"),  # fullwidth A
    # Latin script only (Corda's rule against look-alikes): a Cyrillic or Greek capital A is not "A".
    (
        "O=\u0410lice, L=London, C=GB",
        "'\u0410' (U+0410 CYRILLIC CAPITAL LETTER A) is not of the Latin script",
    ),
    ("O=Alice, L=L\u03bfndon, C=GB", "L='L\u03bfndon': '\u03bf' (U+03BF GREEK SMALL LETTER OMICRON) is not"),
    ("O=Alice \u0661, L=London, C=GB", "U+0661 ARABIC-INDIC DIGIT ONE) is not of the Latin script"),
    ("O=Alice\u02bcs, L=London, C=GB", "U+02BC MODIFIER LETTER APOSTROPHE) is not of the Latin script"),
    ("O=Alice\u3002, L=London, C=GB", "U+3002 IDEOGRAPHIC FULL STOP) is not of the Latin script"),
    ("O=, L=London, C=GB", "O: must not be empty"),
    ("CN=, O=Alice, L=London, C=GB", "CN: must not be empty"),
]


@pytest.mark.parametrize(("text", "canonical"), GOOD)
def test_good_names_parse_to_canonical_form(text: str, canonical: str) -> None:
    name = CordaX500Name.parse(text)
    assert str(name) == canonical
    assert CordaX500Name.parse(str(name)) == name
    assert CordaX500Name.from_x509_name(name.to_x509_name()) == name


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_names_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(pki.InvalidNameError) as info:
        CordaX500Name.parse(text)
    assert message in str(info.value)


def test_keyword_construction_validates() -> None:
    with pytest.raises(pki.InvalidNameError, match="C='UK'"):
        CordaX500Name(organisation="Alice", locality="London", country="UK")
    name = CordaX500Name(organisation="Alice", locality="London", country="GB", common_name="Alice Node")
    assert str(name) == "CN=Alice Node, O=Alice, L=London, C=GB"


def test_certificate_encoding_order_and_equality() -> None:
    name = CordaX500Name.parse("CN=Svc, OU=IT, O=Alice, L=London, ST=Greater London, C=GB")
    x = name.to_x509_name()
    # DER order C, ST, L, O, OU, CN; RFC 4514 prints it reversed, i.e. in canonical order.
    assert [rdn.rfc4514_string() for rdn in x.rdns] == [
        "C=GB", "ST=Greater London", "L=London", "O=Alice", "OU=IT", "CN=Svc",
    ]  # fmt: skip
    assert x.rfc4514_string() == "CN=Svc,OU=IT,O=Alice,L=London,ST=Greater London,C=GB"
    assert CordaX500Name.parse("C=GB, O=Alice, L=London") == CordaX500Name.parse("O=Alice, L=London, C=GB")
    assert hash(CordaX500Name.parse("C=GB,O=Alice,L=London")) == hash(
        CordaX500Name.parse("O=Alice,L=London,C=GB")
    )


def test_from_x509_name_refuses_foreign_attributes() -> None:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    bad = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "GB"),
            x509.NameAttribute(NameOID.LOCALITY_NAME, "London"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Alice"),
            x509.NameAttribute(NameOID.EMAIL_ADDRESS, "a@example.com"),
        ]
    )
    with pytest.raises(pki.InvalidNameError, match=r"unsupported attribute 1\.2\.840\.113549\.1\.9\.1"):
        CordaX500Name.from_x509_name(bad)
    multi = x509.Name(
        [
            x509.RelativeDistinguishedName(
                [
                    x509.NameAttribute(NameOID.COUNTRY_NAME, "GB"),
                    x509.NameAttribute(NameOID.LOCALITY_NAME, "Ldn"),
                ]
            ),
            x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Alice")]),
        ]
    )
    with pytest.raises(pki.InvalidNameError, match="multi-valued RDN"):
        CordaX500Name.from_x509_name(multi)


_value = (
    st.text(
        alphabet=st.characters(categories=("L", "N"), include_characters=" .-&()"), min_size=2, max_size=40
    )
    .map(lambda s: " ".join(s.split()))
    .filter(lambda s: len(s) >= 2)
)


@given(o=_value, loc=_value, c=st.sampled_from(sorted(pki.ISO_3166_COUNTRY_CODES)))
def test_parse_and_print_round_trip(o: str, loc: str, c: str) -> None:
    try:
        name = CordaX500Name(organisation=o, locality=loc, country=c)
    except pki.InvalidNameError:
        return  # e.g. not NFKC: refusing is fine, the round trip below is the property
    assert CordaX500Name.parse(str(name)) == name
    assert CordaX500Name.from_x509_name(name.to_x509_name()) == name


def test_spellings_of_one_name_are_equal_and_case_or_accents_make_a_confusable_other_name() -> None:
    """One canonical form: attribute order, spaces around separators and key case do not matter; values are
    compared exactly, and names that differ only in value case or accents are different but confusable."""
    alice = CordaX500Name.parse("O=Alice, L=London, C=GB")
    for same in ("C=GB, L=London, O=Alice", "o=Alice,l=London,c=GB", " O = Alice ,L= London, C=GB "):
        assert CordaX500Name.parse(same) == alice and str(CordaX500Name.parse(same)) == str(alice)
        assert not alice.is_confusable_with(CordaX500Name.parse(same))
    for other in ("O=alice, L=London, C=GB", "O=ALICE, L=LONDON, C=GB", "O=Alicé, L=London, C=GB",
                  "O=Ålice, L=london, C=GB"):  # fmt: skip
        name = CordaX500Name.parse(other)
        assert name != alice and name.confusable_key == alice.confusable_key == "O=alice, L=london, C=gb"
        assert name.is_confusable_with(alice) and alice.is_confusable_with(name)
        assert pki.find_confusable(name, [CordaX500Name.parse("O=Bob, L=London, C=GB"), alice]) == alice
    # An added attribute is another name, not a look-alike (Corda allows OU/CN variants of one company).
    unit = CordaX500Name.parse("OU=Ops, O=Alice, L=London, C=GB")
    assert not unit.is_confusable_with(alice) and pki.find_confusable(unit, [alice]) is None
    assert pki.confusable_names_message(CordaX500Name.parse("O=ALICE, L=London, C=GB"), alice) == (
        "legal name 'O=ALICE, L=London, C=GB' is confusable with 'O=Alice, L=London, C=GB': they differ only "
        "in letter case or accents, and a network holds one of them"
    )
