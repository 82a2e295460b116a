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
   is a positive answer that needs no write-back, so it is neither read nor rewritten.
5. Write every recovered entry back to its whole write set with RECOVERY_ADD (an entry
   counts as written back once ``Qa`` bookies acknowledged it; fewer aborts recovery --
   there is no ensemble change during recovery: a write set with a dead bookie and
   Qw = Qa keeps the ledger IN_RECOVERY until the bookie is back or re-replicated).
6. CAS CLOSED with the last recovered entry and its cumulative length. On a conflict the
   metadata is reread: CLOSED by another recoverer -> accept its end (recoverers converge);
   otherwise recovery starts over.
"""
from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque

from bkspark import errors
from bkspark.errors import (BKError, DigestMismatchError, LedgerRecoveryError,
                            UnauthorizedError)
from metadata.ledger_metadata import LedgerState

from . import quorum, wire
from .digest import DigestManager, master_key

log = logging.getLogger("bkspark.client.recovery")

_NEGATIVE = (errors.ENOENTRY, errors.ENOLEDGER)


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


class LedgerRecovery:
    """One recovery attempt of one ledger (see the module docstring)."""

    def __init__(self, bk, ledger_id: int, password: bytes):
        self.bk = bk
        self.ledger_id = ledger_id
        self.password = password
        self.master_key = master_key(password)
        self.conf = bk.conf
        self._stream_wb = None

    # ---- driver ------------------------------------------------------------------------
    def run(self, md, version):
        """Recover; return the (CLOSED) metadata and its version."""
        for _ in range(self.conf.metadata_retries):
            md, version = self._mark_in_recovery(md, version)
            if md.state is LedgerState.CLOSED:
                return md, version
            last, length = self._find_end(md)
            closed = md.with_closed(last, length)
            try:
                version = self.bk._write_md(closed, version)
                log.info("ledger %d recovered: closed at entry %d (length %d)",
                         self.ledger_id, last, length)
                return closed, version
            except errors.BadVersionError:
                md, version = self.bk._read_md(self.ledger_id)
                if md.state is LedgerState.CLOSED:
                    log.info("ledger %d: closed concurrently by another client at entry %d "
                             "(we found %d)", self.ledger_id, md.last_entry_id, last)
                    return md, version
                # still IN_RECOVERY but changed (another recoverer): start over
        raise LedgerRecoveryError(f"ledger {self.ledger_id}: recovery kept conflicting "
                                  "with concurrent metadata changes; retry later")

    def _mark_in_recovery(self, md, version):
        for _ in range(self.conf.metadata_retries):
            if md.state is not LedgerState.OPEN:
                return md, version
            try:
                new_md = md.with_in_recovery()
                return new_md, self.bk._write_md(new_md, version)
            except errors.BadVersionError:
                md, version = self.bk._read_md(self.ledger_id)
        raise LedgerRecoveryError(f"ledger {self.ledger_id}: could not mark IN_RECOVERY")

    # ---- fencing -----------------------------------------------------------------------------
    def fence(self, md) -> int:
        """Fence the last ensemble; return the highest LAC learnt from it."""
        ensemble = md.last_ensemble()
        e, qa = md.ensemble_size, md.ack_quorum
        need = quorum.fencing_threshold(e, qa)
        digest = DigestManager(self.ledger_id, md.digest_type, self.password)
        cond = threading.Condition()
        answered: set[int] = set()
        unknown: list[str] = []
        fatal: list[BKError] = []
        best = [-1]
        pool = self.bk._pool

        def on_resp(i, b, fut):
            try:
                resp = fut.result()
                status = resp.status
            except BKError as exc:
                resp, status = None, None
                note = str(exc)
            with cond:
                if status == errors.EOK or status in _NEGATIVE:
                    answered.add(i)
                    if status == errors.EOK:
                        lac = resp.max_lac
                        if resp.body:
                            try:
                                _, blac, _, _ = digest.verify(resp.body)
                                lac = max(lac, blac)
                            except DigestMismatchError as exc:
                                log.warning("ledger %d: fence answer of %s: %s",
                                            self.ledger_id, b, exc)
                        best[0] = max(best[0], lac)
                elif status == errors.EUA:
                    fatal.append(UnauthorizedError(
                        f"ledger {self.ledger_id}: bookie {b} refused the master key (wrong "
                        "password)"))
                else:
                    unknown.append(f"{b}: " + (note if status is None
                                               else errors.status_name(status)))
                cond.notify_all()

        for i, b in enumerate(ensemble):
            f = pool.get(b).read(self.ledger_id, -1, flags=wire.FENCE_LEDGER,
                                 master_key=self.master_key, timeout=self.conf.read_timeout)
            f.add_done_callback(lambda fut, i=i, b=b: on_resp(i, b, fut))
        with cond:
            while True:
                if fatal:
                    raise fatal[0]
                if len(answered) >= need:
                    break
                if len(answered) + len(unknown) >= len(ensemble):
                    raise LedgerRecoveryError(
                        f"ledger {self.ledger_id}: fencing reached {len(answered)} of the "
                        f"{need} bookies needed (E={e}, Qa={qa}); unknown: {unknown}. "
                        "Recovery aborted, the ledger is left IN_RECOVERY; retry later")
                cond.wait(1.0)
            return best[0]

    # ---- finding the end -----------------------------------------------------------------------
    def _find_end(self, md):
        lac = self.fence(md)
        last_fragment_first = md.last_ensemble_first_entry()
        start = max(lac, last_fragment_first - 1)
        qw, qa = md.write_quorum, md.ack_quorum
        digest = DigestManager(self.ledger_id, md.digest_type, self.password)
        log.info("ledger %d: fenced; highest LAC %d, reading forward from %d",
                 self.ledger_id, lac, start + 1)
        writebacks = []
        self._stream_wb = _StreamWriteBacks(self)
        try:
            return self._scan(md, start, digest, writebacks)
        finally:
            self._stream_wb.close()
            self._stream_wb = None

    def _scan(self, md, start: int, digest, writebacks):
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
        window = self.conf.recovery_read_window
        inflight: deque = deque()
        nxt = start + 1
        while True:
            while len(inflight) < window:
                if replicated(nxt):
                    inflight.append(_Outcome.known(nxt, md.write_quorum, md.ack_quorum))
                else:
                    inflight.append(self._recovery_read(md, nxt, digest))
                nxt += 1
            out = inflight[0]
            self._wait_outcome(out, inflight)
            inflight.popleft()
            res = out.result
            if res == quorum.RECOVERABLE:
                last, length = out.entry_id, out.length
                if out.body is not None:
                    writebacks.append(self._write_back(md, out.entry_id, out.body))
                continue
            if res == quorum.UNRECOVERABLE:
                break
            raise LedgerRecoveryError(
                f"ledger {self.ledger_id}: cannot decide whether entry {out.entry_id} exists "
                f"(answers: {out.notes}); recovery aborted without closing, retry later")
        for wb in writebacks:
            wb.wait()
        if length is None:
            # the last entry was known replicated without reading it: read it for its length
            out = self._recovery_read(md, last, digest)
            self._wait_outcome(out, ())
            if out.result != quorum.RECOVERABLE:
                raise LedgerRecoveryError(
                    f"ledger {self.ledger_id}: cannot read the last entry {last} "
                    f"({out.notes}); recovery aborted")
            length = out.length
        return last, length

    def _replicated_checker(self, md):
        """A predicate: is entry ``e`` (of the last fragment) already durably stored on at
        least Qa bookies of its write set, according to ``ListEntries`` (then ``Force``) of
        the last ensemble?

        Such an entry is recoverable (a positive answer) and already has the replication a
        write-back would give it, so recovery needs neither to read nor to write it (only the
        last entry is read, for its length). Anything else takes the per-entry path; a
        missing or failed listing only means fewer shortcuts."""
        ensemble = md.last_ensemble()
        first = md.last_ensemble_first_entry()
        qw, qa, e_size = md.write_quorum, md.ack_quorum, md.ensemble_size
        futs = {b: self.bk._pool.get(b).list_entries(self.ledger_id,
                                                     timeout=self.conf.read_timeout)
                for b in ensemble}
        held: list = []
        for b in ensemble:
            try:
                resp = futs[b].result()
                if resp.status != errors.EOK:
                    raise errors.error_for_status(resp.status)
                ranges = [(r.first, r.last) for r in resp.ranges]
            except BKError as exc:
                log.info("ledger %d: no entry listing from %s (%s)", self.ledger_id, b, exc)
                ranges = []
            held.append(([a for a, _ in ranges], [z for _, z in ranges]))
        # a listed entry may still sit unsynced in the bookie's journal queue: Force makes
        # everything the bookie accepted so far durable; a bookie that cannot force counts
        # as holding nothing
        forced = {i: self.bk._pool.get(b).force(self.ledger_id, timeout=self.conf.add_timeout)
                  for i, b in enumerate(ensemble) if held[i][0]}
        for i, f in forced.items():
            try:
                resp = f.result()
                if resp.status != errors.EOK:
                    raise errors.error_for_status(resp.status)
            except BKError as exc:
                log.info("ledger %d: %s could not force its journal (%s)", self.ledger_id,
                         ensemble[i], exc)
                held[i] = ([], [])
        if not any(starts for starts, _ in held):
            return lambda entry_id: False

        def has(i, entry_id):
            starts, ends = held[i]
            k = bisect.bisect_right(starts, entry_id) - 1
            return k >= 0 and ends[k] >= entry_id

        def replicated(entry_id):
            if entry_id < first:
                return False
            s = entry_id % e_size
            n = 0
            for j in range(qw):
                if has((s + j) % e_size, entry_id):
                    n += 1
            return n >= qa
        return replicated

    def _recovery_read(self, md, entry_id: int, digest) -> _Outcome:
        """Fencing read of ``entry_id``: its first (healthy) replica is asked first, the rest
        of the write set as soon as that answer is not positive or is late
        (:meth:`_Outcome.expand`). One call per entry in the common case."""
        qw, qa = md.write_quorum, md.ack_quorum
        out = _Outcome(entry_id, qw, qa)
        bookies = self.bk._health.order(
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
                        self.bk._scheduler.schedule(self.conf.recovery_negative_grace,
                                                    out.event.set)
                elif res != quorum.PENDING:
                    out.event.set()
            if status != errors.EOK:
                out.expand()

        def send(b):
            f = self.bk._pool.get(b).read(self.ledger_id, entry_id, flags=wire.FENCE_LEDGER,
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

    def _write_back(self, md, entry_id: int, body: bytes):
        """RECOVERY_ADD of a recovered entry to its whole write set; ``.wait()`` raises
        LedgerRecoveryError unless Qa bookies acknowledged it."""
        bookies = quorum.write_set_bookies(entry_id, md.ensemble_for(entry_id), md.write_quorum)
        if self._stream_wb is not None and self._stream_wb.registered:
            return self._stream_wb.add(entry_id, body, bookies, md.ack_quorum)
        # no stream when this client also writes the ledger: its acks go to the writer's
        # handle, so write-backs use unary adds
        return _WriteBack(self, entry_id, body, bookies, md.ack_quorum)


class _StreamWriteBacks:
    """Write-backs of one recovery over the per-bookie add streams (batched like the
    writer's adds), registered as the ledger's ack sink while recovery runs."""

    def __init__(self, rec: "LedgerRecovery"):
        self.rec = rec
        self.lock = threading.Lock()
        self.entries: dict[int, "_StreamWriteBack"] = {}
        self.prefix = wire.request_prefix(rec.ledger_id, rec.master_key)
        self.registered = False
        pool = rec.bk._pool
        if rec.ledger_id not in pool.sinks:       # a writer of this ledger here: no stream
            pool.register(rec.ledger_id, self)
            self.registered = True

    def add(self, entry_id: int, body: bytes, bookies, qa: int) -> "_StreamWriteBack":
        wb = _StreamWriteBack(self.rec, entry_id, bookies, qa)
        with self.lock:
            self.entries[entry_id] = wb
        elem = wire.encode_add(self.prefix, entry_id, wire.RECOVERY_ADD, [body])
        for b in bookies:
            try:
                self.rec.bk._pool.get(b).send_adds([elem])
            except BKError as exc:
                wb.answer(b, False, str(exc))
        return wb

    def on_add_responses(self, bookie_id: str, items) -> None:
        for eid, status in items:
            wb = self.entries.get(eid)
            if wb is not None:
                wb.answer(bookie_id, status == errors.EOK, errors.status_name(status))

    def on_bookie_failed(self, bookie_id: str, error) -> None:
        with self.lock:
            wbs = list(self.entries.values())
        for wb in wbs:
            wb.answer(bookie_id, False, str(error))

    def close(self) -> None:
        if self.registered:
            self.rec.bk._pool.unregister(self.rec.ledger_id, self)


class _StreamWriteBack:
    def __init__(self, rec, entry_id, bookies, qa):
        self.rec = rec
        self.entry_id = entry_id
        self.bookies = list(bookies)
        self.qa = qa
        self.answered: dict[str, bool] = {}
        self.fails: list[str] = []
        self.event = threading.Event()
        self.lock = threading.Lock()

    def answer(self, bookie: str, ok: bool, note: str) -> None:
        with self.lock:
            if bookie not in self.bookies or bookie in self.answered:
                return
            self.answered[bookie] = ok
            if not ok:
                self.fails.append(f"{bookie}: {note}")
            acks = sum(self.answered.values())
            if acks >= self.qa or len(self.fails) > len(self.bookies) - self.qa:
                self.event.set()

    def wait(self):
        if not self.event.wait(self.rec.conf.add_timeout):
            with self.lock:
                self.fails.append(f"no answer within {self.rec.conf.add_timeout}s from "
                                  f"{[b for b in self.bookies if b not in self.answered]}")
        acks = sum(self.answered.values())
        if acks < self.qa:
            raise LedgerRecoveryError(
                f"ledger {self.rec.ledger_id}: write-back of entry {self.entry_id} reached "
                f"{acks} of {self.qa} bookies ({self.fails}); recovery aborted")


class _WriteBack:
    """RECOVERY_ADD of one entry to its whole write set; done at Qa acknowledgements."""

    def __init__(self, rec: LedgerRecovery, entry_id: int, body: bytes, bookies, qa: int):
        self.rec = rec
        self.entry_id = entry_id
        self.bookies = bookies
        self.qa = qa
        self.acks = 0
        self.fails: list[str] = []
        self.event = threading.Event()
        self.lock = threading.Lock()
        for b in bookies:
            f = rec.bk._pool.get(b).add(rec.ledger_id, entry_id, body, rec.master_key,
                                        flags=wire.RECOVERY_ADD,
                                        timeout=rec.conf.add_timeout)
            f.add_done_callback(lambda fut, b=b: self._on_resp(b, fut))

    def _on_resp(self, b, fut):
        try:
            resp = fut.result()
            ok = resp.status == errors.EOK
            note = "" if ok else errors.status_name(resp.status)
        except BKError as exc:
            ok, note = False, str(exc)
        with self.lock:
            if ok:
                self.acks += 1
            else:
                self.fails.append(f"{b}: {note}")
            if self.acks >= self.qa or len(self.fails) > len(self.bookies) - self.qa:
                self.event.set()

    def wait(self):
        self.event.wait()
        if self.acks < self.qa:
            raise LedgerRecoveryError(
                f"ledger {self.rec.ledger_id}: write-back of entry {self.entry_id} reached "
                f"{self.acks} of {self.qa} bookies ({self.fails}); recovery aborted")
