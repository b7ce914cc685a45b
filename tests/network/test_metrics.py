"""``corda-trio networkmap serve`` with ``[metrics] address`` in networkmap.toml: a real service process, real
publications over HTTP, and its /metrics scraped over HTTP (the families are in docs/metrics.md)."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from corda_trio import network
from corda_trio.node import _config
from tests.network.test_cli import ALICE, BOB, CLI, _cli, _env_without_passphrase
from tests.node.test_flows_e2e import parse_exposition
from tests.node.test_metrics_ledger import promtool_problems

CAROL = "O=Carol,L=Paris,C=FR"


def bootstrap(net: Path, *names: str) -> None:
    args = [arg for name in names for arg in ("--node", name)]
    done = _cli("network", "bootstrap", "--dir", str(net), *args, env=_env_without_passphrase())
    assert done.returncode == 0, done.stderr


def add_metrics(net: Path, address: str) -> Path:
    path = net / "network-map" / "networkmap.toml"
    text = path.read_text(encoding="utf-8") + f'\n[metrics]\naddress = "{address}"\n'
    path.write_text(text, encoding="utf-8")
    return path


def scrape(url: str) -> dict[str, float]:
    """The exposition at ``url``, parsed, after ``promtool check metrics`` found nothing wrong with it."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    assert promtool_problems(text) == ""
    return parse_exposition(text)


def publish(url: str, node_dir: Path) -> int:
    cfg = _config.load_node_config(node_dir / "node.toml")
    node_info = (cfg.base_directory / network.node_info_file_name(cfg.legal_name)).read_bytes()
    request = urllib.request.Request(f"{url}/network-map/publish", data=node_info, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@contextlib.contextmanager
def serving(net: Path) -> Iterator[tuple[str, str]]:
    """``networkmap serve --dir net`` (a networkmap.toml with ``[metrics]``) while in the block: (map URL,
    metrics URL) from its ready line."""
    server = subprocess.Popen(
        [*CLI, "networkmap", "serve", "--dir", str(net)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env_without_passphrase(),
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stderr is not None
        line = server.stdout.readline()
        found = re.fullmatch(r"corda-trio networkmap: serving (\S+) \(\d+ nodes?\)  metrics (\S+)\n", line)
        assert found, line + (server.stderr.read() if server.poll() is not None else "")
        yield found[1], found[2]
    finally:
        server.terminate()
        server.communicate(timeout=30)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """A bootstrapped network (Alice, Bob) whose map serves /metrics on any free port: (dir, map URL,
    metrics URL)."""
    net = tmp_path / "net"
    bootstrap(net, ALICE, BOB)
    add_metrics(net, "127.0.0.1:0")
    with serving(net) as (url, metrics):
        yield net, url, metrics


def test_the_map_service_counts_its_nodes_publications_and_requests(served: tuple[Path, str, str]) -> None:
    net, url, metrics = served
    idle = scrape(metrics)
    assert idle["corda_trio_networkmap_nodes{}"] == 0
    assert idle["corda_trio_networkmap_removed_nodes{}"] == 0
    assert publish(url, net / "nodes" / "alice") == 200
    assert publish(url, net / "nodes" / "bob") == 200
    other = net.parent / "other"  # another network's node: its NodeInfo does not chain to this root
    bootstrap(other, CAROL)
    assert publish(url, other / "nodes" / "carol") == 403
    with urllib.request.urlopen(f"{url}/network-map", timeout=10) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{url}/network-map/node-info/{'0' * 64}", timeout=10)
    assert missing.value.code == 404
    s = scrape(metrics)
    assert s["corda_trio_networkmap_nodes{}"] == 2
    assert s["corda_trio_networkmap_publications_accepted_total{result=added}"] == 2
    refused = {k: v for k, v in s.items() if k.startswith("corda_trio_networkmap_publications_refused_total")}
    assert refused == {"corda_trio_networkmap_publications_refused_total{reason=untrusted-root}": 1}
    requests = {
        k.removeprefix("corda_trio_networkmap_requests_total"): v
        for k, v in s.items()
        if k.startswith("corda_trio_networkmap_requests_total")
    }
    assert requests == {
        "{endpoint=/network-map/publish,status=200}": 2,
        "{endpoint=/network-map/publish,status=403}": 1,
        "{endpoint=/network-map,status=200}": 1,
        "{endpoint=/network-map/node-info,status=404}": 1,
    }
    # the operator removes Bob (another process, the same database): the map's figures follow at once
    done = _cli("networkmap", "remove", "--dir", str(net), "--node", BOB)
    assert done.returncode == 0, done.stderr
    assert publish(url, net / "nodes" / "bob") == 403  # (Bob publishes again: refused, counted)
    s = scrape(metrics)
    assert s["corda_trio_networkmap_nodes{}"] == 1
    assert s["corda_trio_networkmap_removed_nodes{}"] == 1
    assert s["corda_trio_networkmap_publications_refused_total{reason=removed-by-operator}"] == 1


@pytest.mark.parametrize("value", ["127.0.0.1", "nowhere:99999", "1", ""])
def test_a_bad_metrics_address_is_one_line_and_exit_2(tmp_path: Path, value: str) -> None:
    net = tmp_path / "net"
    bootstrap(net, ALICE)
    path = add_metrics(net, value)
    done = _cli("networkmap", "serve", "--dir", str(net), env=_env_without_passphrase())
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and str(path) in done.stderr and "metrics.address" in done.stderr
    path.write_text(path.read_text(encoding="utf-8") + "color = 1\n", encoding="utf-8")
    done = _cli("networkmap", "serve", "--dir", str(net), env=_env_without_passphrase())
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done


def test_a_metrics_address_that_cannot_be_bound_is_one_line_and_exit_1(tmp_path: Path) -> None:
    net = tmp_path / "net"
    bootstrap(net, ALICE)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        add_metrics(net, f"127.0.0.1:{taken.getsockname()[1]}")
        done = _cli("networkmap", "serve", "--dir", str(net), env=_env_without_passphrase())
    assert done.returncode == 1, done
    assert done.stderr.count("\n") == 1 and "cannot listen for /metrics on 127.0.0.1:" in done.stderr, done
