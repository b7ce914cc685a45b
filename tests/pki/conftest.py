"""Small networks for the PKI tests: built once per module (key generation is the slow part)."""

from __future__ import annotations

import datetime as dt

import pytest

from corda_trio import pki

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
ALICE = pki.CordaX500Name.parse("O=Alice, L=London, C=GB")
BOB = pki.CordaX500Name.parse("O=Bob, L=New York, C=US")


@pytest.fixture(scope="session")
def network() -> pki.NetworkCredentials:
    return pki.NetworkCredentials.create(now=NOW)


@pytest.fixture(scope="session")
def other_network() -> pki.NetworkCredentials:
    return pki.NetworkCredentials.create(now=NOW)


@pytest.fixture(scope="session")
def alice(network: pki.NetworkCredentials) -> pki.NodeCredentials:
    return network.issue_node(ALICE, now=NOW)


@pytest.fixture(scope="session")
def bob(network: pki.NetworkCredentials) -> pki.NodeCredentials:
    return network.issue_node(BOB, now=NOW)
