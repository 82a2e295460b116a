"""Ledger recovery: fence the ledger, find its last entry, close it — without truncation.

Exactly the seeds (``fencing.txt``, ``closing-ledgers-safely.txt``, ``protocol.txt``):

1. CAS the metadata OPEN -> IN_RECOVERY (a CLOSED ledger needs no recovery; an IN_RECOVERY
   one is recovered again, e.g. after a recoverer died).
2. Fence: a LAC read (``Read(entry -1)`` with the FENCE flag and the master key) to every
   bookie of the last ensemble, until ``(E - Qa) + 1`` bookies answered (quorum coverage:
   every ack quorum of the ensemble contains a fenced bookie, so the old writer can no
   longer get any add acknowledged). EOK, NoSuchEntry and NoSuchLedger answers all come
   after the bookie durably fenced the ledger; anything else is unknown. Fewer answers than
   the threshold: :class:`LedgerRecoveryError`.
3. Start at ``max(highest LAC seen, first entry of the last fragment - 1)``.
4. Read forward with the FENCE flag from the entry's write set (its first healthy replica
   first, the others as soon as that answer is not positive or is late). One positive
   (digest-valid) answer makes it recoverable; ``(Qw - Qa) + 1`` NoSuchEntry/NoSuchLedger
   answers make it unrecoverable (the ledger ends before it; a late positive answer within
   ``recovery_negative_grace`` still wins); if every answer is in and neither threshold is
   met the outcome is unknown and recovery aborts (:class:`LedgerRecoveryError`), never
   closing on unknowns. Shortcut for long unconfirmed tails: an entry that the bookies'
   ``ListEntries`` (made durable by ``Force``) show on at least Qa bookies of its write set
   *in the current write ensemble* (step 5) is a positive answer that needs no write-back,
   so it is neither read nor rewritten.
5. Write every recovered entry back with RECOVERY_ADD. Reads and the end decision always use
   the write sets of the metadata this attempt started from (BookKeeper's
   ``metadataForRecovery``); write-backs use the *write ensemble*, initially that metadata's
   last ensemble. An entry is written back once ``Qa`` bookies of its write set acknowledged
   it; entries are confirmed in entry order (the recovery's own LAC: every entry up to it is
   on Qa bookies of its write set -- the LAC entry, entries at or below the fenced LAC and
   entries known replicated count as confirmed).
   *Ensemble change during recovery*: when a write-back cannot reach Qa because bookies of
   its write set failed (unavailable, no answer within ``add_timeout``, any error but
   EFENCED / EUA, which abort recovery; ETOOMANYREQUESTS is not a failure: the entry is
   sent again a little later), those bookies are replaced in the write ensemble
   (placement among the writable bookies outside it, non-suspect ones first; a bookie that
   failed once in this recovery is never chosen again), in a new segment starting at ``x`` =
   recovery LAC + 1 (the first entry not yet confirmed; never before the last fragment's
   first entry, which the start of step 3 guarantees; a segment already starting at ``x`` is
   replaced). Recovery then goes on from ``x``: every entry >= x -- including the ones read
   but not yet written back, and the ones skipped as known replicated on their old write
   set -- is read again (from the original write sets) or found replicated on Qa bookies of
   its *new* write set by the listing, and written back to its new write set. Entries below
   ``x`` stay in the old segment, where Qa bookies hold them. No replacement available:
   :class:`LedgerRecoveryError` naming the failed bookies; nothing is written to the
   metadata and the ledger stays IN_RECOVERY.
   The new segments stay in memory until the end is found and every entry from ``x`` to the
   end is on Qa bookies of its new write set: a published segment must never attribute an
   entry that may have been acknowledged to a bookie that does not hold it (a later
   recoverer would count that bookie's NoSuchEntry as a negative answer: truncation).
6. Publish and close, each by CAS: first the new segments (segments starting after the end
   are empty and dropped; the state stays IN_RECOVERY, so a recoverer that dies here leaves
   a ledger whose last ensemble no longer has the dead bookie), then CLOSED with the last
   recovered entry and its cumulative length. On a conflict at either CAS the metadata is
   reread: CLOSED by another recoverer -> accept its end (recoverers converge); otherwise
   (still IN_RECOVERY but changed, e.g. another recoverer's segment) recovery starts over
   from step 1 on the reread metadata, fencing its last ensemble.

Apache BookKeeper (4.9+, ``ReadOnlyLedgerHandle.handleBookieFailure``: recovery adds go
through the handle's add path, a failed bookie is replaced in ``newEnsemblesFromRecovery`` at
LAC + 1 and every unacknowledged add is resent; ``closeRecovered`` writes those ensembles in
the same CAS as CLOSED) keeps them in memory until the close; here they are CASed just before
the close, under the same invariant.
"""
from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque

from bkspark import errors
from bkspark.errors import (BKError, DigestMismatchError, LedgerRecoveryError,
                            NotEnoughBookiesError)
from bkspark.proto import wire
from metadata.ledger_metadata import LedgerState
from metadata.update import NoChange

from . import placement, quorum
from .digest import DigestManager
from .lac import NEGATIVE as _NEGATIVE
from .lac import read_lac
from .recovery_add import RecoveryAdds, WriteBack

log = logging.getLogger("bkspark.client.recovery")



class _Outcome:
    """Outcome of the recovery read of one entry, filled in by bookie answers."""

    __slots__ = ("entry_id", "tally", "body", "length", "event", "lock", "notes", "grace",
                 "t0", "_bookies", "_send", "_asked")

    def __init__(self, entry_id, qw, qa):
        self.t0 = time.monotonic()
        self._bookies = []
        self._send = None
        self._asked = 0
        self.entry_id = entry_id
        self.tally = quorum.RecoveryReadTally(qw, qa)
        self.body = None
        self.length = None
        self.event = threading.Event()
        self.lock = threading.Lock()
        self.notes: list[str] = []
        self.grace = False

    @property
    def result(self) -> str:
        return self.tally.outcome()

    @classmethod
    def known(cls, entry_id, qw, qa) -> "_Outcome":
        """An entry known to be stored on Qa bookies (a positive answer, no body read)."""
        out = cls(entry_id, qw, qa)
        out.tally.add_positive()
        out.event.set()
        return out

    def start(self, bookies, send) -> None:
        self._bookies, self._send = bookies, send
        self._asked = 1
        send(bookies[0])

    def expand(self) -> None:
        """Ask every replica not asked yet."""
        with self.lock:
            if self.event.is_set() and self.result != quorum.UNRECOVERABLE:
                return
            rest = self._bookies[self._asked:]
            self._asked = len(self._bookies)
        for b in rest:
            self._send(b)


class _Changed(Exception):
    """The ledger's metadata changed under a recovery (another recoverer or client)."""


class LedgerRecovery:
    """One recovery attempt of one ledger (see the module docstring). ``ctx``: the client's
    :class:`~bkspark.client.context.ClientContext`; ``substitutes``: ``{bookie: replacement}``
    for the write-backs (the replicator's, when a member of the last ensemble is lost: with
    Qw == Qa a write-back to it could never complete).
    """

    def __init__(self, ctx, ledger_id: int, keys, *, substitutes: dict | None = None):
        self.ctx = ctx
        self.substitutes = substitutes or {}
        self.ledger_id = ledger_id
        self.keys = keys
        self.master_key = keys.master_key
        self.conf = ctx.conf
        self._adds: RecoveryAdds | None = None     # while the scan runs
        self._bad: set[str] = set()     # bookies that failed a write-back in this recovery

    # ---- driver ------------------------------------------------------------------------
    def run(self, md, version):
        """Recover; return the (CLOSED) metadata and its version."""
        metrics = self.ctx.metrics
        try:
            closed = self._run(md, version)
        except BaseException:
            if metrics is not None:
                metrics.recoveries.labels(outcome="failed").inc()
            raise
        if metrics is not None:
            metrics.recoveries.labels(outcome="closed").inc()
        return closed

    def _run(self, md, version):
        for _ in range(self.conf.metadata_retries):
            md, version = self._mark_in_recovery(md, version)
            if md.state is LedgerState.CLOSED:
                return md, version
            last, length, segments = self._find_end(md)
            try:
                if segments:
                    # step 6: every entry of these segments up to `last` is on Qa bookies of
                    # its write set in them; publish them first, still IN_RECOVERY
                    with_segments = md
                    for first, bookies in segments:
                        with_segments = with_segments.with_ensemble(first, bookies)
                    md, version = self._replace(md, version, with_segments)
                    log.info("ledger %d: recovery ensemble change published: %s (still "
                             "IN_RECOVERY)", self.ledger_id,
                             ", ".join(f"{bookies} from entry {first}"
                                       for first, bookies in segments))
                md, version = self._replace(md, version, md.with_closed(last, length))
                log.info("ledger %d recovered: closed at entry %d (length %d)",
                         self.ledger_id, last, length)
                return md, version
            except _Changed:
                md, version = self.ctx.read_metadata(self.ledger_id)
                if md.state is LedgerState.CLOSED:
                    log.info("ledger %d: closed concurrently by another client at entry %d "
                             "(we found %d)", self.ledger_id, md.last_entry_id, last)
                    return md, version
                # still IN_RECOVERY but changed (another recoverer, its ensemble change):
                # start over from the reread metadata
                log.info("ledger %d: metadata changed during recovery; starting over",
                         self.ledger_id)
        raise LedgerRecoveryError(f"ledger {self.ledger_id}: recovery kept conflicting "
                                  "with concurrent metadata changes; retry later")

    def _replace(self, base, version: int, new):
        """Store ``new`` in place of ``base`` through the metadata update loop (a lost answer
        is settled from the stored record); :class:`_Changed` if the record is no longer
        ``base``: what this recovery decided rests on it, so it starts over."""
        base_bytes = base.serialize()

        def transform(current):
            if current.serialize() != base_bytes:
                raise _Changed()
            return new

        result = self.ctx.update_metadata(self.ledger_id, transform, start=(base, version),
                                    what=f"ledger {self.ledger_id}: recovery")
        return result.value, result.version

    def _mark_in_recovery(self, md, version):
        def transform(current):
            if current.state is not LedgerState.OPEN:
                raise NoChange()
            return current.with_in_recovery()

        result = self.ctx.update_metadata(self.ledger_id, transform, start=(md, version),
                                    what=f"ledger {self.ledger_id}: mark IN_RECOVERY")
        return result.value, result.version

    # ---- fencing -----------------------------------------------------------------------------
    def fence(self, md) -> int:
        """Fence the last ensemble; return the highest LAC learnt from it."""
        ensemble = md.last_ensemble()
        e, qa = md.ensemble_size, md.ack_quorum
        need = quorum.fencing_threshold(e, qa)
        digest = DigestManager(self.ledger_id, md.digest_type, self.keys.mac_key)
        answers = read_lac(self.ctx, self.ledger_id, ensemble, digest, fence=True,
                           master_key=self.master_key, enough=lambda got: len(got) >= need)
        for note in answers.mismatches:
            log.warning("ledger %d: fence answer of %s", self.ledger_id, note)
        if len(answers.answered) < need:
            raise LedgerRecoveryError(
                f"ledger {self.ledger_id}: fencing reached {len(answers.answered)} of the "
                f"{need} bookies needed (E={e}, Qa={qa}); unknown: {answers.unknown}. "
                "Recovery aborted, the ledger is left IN_RECOVERY; retry later")
        return answers.lac

    # ---- finding the end -----------------------------------------------------------------------
    def _find_end(self, md):
        """Fence, find the end and write back (steps 2-5); return ``(last entry, its
        cumulative length, [(first entry, bookies), ...] segments of the recovery's ensemble
        changes that hold entries up to the end)``."""
        lac = self.fence(md)
        last_fragment_first = md.last_ensemble_first_entry()
        start = max(lac, last_fragment_first - 1)
        digest = DigestManager(self.ledger_id, md.digest_type, self.keys.mac_key)
        log.info("ledger %d: fenced; highest LAC %d, reading forward from %d",
                 self.ledger_id, lac, start + 1)
        self._adds = RecoveryAdds(self.ctx, self.ledger_id, self.master_key,
                                  timeout=self.conf.add_timeout,
                                  retry_delay=self.conf.overload_retry_delay)
        try:
            return self._scan(md, start, digest)
        finally:
            self._adds.close()
            self._adds = None

    def _scan(self, md, start: int, digest):
        last, length = -1, 0
        if start >= 0:
            # the LAC entry is acknowledged: read it (for its length) and write it back
            out = self._recovery_read(md, start, digest)
            self._wait_outcome(out, ())
            if out.result != quorum.RECOVERABLE:
                raise LedgerRecoveryError(
                    f"ledger {self.ledger_id}: cannot read entry {start} (at or below the LAC): "
                    f"{out.notes}; recovery aborted")
            last, length = start, out.length
            # already on Qa bookies (it is <= the LAC): the write-back is best effort
            self._write_back(md, start, out.body)
        replicated = self._replicated_checker(md)
        wmd = md                # md plus the recovery's ensemble changes (in memory)
        segments: list = []
        first = start + 1
        while True:
            try:
                last, length = self._scan_from(md, wmd, first, last, length, digest,
                                               replicated)
                break
            except _WriteBackFailed as f:
                wmd, x = self._change_ensemble(wmd, f)
                if segments and segments[-1][0] == x:
                    segments[-1] = (x, wmd.last_ensemble())
                else:
                    segments.append((x, wmd.last_ensemble()))
                first, last, length = x, f.last, f.length
        if length is None:
            # the last entry was known replicated without reading it: read it for its length
            out = self._recovery_read(md, last, digest)
            self._wait_outcome(out, ())
            if out.result != quorum.RECOVERABLE:
                raise LedgerRecoveryError(
                    f"ledger {self.ledger_id}: cannot read the last entry {last} "
                    f"({out.notes}); recovery aborted")
            length = out.length
        # a segment starting after the end holds nothing: not published
        return last, length, [(x, ens) for x, ens in segments if x <= last]

    def _scan_from(self, md, wmd, first: int, last: int, length, digest, replicated):
        """Read forward from ``first`` (``last``/``length``: entry ``first - 1``, confirmed),
        deciding on ``md``'s write sets and writing back to ``wmd``'s; return the last
        recovered entry and its length once every write-back is confirmed.
        :raises _WriteBackFailed: a write-back cannot reach Qa acks."""
        progress = _Progress(self, first - 1, last, length)
        write_ensemble = wmd.last_ensemble()      # every entry >= first is in it
        window = self.conf.recovery_read_window
        inflight: deque = deque()
        nxt = first
        while True:
            while len(inflight) < window:
                if replicated(nxt, write_ensemble):
                    inflight.append(_Outcome.known(nxt, md.write_quorum, md.ack_quorum))
                else:
                    inflight.append(self._recovery_read(md, nxt, digest))
                nxt += 1
            out = inflight[0]
            self._wait_outcome(out, inflight)
            inflight.popleft()
            progress.check()
            res = out.result
            if res == quorum.RECOVERABLE:
                last, length = out.entry_id, out.length
                wb = None
                if out.body is not None:
                    wb = self._write_back(wmd, out.entry_id, out.body)
                progress.add(out.entry_id, wb, out.length)
                continue
            if res == quorum.UNRECOVERABLE:
                break
            raise LedgerRecoveryError(
                f"ledger {self.ledger_id}: cannot decide whether entry {out.entry_id} exists "
                f"(answers: {out.notes}); recovery aborted without closing, retry later")
        progress.finish()
        return last, length

    def _change_ensemble(self, wmd, f: "_WriteBackFailed"):
        """Replace the bookies that failed write-back ``f.wb`` in a new segment of the write
        ensemble starting at the first unconfirmed entry; return (new wmd, first entry)."""
        wb = f.wb
        x = f.confirmed + 1
        ensemble = wmd.last_ensemble()
        failed = {b: note for b, note in f.failed.items() if b in ensemble}
        if wb.fatal is not None or not failed:
            raise LedgerRecoveryError(
                f"ledger {self.ledger_id}: write-back of entry {wb.entry_id} reached "
                f"{wb.acks} of {wb.qa} bookies ({wb.notes()}); recovery aborted")
        self._bad.update(failed)
        for b in failed:
            self.ctx.health.suspect(b)
        writable = self.ctx.writable_bookies()
        suspects = {b for b in writable if self.ctx.health.is_suspect(b)}
        new_ens = list(ensemble)
        for i, b in enumerate(ensemble):
            if b not in failed:
                continue
            try:
                try:        # avoid bookies that recently failed, if possible
                    nb = placement.choose_replacement(writable, new_ens, i,
                                                      self._bad | suspects)
                except NotEnoughBookiesError:
                    nb = placement.choose_replacement(writable, new_ens, i, self._bad)
            except NotEnoughBookiesError as exc:
                raise LedgerRecoveryError(
                    f"ledger {self.ledger_id}: write-back of entry {wb.entry_id} cannot reach "
                    f"Qa={wb.qa}: bookie(s) {sorted(failed)} failed ({wb.notes()}) and there is "
                    f"no bookie to replace {b} (failed in this recovery: {sorted(self._bad)}; "
                    f"{exc}); recovery aborted, the ledger stays IN_RECOVERY; retry once a "
                    "bookie is available") from None
            new_ens[i] = nb
        log.info("ledger %d: recovery ensemble change: %s replaced from entry %d "
                 "(write ensemble %s -> %s; %s)", self.ledger_id, sorted(failed), x,
                 ensemble, new_ens, "; ".join(f"{b}: {n}" for b, n in failed.items()))
        return wmd.with_ensemble(x, new_ens), x

    def _replicated_checker(self, md):
        """A predicate ``replicated(e, write_ensemble)``: is entry ``e`` (of the last
        fragment) already durably stored on at least Qa bookies of its write set in
        ``write_ensemble``, according to ``ListEntries`` (then ``Force``) of ``md``'s last
        ensemble?

        Such an entry is recoverable (a positive answer) and already has the replication a
        write-back would give it, so recovery needs neither to read nor to write it (only the
        last entry is read, for its length). Anything else takes the per-entry path; a
        missing or failed listing only means fewer shortcuts. A bookie that was not listed
        (a replacement of the recovery's ensemble change) holds nothing here."""
        ensemble = md.last_ensemble()
        first = md.last_ensemble_first_entry()
        qw, qa = md.write_quorum, md.ack_quorum
        futs = {b: self.ctx.pool.get(b).list_entries(self.ledger_id,
                                                     timeout=self.conf.read_timeout)
                for b in ensemble}
        held: dict = {}
        for b in ensemble:
            try:
                resp = futs[b].result()
                if resp.status != errors.EOK:
                    raise errors.error_for_status(resp.status)
                ranges = [(r.first, r.last) for r in resp.ranges]
            except BKError as exc:
                log.info("ledger %d: no entry listing from %s (%s)", self.ledger_id, b, exc)
                ranges = []
            if ranges:
                held[b] = ([a for a, _ in ranges], [z for _, z in ranges])
        # a listed entry may still sit unsynced in the bookie's journal queue: Force makes
        # everything the bookie accepted so far durable; a bookie that cannot force counts
        # as holding nothing
        forced = {b: self.ctx.pool.get(b).force(self.ledger_id, timeout=self.conf.add_timeout)
                  for b in held}
        for b, f in forced.items():
            try:
                resp = f.result()
                if resp.status != errors.EOK:
                    raise errors.error_for_status(resp.status)
            except BKError as exc:
                log.info("ledger %d: %s could not force its journal (%s)", self.ledger_id,
                         b, exc)
                del held[b]
        if not held:
            return lambda entry_id, write_ensemble: False

        def has(b, entry_id):
            h = held.get(b)
            if h is None:
                return False
            starts, ends = h
            k = bisect.bisect_right(starts, entry_id) - 1
            return k >= 0 and ends[k] >= entry_id

        def replicated(entry_id, write_ensemble):
            if entry_id < first:
                return False
            n = 0
            for b in quorum.write_set_bookies(entry_id, write_ensemble, qw):
                if has(b, entry_id):
                    n += 1
            return n >= qa
        return replicated

    def _recovery_read(self, md, entry_id: int, digest) -> _Outcome:
        """Fencing read of ``entry_id``: its first (healthy) replica is asked first, the rest
        of the write set as soon as that answer is not positive or is late
        (:meth:`_Outcome.expand`). One call per entry in the common case."""
        qw, qa = md.write_quorum, md.ack_quorum
        out = _Outcome(entry_id, qw, qa)
        bookies = self.ctx.health.order(
            quorum.write_set_bookies(entry_id, md.ensemble_for(entry_id), qw))

        def on_resp(b, fut):
            body = None
            try:
                resp = fut.result()
                status = resp.status
                if status == errors.EOK:
                    _, _, length, _ = digest.verify(resp.body, entry_id)
                    body = bytes(resp.body)
            except DigestMismatchError as exc:
                status, note = "digest", str(exc)
            except BKError as exc:
                status, note = None, str(exc)
            with out.lock:
                if out.event.is_set() and out.result != quorum.UNRECOVERABLE:
                    return
                if status == errors.EOK:
                    out.body, out.length = body, length
                    res = out.tally.add_positive()
                    out.notes.append(f"{b}: EOK")
                elif status in _NEGATIVE:
                    res = out.tally.add_negative()
                    out.notes.append(f"{b}: {errors.status_name(status)}")
                else:
                    res = out.tally.add_unknown()
                    out.notes.append(f"{b}: " + (errors.status_name(status)
                                                 if isinstance(status, int) else note))
                answered = out.tally.positive + out.tally.negative + out.tally.unknown
                if res == quorum.UNRECOVERABLE and answered < len(bookies):
                    # generous on positive: give the remaining replicas a moment to say
                    # they have it (either outcome is safe; this one recovers more)
                    if not out.grace:
                        out.grace = True
                        self.ctx.scheduler.schedule(self.conf.recovery_negative_grace,
                                                    out.event.set)
                elif res != quorum.PENDING:
                    out.event.set()
            if status != errors.EOK:
                out.expand()

        def send(b):
            f = self.ctx.pool.get(b).read(self.ledger_id, entry_id, flags=wire.FENCE_LEDGER,
                                          master_key=self.master_key,
                                          timeout=self.conf.read_timeout)
            f.add_done_callback(lambda fut, b=b: on_resp(b, fut))

        out.start(bookies, send)
        return out

    def _wait_outcome(self, out: _Outcome, inflight) -> None:
        """Wait for ``out``; every ``speculative_read_timeout`` without a decision, each read
        in flight that long asks the rest of its write set too."""
        spec = self.conf.speculative_read_timeout or None
        while not out.event.wait(spec):
            now = time.monotonic()
            for o in inflight:
                if now - o.t0 >= spec:
                    o.expand()
            if now - out.t0 >= spec:
                out.expand()

    def _write_back(self, md, entry_id: int, body: bytes) -> WriteBack:
        """RECOVERY_ADD of a recovered entry to its whole write set (a member named in
        ``substitutes`` replaced by its substitute); done once Qa bookies acknowledged it or
        once they cannot."""
        bookies = quorum.write_set_bookies(entry_id, md.ensemble_for(entry_id), md.write_quorum)
        if self.substitutes:
            bookies = [self.substitutes.get(b, b) for b in bookies]
        return self._adds.add(entry_id, body, bookies, md.ack_quorum)


class _WriteBackFailed(Exception):
    """A write-back cannot reach Qa acks; ``confirmed``/``last``/``length``: the recovery's
    LAC (every entry up to it is on Qa bookies of its write set) and its entry's length;
    ``failed``: {bookie: note} of every failed write-back seen so far."""

    def __init__(self, wb, failed: dict, confirmed: int, last: int, length):
        super().__init__(f"write-back of entry {wb.entry_id} failed")
        self.wb = wb
        self.failed = failed
        self.confirmed = confirmed
        self.last = last
        self.length = length


class _Progress:
    """The write-backs of one pass, confirmed in entry order (the recovery's LAC)."""

    def __init__(self, rec: "LedgerRecovery", confirmed: int, last: int, length):
        self.rec = rec
        self.pending: deque = deque()         # (entry_id, write-back or None, length)
        self.confirmed, self.last, self.length = confirmed, last, length
        self.failure = threading.Event()      # some write-back cannot reach Qa

    def add(self, entry_id: int, wb, length) -> None:
        self.pending.append((entry_id, wb, length))
        if wb is not None:
            wb.add_listener(self._on_done)
        self._advance(block=False)

    def _on_done(self, wb) -> None:
        if not wb.ok:
            self.failure.set()

    def check(self) -> None:
        """Advance the LAC over finished write-backs; raise if one failed."""
        self._advance(block=False)
        if self.failure.is_set():
            wb = next((wb for _, wb, _ in self.pending
                       if wb is not None and wb.done and not wb.ok), None)
            if wb is not None:
                self._raise(wb)

    def finish(self) -> None:
        """Wait until every write-back is confirmed (or raise)."""
        self._advance(block=True)

    def _advance(self, block: bool) -> None:
        while self.pending:
            entry_id, wb, length = self.pending[0]
            if wb is not None:
                if not wb.done and not block and time.monotonic() < wb.deadline:
                    return
                if not wb.wait():
                    self._raise(wb)
            self.pending.popleft()
            self.confirmed, self.last, self.length = entry_id, entry_id, length

    def _raise(self, wb) -> None:
        failed: dict = {}
        for _, other, _ in self.pending:      # every failure known now, not just this one
            if other is not None and other.done and not other.ok:
                for b, note in other.failures().items():
                    failed.setdefault(b, note)
        raise _WriteBackFailed(wb, failed, self.confirmed, self.last, self.length)
