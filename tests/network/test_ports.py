"""Ports chosen by ``network bootstrap`` and listened on later: below the kernel's ephemeral range, where no
outgoing connection on the machine can take one before its node starts."""

from __future__ import annotations

import datetime as dt
import errno
import socket
from pathlib import Path

import pytest

from corda_trio import network, pki

RANGE = network.ephemeral_port_range()
needs_range = pytest.mark.skipif(RANGE is None, reason="no /proc/sys/net/ipv4/ip_local_port_range here")


@needs_range
def test_a_bootstraps_ports_are_all_below_the_ephemeral_range_so_outgoing_connections_cannot_take_them(
    tmp_path: Path,
) -> None:
    assert RANGE is not None
    names = [pki.CordaX500Name.parse(f"O=Node{i},L=London,C=GB") for i in range(5)]
    result = network.bootstrap_network(tmp_path / "n", names, now=dt.datetime.now(dt.UTC), map_port=0)
    ports = [p for n in result.nodes for p in (n.p2p_address.port, n.rpc_address.port)]
    assert result.map_address is not None
    ports.append(result.map_address.port)
    assert len(set(ports)) == len(ports) == 11
    assert all(10_000 <= p < RANGE[0] for p in ports), (ports, RANGE)


def test_the_ports_are_distinct_free_and_outside_the_given_range() -> None:
    ports = network.free_ports("127.0.0.1", 20, ephemeral=(30_000, 60_999))
    assert len(set(ports)) == 20
    assert all(10_000 <= p < 30_000 for p in ports)
    for p in ports:  # each can be listened on now
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
            s.listen()


def test_a_port_in_use_is_skipped_and_with_none_left_below_the_range_the_kernel_chooses() -> None:
    first = 20_000 + (hash(object()) % 5_000)
    window = list(range(first, first + 3))
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", window[1]))
        held.listen()
        chosen = network.free_ports("127.0.0.1", 2, ephemeral=(first + 3, 60_999), lowest=first)
        assert sorted(chosen) == [window[0], window[2]]
        # with every port of the window taken, the rest come from the kernel (bind 0), still distinct and free
        others = [socket.socket() for _ in (0, 2)]
        try:
            for s, p in zip(others, (window[0], window[2]), strict=True):
                s.bind(("127.0.0.1", p))
            ports = network.free_ports("127.0.0.1", 2, ephemeral=(first + 3, 60_999), lowest=first)
            assert len(set(ports)) == 2 and not set(ports) & set(window)
        finally:
            for s in others:
                s.close()
    finally:
        held.close()


def test_a_host_this_machine_cannot_bind_raises_at_once() -> None:
    with pytest.raises(OSError) as caught:
        network.free_ports("192.0.2.1", 2)  # TEST-NET-1: no interface has it
    assert caught.value.errno == errno.EADDRNOTAVAIL


def test_the_range_file_is_read_and_junk_is_none(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("32768\t60999\n")
    assert network.ephemeral_port_range(f) == (32768, 60999)
    for junk in ("", "1", "a b", "60999 32768", "0 10", "1 70000"):
        f.write_text(junk)
        assert network.ephemeral_port_range(f) is None, junk
    assert network.ephemeral_port_range(tmp_path / "absent") is None
