"""Two real node processes in two Linux network namespaces joined by a link that is slow, lossy,
reordering, narrow or cut at will: ``tunlink.py``, a TUN device in each namespace and a user-space wire
between them with netem's impairments (this machine's kernel has no ``sch_netem``).

Topology (names carry this process's pid and a counter, so parallel runs never collide)::

    root ns:  m<tag>a 100.x.y.1/30          m<tag>b 100.x.y.5/30        (the test: RPC and /metrics only)
                 |                               |
    ns A:     n<tag>a 100.x.y.2/30          ns B: n<tag>b 100.x.y.6/30
              t<tag>a 10.77.0.1  <-- tunlink.py: delay, jitter, loss, rate, cut -->  t<tag>b 10.77.0.2

The nodes' P2P addresses are on the impaired link; their RPC and /metrics on the management veths, which
are plain. No qdisc is put anywhere, on ``lo`` or a host interface least of all. The namespaces, the root
ends of the management veths and the link process are removed when :func:`netns_pair` ends (deleting a
namespace deletes the devices in it).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import trio

from corda_trio import network, rpc
from corda_trio.node import _config
from corda_trio.node._processes import NodeProcess, start_node_process

from .netutil import PASSWORD, make_network
from .parking_flows import node_env
from .stream_flows import MODULE

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"
P2P_HOSTS = ("10.77.0.1", "10.77.0.2")
P2P_PORT = 10_002
RPC_PORT = 10_003
METRICS_PORT = 10_004
_runs = itertools.count(1)
TUNLINK = Path(__file__).with_name("tunlink.py")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def netns_unavailable() -> str | None:
    """Why this process cannot build the namespaces and the link (``None``: it can): it tries, as the tests
    would."""
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return "/dev/net/tun is not available"
    name = f"ctprobe{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        return f"'ip netns add' is not permitted here: {exc.stderr.decode().strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


@attrs.define
class NetnsPair:
    tag: str
    #: the namespaces of Alice and Bob
    names: tuple[str, str]
    #: the management addresses (RPC, /metrics) of Alice's and Bob's namespace
    mgmt_hosts: tuple[str, str]
    link: subprocess.Popen[str]

    def exec_prefix(self, i: int) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.names[i])

    def shape(self, **settings: float | bool) -> None:
        """Replace the link's settings (both ways; see ``tunlink.py``: delay, jitter, reorder, loss, rate,
        queue, cut); no settings: a plain wire again."""
        assert self.link.stdin is not None and self.link.stdout is not None
        self.link.stdin.write(json.dumps(settings) + "\n")
        self.link.stdin.flush()
        assert self.link.stdout.readline().strip() == "ok"

    def cut(self) -> None:
        """A black hole both ways: every packet dropped, the interfaces stay up (no RST, no ICMP)."""
        self.shape(cut=True)


_OURS = re.compile(r"ct(\d+)x\d+[ab]")


def _remove_stale_namespaces() -> None:
    """Delete the namespaces of test runs that were killed before they could (their veths go with them)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in (line.split()[0] for line in listed.splitlines() if line.strip()):
        match = _OURS.fullmatch(name)
        if match and not Path(f"/proc/{match[1]}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextlib.contextmanager
def netns_pair() -> Iterator[NetnsPair]:
    _remove_stale_namespaces()
    tag = f"{os.getpid()}x{next(_runs)}"  # (interface names m<tag>a: at most 15 characters)
    names = (f"ct{tag}a", f"ct{tag}b")
    mgmt_root = (f"m{tag}a", f"m{tag}b")
    mgmt_ns = (f"n{tag}a", f"n{tag}b")
    rng = random.Random()
    base = f"100.{rng.randrange(64, 128)}.{rng.randrange(256)}"
    octet = rng.randrange(0, 256, 8)
    root_ips = (f"{base}.{octet + 1}", f"{base}.{octet + 5}")
    ns_ips = (f"{base}.{octet + 2}", f"{base}.{octet + 6}")
    link: subprocess.Popen[str] | None = None
    try:
        for name in names:
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
        for i in (0, 1):
            _ip("link", "add", mgmt_root[i], "type", "veth", "peer", "name", mgmt_ns[i], "netns", names[i])
            _ip("addr", "add", f"{root_ips[i]}/30", "dev", mgmt_root[i])
            _ip("link", "set", mgmt_root[i], "up")
            _ip("-n", names[i], "addr", "add", f"{ns_ips[i]}/30", "dev", mgmt_ns[i])
            _ip("-n", names[i], "link", "set", mgmt_ns[i], "up")
        link = subprocess.Popen(
            [sys.executable, str(TUNLINK), names[0], P2P_HOSTS[0], names[1], P2P_HOSTS[1], tag],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert link.stdout is not None
        if link.stdout.readline().strip() != "ready":
            raise RuntimeError(f"tunlink.py failed (exit {link.wait()})")
        yield NetnsPair(tag=tag, names=names, mgmt_hosts=ns_ips, link=link)
    finally:
        if link is not None:
            link.kill()
            link.wait()
        for dev in mgmt_root:
            subprocess.run(["ip", "link", "del", dev], capture_output=True)
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def fd_count(node: NodeProcess) -> int:
    return len(os.listdir(f"/proc/{node.process.pid}/fd"))


@attrs.define(eq=False)
class NetnsNodes:
    pair: NetnsPair
    paths: list[Path]
    configs: list[_config.NodeConfig]
    nodes: list[NodeProcess | None]

    async def start(self, i: int) -> NodeProcess:
        node = await start_node_process(
            self.paths[i], self.configs[i], env=node_env(), command_prefix=self.pair.exec_prefix(i)
        )
        self.nodes[i] = node
        return node

    def node(self, i: int) -> NodeProcess:
        node = self.nodes[i]
        assert node is not None
        return node

    def log(self, i: int) -> str:
        return self.configs[i].log_path.read_text(encoding="utf-8")


async def _wait_sees(url: str, name: str, host: str) -> None:
    async with rpc.connect(url, "ops", PASSWORD) as client:
        with trio.fail_after(30):
            while True:
                entries = await client.network_map()
                if any(
                    e["legal_name"].startswith(name) and any(a.startswith(host + ":") for a in e["addresses"])
                    for e in entries
                ):
                    return
                await trio.sleep(0.2)


@contextlib.asynccontextmanager
async def open_netns_nodes(
    directory: Path, pair: NetnsPair, **overrides: object
) -> AsyncIterator[NetnsNodes]:
    """Alice in ``pair.names[0]``, Bob in ``pair.names[1]``, each knowing the other at its P2P address on
    the netem link (NodeInfo files exchanged through ``additional-node-infos``); stopped on leaving."""
    made = make_network(directory, [ALICE, BOB], flows_modules=(MODULE,), **overrides)
    paths, configs = [], []
    for i, (path, cfg) in enumerate(made):
        p2p = network.NetworkHostAndPort(host=P2P_HOSTS[i], port=P2P_PORT)
        cfg = attrs.evolve(
            cfg,
            p2p_address=p2p,
            p2p_listen=p2p,
            rpc_address=network.NetworkHostAndPort(host=pair.mgmt_hosts[i], port=RPC_PORT),
            metrics_address=(pair.mgmt_hosts[i], METRICS_PORT),
        )
        path.write_text(_config.dump_node_config(cfg, path.parent), encoding="utf-8")
        paths.append(path)
        configs.append(_config.load_node_config(path))
    nodes = NetnsNodes(pair=pair, paths=paths, configs=configs, nodes=[None, None])
    try:
        async with trio.open_nursery() as nursery:
            for i in (0, 1):
                nursery.start_soon(nodes.start, i)
        for i, j in ((0, 1), (1, 0)):
            info = next(configs[i].base_directory.glob("nodeInfo-*"))
            configs[j].additional_node_infos.mkdir(parents=True, exist_ok=True)
            shutil.copy(info, configs[j].additional_node_infos / info.name)
        for i, (name, host) in ((0, (BOB, P2P_HOSTS[1])), (1, (ALICE, P2P_HOSTS[0]))):
            await _wait_sees(nodes.node(i).rpc_url, name.split(",")[0], host)
        yield nodes
    finally:
        with trio.CancelScope(shield=True):
            for node in nodes.nodes:
                if node is not None:
                    await node.stop(timeout_seconds=10)
