"""Credentials for the bridge tests: one network (Alice, Bob, Carol) and a foreign one (Mallory)."""

from __future__ import annotations

import pytest

from corda_trio import pki
from tests.interop.conftest import rabbitmq as rabbitmq  # the RabbitMQ peer fixture
from tests.p2p_harness import NOW

ALICE = pki.CordaX500Name.parse("O=Alice, L=London, C=GB")
BOB = pki.CordaX500Name.parse("O=Bob, L=New York, C=US")
CAROL = pki.CordaX500Name.parse("O=Carol, L=Paris, C=FR")


@pytest.fixture(scope="session")
def network() -> pki.NetworkCredentials:
    return pki.NetworkCredentials.create(now=NOW)


@pytest.fixture(scope="session")
def alice(network: pki.NetworkCredentials) -> pki.NodeCredentials:
    return network.issue_node(ALICE, now=NOW)


@pytest.fixture(scope="session")
def bob(network: pki.NetworkCredentials) -> pki.NodeCredentials:
    return network.issue_node(BOB, now=NOW)


@pytest.fixture(scope="session")
def carol(network: pki.NetworkCredentials) -> pki.NodeCredentials:
    return network.issue_node(CAROL, now=NOW)


@pytest.fixture(scope="session")
def mallory() -> tuple[pki.NodeCredentials, pki.NetworkCredentials]:
    """Bob's legal name, issued by another network's root."""
    other = pki.NetworkCredentials.create(now=NOW)
    return other.issue_node(BOB, now=NOW), other
