"""Ports for servers that keep their port across restarts (bookies, ZooKeeper, HTTP endpoints):
:func:`free_port` picks one outside the kernel's ephemeral range."""
from __future__ import annotations

import random
import socket

from bkspark.errors import BKError

_handed_out: set[int] = set()
_port_rng = random.Random()     # its own generator: tests that seed ``random`` get no fixed ports
LOWEST_PORT = 10000             # below this lie well-known services' ports


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default if unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now, outside the kernel's ephemeral range, that this process has not
    handed out before.

    Servers here keep their port across restarts (a bookie's identity is its address). A port
    from the ephemeral range could be taken, while its server is down, as the local port of
    any outgoing connection on the machine, and the restart would fail with "address already
    in use"; ports outside that range are only ever taken by an explicit bind. Another process
    may still bind the port before its server does: see :meth:`LocalCluster.wait_ready`.
    """
    low, high = _ephemeral_range()
    ranges = [r for r in (range(LOWEST_PORT, low), range(high + 1, 65536)) if len(r) >= 1000]
    if not ranges:
        raise BKError(f"no port range outside the ephemeral ports {low}-{high} to choose from")
    for _ in range(10000):
        span = _port_rng.choices(ranges, weights=[len(r) for r in ranges])[0]
        port = _port_rng.choice(span)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise BKError(f"no free port found on {host} outside the ephemeral ports {low}-{high}")
