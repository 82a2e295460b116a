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

**Skew.** :meth:`StoreClock.skew_ms` is this host's wall clock minus the store's, as of the
last probe. Beyond the tolerance (the store's ``clock_skew_tolerance``, 60 s by default)
the two clocks disagree and nobody can tell from one host which one is wrong, so:

* the actors that delete by time (the retention enforcer, the Spark job reclaimer) refuse
  (:meth:`StoreClock.check_skew`);
* the stamps that retention and key expiry judge -- a ledger closed in a log, an idempotency
  key used, a cursor moved -- are refused too (:meth:`StoreClock.stamp_ms`): were the store's
  clock the wrong one (a ZooKeeper server a day behind), a stamp taken from it would make
  fresh data look old long after it is fixed. The write fails with :class:`ClockSkewError`
  (before anything is written) until the clocks agree again. Stamps nothing deletes by (a
  ledger's creation time, record timestamps, a Spark job's registration, which only delays
  its reclaim) take the store's time without the check.

A refusal is logged as an alarm (at most once a minute per process) and the skew is
exported as ``bkspark_clock_skew_seconds`` by autorecovery processes.
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


def elapsed() -> float:
    """Seconds on a clock that no wall-clock step moves and that counts a suspend of the
    machine too (CLOCK_BOOTTIME where the platform has it, else the monotonic clock)."""
    return time.clock_gettime(_ELAPSED_CLOCK)


_ELAPSED_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
#: default tolerance of a destructive actor's wall clock against the store's, seconds
DEFAULT_SKEW_TOLERANCE_S = 60.0


class StoreClock:
    """The store's time in ms since the epoch (module docstring). Thread-safe; one probe at
    a time (threads that find the last probe stale wait for the one probe under way).

    ``probe()``: the store's time now (ms), by one write; ``tolerance_s``: the skew beyond
    which :meth:`check_skew` and :meth:`stamp_ms` refuse."""

    def __init__(self, probe: Callable[[], int], tolerance_s: float = DEFAULT_SKEW_TOLERANCE_S,
                 refresh_s: float = REFRESH_S):
        self._probe = probe
        self.tolerance_s = float(tolerance_s)
        self.refresh_s = float(refresh_s)
        self._lock = threading.Lock()           # guards the fields below
        self._probing = threading.Lock()        # held by the one probe under way
        self._base: tuple[int, float] | None = None     # (store ms, elapsed s) of a probe
        self._skew_ms = 0
        self._alarmed_at: float | None = None   # (elapsed s) of the last alarm logged

    def _current(self, fresh: bool) -> tuple[int, float]:
        """The last probe's (store ms, elapsed s), probing first if it is stale (or
        ``fresh``); a thread that waited for another's probe uses that one."""
        asked = elapsed()
        with self._lock:
            base = self._base
        if not fresh and base is not None and asked - base[1] < self.refresh_s:
            return base
        seen = base
        with self._probing:
            with self._lock:
                base = self._base
            if base is not None and base is not seen and (not fresh or base[1] >= asked):
                return base                     # probed by another thread meanwhile
            before = elapsed()
            wall_before = time.time()
            store_ms = int(self._probe())
            after = elapsed()
            mid = (before + after) / 2
            wall_ms = (wall_before + (mid - before)) * 1000
            with self._lock:
                self._base = (store_ms, mid)
                self._skew_ms = int(wall_ms - store_ms)
            return store_ms, mid

    def now_ms(self, fresh: bool = False) -> int:
        """The store's time now (ms); ``fresh``: probe now rather than run on from the last
        probe. :raises MetadataConnectionError: a probe got no answer."""
        base = self._current(fresh)
        return base[0] + int((elapsed() - base[1]) * 1000)

    def at(self, moment: float) -> int:
        """The store's time (ms) at ``moment``, a reading of :func:`elapsed` taken earlier on
        this machine (in any process: the clock is the machine's)."""
        base = self._current(False)
        return base[0] + int((moment - base[1]) * 1000)

    def skew_ms(self, fresh: bool = False) -> int:
        """This host's wall clock minus the store's (ms), as of a probe at most
        :data:`REFRESH_S` old (``fresh``: now)."""
        self._current(fresh)
        with self._lock:
            return self._skew_ms

    def _refuse(self, action: str) -> int:
        """The store's time now, unless this host's clock is off it beyond the tolerance:
        then :class:`ClockSkewError` (and an alarm in the log, at most one a minute)."""
        now = self.now_ms()
        with self._lock:
            skew = self._skew_ms
            if abs(skew) <= self.tolerance_s * 1000:
                return now
            quiet = self._alarmed_at is not None and elapsed() - self._alarmed_at < 60
            if not quiet:
                self._alarmed_at = elapsed()
        msg = (f"{action} refused: this host's clock is {skew / 1000:+.1f} s off the "
               f"metadata store's (tolerance {self.tolerance_s:g} s). Fix the time of this "
               "host, or of the metadata store's servers if every host reports this (NTP)")
        if not quiet:
            log.error("clock skew alarm: %s", msg)
        raise ClockSkewError(msg)

    def check_skew(self, action: str) -> int:
        """For an action that deletes by time (retention, reclaim): the store's time (ms) its
        decisions use -- or :class:`ClockSkewError` when this host's clock is off the store's
        by more than the tolerance (as of a probe at most :data:`REFRESH_S` old)."""
        return self._refuse(action)

    def stamp_ms(self, what: str) -> int:
        """The store's time (ms) for a stamp that retention or key expiry will judge (a
        ledger closed in a log, an idempotency key used, a cursor moved) -- or
        :class:`ClockSkewError` when this host's clock is off the store's by more than the
        tolerance. Nobody can tell from here which clock is wrong: should it be the store's
        (a ZooKeeper server a day behind), the stamp would make fresh data look old long
        after that clock is fixed, so nothing is stamped until the two agree again."""
        return self._refuse(what)
