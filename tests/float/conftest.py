"""Credentials for the float tests: the bridge tests' network (Alice, Bob, Carol) plus a tunnel PKI."""

from __future__ import annotations

import pytest

from corda_trio.bridge import float as fl
from tests.bridge.conftest import alice as alice
from tests.bridge.conftest import bob as bob
from tests.bridge.conftest import carol as carol
from tests.bridge.conftest import network as network
from tests.p2p_harness import NOW


@pytest.fixture(scope="session")
def tunnel() -> fl.TunnelPki:
    return fl.TunnelPki.create(now=NOW)


@pytest.fixture(scope="session")
def float_creds(tunnel: fl.TunnelPki) -> fl.TunnelCredentials:
    return tunnel.issue("float", "float-a", now=NOW)


@pytest.fixture(scope="session")
def bridge_creds(tunnel: fl.TunnelPki) -> fl.TunnelCredentials:
    return tunnel.issue("bridge", "bridge-bob", now=NOW)
