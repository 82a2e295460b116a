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

Periodic checks, each with its own period (0: off), catch what the event-driven path
missed (e.g. while no auditor ran):

* ``bookie_check_interval`` (BookKeeper's ``auditorPeriodicBookieCheckInterval``): a full
  scan of every ledger's ensembles for bookies that are not registered (also run whenever
  the registered bookies change, and every ``audit_interval`` while some are missing);
* ``periodic_check_interval`` (``auditorPeriodicCheckInterval``, weekly by default as
  BookKeeper's): each live bookie is asked (``ListEntries``) whether it holds every entry its
  closed fragments say it should; ledgers with missing entries are published too. The
  *entries check* reads the ledgers' metadata :data:`METADATA_BATCH` at a time (one
  pipelined round), keeps up to :data:`LISTINGS_IN_FLIGHT` requests of many ledgers in
  flight, and checks at most ``entries_check_rate`` ledgers per second (default
  :data:`DEFAULT_ENTRIES_CHECK_RATE`, 0: unlimited) so that a large cluster's check does not
  crowd out the bookies' and the metadata store's foreground work (it takes at least
  ledgers / rate seconds);
* ``placement_check_interval`` (``auditorPeriodicPlacementPolicyCheckInterval``): every
  fragment's ensemble against the placement policy (spread over racks when bookies carry
  rack labels, :func:`~bkspark.client.placement.rack_shortfall`); ledgers that do not adhere
  are reported (log, metrics, status), not re-replicated: their data is whole.

A full audit on request (``bkspark shell triggeraudit``, ``PUT
/api/v1/autorecovery/trigger_audit``: a change of ``/underreplication/auditRequest``) runs
all three at once and publishes the lost bookies' ledgers without waiting for the delay.

The periods survive failovers: each check's last run and the last audit request served are
recorded in ``/underreplication/auditorChecks`` (:meth:`UnderReplicationManager.
auditor_checks`); a newly elected auditor runs a check once its period has passed since the
recorded run (or since the first auditor began counting, for a check that never ran), and
serves a request made while no auditor ran. Auditors that restart more often than a period
therefore still run every check.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from bkspark.errors import BKError, NoSuchLedgerError
from bkspark.client.placement import rack_shortfall
from metadata import ledgers as ledger_store
from metadata import registry

from .replicator import LedgerReplicator, fragments, live_bookies
from .throttle import Throttle
from .urm import UnderReplicationManager

log = logging.getLogger("bkspark.recovery.auditor")

#: ledgers a placement check names at most (the count covers them all)
PLACEMENT_REPORT = 100

#: BookKeeper's default ``auditorPeriodicCheckInterval``: a week (seconds)
DEFAULT_PERIODIC_CHECK_INTERVAL = 604800.0
#: ledgers the entries check checks per second at most unless configured (0: unlimited)
DEFAULT_ENTRIES_CHECK_RATE = 1000.0
#: ledgers whose metadata the entries check reads in one pipelined round
METADATA_BATCH = 256
#: ListEntries requests the entries check keeps in flight at most (a ledger's requests are
#: sent together, so one ledger with more members than this is sent alone)
LISTINGS_IN_FLIGHT = 64


@dataclass
class AuditorConfig:
    """The auditor's periods (seconds; 0: that check is off) and limits (module docstring).

    * ``lost_bookie_recovery_delay``: how long a bookie stays unregistered before its ledgers
      are published (the value stored in the metadata wins);
    * ``audit_interval``: rescan of every ledger's ensembles while lost bookies remain;
    * ``periodic_check_interval``: the entries check (``ListEntries``) of every ledger,
      :data:`DEFAULT_PERIODIC_CHECK_INTERVAL` (weekly, BookKeeper's) by default;
    * ``entries_check_rate``: ledgers the entries check checks per second at most
      (:data:`DEFAULT_ENTRIES_CHECK_RATE`; 0: unlimited);
    * ``bookie_check_interval``: scan of every ledger for bookies that are not registered;
    * ``placement_check_interval``: every ensemble against the placement policy;
    * ``tick``: the leader loop's longest sleep between passes.
    """
    lost_bookie_recovery_delay: float = 30.0
    audit_interval: float = 10.0
    periodic_check_interval: float = DEFAULT_PERIODIC_CHECK_INTERVAL
    entries_check_rate: float = DEFAULT_ENTRIES_CHECK_RATE
    bookie_check_interval: float = 86400.0
    placement_check_interval: float = 86400.0
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
        self.audits = 0               # full audits run on request
        self.last_checks: dict[str, int] = {}       # check -> when it last ran (epoch ms)
        #: ledgers the last placement check found not adhering (id -> why; at most
        #: PLACEMENT_REPORT of them), and how many there were in all
        self.placement_violations: dict[int, str] = {}
        self.placement_violation_count = 0
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
        last_alive = None
        recorded = self._recorded_checks()
        audit_seen = recorded.get("auditRequestServed")
        last_check, last_placement = self._last_runs(recorded, "entries", "placement")
        self._wake.set()                # the first pass at once
        try:
            while still_leader():
                self._wake.wait(self.config.tick)
                self._wake.clear()
                if not still_leader():
                    break
                try:
                    now = time.monotonic()
                    _, alive = live_bookies(self.store)
                    every = (self.config.audit_interval if self.first_missing
                             else self.config.bookie_check_interval)
                    stale = every > 0 and now - last_scan >= every
                    audit = self.urm.audit_request()
                    requested = audit != audit_seen
                    if alive != last_alive or stale or requested:
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
                    if requested:
                        log.info("auditor: full audit requested")
                        self.audit(index, alive)
                        audit_seen = audit
                        self._record(auditRequestServed=audit)
                        last_check = last_placement = time.monotonic()
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
                    if self.config.placement_check_interval > 0 and \
                            now - last_placement >= self.config.placement_check_interval:
                        self.check_placement()
                        last_placement = time.monotonic()
                except BKError as exc:
                    log.warning("auditor pass failed: %s", exc)
        finally:
            for cancel in cancels:
                try:
                    cancel()
                except Exception:  # noqa: BLE001
                    pass

    def audit(self, index: dict | None = None, alive: set | None = None) -> int:
        """A full audit now: every ledger of every bookie that is not registered is published
        (no recovery delay), then the entries check and the placement check run. ``index``
        and ``alive``: a bookie scan just made (default: made here). Returns the records
        published."""
        self.audits += 1
        if alive is None:
            _, alive = live_bookies(self.store)
        if index is None:
            index = self._bookie_index()
        lost = set(index) - alive
        n = self.publish_lost(lost, index) if lost and self.urm.is_enabled() else 0
        if self.urm.is_enabled():
            n += self.check_all_ledgers(lost)
        self.check_placement()
        return n

    def _recorded_checks(self) -> dict:
        """The check record (module docstring), ``since`` set when nobody counted yet."""
        try:
            recorded = self.urm.auditor_checks()
            if "since" not in recorded:
                recorded = self.urm.record_auditor_checks(since=int(time.time() * 1000))
            return recorded
        except BKError as exc:
            log.warning("auditor: cannot read the recorded checks (periods start now): %s", exc)
            return {}

    @staticmethod
    def _last_runs(recorded: dict, *checks: str) -> list[float]:
        """When each check last ran (or the periods began), on this process's monotonic
        clock; now when nothing is recorded."""
        now_ms, mono = time.time() * 1000, time.monotonic()
        since = recorded.get("since", now_ms)
        return [mono - max(0.0, now_ms - recorded.get(check, since)) / 1000 for check in checks]

    def _ran(self, check: str) -> None:
        """``check`` just finished: kept for status and metrics, and recorded for the next
        auditor."""
        self.last_checks[check] = int(time.time() * 1000)
        self._record(**{check: self.last_checks[check]})

    def _announce(self) -> None:
        try:
            self.urm.announce()
        except BKError as exc:  # the workers find the records at their next poll
            log.warning("auditor: cannot tell the workers about new records: %s", exc)

    def _record(self, **values) -> None:
        try:
            self.urm.record_auditor_checks(**values)
        except BKError as exc:  # the next auditor runs the check once more
            log.warning("auditor: cannot record %s: %s", sorted(values), exc)

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
        self._ran("bookies")
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
            self._announce()
        self.published += n
        return n

    def check_all_ledgers(self, lost: set = frozenset()) -> int:
        """The entries check (module docstring): publishes every ledger whose live members
        lack entries of its closed fragments, or that uses one of the ``lost`` bookies.
        Returns the records published.

        Ledgers are judged and published in the order they are listed; their metadata is
        read :data:`METADATA_BATCH` at a time and their ``ListEntries`` requests sent ahead,
        at most :data:`LISTINGS_IN_FLIGHT` outstanding, each ledger once the rate limit
        (``entries_check_rate``) allows. Failure semantics are
        :meth:`~.replicator.LedgerReplicator.missing_entries`': a member that does not
        answer is unknown, neither lacking nor complete, so only the members that answered
        can get a ledger published. A ledger deleted since it was listed, or whose metadata
        cannot be read, is skipped."""
        self.checks += 1
        n = 0
        lost = set(lost)
        _, alive = live_bookies(self.store)
        pace = Throttle(entries_per_s=self.config.entries_check_rate)
        for md, missing in self._entries_verdicts(self._listed_metadata(), alive, pace):
            lost_members = sorted(md.all_bookies() & lost)
            if missing or lost_members:
                if missing:
                    log.info("auditor: ledger %d lacks entries on %s", md.ledger_id, sorted(
                        {md.ensembles[s][1][i] for s, i in missing}))
                if self.urm.mark(md.ledger_id, lost_members, by=self.identifier):
                    n += 1
        if n:
            self._announce()
        self.published += n
        self._ran("entries")
        return n

    def _listed_metadata(self):
        """The metadata of every listed ledger, in listing order, read
        :data:`METADATA_BATCH` ledgers per pipelined round. A ledger deleted since it was
        listed is left out; a batch that cannot be read at once (a corrupt record, a lost
        connection) is read ledger by ledger, leaving out the unreadable ones."""
        def read_batch(ids):
            try:
                return [found[0] for found in ledger_store.read_ledgers(self.store, ids)
                        if found is not None]
            except BKError as exc:
                log.info("auditor: reading %d ledgers at once failed (%s): one by one",
                         len(ids), exc)
            one_by_one = []
            for lid in ids:
                try:
                    one_by_one.append(ledger_store.read_ledger(self.store, lid)[0])
                except NoSuchLedgerError:
                    continue
                except BKError as exc:
                    log.warning("auditor: ledger %d unreadable: %s", lid, exc)
            return one_by_one

        batch: list[int] = []
        for lid in ledger_store.list_ledgers(self.store):
            batch.append(lid)
            if len(batch) == METADATA_BATCH:
                yield from read_batch(batch)
                batch = []
        if batch:
            yield from read_batch(batch)

    def _entries_verdicts(self, ledgers, alive: set, pace: Throttle):
        """``(metadata, missing entries)`` of each of ``ledgers``, in their order:
        :meth:`~.replicator.LedgerReplicator.missing_entries` with the requests of later
        ledgers sent while earlier ones are judged (at most :data:`LISTINGS_IN_FLIGHT`
        outstanding; each ledger's requests go once ``pace`` allows)."""
        sent: deque = deque()       # (metadata, {bookie: Future}), oldest first
        outstanding = 0

        def judge_oldest():
            nonlocal outstanding
            md, answers = sent.popleft()
            outstanding -= len(answers)
            return md, self.replicator.missing_entries(md, alive, answers=answers)

        for md in ledgers:
            pace.acquire(0)
            members = self.replicator.members_to_list(md, alive)
            while sent and outstanding + len(members) > LISTINGS_IN_FLIGHT:
                yield judge_oldest()
            sent.append((md, self.replicator.request_listings(md.ledger_id, members)))
            outstanding += len(members)
        while sent:
            yield judge_oldest()

    def check_placement(self) -> int:
        """Every ledger's fragments against the placement policy (module docstring); the
        ledgers that do not adhere are logged and kept in :attr:`placement_violations`.
        Returns how many there are."""
        bookies = {**registry.list_bookies(self.store, readonly=True),
                   **registry.list_bookies(self.store)}
        found: dict[int, str] = {}
        count = 0
        for md in self._listed_metadata():
            lid = md.ledger_id
            for frag in fragments(md):
                short = rack_shortfall(frag.ensemble, bookies)
                if short:
                    count += 1
                    if len(found) < PLACEMENT_REPORT:
                        racks = sorted({str((bookies.get(b) or {}).get("rack"))
                                        for b in frag.ensemble if b in bookies})
                        end = "open" if frag.last is None else frag.last
                        found[lid] = (f"fragment {frag.first}..{end} {frag.ensemble} spans "
                                      f"racks {racks}: {short} fewer than the cluster allows")
                    break
        self.placement_violations, self.placement_violation_count = found, count
        self._ran("placement")
        if count:
            log.warning("auditor: %d ledgers do not adhere to the placement policy (e.g. %s)",
                        count, "; ".join(f"{k}: {v}" for k, v in list(found.items())[:3]))
        return count
