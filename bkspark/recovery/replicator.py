"""Re-replication of ledger fragments (the seed's "Rereplication process").

A *fragment* (BookKeeper's "segment") is a continuous run of entries sharing one ensemble:
segment ``k`` of the metadata covers ``first_k .. first_{k+1} - 1``; the last segment of a
CLOSED ledger ends at ``last_entry_id``; the last segment of an OPEN / IN_RECOVERY ledger
has no defined end yet.

Bookie at ensemble index ``i`` of a fragment must hold exactly the entries ``e`` of the
fragment whose write set contains ``i`` (:func:`~bkspark.client.quorum.has_entry`).

:class:`LedgerReplicator` repairs one ledger:

1. every fragment with a *bad* member (a bookie that is gone, or one being moved away
   from): read the entries that member should hold from the surviving members of each
   entry's write set (digest-checked), write them to a replacement bookie with the
   ``RECOVERY_ADD`` flag (accepted on fenced ledgers; sent by
   :class:`~bkspark.client.recovery_add.RecoveryAdds`, as recovery's write-backs are, with
   at most :data:`MAX_UNACKED` copies unacknowledged), then compare-and-set the new member
   into that fragment's metadata (re-read and re-check on a conflict; if the fragment
   changed under us nothing is written and the ledger is retried later);
2. optionally, every live member of a closed fragment that lacks entries it should hold
   (``ListEntries``) gets them copied back (RECOVERY_ADD, no metadata change);
3. an open last fragment with a bad member is only touched after the caller allows
   fencing: the ledger is then recovered (fenced and closed, no truncation: the client's
   quorum-coverage recovery) and its last fragment replicated like any other.

Fragments of one ledger are repaired at once (``fragments_at_once``), the lost members of a
fragment one after another. Metadata is only ever changed by swapping one member of one
fragment whose entries were all acknowledged by the replacement first; the state, last entry
id and length are never written here (no truncation). Empty fragments (a ledger closed at -1, or a last fragment past the last
entry) need no copy: the member is swapped directly.
"""
from __future__ import annotations

import bisect
import heapq
import logging
import random
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from bkspark import errors
from bkspark.client import quorum
from bkspark.client.digest import DigestManager
from bkspark.client.placement import choose_replacement
from bkspark.client.recovery import LedgerRecovery
from bkspark.client.recovery_add import RecoveryAdds
from bkspark.errors import (BKError, DigestMismatchError, MetadataConnectionError, MetadataError,
                            NotEnoughBookiesError, ReplicationError)
from metadata import ledgers as ledger_store
from metadata import registry
from metadata.ledger_metadata import LedgerState

from .throttle import UNLIMITED, Throttle

log = logging.getLogger("bkspark.recovery")

#: an arithmetic run of fewer entries is read entry by entry (a stream costs a request)
MIN_STREAM = 4
#: bytes a ranged read of a copy asks for at once (then the next piece, on the same
#: connection); entries per piece at most
PIECE_BYTES = 8 << 20
MAX_PIECE_ENTRIES = 4096
#: copies sent to the replacement and not yet acknowledged, at most (over its add stream;
#: unary adds: the replicator's ``window``), and their bytes; entries to a stream send
MAX_UNACKED = 4096
MAX_UNACKED_BYTES = 32 << 20
ADD_BATCH = 64


# ---- fragments -------------------------------------------------------------------------------

@dataclass
class Fragment:
    ledger_id: int
    segment: int                # index in md.ensembles
    first: int
    last: int | None            # None: open last fragment (end not defined yet)
    ensemble: list[str]

    @property
    def is_open(self) -> bool:
        return self.last is None

    @property
    def is_empty(self) -> bool:
        return self.last is not None and self.last < self.first

    def entries_of(self, index: int, ensemble_size: int, write_quorum: int) -> list[int]:
        """Entries the member at ``index`` must hold (closed fragments only)."""
        if self.last is None or self.last < self.first:
            return []
        e, qw = ensemble_size, write_quorum
        if qw >= e:
            return list(range(self.first, self.last + 1))
        return [x for x in range(self.first, self.last + 1) if quorum.has_entry(index, x, e, qw)]

    def __str__(self):
        end = "open" if self.last is None else str(self.last)
        return f"ledger {self.ledger_id} fragment {self.first}..{end} {self.ensemble}"


def fragments(md) -> list[Fragment]:
    """The fragments of a ledger, first to last."""
    out = []
    n = len(md.ensembles)
    for k, (first, bookies) in enumerate(md.ensembles):
        if k + 1 < n:
            last = md.ensembles[k + 1][0] - 1
            if md.state is LedgerState.CLOSED:
                last = min(last, md.last_entry_id)
        elif md.state is LedgerState.CLOSED:
            last = md.last_entry_id
        else:
            last = None
        out.append(Fragment(md.ledger_id, k, first, last, list(bookies)))
    return out


class EntryRanges:
    """Sorted disjoint inclusive ranges (a ListEntries answer) with membership tests."""

    def __init__(self, ranges):
        self.ranges = sorted((int(a), int(b)) for a, b in ranges)
        self._firsts = [a for a, _ in self.ranges]

    def __contains__(self, entry_id: int) -> bool:
        i = bisect.bisect_right(self._firsts, entry_id) - 1
        return i >= 0 and self.ranges[i][1] >= entry_id

    def count(self) -> int:
        return sum(b - a + 1 for a, b in self.ranges)


def _arithmetic_runs(entries: list[int], step: int) -> list[tuple[int, int]]:
    """``[(first, count)]``: ``entries`` (ascending) as runs ``first, first+step, ...`` of
    one residue class mod ``step``, in order of their first entry."""
    runs: dict[int, list[list[int]]] = {}
    for x in entries:
        mine = runs.setdefault(x % step, [])
        if mine and mine[-1][0] + mine[-1][1] * step == x:
            mine[-1][1] += 1
        else:
            mine.append([x, 1])
    return sorted((first, count) for per_class in runs.values() for first, count in per_class)


#: seconds a ListEntries request may take
LIST_ENTRIES_TIMEOUT = 10.0


def list_entries(ctx, bookie_id: str, ledger_id: int,
                 timeout: float = LIST_ENTRIES_TIMEOUT) -> EntryRanges:
    """What ``bookie_id`` holds for the ledger (empty if it does not know the ledger);
    ``ctx``: the client's :class:`~bkspark.client.context.ClientContext`.

    :raises BKError: the bookie did not answer (unknown, not "empty")."""
    return listed_entries(bookie_id,
                          ctx.pool.get(bookie_id).list_entries(ledger_id, timeout=timeout))


def listed_entries(bookie_id: str, answer: Future) -> EntryRanges:
    """What ``bookie_id`` holds, from ``answer``: the Future of its ``ListEntriesResponse``
    (waits for it; the request's own timeout bounds the wait).

    :raises BKError: the bookie did not answer (unknown, not "empty")."""
    resp = answer.result()
    if resp.status == errors.ENOLEDGER:
        return EntryRanges([])
    if resp.status != errors.EOK:
        raise errors.error_for_status(resp.status, f"bookie {bookie_id}: ListEntries: "
                                      f"{resp.message or errors.status_name(resp.status)}")
    return EntryRanges((r.first, r.last) for r in resp.ranges)


def live_bookies(store) -> tuple[dict, set]:
    """``(writable {id: info}, alive ids incl. read-only)``."""
    writable = registry.list_bookies(store)
    readonly = registry.list_bookies(store, readonly=True)
    return writable, set(writable) | set(readonly)


# ---- progress --------------------------------------------------------------------------------

@dataclass
class Stats:
    """What a worker copied since it started (thread-safe), and its recent rate."""
    entries: int = 0
    bytes: int = 0
    fragments: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: (monotonic time, bytes so far), one every MARK_EVERY s at most: the rate's samples
    marks: deque = field(default_factory=lambda: deque(maxlen=64), repr=False)

    MARK_EVERY = 0.5

    def add(self, entries=0, nbytes=0, fragments=0):
        now = time.monotonic()
        with self.lock:
            self.entries += entries
            self.bytes += nbytes
            self.fragments += fragments
            if not self.marks or now - self.marks[-1][0] >= self.MARK_EVERY:
                self.marks.append((now, self.bytes))

    def rate(self, window: float) -> float:
        """Bytes/s copied over about the last ``window`` seconds (0 when idle)."""
        now = time.monotonic()
        with self.lock:
            base = next(((t, b) for t, b in self.marks if now - t <= window), None)
            total = self.bytes
        if base is None:
            return 0.0
        return (total - base[1]) / max(now - base[0], self.MARK_EVERY)


# ---- outcome of one ledger ---------------------------------------------------------------------

FULL = "full"               # nothing left to do: the record can go
PARTIAL = "partial"         # something failed or is pending: keep the record
OPEN = "open"               # only the open last fragment is left (waiting for the grace period)


@dataclass
class LedgerResult:
    ledger_id: int
    status: str
    fragments_replicated: int = 0
    entries: int = 0
    bytes: int = 0
    notes: list = field(default_factory=list)
    fenced: bool = False


class LedgerReplicator:
    """Re-replicates the fragments of ledgers (see the module docstring).

    ``bk``: a :class:`bkspark.client.BookKeeper` (its bookie connections and metadata store).
    ``window``: single-entry reads and unstreamed writes in flight per fragment. ``rng``
    picks replacements. ``progress``: called with (entries, bytes) as entries are copied.
    ``throttle``: the run's rate limit (:class:`~.throttle.Throttle`, shared by the threads
    of a run; default none). ``fragments_at_once``: fragments of one ledger copied at the same
    time (each fragment's lost members one after another; each fragment's metadata change is
    its own compare-and-set, so they need no order).
    """

    def __init__(self, bk, *, window: int = 128, timeout: float = 30.0, rng=None,
                 progress=None, throttle: Throttle | None = None, fragments_at_once: int = 2):
        self.ctx = bk.ctx
        self.fragments_at_once = max(1, fragments_at_once)
        self.throttle = throttle or UNLIMITED
        self.store = bk.store
        self.window = max(1, window)
        self.timeout = timeout
        self.rng = rng or random.Random()
        self.progress = progress        # callable(entries, nbytes) or None

    # ---- checking --------------------------------------------------------------------
    def bad_members(self, md, alive: set) -> set:
        return {b for b in md.all_bookies() if b not in alive}

    @staticmethod
    def _listed_members(md, alive: set, only=None):
        """``(fragment, index, bookie)`` of each live member (of ``only``, if given) of the
        closed, non-empty fragments: what :meth:`missing_entries` judges, in fragment order."""
        for frag in fragments(md):
            if frag.is_open or frag.is_empty:
                continue
            for i, b in enumerate(frag.ensemble):
                if b in alive and (only is None or b in only):
                    yield frag, i, b

    def members_to_list(self, md, alive: set, only=None) -> list[str]:
        """The bookies :meth:`missing_entries` asks about ``md``'s ledger, each once, in the
        order they are judged."""
        return list(dict.fromkeys(b for _, _, b in self._listed_members(md, alive, only)))

    def request_listings(self, ledger_id: int, bookies) -> dict[str, Future]:
        """Send ``ListEntries`` of the ledger to each of ``bookies`` at once, without waiting:
        ``{bookie: Future of its ListEntriesResponse}``. A request that cannot be sent is a
        Future failed with its BKError (judged like a bookie that did not answer)."""
        answers: dict[str, Future] = {}
        for b in bookies:
            try:
                answers[b] = self.ctx.pool.get(b).list_entries(ledger_id,
                                                               timeout=LIST_ENTRIES_TIMEOUT)
            except BKError as exc:
                answers[b] = Future()
                answers[b].set_exception(exc)
        return answers

    def missing_entries(self, md, alive: set, only=None, answers: dict | None = None) -> dict:
        """``{(segment, index): [entry ids]}`` that live members of closed fragments lack.

        Bookies that do not answer are skipped (unknown, not missing): a fragment is only
        judged against the members that answered. ``only``: restrict to these bookies.
        ``answers``: the requests already sent, :meth:`request_listings` of
        :meth:`members_to_list` with the same ``md``, ``alive`` and ``only`` (a caller
        checking many ledgers keeps many in flight); by default they are sent here, all at
        once, and waited for."""
        if answers is None:
            answers = self.request_listings(md.ledger_id,
                                            self.members_to_list(md, alive, only))
        out = {}
        cache: dict[str, EntryRanges | None] = {}
        for frag, i, b in self._listed_members(md, alive, only):
            if b not in cache:
                try:
                    cache[b] = listed_entries(b, answers[b])
                except BKError as exc:
                    log.info("ledger %d: cannot list entries of %s: %s", md.ledger_id, b, exc)
                    cache[b] = None
            have = cache[b]
            if have is None:
                continue
            lacking = [e for e in frag.entries_of(i, md.ensemble_size, md.write_quorum)
                       if e not in have]
            if lacking:
                out[(frag.segment, i)] = lacking
        return out

    # ---- the driver --------------------------------------------------------------------
    def replicate_ledger(self, ledger_id: int, *, bad=None, target: str | None = None,
                         read_from_bad: bool = False, fence_open: bool = False,
                         repair_missing: bool = False) -> LedgerResult:
        """Repair one ledger.

        ``bad``: bookies to move data away from (default: members that are not registered).
        ``target``: put every copy on this bookie (manual recovery ``--to``); default a
        random writable bookie outside the fragment's ensemble, per fragment.
        ``read_from_bad``: bad bookies that are alive may serve reads (decommission).
        ``fence_open``: an open last fragment with a bad member may be fenced now;
        otherwise the result is :data:`OPEN` when only that fragment is left.
        ``repair_missing``: also copy back entries live members lack.

        :raises NoSuchLedgerError: the ledger was deleted.
        """
        res = LedgerResult(ledger_id, FULL)
        md, _ = ledger_store.read_ledger(self.store, ledger_id)
        preferred: dict = {}            # bad bookie -> replacement already holding entries
        for _attempt in range(8):
            writable, alive = live_bookies(self.store)
            bad_now = set(bad) if bad is not None else self.bad_members(md, alive)
            frags = fragments(md)
            todo = [f for f in frags if bad_now & set(f.ensemble)]
            open_bad = [f for f in todo if f.is_open]
            if open_bad:
                if not fence_open:
                    # copy the closed fragments now; the open one after the grace period
                    todo = [f for f in todo if not f.is_open]
                    res.status = OPEN
                else:
                    log.info("ledger %d: open last fragment includes %s: fencing and "
                             "recovering the ledger before re-replication", ledger_id,
                             sorted(bad_now & set(open_bad[0].ensemble)))
                    try:
                        preferred.update(self._recover(md, bad_now, writable, target))
                    except ReplicationError as exc:
                        log.warning("%s", exc)
                        res.notes.append(str(exc))
                        res.status = PARTIAL
                        fence_open = False
                        todo = [f for f in todo if not f.is_open]
                    else:
                        res.fenced = True
                        md, _ = ledger_store.read_ledger(self.store, ledger_id)
                        continue

            def repair(frag, md=md, bad_now=bad_now, alive=alive, writable=writable):
                """The lost members of one fragment, one after another: (members replaced,
                entries, bytes, error note or None, conflict note or None)."""
                done = n_all = b_all = 0
                for i, b in enumerate(frag.ensemble):
                    if b not in bad_now:
                        continue
                    try:
                        n, nbytes, md = self._replace_member(md, frag, i, bad_now, alive,
                                                             writable, target, read_from_bad,
                                                             preferred.get(b))
                    except ReplicationError as exc:
                        return done, n_all, b_all, str(exc), None
                    except _Conflict as exc:
                        return done, n_all, b_all, None, str(exc)
                    done, n_all, b_all = done + 1, n_all + n, b_all + nbytes
                    frag.ensemble = md.ensembles[frag.segment][1]
                return done, n_all, b_all, None, None

            if len(todo) > 1 and self.fragments_at_once > 1:
                with ThreadPoolExecutor(min(self.fragments_at_once, len(todo)),
                                        thread_name_prefix=f"ledger-{ledger_id}") as pool:
                    outcomes = list(pool.map(repair, todo))
            else:
                outcomes = [repair(frag) for frag in todo]
            conflicts = []
            for done, n, nbytes, error, conflict in outcomes:
                res.fragments_replicated += done
                res.entries += n
                res.bytes += nbytes
                if error is not None:
                    res.notes.append(error)
                    res.status = PARTIAL
                    log.warning("%s", error)
                if conflict is not None:
                    conflicts.append(conflict)
            md, _ = ledger_store.read_ledger(self.store, ledger_id)
            if conflicts:
                log.info("ledger %d: %s; re-planning", ledger_id, "; ".join(conflicts))
                continue
            if repair_missing and res.status != PARTIAL:
                _, alive = live_bookies(self.store)
                md, _ = ledger_store.read_ledger(self.store, ledger_id)
                for (seg, i), lacking in self.missing_entries(md, alive).items():
                    frag = fragments(md)[seg]
                    b = frag.ensemble[i]
                    try:
                        n, nbytes = self._copy(md, frag, i, b, lacking, exclude=set(),
                                               read_from=None)
                        res.entries += n
                        res.bytes += nbytes
                        log.info("ledger %d: copied %d missing entries back to %s", ledger_id,
                                 n, b)
                    except ReplicationError as exc:
                        res.notes.append(str(exc))
                        res.status = PARTIAL
            return res
        res.status = PARTIAL
        res.notes.append("metadata kept changing while re-replicating")
        return res

    # ---- one fragment member ------------------------------------------------------------
    def _replace_member(self, md, frag: Fragment, index: int, bad: set, alive: set,
                        writable: dict, target: str | None, read_from_bad: bool,
                        preferred: str | None = None):
        old = frag.ensemble[index]
        if target is None and preferred is not None and preferred in writable \
                and preferred not in frag.ensemble and preferred not in bad:
            target = preferred
        if target is not None:
            if target in frag.ensemble:
                raise ReplicationError(
                    f"{frag}: target bookie {target} is already a member of this fragment")
            if target not in writable:
                raise ReplicationError(f"{frag}: target bookie {target} is not a registered "
                                       "writable bookie")
            new = target
        else:
            candidates = {b: info for b, info in writable.items() if b not in bad}
            try:
                new = choose_replacement(candidates, frag.ensemble, index, exclude=bad,
                                         rng=self.rng)
            except NotEnoughBookiesError as exc:
                raise ReplicationError(f"{frag}: no bookie to replace {old}: {exc}") from None
        entries = frag.entries_of(index, md.ensemble_size, md.write_quorum)
        n = nbytes = 0
        if entries:
            readable = (alive - bad) | ((alive & bad) if read_from_bad else set())
            n, nbytes = self._copy(md, frag, index, new, entries, exclude=bad - readable,
                                   read_from=readable)
        md = self._swap(md.ledger_id, frag, index, old, new)
        log.info("ledger %d: fragment %d..%s member %d %s -> %s (%d entries, %d bytes)",
                 md.ledger_id, frag.first, frag.last, index, old, new, n, nbytes)
        return n, nbytes, md

    def _swap(self, ledger_id: int, frag: Fragment, index: int, old: str, new: str):
        """CAS ``new`` into the fragment's metadata (the metadata update loop: re-read and
        re-check on conflicts; a lost answer is settled from the stored record)."""

        def swapped(md) -> bool:
            now = fragments(md)
            return (frag.segment < len(now) and now[frag.segment].first == frag.first
                    and now[frag.segment].ensemble[index] == new)

        def transform(md):
            now = fragments(md)
            if frag.segment >= len(now) or now[frag.segment].first != frag.first:
                raise _Conflict(f"fragment at entry {frag.first} changed")
            cur = now[frag.segment]
            if cur.ensemble[index] != old:
                raise _Conflict(f"member {index} of fragment {frag.first} is now "
                                f"{cur.ensemble[index]}, not {old}")
            if cur.last != frag.last:
                raise _Conflict(f"fragment at entry {frag.first} now ends at {cur.last}, "
                                f"not {frag.last}")
            if new in cur.ensemble:
                raise _Conflict(f"{new} joined fragment {frag.first} meanwhile")
            return md.with_replaced_bookie(frag.first, index, new)

        try:
            return ledger_store.update_ledger(
                self.store, ledger_id, transform, done=swapped,
                what=f"ledger {ledger_id}: fragment {frag.first} member {index}").value
        except MetadataError as exc:
            if isinstance(exc, MetadataConnectionError):
                raise
            raise ReplicationError(f"{frag}: metadata update failed: {exc}") from exc

    # ---- copying entries ----------------------------------------------------------------
    def _copy(self, md, frag: Fragment, index: int, target: str, entries: list[int],
              exclude: set, read_from) -> tuple[int, int]:
        """Copy ``entries`` (of member ``index``) from the other members of each entry's write
        set to ``target`` with RECOVERY_ADD. Returns (entries, bytes)."""
        lid = md.ledger_id
        e, qw = md.ensemble_size, md.write_quorum
        ens = frag.ensemble
        sources = {b for b in ens if b != ens[index] and b != target and b not in exclude
                   and (read_from is None or b in read_from)}
        if read_from is not None and ens[index] in read_from and ens[index] != target:
            sources.add(ens[index])       # decommission: the leaving bookie can serve too
        holdings: dict[str, EntryRanges | None] = {}
        for b in sources:
            try:
                holdings[b] = list_entries(self.ctx, b, lid)
            except BKError:
                holdings[b] = None      # unknown: may still try to read from it
        keys = md.keys.stored_keys()        # no password here: the record's keys
        digest = DigestManager(lid, md.digest_type, keys.mac_key)
        mk = keys.master_key

        def candidates(x: int) -> list[str]:
            ws = quorum.write_set_bookies(x, ens, qw) if qw < e else list(ens)
            if ens[index] not in ws:
                ws.append(ens[index])
            cands = [b for b in ws if b in sources]
            have = [b for b in cands if holdings.get(b) is not None and x in holdings[b]]
            unknown = [b for b in cands if holdings.get(b) is None]
            return have + unknown

        adds = RecoveryAdds(self.ctx, lid, mk, timeout=self.timeout,
                            retry_delay=self.ctx.conf.overload_retry_delay, batch=ADD_BATCH)
        # entries sent and not yet acknowledged: a window over the stream, ``window`` unary
        max_entries = MAX_UNACKED if adds.streamed else self.window
        unacked: deque = deque()        # (write-back, bytes)
        held = copied = nbytes = 0
        try:
            for x, body in self._fetch(lid, entries, candidates, digest, e,
                                       self._piece(md)):
                self.throttle.acquire(len(body))
                unacked.append((adds.add(x, body, [target], 1), len(body)))
                held += len(body)
                copied += 1
                nbytes += len(body)
                if self.progress is not None:
                    self.progress(1, len(body))
                while unacked and unacked[0][0].done:       # a refusal stops the copy early
                    held -= self._acked(lid, target, *unacked.popleft())
                if len(unacked) > max_entries or held > MAX_UNACKED_BYTES:
                    adds.flush()
                    while len(unacked) > max_entries // 2 or held > MAX_UNACKED_BYTES // 2:
                        held -= self._acked(lid, target, *unacked.popleft())
            adds.flush()
            while unacked:
                self._acked(lid, target, *unacked.popleft())
        finally:
            adds.close()
        return copied, nbytes

    @staticmethod
    def _acked(lid: int, target: str, wb, size: int) -> int:
        """Wait for ``target``'s answer to the copy of ``wb``; return its size in bytes.
        :raises ReplicationError: it did not take the entry."""
        if not (wb.done and wb.ok) and not wb.wait():
            raise ReplicationError(f"ledger {lid} entry {wb.entry_id}: {target} did not take "
                                   f"the recovery add ({'; '.join(wb.notes())})")
        return size

    def _piece(self, md) -> int:
        """Entries a ranged read asks for at once: about :data:`PIECE_BYTES` of the ledger's
        average entry, fewer under a byte rate limit (one piece must arrive well within the
        read timeout at that rate)."""
        avg = md.length / (md.last_entry_id + 1) if md.last_entry_id >= 0 and md.length else 0
        budget = PIECE_BYTES
        at_rate = self.throttle.seconds_for(PIECE_BYTES)
        if at_rate is not None and at_rate > self.timeout / 4:
            budget = int(PIECE_BYTES * (self.timeout / 4) / at_rate)
        return max(MIN_STREAM, min(MAX_PIECE_ENTRIES, int(budget // max(avg, 1))))

    def _fetch(self, lid, entries, candidates, digest, step: int, piece: int):
        """Yield ``(entry_id, body)`` for ``entries`` in order, each digest-checked.

        A bookie holds the entries of a fragment in residue classes mod E (entry ``x`` is
        written to the write set that starts at member ``x mod E``), so ``entries`` are cut
        into arithmetic runs ``x, x+E, x+2E, ...`` of one class (``step`` = E) and each run
        is streamed with ranged reads (``ReadRange`` with that step, over the bookie's data
        port: the Spark reader's path) from a surviving member of its write set; the runs
        are spread over those members so that every surviving bookie sends at once. A
        stream that stops (an error, a gap, a digest mismatch) continues on the class's next
        member, and what no member streamed is read entry by entry from any replica. The
        streams are merged in entry order, each pulled as the writes consume it, so at most
        a range chunk of each is held."""
        load: dict[str, int] = {}
        streams = []
        singles: list[int] = []
        for first, count in _arithmetic_runs(entries, step):
            cands = candidates(first)
            if not cands:
                raise ReplicationError(f"ledger {lid} entry {first}: no surviving replica to "
                                       "read it from")
            if count < MIN_STREAM:
                singles.extend(range(first, first + count * step, step))
                continue
            members = sorted(cands, key=lambda b: (load.get(b, 0), cands.index(b)))
            load[members[0]] = load.get(members[0], 0) + 1
            streams.append(self._stream(lid, first, count, members, candidates, digest, step,
                                        piece))
        if singles:
            streams.append(self._singles(lid, sorted(singles), candidates, digest))
        try:
            yield from heapq.merge(*streams, key=lambda item: item[0])
        finally:
            for stream in streams:
                stream.close()

    def _stream(self, lid, first, count, members, candidates, digest, step, piece):
        """``(x, body)`` for ``first, first+step, ...`` (``count`` entries): ranged reads of
        at most ``piece`` entries from ``members[0]``, going on from the next member where
        one stops; the rest, if every member stopped, entry by entry."""
        last = first + (count - 1) * step
        nxt = first
        for bookie in members:
            try:
                while nxt <= last:
                    hi = min(last, nxt + (piece - 1) * step)
                    start = nxt
                    for x, body in self.ctx.pool.get(bookie).read_range(
                            lid, nxt, hi, step=step, timeout=self.timeout):
                        if x != nxt:
                            raise DigestMismatchError(f"sent entry {x}, expected {nxt}")
                        digest.verify(body, x)
                        yield x, body
                        nxt += step
                    if nxt == start:
                        raise ReplicationError(f"range {start}..{hi} came back empty")
                return
            except BKError as exc:
                log.info("ledger %d: range read of entries %d..%d (step %d) from %s stopped at "
                         "%d: %s", lid, first, last, step, bookie, nxt, exc)
        yield from self._singles(lid, range(nxt, last + 1, step), candidates, digest)

    def _singles(self, lid, entries, candidates, digest):
        """``(x, body)`` for ``entries`` read one by one (``window`` in flight), each from its
        first candidate, falling over to the others."""
        pending: deque = deque()
        try:
            for x in entries:
                cands = candidates(x)
                if not cands:
                    raise ReplicationError(f"ledger {lid} entry {x}: no surviving replica to "
                                           "read it from")
                pending.append((x, cands, self._read(cands[0], lid, x)))
                while len(pending) > self.window:
                    x0, c0, fut = pending.popleft()
                    yield x0, self._await_read(lid, x0, fut, c0, digest)
            while pending:
                x0, c0, fut = pending.popleft()
                yield x0, self._await_read(lid, x0, fut, c0, digest)
        finally:
            for _, _, fut in pending:
                fut.cancel()

    def _read(self, bookie, lid, x):
        """A future of one entry read (its errors are the client's: BKError)."""
        return self.ctx.pool.get(bookie).read(lid, x, timeout=self.timeout)

    def _await_read(self, lid, x, fut, cands, digest) -> bytes:
        notes = []
        tried = 0
        while True:
            who = cands[tried] if tried < len(cands) else "?"
            try:
                resp = fut.result()
                if resp.status == errors.EOK:
                    digest.verify(resp.body, x)
                    return bytes(resp.body)
                notes.append(f"{who}: {errors.status_name(resp.status)}")
            except BKError as exc:      # (a transport error too: unknown, try another)
                notes.append(f"{who}: {exc}")
            tried += 1
            if tried >= len(cands):
                raise ReplicationError(f"ledger {lid} entry {x}: no replica could serve it "
                                       f"({'; '.join(notes)})")
            fut = self._read(cands[tried], lid, x)

    # ---- recovery of an open ledger -------------------------------------------------------
    def _recover(self, md, bad: set, writable: dict, target: str | None) -> dict:
        """Fence and close the ledger (the client's quorum-coverage recovery: no
        truncation). Recovered entries are written back to their write sets with the bad
        members substituted by replacements (the client's own write-back would need the
        dead bookie: with Qw == Qa it could never complete). Returns the substitutions, to
        be reused as the replacements of the last fragment."""
        last = md.last_ensemble()
        subst = {}
        for i, b in enumerate(last):
            if b in bad:
                if target is not None and target not in last:
                    subst[b] = target
                    continue
                candidates = {x: info for x, info in writable.items()
                              if x not in bad and x not in subst.values()}
                try:
                    subst[b] = choose_replacement(candidates, [subst.get(x, x) for x in last],
                                                  i, exclude=bad, rng=self.rng)
                except NotEnoughBookiesError as exc:
                    raise ReplicationError(f"ledger {md.ledger_id}: no bookie to write "
                                           f"recovered entries to instead of {b}: {exc}") from None
        try:
            cur, version = ledger_store.read_ledger(self.store, md.ledger_id)
            if cur.state is not LedgerState.CLOSED:
                LedgerRecovery(self.ctx, md.ledger_id, cur.keys.stored_keys(),
                               substitutes=subst).run(cur, version)
        except BKError as exc:
            raise ReplicationError(f"ledger {md.ledger_id}: fencing/recovery failed: {exc}") \
                from None
        return subst


class _Conflict(Exception):
    pass


def wait_for(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
