"""The metadata store's clock: the one time that stamps and judges (issue 47).

Every time that a later decision judges -- when a log segment closed (time retention), when
an idempotency key was last used (key expiry), when a cursor moved, when a Spark job was
registered or reclaimed -- is taken from this clock, and judged against it, never against
the caller's wall clock: hosts' clocks drift, NTP steps them, a VM restored from a snapshot
is days off, and a stamp from one host judged by another's clock deletes fresh data or
expires a live key.

**The authority.** ZooKeeper: the ``mtime`` the server stamps on a write of the store's
``/clock`` record (a probe write). The embedded SQLite store: the modification time the
kernel stamps on a write of the store's clock file (``<db>-clock``, beside the database):
the kernel's clock, not the process's (a process's own idea of the time -- libfaketime, a
container's -- does not reach it). A probe costs one store write.

**Between probes** the clock runs on the process's elapsed-time clock (``CLOCK_BOOTTIME``:
monotonic, and counting a suspend of the machine) from the last probe
(re-probed every :data:`REFRESH_S`): a wall-clock step of this host does not move it, and a
probe's round trip bounds its error (the probe is taken as happening at the middle of it).
A probe that gets no answer raises :class:`MetadataConnectionError`: no time is guessed.

**Skew.** :meth:`StoreClock.skew_ms` is this host's wall clock minus the store's, at the
last probe. The actors that destroy data by time (the retention enforcer, the Spark job
reclaimer) call :meth:`StoreClock.check_skew` first: beyond the tolerance (the store's
``clock_skew_tolerance``, 60 s by default) they refuse (:class:`ClockSkewError`, logged as
an alarm and exported as ``bkspark_clock_skew_seconds``) -- their decisions would be right
(they use the store's time), but a host that far off is misconfigured and the operator
must know before anything else on it misjudges.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from bkspark.errors import ClockSkewError

log = logging.getLogger(__name__)

#: seconds between probes of the store's time (between them: the monotonic clock)
REFRESH_S = 30.0


def _elapsed() -> float:
    """Seconds on a clock that no wall-clock step moves and that counts a suspend of the
    machine too (CLOCK_BOOTTIME where the platform has it, else the monotonic clock)."""
    return time.clock_gettime(_ELAPSED_CLOCK)


_ELAPSED_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
#: default tolerance of a destructive actor's wall clock against the store's, seconds
DEFAULT_SKEW_TOLERANCE_S = 60.0


class StoreClock:
    """The store's time in ms since the epoch (module docstring). Thread-safe.

    ``probe()``: the store's time now (ms), by one write; ``tolerance_s``: the skew beyond
    which :meth:`check_skew` refuses."""

    def __init__(self, probe: Callable[[], int], tolerance_s: float = DEFAULT_SKEW_TOLERANCE_S,
                 refresh_s: float = REFRESH_S):
        self._probe = probe
        self.tolerance_s = float(tolerance_s)
        self.refresh_s = float(refresh_s)
        self._lock = threading.Lock()
        self._base: tuple[int, float] | None = None     # (store ms, monotonic s) of a probe
        self._skew_ms = 0

    def _sample(self) -> tuple[int, float]:
        before = _elapsed()
        wall_before = time.time()
        store_ms = int(self._probe())
        after = _elapsed()
        mid = (before + after) / 2
        wall_ms = (wall_before + (mid - before)) * 1000
        with self._lock:
            self._base = (store_ms, mid)
            self._skew_ms = int(wall_ms - store_ms)
        return store_ms, mid

    def now_ms(self, fresh: bool = False) -> int:
        """The store's time now (ms); ``fresh``: probe now rather than run on from the last
        probe. :raises MetadataConnectionError: a probe got no answer."""
        with self._lock:
            base = self._base
        if fresh or base is None or _elapsed() - base[1] >= self.refresh_s:
            base = self._sample()
        return base[0] + int((_elapsed() - base[1]) * 1000)

    def skew_ms(self, fresh: bool = False) -> int:
        """This host's wall clock minus the store's (ms), at the last probe (``fresh``: now)."""
        if fresh or self._base is None:
            self._sample()
        return self._skew_ms

    def check_skew(self, action: str) -> int:
        """Refuse ``action`` (raise :class:`ClockSkewError`, logged as an error) when this
        host's clock is off the store's by more than the tolerance (as of a probe at most
        :data:`REFRESH_S` old). Returns the store's time (ms) the decision is to use."""
        now = self.now_ms()
        skew = self._skew_ms
        if abs(skew) > self.tolerance_s * 1000:
            msg = (f"{action} refused: this host's clock is {skew / 1000:+.1f} s off the "
                   f"metadata store's (tolerance {self.tolerance_s:g} s). Fix the host's time "
                   "(NTP); decisions by time are the store's, but a host this far off "
                   "misjudges elsewhere")
            log.error("clock skew alarm: %s", msg)
            raise ClockSkewError(msg)
        return now
