"""Own certificates over time, with real ``corda-trio node start`` and ``networkmap serve`` processes: a start
with an expired or not-yet-valid certificate is refused in one line; one that expires soon gives a warning at
start, one error line when it expires while the process runs, and (a node) its not-after time is on
``/metrics``."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

import pytest
import trio

from corda_trio import pki
from corda_trio.node import _config
from corda_trio.node._processes import start_node_process

from .cli_helpers import CLI, read_past, run_cli
from .netutil import make_network, reissue_map_certificate, reissue_tls_certificate, scrape_metrics

pytestmark = pytest.mark.slow

ALICE = "O=Alice,L=London,C=GB"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


@pytest.mark.parametrize("when", ["expired", "not-yet-valid"])
def test_start_with_an_out_of_date_tls_certificate_is_refused_in_one_line(tmp_path: Path, when: str) -> None:
    [(path, config)] = make_network(tmp_path / "net", [ALICE])
    node_dir = path.parent
    if when == "expired":
        cert = reissue_tls_certificate(node_dir, not_after=_now() - dt.timedelta(seconds=30))
        expected = f"expired at {cert.not_valid_after_utc.isoformat()}"
    else:  # this machine's clock is a minute behind the issuer's
        cert = reissue_tls_certificate(
            node_dir, not_before=_now() + dt.timedelta(seconds=60), not_after=_now() + dt.timedelta(days=1)
        )
        expected = f"is not valid before {cert.not_valid_before_utc.isoformat()}"
    done = run_cli("node", "start", "--config", str(path), timeout=60)
    assert done.returncode == 1, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert str(config.tls_cert_chain) in lines[0] and expected in lines[0], lines[0]
    assert "'O=Alice,L=London,C=GB'" in lines[0]
    assert not config.store_directory.exists()  # refused before anything was written


async def test_a_certificate_expiring_while_the_node_runs(tmp_path: Path) -> None:
    [(path, config)] = make_network(tmp_path / "net", [ALICE])
    cert = reissue_tls_certificate(path.parent, not_after=_now() + dt.timedelta(seconds=6))
    not_after = cert.not_valid_after_utc.isoformat()
    node = await start_node_process(path, config)
    try:
        console = node.console_log.read_text()
        assert "WARNING" in console and f"expires at {not_after}" in console, console
        assert str(config.tls_cert_chain) in console
        metrics_url = node.metrics_url
        assert metrics_url is not None
        samples = await scrape_metrics(metrics_url)
        key = "corda_trio_certificate_not_after_timestamp_seconds,role=TLS,subject=O=Alice,L=London,C=GB"
        assert samples[key] == cert.not_valid_after_utc.timestamp(), samples
        roles = {k.split(",")[1] for k in samples if k.startswith("corda_trio_certificate_not_after")}
        assert roles == {"role=TLS", "role=NODE_CA", "role=DOORMAN_CA", "role=LEGAL_IDENTITY", "role=ROOT"}
        with trio.fail_after(20):
            while f"expired at {not_after}" not in node.console_log.read_text():  # noqa: ASYNC110
                await trio.sleep(0.2)
        await trio.sleep(1)  # (one line, not one per second)
        errors = [line for line in node.console_log.read_text().splitlines() if "ERROR" in line]
        assert len(errors) == 1, errors
        assert str(config.tls_cert_chain) in errors[0] and "peers refuse" in errors[0], errors
    finally:
        await node.stop()


def test_networkmap_serve_with_an_expired_signing_certificate_is_refused_in_one_line(tmp_path: Path) -> None:
    net = tmp_path / "net"
    make_network(net, [ALICE], with_map=True)
    cert = reissue_map_certificate(net, not_after=_now() - dt.timedelta(seconds=30))
    done = run_cli("networkmap", "serve", "--dir", str(net), timeout=60)
    assert done.returncode == 2, done
    (line,) = done.stderr.splitlines()
    assert str(net / "network-map" / "map.chain.pem") in line, line
    assert f"expired at {cert.not_valid_after_utc.isoformat()}" in line, line


async def test_networkmap_serve_says_when_its_signing_certificate_expires(tmp_path: Path) -> None:
    net = tmp_path / "net"
    make_network(net, [ALICE], with_map=True)
    cert = reissue_map_certificate(net, not_after=_now() + dt.timedelta(seconds=4))
    not_after = cert.not_valid_after_utc.isoformat()
    proc = await trio.lowlevel.open_process(
        [*CLI, "networkmap", "serve", "--dir", str(net)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    try:  # (one line, not one per request or second)
        lines = (await read_past(proc.stderr, f"expired at {not_after}")).splitlines()
    finally:
        proc.terminate()
        await proc.wait()
    (warning,) = [line for line in lines if "WARNING" in line]
    assert (
        "map.chain.pem: certificate 'CN=Corda Trio Network Map" in warning
        and f"expires at {not_after}" in warning
    )
    (error,) = [line for line in lines if "ERROR" in line]
    assert "nodes refuse the network map" in error and "map.chain.pem" in error, error


async def test_bootstrap_chooses_how_long_node_certificates_are_valid(tmp_path: Path) -> None:
    net = tmp_path / "net"
    for days in ("0", "3651"):
        refused = run_cli(
            "network", "bootstrap", "--dir", str(net), "--node", ALICE, "--node-cert-days", days
        )
        assert refused.returncode == 2, refused
        assert refused.stderr.splitlines() == [
            f"corda-trio: error: --node-cert-days {days}: must be in 1..3650"
        ]
        assert not net.exists()
    before = _now()
    done = run_cli(
        "network", "bootstrap", "--dir", str(net), "--node", ALICE, "--no-map", "--node-cert-days", "20"
    )
    assert done.returncode == 0, done
    node_dir = net / "nodes" / "alice"
    certs = node_dir / "certificates"
    for name in ("tls.chain.pem", "identity.chain.pem", "node-ca.chain.pem"):
        leaf = pki.read_certificates(certs / name)[0]
        assert before + dt.timedelta(days=20) <= leaf.not_valid_after_utc <= _now() + dt.timedelta(days=20)
    doorman = pki.read_certificates(certs / "node-ca.chain.pem")[1]  # (the network's CAs keep ten years)
    assert doorman.not_valid_after_utc - before > dt.timedelta(days=3649)
    config = _config.load_node_config(node_dir / "node.toml")
    node = await start_node_process(node_dir / "node.toml", config)
    try:
        console = node.console_log.read_text()
        assert "WARNING" in console and "(in 19 days): have it renewed before then" in console, console
    finally:
        await node.stop()
