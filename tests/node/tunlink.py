"""A point-to-point IP link between two network namespaces with netem's impairments, in user space.

``python tunlink.py NS_A IP_A NS_B IP_B TAG`` creates a TUN device in each namespace (``t<TAG>a`` with
``IP_A``, peer ``IP_B``; ``t<TAG>b`` the other way round), prints ``ready``, and forwards every IP packet
from one to the other, as a wire would, until its stdin ends. Each line on stdin is a JSON object that
replaces the link's settings (both directions), all optional:

* ``delay`` (seconds, one way), ``jitter`` (seconds: each packet's delay is uniform in ``delay +- jitter``,
  so packets overtake each other as with netem's jitter), ``reorder`` (probability that a packet skips the
  delay altogether, netem's ``reorder``), ``loss`` (probability that a packet is dropped);
* ``rate`` (bits per second; 0: unlimited) with ``queue`` (seconds of backlog the sender's side holds before
  it drops at the tail, as tbf's ``latency``);
* ``cut`` (true: a black hole; nothing is queued, nothing answered);
* ``a_to_b`` / ``b_to_a``: an object of these settings for that direction alone (over the others).

It prints ``ok`` after applying each line. Why not ``tc qdisc ... netem``: kernels without ``sch_netem``
(this test machine's is one) refuse it, while TUN devices are everywhere namespaces are. Packets are whole
IP datagrams (no GSO), at most the TUN MTU (1500) long.
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import random
import select
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def main() -> None:
    ns_a, ip_a, ns_b, ip_b, tag = sys.argv[1:6]
    devs = (f"t{tag}a", f"t{tag}b")
    fds = (open_tun(devs[0]), open_tun(devs[1]))
    for dev, ns, mine, peer in ((devs[0], ns_a, ip_a, ip_b), (devs[1], ns_b, ip_b, ip_a)):
        ip("link", "set", dev, "netns", ns)
        ip("-n", ns, "addr", "add", mine, "peer", peer, "dev", dev)
        ip("-n", ns, "link", "set", dev, "mtu", "1500", "up")
    settings: dict[str, float] = {}
    rng = random.Random(int(os.environ.get("TUNLINK_SEED", "1")))
    #: per direction (0: a -> b): when the sender's side of the wire is free again (rate limiting)
    free_at = [0.0, 0.0]
    pending: list[tuple[float, int, int, bytes]] = []  # (due, seq, out fd, packet)
    seq = 0
    stdin = sys.stdin.fileno()
    print("ready", flush=True)
    inputs = [fds[0], fds[1], stdin]
    while True:
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            _, _, out, packet = heapq.heappop(pending)
            try:
                os.write(out, packet)
            except OSError:
                pass  # (the device's queue is full or the namespace is going away: a lost packet)
        timeout = max(0.0, pending[0][0] - now) if pending else None
        ready, _, _ = select.select(inputs, [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            if fd == stdin:
                line = sys.stdin.readline()
                if not line:
                    return
                settings = json.loads(line)
                if settings.get("cut"):
                    pending.clear()
                print("ok", flush=True)
                continue
            direction = 0 if fd == fds[0] else 1
            out = fds[1 - direction]
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                own = {**settings, **settings.get(("a_to_b", "b_to_a")[direction], {})}
                if own.get("cut") or rng.random() < own.get("loss", 0.0):
                    continue
                start = now
                rate = own.get("rate", 0.0)
                if rate:
                    start = max(now, free_at[direction])
                    if start - now > own.get("queue", 1.0):
                        continue  # tail drop: the backlog is full
                    free_at[direction] = start + len(packet) * 8 / rate
                    start = free_at[direction]
                delay = own.get("delay", 0.0)
                if rng.random() < own.get("reorder", 0.0):
                    delay = 0.0
                elif own.get("jitter"):
                    delay = max(0.0, delay + rng.uniform(-own["jitter"], own["jitter"]))
                seq += 1
                heapq.heappush(pending, (start + delay, seq, out, packet))


if __name__ == "__main__":
    main()
