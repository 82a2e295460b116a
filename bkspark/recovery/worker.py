"""Replication worker: takes under-replication records under a lock and repairs the ledgers.

For each record (in random order, so several workers spread out): create the ephemeral lock
``/underreplication/locks/urL<id>`` -- if another worker holds it, skip to the next record.
Then :meth:`LedgerReplicator.replicate_ledger` repairs every fragment with a lost member
(and entries missing on live members). Fully replicated: the record is deleted (only if the
auditor did not re-mark it meanwhile) and the lock released. Otherwise only the lock is
released and the ledger is retried after a back-off.

Idle workers look for records every ``poll_interval`` seconds, and at once when the auditor
announces that it published some (a watch on ``/underreplication/published``,
:meth:`UnderReplicationManager.announce`): a lost bookie's repair starts within the
metadata store's notification latency, not a poll interval later.

An open last fragment with a lost member is left alone for ``open_ledger_grace`` seconds
(the writer normally notices the failed bookie and starts a new fragment); if it is still
there after the grace period the ledger is fenced and recovered, then replicated.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass

from bkspark.errors import BKError, NoSuchLedgerError

from .replicator import FULL, OPEN, LedgerReplicator, Stats
from .throttle import DEFAULT_DAEMON_MB_PER_S, Throttle
from .urm import UnderReplicationManager

log = logging.getLogger("bkspark.recovery.worker")


@dataclass
class WorkerConfig:
    threads: int = 1
    open_ledger_grace: float = 30.0     # BookKeeper's openLedgerRereplicationGracePeriod
    retry_backoff: float = 5.0
    poll_interval: float = 1.0
    rate_mb_per_s: float | None = DEFAULT_DAEMON_MB_PER_S   # copy rate limit of all threads
    rate_entries_per_s: float | None = None                 # (None or <= 0: unlimited)


class ReplicationWorker:
    def __init__(self, bk, config: WorkerConfig | None = None, identifier: str = ""):
        self.bk = bk
        self.config = config or WorkerConfig()
        self.identifier = identifier
        self.urm = UnderReplicationManager(bk.store, identifier)
        self.stats = Stats()
        self.throttle = Throttle(self.config.rate_mb_per_s, self.config.rate_entries_per_s)
        self.replicator = LedgerReplicator(bk, progress=lambda n, b: self.stats.add(n, b),
                                           throttle=self.throttle)
        self.ledgers_replicated = 0
        self.failures = 0               # passes that failed or left the ledger under-replicated
        self._stop = threading.Event()
        self._wake = threading.Event()  # records were announced (or stop)
        self._cancel_watch = None
        self._threads: list[threading.Thread] = []
        self._open_since: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        try:
            self._cancel_watch = self.urm.watch_published(self._wake.set)
        except BKError as exc:
            log.warning("replication worker: cannot watch for published records (polling "
                        "every %gs): %s", self.config.poll_interval, exc)
        for i in range(max(1, self.config.threads)):
            t = threading.Thread(target=self._loop, daemon=True, name=f"replication-worker-{i}")
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._cancel_watch is not None:
            self._cancel_watch()
        for t in self._threads:
            t.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            worked = False
            try:
                if self.urm.is_enabled():
                    worked = self.run_once()
            except Exception:  # noqa: BLE001 - keep working
                log.exception("replication worker pass failed")
            if not worked and self._wake.wait(self.config.poll_interval):
                self._wake.clear()

    def run_once(self) -> bool:
        """One pass over the records; True if some ledger was processed."""
        ids = self.urm.list()
        random.shuffle(ids)
        worked = False
        for lid in ids:
            if self._stop.is_set() or not self.urm.is_enabled():
                break
            with self._lock:
                if self._backoff.get(lid, 0.0) > time.monotonic():
                    continue
            version = self.urm.try_lock(lid)
            if version is None:
                continue
            worked = True
            self.process(lid, version)
        return worked

    def process(self, lid: int, version: int) -> None:
        """Repair ledger ``lid`` whose lock we hold (record version ``version``)."""
        now = time.monotonic()
        with self._lock:
            since = self._open_since.get(lid)
        fence_open = since is not None and now - since >= self.config.open_ledger_grace
        try:
            res = self.replicator.replicate_ledger(lid, fence_open=fence_open,
                                                   repair_missing=True)
        except NoSuchLedgerError:
            log.info("ledger %d was deleted: dropping its under-replication record", lid)
            self.urm.delete_record(lid)
            self.urm.release(lid)
            return
        except Exception as exc:  # noqa: BLE001
            log.warning("ledger %d: re-replication failed: %s", lid, exc)
            self.urm.release(lid)
            with self._lock:
                self.failures += 1
                self._backoff[lid] = time.monotonic() + self.config.retry_backoff
            return
        self.stats.add(fragments=res.fragments_replicated)
        if res.status == FULL:
            if self.urm.mark_replicated(lid, version):
                log.info("ledger %d fully replicated (%d fragments, %d entries, %d bytes)",
                         lid, res.fragments_replicated, res.entries, res.bytes)
                self.ledgers_replicated += 1
            else:
                log.info("ledger %d was re-marked while being replicated; will check again", lid)
            with self._lock:
                self._open_since.pop(lid, None)
                self._backoff.pop(lid, None)
            return
        self.urm.release(lid)
        with self._lock:
            if res.status == OPEN:
                since = self._open_since.setdefault(lid, now)
                self._backoff[lid] = since + self.config.open_ledger_grace
                log.info("ledger %d: open last fragment has a lost bookie; fencing it after "
                         "the %.0fs grace period unless the writer moves on", lid,
                         self.config.open_ledger_grace)
            else:
                self.failures += 1
                self._backoff[lid] = time.monotonic() + self.config.retry_backoff
                log.warning("ledger %d still under-replicated: %s", lid, "; ".join(res.notes))
