"""The retention service: applies every log's retention and offload policies in the background.

One process in the cluster applies them (a :class:`~.election.LeaderElection` at
``/logs-retention/election``); it runs in ``bkspark autorecovery``, in a bookie started with
``--autorecovery`` and in ``bkspark localcluster``, so a deployment that repairs its ledgers
also keeps its logs within their policies. Every ``interval`` seconds the leader lists the
logs, reads their heads (pipelined, many logs a read) and applies the policy of each that
has one (:func:`bkspark.log.retention.enforce`), then its offload policy if it has one
(:func:`bkspark.recovery.offload.run`; its directory is swept for a crashed offload's files every
:data:`ORPHAN_SCAN_S`); a log with nothing to cut and no offload policy is not read again
until its head changes or its oldest ledger ages out (:meth:`RetentionService.run_once`). A log that fails (its
metadata unreachable, being deleted) is logged and retried at the next pass; a change the
service makes is the same conditional truncation a user's would be, so two enforcers at
once (a leader that does not know yet it was replaced) cannot remove more than the policy
allows.
"""
from __future__ import annotations

import logging
import math
import threading
import time

from bkspark.errors import BKError, ClockSkewError, NoSuchLogError
from bkspark.log import LogStore, offload
from bkspark.log.retention import PROPERTY, RetentionPolicy, enforce
from metadata.log_segments import LogHead
from metadata.layout import RETENTION_ELECTION

from .election import LeaderElection

log = logging.getLogger("bkspark.recovery.retention")

#: seconds between passes, by default
DEFAULT_INTERVAL = 60.0
#: logs whose heads one pipelined read fetches
HEADS_PER_READ = 1024
#: seconds between sweeps of a log's offload directory for a crashed offload's files
ORPHAN_SCAN_S = 3600.0


class RetentionService:
    """Elected background enforcement of logs' retention (module docstring). ``bk``: the
    client whose metadata store and ledgers it uses (closed by its owner, not here)."""

    def __init__(self, bk, identifier: str, interval: float = DEFAULT_INTERVAL):
        if interval <= 0:
            raise ValueError("the retention interval must be > 0 seconds")
        self.logs = LogStore(bk)
        self.identifier = identifier
        self.interval = interval
        self.passes = 0                 # completed passes (status, tests)
        self.removed = 0                # ledgers removed so far
        self.refused_by_skew = 0        # passes refused: this host's clock is off the store's
        self.offloaded_ledgers = 0      # ledgers offloaded so far (bkspark.log.offload)
        self.offloaded_bytes = 0        # ... the bytes of their Parquet files
        self.offload_failures = 0       # offload passes of a log that failed
        self.dropped_ledgers = 0        # offloaded ledgers whose bookies' copy it dropped
        self._swept: dict[str, float] = {}      # log -> when its offload directory was swept
        # log -> (head mark, store ms): nothing to cut before then while the head keeps
        # that mark (rebuilt by every pass: logs gone drop out)
        self._quiet: dict[str, tuple] = {}
        self._stop = threading.Event()
        self._election = LeaderElection(bk.store, identifier, self._lead,
                                        path=RETENTION_ELECTION, role="retention enforcer")

    @property
    def is_leader(self) -> bool:
        return self._election.is_leader

    def start(self) -> "RetentionService":
        self._election.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._election.stop()

    def _lead(self, still_leader) -> None:
        while still_leader() and not self._stop.is_set():
            started = time.monotonic()
            self.run_once(still_leader)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def run_once(self, still_leader=lambda: True) -> dict[str, list[int]]:
        """One pass over every log; returns the ledgers removed per log.

        The heads are read :data:`HEADS_PER_READ` logs per pipelined read. A log whose head
        is unchanged since a pass found nothing to cut until a time still ahead (no policy;
        a size policy within its bound; the oldest ledger not old enough yet -- not when
        cursors held the cut, they move without the head) costs nothing more; the others
        are planned and cut from a fresh read (:func:`~bkspark.log.retention.enforce`)."""
        removed: dict[str, list[int]] = {}
        try:
            # (ages are the store's; a host whose clock is that far off is refused anyway,
            # once a pass rather than once a log: metadata.clock)
            self.logs.store.clock.check_skew("retention pass")
            names = self.logs.list_logs()
            listed = set(names)     # (sweep times of logs deleted since are forgotten)
            self._swept = {n: t for n, t in self._swept.items() if n in listed}
        except ClockSkewError:
            self.refused_by_skew += 1
            return removed
        except BKError as exc:
            log.warning("retention: cannot read the store's time or list logs: %s", exc)
            return removed
        quiet: dict[str, tuple] = {}
        for at in range(0, len(names), HEADS_PER_READ):
            chunk = names[at:at + HEADS_PER_READ]
            try:
                now = self.logs.store.clock.check_skew("retention pass")
                heads = self.logs.raw_heads(chunk)
            except ClockSkewError:
                self.refused_by_skew += 1
                break
            except BKError as exc:
                log.warning("retention: cannot read the heads of %d logs: %s (retried at the "
                            "next pass)", len(chunk), exc)
                continue
            for name, (mark, data) in heads.items():
                if not still_leader() or self._stop.is_set():
                    self._quiet = quiet
                    self.passes += 1
                    return removed
                known = self._quiet.get(name)
                if known is not None and known[0] == mark and now < known[1]:
                    quiet[name] = known
                    continue
                try:
                    until = self._apply(name, data, removed, still_leader)
                except NoSuchLogError:
                    continue                # deleted meanwhile
                except BKError as exc:
                    log.warning("retention: log %s: %s (retried at the next pass)", name, exc)
                    continue
                if until is not None:
                    quiet[name] = (mark, until)
        self._quiet = quiet
        self.passes += 1
        return removed

    def _apply(self, name: str, data: bytes, removed: dict, still_leader) -> float | None:
        """Apply the policy of log ``name``, whose head record is ``data``; returns until when
        (the store's ms) nothing is to be cut while that head is unchanged, or None."""
        head = LogStore.parse_head(name, data)
        offloads = head.properties.get(offload.PROPERTY) is not None or \
            bool(offload.previous_locations(head.properties))   # (left to sweep)
        if offloads:
            self._offload(name, still_leader)
        if RetentionPolicy.from_property(head.properties.get(PROPERTY)) is None:
            return None if offloads else math.inf   # (a policy set later changes the head)
        cut = enforce(self.logs, name)
        if cut.removed:
            removed[name] = cut.removed
            self.removed += len(cut.removed)
        settled = isinstance(head, LogHead) and head.gc == head.first   # nothing to collect
        return cut.quiet_until_ms if cut.before is None and settled and not offloads else None

    def _offload(self, name: str, still_leader) -> None:
        """Apply log ``name``'s offload policy: offload what is due, drop the bookies' copies
        kept long enough, sweep its directory -- and those of locations it named before --
        every :data:`ORPHAN_SCAN_S` -- each step tried
        whatever the one before did (one ledger that does not offload must not keep the
        others' copies), a pass with a failure counted once and logged, the next pass
        retries. Any error of it stays with this log: the pass goes on to the next one."""
        from bkspark.recovery import offload as offload_pass    # (pyarrow: when used)

        def offload_due():
            done = offload_pass.run(self.logs, name, still_leader=still_leader)
            self.offloaded_ledgers += len(done)
            self.offloaded_bytes += sum(f["bytes"] for rec in done.values() for f in rec["files"])

        def drop():
            self.dropped_ledgers += len(offload_pass.drop_copies(self.logs, name,
                                                                 still_leader=still_leader))

        def sweep():
            now = time.monotonic()
            if now - self._swept.get(name, -math.inf) >= ORPHAN_SCAN_S:
                self._swept[name] = now         # (a location that fails: next hour)
                offload.sweep_locations(self.logs, name)
        failed = False
        for step in (offload_due, drop, sweep):
            try:
                step()
            except NoSuchLogError:
                return                  # deleted meanwhile
            except Exception as exc:  # noqa: BLE001 - one log's failure must not stop the pass
                failed = True
                log.warning("offload: log %s: %s (retried at the next pass)", name, exc)
        self.offload_failures += failed     # (a pass of the log that failed, once)
