"""The rate limit of re-replication (BookKeeper's ``replicationRateByBytes``).

Copying a lost bookie's data competes with the foreground for the surviving bookies' disks
and the network: unthrottled, a repair finishes soonest (the cluster is exposed to a second
failure for the shortest time) but adds the most to the clients' latency. Operators choose
with a limit in MB/s (10**6 bytes) and/or entries/s, per run (``bkspark shell recover
--rate``, ``decommission --rate``) or in the autorecovery configuration
(``replication_rate_mb_per_s``; default :data:`DEFAULT_DAEMON_MB_PER_S`).

One :class:`Throttle` is shared by every thread of a run (the ledgers recovered at once, the
worker's threads), so the limit is the run's total. It paces entries as they are copied
(before each write to the replacement bookie); reads from the surviving bookies are pulled
by those writes, so they follow the same pace.
"""
from __future__ import annotations

import threading
import time

from bkspark.errors import BadRequestError

#: the autorecovery daemon's limit unless configured (MB/s); ``shell recover`` and
#: ``decommission`` run unlimited unless given ``--rate``
DEFAULT_DAEMON_MB_PER_S = 100.0

#: how far ahead of its pace a run may go (seconds of its rate): one burst after an idle time
BURST_S = 0.1


def _rate(value, what: str) -> float | None:
    if value is None:
        return None
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise BadRequestError(f"{what} {value!r}: give a number (0 or less: unlimited)") from None
    return rate if rate > 0 else None


class Throttle:
    """Paces copies to at most ``mb_per_s`` MB/s and ``entries_per_s`` entries/s (None or
    <= 0: no limit of that kind; both: :meth:`acquire` never waits). Thread-safe.

    The generic cell rate algorithm: each entry costs ``max(bytes / byte rate, 1 / entry
    rate)`` seconds of a schedule; :meth:`acquire` books the next slot and sleeps until it
    is due, so the long-run rate never exceeds the limit and a run idle for a while may go
    ahead by at most :data:`BURST_S` seconds of it."""

    def __init__(self, mb_per_s=None, entries_per_s=None, *, clock=time.monotonic,
                 sleep=time.sleep):
        self.bytes_per_s = None if (r := _rate(mb_per_s, "rate (MB/s)")) is None else r * 1e6
        self.entries_per_s = _rate(entries_per_s, "rate (entries/s)")
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._due = float("-inf")   # when the schedule's next free slot starts

    @property
    def limited(self) -> bool:
        return self.bytes_per_s is not None or self.entries_per_s is not None

    def describe(self) -> str:
        parts = []
        if self.bytes_per_s is not None:
            parts.append(f"{self.bytes_per_s / 1e6:g} MB/s")
        if self.entries_per_s is not None:
            parts.append(f"{self.entries_per_s:g} entries/s")
        return " and ".join(parts) or "unlimited"

    def cost(self, nbytes: int, entries: int = 1) -> float:
        """Seconds of the schedule that ``entries`` entries of ``nbytes`` bytes take."""
        c = 0.0
        if self.bytes_per_s is not None:
            c = nbytes / self.bytes_per_s
        if self.entries_per_s is not None:
            c = max(c, entries / self.entries_per_s)
        return c

    def acquire(self, nbytes: int, entries: int = 1) -> float:
        """Wait until copying ``entries`` entries of ``nbytes`` bytes keeps within the
        limits; returns the seconds waited."""
        if not self.limited:
            return 0.0
        with self._lock:
            now = self._clock()
            start = max(self._due, now - BURST_S)
            self._due = start + self.cost(nbytes, entries)
            wait = start - now
        if wait > 0:
            self._sleep(wait)
            return wait
        return 0.0

    def seconds_for(self, nbytes: int) -> float | None:
        """How long ``nbytes`` take at the byte rate (None: unlimited)."""
        return None if self.bytes_per_s is None else nbytes / self.bytes_per_s


#: no limit (the default of a manual run)
UNLIMITED = Throttle()
