"""The read handle: entry reads with replica fall-over and speculation, LAC reads, tailing.

* an entry is read from a bookie of its write set; an error, a NoSuchEntry or a digest
  mismatch makes the read fall over to the next replica, and if a replica has not answered
  within ``speculative_read_timeout`` a second replica is asked too (first good answer wins);
* a range whose fragment is fully replicated on each member (Qw == E) is read with one
  streaming ``ReadRange`` per fragment; otherwise entries are read one by one with a window
  of requests in flight;
* :class:`RangeBatch` sends the ranged requests of many small ledgers' reads together: one
  send and one data-port connection per bookie, answered in order;
* :meth:`ReadHandle.read` stops at the LAC (or the last entry of a closed ledger); entries
  beyond it are only for the tailing APIs (:meth:`read_lac_long_poll`,
  :meth:`read_unconfirmed`).
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from bkspark import errors
from bkspark.errors import (BadRequestError, BKError, BookieUnavailableError,
                            DigestMismatchError, NoSuchEntryError)
from bkspark.proto import wire
from metadata.ledger_metadata import LedgerState

from . import quorum
from .digest import DigestManager, peek_header
from .lac import lac_of, read_lac

log = logging.getLogger("bkspark.client.read")


class LedgerEntry:
    """One entry read from a ledger (its digest verified).

    ``data`` is the payload as ``bytes``, copied out of the received message on first use;
    ``view`` is the same payload as a read-only memoryview of the received message, without
    a copy -- for readers that only pass the bytes on (Arrow IPC decoding, for one). A view
    keeps the whole received message (up to a range chunk, a few MiB) alive while referenced.
    ``length`` is the cumulative ledger length up to and including this entry.
    """

    __slots__ = ("ledger_id", "entry_id", "length", "_view", "_data")

    def __init__(self, ledger_id: int, entry_id: int, data, length: int = 0):
        self.ledger_id, self.entry_id, self.length = ledger_id, entry_id, length
        self._data, self._view = (data, None) if isinstance(data, bytes) else (None, data)

    @property
    def data(self) -> bytes:
        if self._data is None:
            self._data = bytes(self._view)
        return self._data

    @property
    def view(self) -> memoryview:
        return self._view if self._view is not None else memoryview(self._data)

    def __len__(self):
        return len(self._data) if self._data is not None else len(self._view)

    def __eq__(self, other):
        if not isinstance(other, LedgerEntry):
            return NotImplemented
        return ((self.ledger_id, self.entry_id, self.length, self.view)
                == (other.ledger_id, other.entry_id, other.length, other.view))

    __hash__ = None

    def __repr__(self):
        return (f"LedgerEntry(ledger_id={self.ledger_id}, entry_id={self.entry_id}, "
                f"{len(self)} bytes, length={self.length})")


class _EntryRead:
    """Read of one entry from its write set: fall-over and speculative retries."""

    def __init__(self, rh: "ReadHandle", entry_id: int, bookies: list[str], flags: int = 0):
        self.rh = rh
        self.entry_id = entry_id
        # replicas that recently failed or were slow are asked last
        self.bookies = rh._ctx.health.order(bookies)
        self.flags = flags
        self.future: Future = Future()
        self._next = 0
        self._outstanding = 0
        self._errors: list[BKError] = []
        self._lock = threading.Lock()

    def start(self) -> Future:
        self._send_next()
        return self.future

    def _send_next(self) -> bool:
        with self._lock:
            if self.future.done() or self._next >= len(self.bookies):
                return False
            b = self.bookies[self._next]
            self._next += 1
            self._outstanding += 1
        conf = self.rh._ctx.conf
        mk = self.rh._master_key if self.flags & wire.FENCE_LEDGER else b""
        f = self.rh._ctx.pool.get(b).read(self.rh.ledger_id, self.entry_id, flags=self.flags,
                                          master_key=mk, timeout=conf.read_timeout)
        f.add_done_callback(lambda fut, b=b: self._on_response(b, fut))
        return True

    def _speculate(self):
        if not self.future.done():
            with self._lock:
                slow = self.bookies[self._next - 1] if self._next else None
            if slow is not None:
                self.rh._ctx.health.suspect(slow)
            self._send_next()

    def _on_response(self, bookie: str, fut: Future):
        try:
            resp = fut.result()
            if resp.status != errors.EOK:
                raise errors.error_for_status(
                    resp.status, f"bookie {bookie}: {errors.status_name(resp.status)} reading "
                    f"entry {self.entry_id} of ledger {self.rh.ledger_id}")
            eid, lac, length, payload = self.rh._digest.verify(resp.body, self.entry_id)
            entry = LedgerEntry(self.rh.ledger_id, eid, payload, length)
        except BKError as exc:
            if isinstance(exc, DigestMismatchError):
                log.warning("ledger %d entry %d from %s: %s; trying another replica",
                            self.rh.ledger_id, self.entry_id, bookie, exc)
            if not isinstance(exc, (errors.NoSuchEntryError, errors.NoSuchLedgerError)):
                self.rh._ctx.health.suspect(bookie)
            with self._lock:
                self._outstanding -= 1
                self._errors.append(exc)
                outstanding = self._outstanding
            if not self._send_next() and outstanding == 0:
                self._fail()
            return
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self._outstanding -= 1
                self._errors.append(BKError(repr(exc)))
            if not self._send_next() and self._outstanding == 0:
                self._fail()
            return
        with self._lock:
            self._outstanding -= 1
        if not self.future.done():
            try:
                self.future.set_result(entry)
            except Exception:  # noqa: BLE001 - lost a race with another replica
                pass
            self.rh._saw_lac(lac)

    def _fail(self):
        errs = self._errors
        if errs and all(isinstance(e, (errors.NoSuchEntryError, errors.NoSuchLedgerError))
                        for e in errs):
            exc: BKError = NoSuchEntryError(
                f"ledger {self.rh.ledger_id}: entry {self.entry_id} not found on "
                f"{self.bookies}")
        else:
            exc = next((e for e in errs if not isinstance(
                e, (errors.NoSuchEntryError, errors.NoSuchLedgerError))), None) or BKError(
                f"ledger {self.rh.ledger_id}: entry {self.entry_id} unreadable")
            exc = type(exc)(f"ledger {self.rh.ledger_id}: entry {self.entry_id} unreadable "
                            f"from every replica {self.bookies}: "
                            + "; ".join(str(e) for e in errs))
        if not self.future.done():
            try:
                self.future.set_exception(exc)
            except Exception:  # noqa: BLE001
                pass


class ReadHandle:
    """Handle for reading a ledger (opened with or without recovery). Thread-safe."""

    def __init__(self, ctx, md, version: int, keys, lac: int | None = None):
        self._ctx = ctx
        self._md = md
        self._version = version
        self.ledger_id = md.ledger_id
        self._digest = DigestManager(md.ledger_id, md.digest_type, keys.mac_key)
        self._master_key = keys.master_key
        if md.state is LedgerState.CLOSED:
            self._lac = md.last_entry_id
        else:
            self._lac = -1 if lac is None else lac
        self._lac_lock = threading.Lock()
        self._closed = False

    # ---- properties ------------------------------------------------------------------------
    @property
    def metadata(self):
        return self._md

    @property
    def is_closed(self) -> bool:
        """True when the ledger's metadata says CLOSED (its end is final)."""
        return self._md.state is LedgerState.CLOSED

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        return self._md.length

    def _saw_lac(self, lac: int):
        if lac > self._lac and not self.is_closed:
            with self._lac_lock:
                if lac > self._lac:
                    self._lac = lac

    # ---- entry reads ---------------------------------------------------------------------
    def read(self, first: int, last: int | None = None, batch: "RangeBatch | None" = None):
        """Iterate the entries ``first..last`` (inclusive; ``last`` defaults to the LAC) in
        order. Entries beyond the LAC are refused (use :meth:`read_unconfirmed`). With
        ``batch``, the ranged requests of the first fragment wait for ``batch.send()`` (to go
        out with other ledgers' together); iterate only after it."""
        if last is None:
            last = self._lac
            if last < first:
                return iter(())
        self._check_range(first, last)
        if last > self._lac:
            if self.is_closed:
                raise NoSuchEntryError(
                    f"ledger {self.ledger_id} is closed at entry {self._md.last_entry_id}; "
                    f"entry {last} does not exist")
            raise BadRequestError(
                f"ledger {self.ledger_id}: entry {last} is beyond the last add confirmed "
                f"({self._lac}); refresh it with read_last_add_confirmed() or tail with "
                "read_lac_long_poll(), or use read_unconfirmed()")
        return self._iter_entries(first, last, batch)

    def read_all(self, first: int = 0, last: int | None = None) -> list[LedgerEntry]:
        return list(self.read(first, last))

    def read_async(self, first: int, last: int | None = None) -> Future:
        """Future of the list of entries ``first..last``."""
        it = self.read(first, last)
        return self._ctx.executor.submit(list, it)

    def read_unconfirmed(self, first: int, last: int, batch: "RangeBatch | None" = None):
        """Iterate entries ``first..last`` without the LAC bound (tailing; an entry beyond the
        LAC may still be dropped by recovery). ``batch``: as :meth:`read`'s."""
        self._check_range(first, last)
        return self._iter_entries(first, last, batch)

    def read_entry(self, entry_id: int) -> LedgerEntry:
        return next(iter(self.read(entry_id, entry_id)))

    def _check_range(self, first, last):
        if not isinstance(first, int) or not isinstance(last, int) or first < 0:
            raise BadRequestError(f"bad entry range {first!r}..{last!r}")
        if last < first:
            raise BadRequestError(f"bad entry range {first}..{last}: last < first")

    def _segments(self, first: int, last: int):
        """(seg_first, seg_last, ensemble) pieces of first..last by fragment."""
        ens = self._md.ensembles
        for i, (start, bookies) in enumerate(ens):
            end = ens[i + 1][0] - 1 if i + 1 < len(ens) else None
            lo = max(first, start)
            hi = last if end is None else min(last, end)
            if lo <= hi:
                yield lo, hi, list(bookies)

    def _iter_entries(self, first: int, last: int, batch=None):
        """The entries ``first..last`` in order (lazily); counted when the client keeps
        metrics (without them no generator layer is added to the read path)."""
        entries = self._entries(first, last, batch)
        metrics = self._ctx.metrics
        return entries if metrics is None else _counted(entries, metrics.read_entries)

    def _entries(self, first: int, last: int, batch=None):
        """The entries first..last in order. The requests of the first fragment are sent
        now (a reader may start the next ledgers' reads before it iterates this one), or
        with ``batch``; later fragments' when the iteration reaches them."""
        segments = list(self._segments(first, last))
        if not segments:
            return iter(())
        return itertools.chain(self._segment(*segments[0], batch), itertools.chain.from_iterable(
            self._segment(*segment) for segment in segments[1:]))

    def _segment(self, lo: int, hi: int, ensemble: list[str], batch=None):
        """Entries lo..hi of one fragment. A short fragment alone is read entry by entry
        (a few single reads cost less than a stream from each bookie); in a ``batch`` it is
        streamed too, since its requests share a send with the other ranges' (a gRPC read
        costs ~1 ms of client CPU: 2026-11-28, bench/many_logs.py, 1,000 logs x 2 ledgers x
        3 entries read in 1.3-2.6 s instead of 4.1-6.8 s). Streamed, it falls over as every
        range does: after ``read_range_timeout``, with no speculative read."""
        short = hi - lo < 2 * len(ensemble)
        if not self._ctx.conf.use_read_range or (short and batch is None):
            return self._read_window(lo, hi, ensemble)
        if self._md.write_quorum == len(ensemble):
            return self._read_range_segment(lo, hi, ensemble, batch)
        return self._read_striped_segment(lo, hi, ensemble, batch)

    def _read_one_op(self, entry_id: int, ensemble: list[str], flags: int = 0) -> _EntryRead:
        bookies = quorum.write_set_bookies(entry_id, ensemble, self._md.write_quorum)
        op = _EntryRead(self, entry_id, bookies, flags)
        op.start()
        return op

    def _read_window(self, lo: int, hi: int, ensemble: list[str]):
        """Per-entry reads with ``read_window`` in flight (the first window sent now),
        yielded in order."""
        inflight: deque = deque()
        self._fill_window(inflight, lo, hi, ensemble)
        return self._window(inflight, lo + len(inflight), hi, ensemble)

    def _fill_window(self, inflight: deque, nxt: int, hi: int, ensemble: list[str]) -> int:
        while nxt <= hi and len(inflight) < self._ctx.conf.read_window:
            inflight.append((time.monotonic(), self._read_one_op(nxt, ensemble)))
            nxt += 1
        return nxt

    def _window(self, inflight: deque, nxt: int, hi: int, ensemble: list[str]):
        """Speculation is driven from here (no timer per read): when the oldest read is not
        answered within ``speculative_read_timeout``, every read that old also asks its
        next replica."""
        spec = self._ctx.conf.speculative_read_timeout or None
        try:
            while inflight:
                t0, op = inflight[0]
                while True:
                    try:
                        entry = op.future.result(timeout=spec)
                        break
                    except FutureTimeout:
                        now = time.monotonic()
                        for t, other in list(inflight):
                            if now - t >= spec and not other.future.done():
                                other._speculate()
                inflight.popleft()
                nxt = self._fill_window(inflight, nxt, hi, ensemble)
                yield entry
        finally:
            for _, op in inflight:
                op.future.cancel()

    def _read_range_segment(self, lo: int, hi: int, ensemble: list[str], batch=None):
        """Stream lo..hi with ReadRange (Qw == E: every member holds the whole fragment),
        falling over to the next member, then to per-entry reads."""
        k = lo % len(ensemble)
        return (entry for _, entry in self._stream(lo, hi, ensemble[k:] + ensemble[:k], 1,
                                                   ensemble, batch))

    def _read_striped_segment(self, lo: int, hi: int, ensemble: list[str], batch=None):
        """Stream lo..hi of a striped fragment (Qw < E) from all E bookies at once (their
        requests sent now): bookie ``ensemble[r]`` is first in the write set of every entry
        e with e mod E == r, so it streams those (ReadRange with step E). A stream that
        fails continues on the next member of that write set, then entry by entry; entries
        are yielded in order."""
        n, qw = len(ensemble), self._md.write_quorum
        streams = {}
        for r in range(n):
            first = lo + (r - lo) % n
            if first <= hi:
                members = [ensemble[(first + k) % n] for k in range(qw)]
                streams[r] = self._stream(first, hi, members, n, ensemble, batch)
        return self._interleave(streams, lo, hi, n)

    @staticmethod
    def _interleave(streams: dict, lo: int, hi: int, n: int):
        try:
            for eid in range(lo, hi + 1):
                got_id, entry = next(streams[eid % n])
                if got_id != eid:
                    raise DigestMismatchError(f"striped read expected entry {eid}, got {got_id}")
                yield entry
        finally:
            for stream in streams.values():
                stream.close()

    def _stream(self, first: int, hi: int, members: list[str], step: int, ensemble: list[str],
                batch: "RangeBatch | None" = None):
        """(entry_id, LedgerEntry) for first, first+step, ... <= hi: streamed by ReadRange
        from one member (its request sent now, or by ``batch.send()``), continuing on the
        next member when it fails (error, gap, digest mismatch); when every member failed,
        the rest is read entry by entry."""
        order = list(self._ctx.health.order(members))
        started = (self._start_range(order[0], first, hi, step) if batch is None else
                   batch.add(self._ctx, order[0], (self.ledger_id, first, hi, step)))
        return self._streamed(started, order, first, hi, step, ensemble)

    def _start_range(self, bookie: str, first: int, hi: int, step: int):
        """The started range read of ``bookie``, or the BKError that stopped its start."""
        try:
            return self._ctx.pool.get(bookie).read_range(
                self.ledger_id, first, hi, step=step, timeout=self._ctx.conf.read_range_timeout)
        except BKError as exc:
            return exc

    def _streamed(self, started, order: list[str], nxt: int, hi: int, step: int,
                  ensemble: list[str]):
        if isinstance(started, _Batched):
            if started.started is None:
                raise BadRequestError("a batched read was iterated before its RangeBatch was "
                                      "sent: call batch.send() first")
            started = started.started
        for bookie in order:
            try:
                if started is None:
                    started = self._start_range(bookie, nxt, hi, step)
                rng, started = started, None
                if isinstance(rng, BKError):
                    raise rng
                for eid, body in rng:
                    if eid != nxt:
                        raise DigestMismatchError(f"bookie {bookie} sent entry {eid}, expected {nxt}")
                    _, lac, length, payload = self._digest.verify(body, nxt)
                    self._saw_lac(lac)
                    yield eid, LedgerEntry(self.ledger_id, eid, payload, length)
                    nxt += step
                if nxt > hi:
                    return
            except BKError as exc:
                if not isinstance(exc, (errors.NoSuchEntryError, errors.NoSuchLedgerError)):
                    self._ctx.health.suspect(bookie)
                log.info("ledger %d: range read from %s stopped at entry %d (%s); falling over",
                         self.ledger_id, bookie, nxt, exc)
        if step == 1:
            for entry in self._read_window(nxt, hi, ensemble):
                yield entry.entry_id, entry
        else:
            while nxt <= hi:
                yield nxt, self._read_one_op(nxt, ensemble).future.result()
                nxt += step

    # ---- LAC ----------------------------------------------------------------------------
    def _read_lac_round(self, require_coverage: bool) -> int:
        if self.is_closed:
            return self._lac
        md = self._md
        ensemble = md.last_ensemble()
        answers = read_lac(self._ctx, self.ledger_id, ensemble, self._digest)
        if require_coverage and not quorum.rr_coverage(md.ensemble_size, md.write_quorum,
                                                       md.ack_quorum, answers.answered):
            raise BookieUnavailableError(
                f"ledger {self.ledger_id}: too few bookies answered the LAC read "
                f"({len(answers.answered)} of {len(ensemble)}): " + "; ".join(answers.unknown))
        if not answers.answered:
            raise BookieUnavailableError(
                f"ledger {self.ledger_id}: no bookie answered the LAC read: "
                + "; ".join(answers.unknown))
        self._saw_lac(answers.lac)
        return self._lac

    def read_last_add_confirmed(self) -> int:
        """Ask the bookies of the last ensemble for their LAC (needs quorum coverage of
        answers); return the highest and remember it."""
        self._refresh_if_open()
        return self._read_lac_round(require_coverage=True)

    def read_last_add_confirmed_async(self) -> Future:
        return self._ctx.executor.submit(self.read_last_add_confirmed)

    def try_read_last_add_confirmed(self) -> int:
        """Like :meth:`read_last_add_confirmed` but content with any answer."""
        return self._read_lac_round(require_coverage=False)

    def read_lac_long_poll(self, previous: int, timeout: float,
                           wake: threading.Event | None = None) -> int:
        """Wait up to ``timeout`` seconds for the LAC to pass ``previous``; return the LAC
        known then (possibly still ``previous``). A ledger found closed when the wait ends
        (its metadata is re-read then) returns its last entry.

        ``wake``: the event this call waits on, a fresh one per call; the caller may set it
        from another thread to end the wait early (say, a watch saw the ledger's log record
        change: a roll or a takeover closed the ledger, and bookies do not answer a long
        poll for a close). The call sets it too when the wait is over. A bookie that holds
        its limit of long polls answers ETOOMANYREQUESTS: that is no answer, so a reader
        refused by all waits out ``timeout`` before asking again (its back-off)."""
        if self.is_closed or self._lac > previous or (wake is not None and wake.is_set()):
            return self._lac
        md = self._md
        conf = self._ctx.conf
        done = wake if wake is not None else threading.Event()
        lock = threading.Lock()
        asked = len(md.last_ensemble())
        state = {"left": asked, "refused": 0}

        def on_resp(fut):
            refused = False
            try:
                resp = fut.result()
                if resp.status == errors.EOK:
                    self._saw_lac(lac_of(resp, self._digest)[0])
                refused = resp.status == errors.ETOOMANYREQUESTS
            except BKError:
                pass
            with lock:
                state["left"] -= 1
                state["refused"] += refused
                # every bookie answered: done -- unless all of them hold their limit of long
                # polls (ETOOMANYREQUESTS at once): that is no answer, the wait goes on
                if self._lac > previous or (state["left"] == 0 and state["refused"] < asked):
                    done.set()

        for b in md.last_ensemble():
            f = self._ctx.pool.get(b).read(
                self.ledger_id, previous + 1, flags=wire.ENTRY_PIGGYBACK,
                previous_lac=previous, long_poll_ms=int(timeout * 1000),
                timeout=timeout + conf.read_timeout)
            f.add_done_callback(on_resp)
        if not done.wait(timeout) and state["refused"] < asked:
            done.wait(conf.read_timeout)    # the long polls' answers, which take their time
        if self._lac <= previous:
            self._refresh_if_open()
        return self._lac

    def refresh(self, settle: bool = False) -> bool:
        """Re-read the ledger's metadata, unless this handle already knows it CLOSED; return
        :attr:`is_closed`. A handle opened while the ledger was OPEN so learns a close made
        since -- by its writer, or by another client's recovery, which may close it beyond
        every LAC this handle saw -- and then reads up to the closed end (never beyond).
        ``settle``: read after a sync, so every change the metadata store committed before
        this call is seen."""
        self._refresh_if_open(settle)
        return self.is_closed

    def _refresh_if_open(self, settle: bool = False):
        if self._md.state is not LedgerState.CLOSED:
            md, version = self._ctx.read_metadata(self.ledger_id, settle=settle)
            with self._lac_lock:
                if md.state is LedgerState.CLOSED:
                    self._lac = md.last_entry_id    # before the state: is_closed implies it
                self._md, self._version = md, version

    # ---- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> "ReadHandle":
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"ReadHandle(ledger_id={self.ledger_id}, state={self._md.state.value}, "
                f"lac={self._lac})")


class _Batched:
    """A range read of a :class:`RangeBatch`: ``started`` is its iterator, or the BKError
    that stopped its start, once the batch is sent."""

    __slots__ = ("started",)

    def __init__(self):
        self.started = None


class RangeBatch:
    """The range reads of several ledgers' small ranges, sent together: each bookie's in one
    send on one data-port connection (:meth:`BookieClient.read_ranges`), which it answers
    in order. Pass the batch to :meth:`ReadHandle.read` (or ``read_unconfirmed``) for each
    range, then :meth:`send` once, then iterate them -- best in the order they were added
    (a range iterated ahead of the ones added before it holds theirs in memory). Reads that
    are not ranged (per-entry windows, later fragments) go out as they would without it. A
    bookie that cannot be sent to fails its ranges, each falling over as any range does."""

    def __init__(self):
        self._by_bookie: dict = {}

    def add(self, ctx, bookie: str, rng: tuple) -> _Batched:
        """``rng`` = (ledger_id, first, last, step), to be read from ``bookie``."""
        slot = _Batched()
        key = (id(ctx), bookie)
        if key not in self._by_bookie:
            self._by_bookie[key] = (ctx, bookie, [], [])
        _, _, ranges, slots = self._by_bookie[key]
        ranges.append(rng)
        slots.append(slot)
        return slot

    def send(self) -> None:
        by_bookie, self._by_bookie = self._by_bookie, {}
        for ctx, bookie, ranges, slots in by_bookie.values():
            try:
                started = ctx.pool.get(bookie).read_ranges(
                    ranges, timeout=ctx.conf.read_range_timeout)
            except BKError as exc:
                started = [exc] * len(slots)
            for slot, it in zip(slots, started):
                slot.started = it


def _counted(entries, counter):
    """``entries``, counting each one in ``counter`` as it is yielded."""
    for entry in entries:
        counter.inc()
        yield entry


__all__ = ["ReadHandle", "LedgerEntry", "RangeBatch", "peek_header"]
