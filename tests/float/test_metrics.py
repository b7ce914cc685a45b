"""``corda-trio float start`` with ``[metrics] address``: a real float process activated by a node behind it,
a peer node sending through it, and the float's /metrics scraped over HTTP (the families: docs/metrics.md)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from corda_trio import pki, transport
from corda_trio.bridge import float as fl
from tests.node.test_flows_e2e import parse_exposition, scrape_text
from tests.node.test_metrics_ledger import promtool_problems
from tests.p2p_harness import contexts

from .test_processes import ENV, FloatProc, publish_sender_first, write_float, write_node

LINE = re.compile(r"float: control port listening on 127\.0\.0\.1:(\d+)  metrics (http://\S+/metrics)")


def with_metrics(flt: FloatProc, address: str) -> Path:
    path = flt.directory / "float.toml"
    path.write_text(path.read_text() + f'\n[metrics]\naddress = "{address}"\n')
    return path


async def scrape(url: str) -> dict[str, float]:
    return parse_exposition(await scrape_text(url))


async def scrape_until(url: str, key: str, value: float, within: float = 30) -> dict[str, float]:
    with trio.fail_after(within):
        while (s := await scrape(url)).get(key) != value:  # noqa: ASYNC110  (another process's counter)
            await trio.sleep(0.1)
    return s


async def test_the_float_counts_what_it_forwarded_and_refused_and_its_activation(
    tmp_path: Path,
    network: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tunnel: fl.TunnelPki,
) -> None:
    n = 25
    root = network.root.cert
    flt = write_float(tmp_path, "float-a", tunnel, bob, root)
    with_metrics(flt, "127.0.0.1:0")
    async with trio.open_nursery() as nursery:
        b = a = None
        try:
            await flt.start(nursery)
            found = LINE.fullmatch(await flt.wait_line(lambda x: "control port listening" in x))
            assert found, flt.lines
            flt.control_port, metrics = int(found[1]), found[2]
            idle = await scrape(metrics)
            assert idle["corda_trio_float_activated{}"] == 0
            assert idle["corda_trio_float_control_connected{}"] == 0
            b = write_node(tmp_path, bob, root, tunnel=tunnel, floats=[flt], expect=n)
            a = write_node(tmp_path, alice, root, send={"to": str(bob.legal_name), "count": n, "batch": 5})
            await b.start(nursery)
            await flt.wait_line(lambda x: "public listener open" in x)
            active = await scrape(metrics)
            assert active["corda_trio_float_activated{}"] == 1
            assert active["corda_trio_float_control_connected{}"] == 1
            assert active["corda_trio_float_activated_inboxes{}"] == 1
            assert active["corda_trio_float_activation_tls_info{tls_ref=node}"] == 1
            await a.start(nursery)
            alice_port = int((await a.wait_line(lambda x: x.startswith("ready "))).split()[1])
            await publish_sender_first(
                tmp_path, (alice, [alice_port]), [(alice, [alice_port]), (bob, [flt.public_port])]
            )
            await b.wait_line(lambda x: x == "done", within=120)
            s = await scrape_until(metrics, "corda_trio_float_deliveries_accepted_total{}", n)
            assert s["corda_trio_float_deliveries_forwarded_total{}"] == n
            assert s["corda_trio_float_deliveries_refused_total{}"] == 0
            assert s["corda_trio_float_forward_duration_seconds_count{}"] == n
            assert s["corda_trio_float_forward_duration_seconds_bucket{le=+Inf}"] == n
            assert s["corda_trio_float_peer_links_attached_total{}"] >= 1
            assert s["corda_trio_float_public_connections_accepted_total{}"] >= 1
            # a member attaching to anything but the inbox: refused, counted by its condition
            client = contexts(alice, root)[1]
            async with transport.open_amqp_connection(
                "127.0.0.1", flt.public_port, ssl_context=client,
                peer_check=lambda t: pki.check_peer_legal_name(t, bob.legal_name),
            ) as conn:  # fmt: skip
                with pytest.raises(transport.LinkDetachedError, match="unauthorized-access"):
                    await conn.open_sender("internal.peers.DLx")
            text = await scrape_text(metrics)
            s = parse_exposition(text)
            assert s["corda_trio_float_peer_links_refused_total{condition=amqp:unauthorized-access}"] == 1
            assert promtool_problems(text) == ""
            # the node behind the float goes away: the control link and the activation with it
            before = len(flt.lines)
            await b.kill()
            await flt.wait_line(lambda x: "control link down" in x, after=before)
            s = await scrape(metrics)
            assert s["corda_trio_float_activated{}"] == 0
            assert s["corda_trio_float_control_connected{}"] == 0
            assert s["corda_trio_float_activated_inboxes{}"] == 0
            assert not [k for k in s if k.startswith("corda_trio_float_activation_tls_info")]
            s = await scrape_until(metrics, "corda_trio_float_public_connections{}", 0)
            assert s["corda_trio_float_deliveries_accepted_total{}"] == n  # (counters stay)
        finally:
            for p in (a, b, flt):
                if p is not None:
                    await p.kill()
            nursery.cancel_scope.cancel()


def run_float(config: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "corda_trio", "float", "start", "--config", str(config)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=ENV)


@pytest.mark.parametrize("value", ["127.0.0.1", "127.0.0.1:99999", "1", ""])
def test_a_bad_metrics_address_is_one_line_and_exit_2(
    tmp_path: Path,
    network: pki.NetworkCredentials,
    bob: pki.NodeCredentials,
    tunnel: fl.TunnelPki,
    value: str,
) -> None:
    flt = write_float(tmp_path, "float-a", tunnel, bob, network.root.cert)
    path = with_metrics(flt, value)
    done = run_float(path)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and str(path) in done.stderr, done
    assert "metrics.address" in done.stderr, done


def test_an_unknown_metrics_key_is_one_line_and_exit_2(
    tmp_path: Path, network: pki.NetworkCredentials, bob: pki.NodeCredentials, tunnel: fl.TunnelPki
) -> None:
    flt = write_float(tmp_path, "float-a", tunnel, bob, network.root.cert)
    path = flt.directory / "float.toml"
    path.write_text(path.read_text() + '\n[metrics]\nadress = "127.0.0.1:0"\n')
    done = run_float(path)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and str(path) in done.stderr, done
    assert "metrics.adress" in done.stderr and "unknown setting" in done.stderr, done


def test_a_metrics_address_that_cannot_be_bound_is_one_line_and_exit_1(
    tmp_path: Path, network: pki.NetworkCredentials, bob: pki.NodeCredentials, tunnel: fl.TunnelPki
) -> None:
    flt = write_float(tmp_path, "float-a", tunnel, bob, network.root.cert)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        path = with_metrics(flt, f"127.0.0.1:{taken.getsockname()[1]}")
        done = run_float(path)
    assert done.returncode == 1, done
    assert done.stderr.count("\n") == 1 and "cannot listen for /metrics on 127.0.0.1:" in done.stderr, done
    assert "control port listening" not in done.stdout  # (the float did not start serving)
