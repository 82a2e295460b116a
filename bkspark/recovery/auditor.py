"""The auditor: finds under-replicated ledgers and publishes one record per ledger.

Runs only while elected (:mod:`.election`). It watches the registered bookies (writable and
read-only: a read-only bookie still serves its data). A bookie that some ledger's ensemble
names but that is not registered is *lost* once it has been missing for
``lost_bookie_recovery_delay`` seconds (a quick restart does not trigger a storm; the value
in ``/underreplication/lostBookieRecoveryDelay`` overrides the configured one). Then every
ledger with a fragment on a lost bookie gets an under-replication record naming it.

A newly elected auditor computes the lost bookies from the ledgers' metadata (bookies
referenced but not registered), so a failover loses nothing: it waits the delay and
publishes what its predecessor had not.

Every ``periodic_check_interval`` seconds a full check also asks each live bookie
(``ListEntries``) whether it holds every entry its closed fragments say it should; ledgers
with missing entries are published too.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from bkspark.errors import BKError, NoSuchLedgerError
from metadata import ledgers as ledger_store
from metadata import registry

from .replicator import LedgerReplicator, live_bookies
from .urm import UnderReplicationManager

log = logging.getLogger("bkspark.recovery.auditor")


@dataclass
class AuditorConfig:
    lost_bookie_recovery_delay: float = 30.0
    audit_interval: float = 10.0            # rescan ledgers while lost bookies remain
    periodic_check_interval: float = 3600.0  # ListEntries check of every ledger (0 = off)
    tick: float = 0.5


class Auditor:
    def __init__(self, bk, config: AuditorConfig | None = None, identifier: str = ""):
        self.bk = bk
        self.store = bk.store
        self.config = config or AuditorConfig()
        self.identifier = identifier
        self.urm = UnderReplicationManager(self.store, identifier)
        self.replicator = LedgerReplicator(bk)
        self.published = 0            # records created/changed (for tests and status)
        self.checks = 0
        self._wake = threading.Event()
        self.first_missing: dict[str, float] = {}

    def run(self, still_leader) -> None:
        """The leader loop (returns when ``still_leader()`` is False)."""
        cancels = []
        for readonly in (False, True):
            try:
                cancels.append(registry.watch_bookies(
                    self.store, lambda _b: self._wake.set(), readonly=readonly))
            except BKError as exc:
                log.warning("auditor: cannot watch bookies: %s", exc)
        self.first_missing = {}
        index: dict = {}
        last_scan = 0.0
        last_due: set = set()
        last_check = time.monotonic()
        last_alive = None
        try:
            while still_leader():
                self._wake.wait(self.config.tick)
                self._wake.clear()
                if not still_leader():
                    break
                try:
                    now = time.monotonic()
                    _, alive = live_bookies(self.store)
                    stale = now - last_scan >= (self.config.audit_interval if self.first_missing
                                                else 6 * self.config.audit_interval)
                    if alive != last_alive or stale:
                        index = self._bookie_index()
                        last_scan = now
                        last_alive = alive
                        missing = set(index) - alive
                        for b in missing:
                            if b not in self.first_missing:
                                log.info("auditor: bookie %s is not registered (%d ledgers "
                                         "use it)", b, len(index[b]))
                                self.first_missing[b] = now
                        for b in list(self.first_missing):
                            if b not in missing:
                                del self.first_missing[b]
                    delay = self.urm.lost_bookie_recovery_delay(
                        self.config.lost_bookie_recovery_delay)
                    due = {b for b, t in self.first_missing.items() if now - t >= delay}
                    if due and self.urm.is_enabled() and (due != last_due or now == last_scan):
                        if now != last_scan:
                            index = self._bookie_index()
                            last_scan = now
                        self.publish_lost(due, index)
                        last_due = due
                    elif not due:
                        last_due = set()
                    if self.config.periodic_check_interval > 0 and \
                            now - last_check >= self.config.periodic_check_interval and \
                            self.urm.is_enabled():
                        self.check_all_ledgers(due)
                        last_check = time.monotonic()
                except BKError as exc:
                    log.warning("auditor pass failed: %s", exc)
        finally:
            for cancel in cancels:
                try:
                    cancel()
                except Exception:  # noqa: BLE001
                    pass

    def _bookie_index(self) -> dict[str, set]:
        """bookie -> ledgers with a fragment on it."""
        index: dict[str, set] = {}
        for lid in ledger_store.list_ledgers(self.store):
            try:
                md, _ = ledger_store.read_ledger(self.store, lid)
            except NoSuchLedgerError:
                continue
            except BKError as exc:
                log.warning("auditor: ledger %d unreadable: %s", lid, exc)
                continue
            for b in md.all_bookies():
                index.setdefault(b, set()).add(lid)
        return index

    def publish_lost(self, lost: set, index: dict | None = None) -> int:
        """Publish a record for every ledger with a fragment on a ``lost`` bookie."""
        n = 0
        if index is None:
            index = self._bookie_index()
        for b in sorted(lost):
            for lid in sorted(index.get(b, ())):
                if self.urm.mark(lid, [b], by=self.identifier):
                    n += 1
        if n:
            log.info("auditor: published %d under-replicated ledgers for lost bookies %s", n,
                     sorted(lost))
        self.published += n
        return n

    def check_all_ledgers(self, lost: set = frozenset()) -> int:
        """Full check: ledgers whose live members lack entries of closed fragments (or that
        use one of the ``lost`` bookies)."""
        self.checks += 1
        n = 0
        _, alive = live_bookies(self.store)
        for lid in ledger_store.list_ledgers(self.store):
            try:
                md, _ = ledger_store.read_ledger(self.store, lid)
            except BKError:
                continue
            missing = self.replicator.missing_entries(md, alive)
            lost = sorted(md.all_bookies() & set(lost))
            if missing or lost:
                if missing:
                    log.info("auditor: ledger %d lacks entries on %s", lid, sorted(
                        {md.ensembles[s][1][i] for s, i in missing}))
                if self.urm.mark(lid, lost, by=self.identifier):
                    n += 1
        self.published += n
        return n
