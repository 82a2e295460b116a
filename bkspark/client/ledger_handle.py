"""The write handle: pipelined adds, LAC-ordered acknowledgement, ensemble change, close.

Protocol (``shared/seeds/protocol.txt``):

* entry ``e`` goes to its write set, the ``Qw`` bookies from index ``e mod E`` of the last
  ensemble; every entry carries ledger id, entry id, the LAC at the time it was framed, the
  cumulative length and a digest (:mod:`bkspark.client.digest`);
* an entry is acknowledged to the application once ``Qa`` bookies of its *current* write set
  acknowledged it **and** every lower entry was acknowledged (acks complete strictly in
  entry order; the LAC is the last acknowledged entry);
* a bookie that fails an add (any error but EFENCED/EUA, a broken stream, or no answer
  within ``add_timeout``) is replaced: placement picks a bookie outside the ensemble, the
  client CASes a new fragment starting at LAC+1 (replacing the last fragment if it already
  starts there), drops acks of replaced bookies and resends every unacknowledged entry to
  the replacement. No ack completes while the change runs. On a CAS conflict the metadata
  is reread: if the ledger is no longer OPEN every pending add fails with FencedError (another
  client is recovering or has closed the ledger), else the change is retried;
* EFENCED / EUA are unrecoverable: every pending add fails with that error (EUA also when a
  bookie refuses this client's credentials: :mod:`bkspark.auth`);
* close CASes CLOSED with last entry = LAC; on conflict: still OPEN -> retry, IN_RECOVERY ->
  error, CLOSED at our LAC -> success, CLOSED elsewhere -> error.

Explicit LAC (how a tailing reader sees the last entry). Every entry carries the LAC known
when it was framed, so the bookies learn that entry ``e`` is confirmed only when a later
entry reaches them: while adds flow, nothing else is needed. When the add stream goes idle
-- an acknowledgement leaves no add pending -- the last entry is confirmed but no bookie
knows. ``explicit_lac_delay`` (ClientConfig) after that moment, if no add was appended
meanwhile (the next add would carry the LAC) and the LAC is beyond every LAC this handle
already sent, the handle sends ``WriteLac(LAC)`` to every bookie of its current ensemble;
bookies store it (journaled) and wake their long-polling readers, so the last entry is
visible about one round trip after the delay. Rules:

* the LAC sent is the handle's LAC: entries up to it were acknowledged by Qa bookies of
  their write sets, in entry order -- a WriteLac never claims an entry that is not
  confirmed, so whatever bookie stores it (even one replaced meanwhile), readers and
  recovery may rely on it (recovery closes at or beyond every confirmed entry);
* none is sent while an ensemble change runs (the LAC does not move then; the change ends
  with acknowledgements, which start the delay again), after the handle failed, or once it
  is closed. One sent while ``close`` runs is harmless: ``close`` refuses appends, so its
  LAC -- the end it records -- is at or beyond any LAC sent before;
* at most one WriteLac round is in flight per handle, so a bookie never gets a lower LAC
  after a higher one from this handle; a LAC that moved while a round was in flight is sent
  when it ends (if the stream is still idle);
* answers are not waited for by appends: a bookie that fails a WriteLac (not running, not
  holding the ledger yet, read-only) is ignored. If no bookie stored the LAC, the handle
  sends it again once idle for ``explicit_lac_interval`` (the only path when the delay is
  0, as before); ``explicit_lac_interval=0`` turns explicit LACs off altogether;
* in steady state (adds keep coming, or come less than the delay apart) no WriteLac is
  sent: a round costs E unary calls and E small journal records, once per idle period.

:meth:`LedgerHandle.flush_lac` does the same synchronously, waiting for the answers.

Memory is bounded: ``append`` blocks while more than ``max_outstanding_bytes`` of
unacknowledged entries are in flight.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from bkspark import errors
from bkspark.errors import (BadRequestError, BKError, BookieUnavailableError, FencedError,
                            LedgerClosedError, NotEnoughBookiesError, OperationTimeoutError)
from bkspark.proto import wire
from metadata.ledger_metadata import LedgerState
from metadata.update import NoChange

from . import placement
from .digest import DigestManager
from .quorum import has_entry, write_set_bookies

log = logging.getLogger("bkspark.client.ledger")

_FATAL = (errors.EFENCED, errors.EUA)
#: errors after which the handle's fate is settled: every later call repeats them. Any other
#: failure (metadata or bookies unreachable, timeouts) is re-checked against the metadata on
#: the next call, which then reports FencedError if another client took the ledger over.
_SETTLED = (FencedError, LedgerClosedError, errors.UnauthorizedError, BadRequestError)


class _PendingAdd:
    __slots__ = ("entry_id", "elem", "size", "length", "acked", "future", "sent", "t0", "trace")

    def __init__(self, entry_id, elem, size, length, future, t0):
        self.entry_id = entry_id
        self.elem = elem            # encoded AddBatch element, resent as is
        self.size = size
        self.length = length        # cumulative ledger length including this entry
        self.acked: set = set()
        self.future = future
        self.sent = False
        self.t0 = t0
        self.trace = None           # its stamps, if the client traces it (add_trace)


class LedgerHandle:
    """Handle of a ledger this client created and writes (single writer).

    Thread-safe. Use as a context manager (closes the ledger on exit).
    """

    def __init__(self, ctx, md, version: int, keys):
        self._ctx = ctx
        self._md = md
        self._version = version
        self.ledger_id = md.ledger_id
        self._E, self._Qw, self._Qa = md.ensemble_size, md.write_quorum, md.ack_quorum
        self._digest = DigestManager(md.ledger_id, md.digest_type, keys.mac_key)
        self._master_key = keys.master_key
        self._prefix = wire.request_prefix(md.ledger_id, self._master_key)
        self._set_ensemble(md.last_ensemble())

        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._pending: deque[_PendingAdd] = deque()
        self._pmap: dict[int, _PendingAdd] = {}
        self._next_id = 0
        self._lac = -1
        self._length = 0            # cumulative length of the last appended entry
        self._lac_length = 0        # cumulative length at the LAC
        self._outstanding = 0
        self._max_outstanding = ctx.conf.max_outstanding_bytes
        self._changing = False
        self._failed: dict[str, BKError] = {}
        self._error: BKError | None = None
        self._closing = False
        self._closed = False
        self._close_future: Future | None = None   # the one close; its outcome is final
        self._done_q: deque = deque()
        self._traced_done: deque = deque()  # traced entries completed, future not yet resolved
        self._cb_lock = threading.Lock()
        self.ensemble_changes = 0
        # explicit LAC (module docstring); every field under _lock
        conf = ctx.conf
        self._lac_delay = conf.explicit_lac_delay if conf.explicit_lac_interval else 0.0
        self._idle_at = 0.0         # when the add stream last went idle (monotonic)
        self._lac_timer = False     # a delayed check is scheduled
        self._lac_sent = -1         # highest LAC a WriteLac round was started with
        self._lac_stored = -1       # highest LAC a bookie answered EOK to
        self._lac_round_at = 0.0    # when the last round started
        self._lac_round = False     # a round is in flight
        self._lac_done = threading.Condition(self._lock)    # ... and ended
        self.explicit_lac_rounds = 0    # WriteLac rounds sent (each to the whole ensemble)
        self._last_append = 0.0
        ctx.pool.register(self.ledger_id, self)
        ctx.register_writer(self)

    # ---- properties --------------------------------------------------------------------
    @property
    def metadata(self):
        return self._md

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def last_add_pushed(self) -> int:
        return self._next_id - 1

    @property
    def length(self) -> int:
        """Cumulative length of the acknowledged entries."""
        return self._lac_length

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def failure(self) -> BKError | None:
        """The error this handle failed with (it takes no more appends), or None."""
        return self._error

    def _set_ensemble(self, ensemble):
        self._ensemble = list(ensemble)
        self._index = {b: i for i, b in enumerate(self._ensemble)}

    def _write_set(self, entry_id: int) -> list[str]:
        return write_set_bookies(entry_id, self._ensemble, self._Qw)

    # ---- appends -----------------------------------------------------------------------
    def append(self, data, timeout: float | None = None) -> int:
        """Append one entry; block until it is acknowledged; return its entry id."""
        return self.append_async(data).result(timeout)

    def append_async(self, data) -> Future:
        """Append one entry; a Future of its entry id (acknowledged in entry order)."""
        fut: Future = Future()
        self._add([data], fut)
        return fut

    def append_many(self, datas, timeout: float | None = None) -> list[int]:
        """Append a batch of entries (pipelined together); block until all are acknowledged;
        return their entry ids."""
        return self.append_many_async(datas).result(timeout)

    def append_many_async(self, datas) -> Future:
        """Future of the list of entry ids of ``datas`` (resolved when the last is acked)."""
        datas = list(datas)
        out: Future = Future()
        if not datas:
            out.set_result([])
            return out
        fut: Future = Future()
        first = self._add(datas, fut)

        def done(f):
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(list(range(first, first + len(datas))))
        fut.add_done_callback(done)
        return out

    def _add(self, datas, fut: Future) -> int:
        """Frame, queue and send ``datas``; ``fut`` resolves with the last entry id."""
        for d in datas:
            if not isinstance(d, (bytes, bytearray, memoryview)):
                raise BadRequestError(f"entry data must be bytes, got {type(d).__name__}")
        if self._error is not None:
            self._settle_failure()
        now = time.monotonic()
        tracer = self._ctx.add_trace
        t_call = time.perf_counter_ns() if tracer is not None else 0
        sends: dict[str, list] = {}
        with self._lock:
            self._check_writable()
            while self._outstanding > self._max_outstanding and self._error is None:
                self._space.wait(1.0)
                self._check_writable()
            t_admitted = time.perf_counter_ns() if tracer is not None else 0
            first = self._next_id
            last_i = len(datas) - 1
            send = not self._changing
            if send:
                # per write-set class (entry_id mod E): the send lists of its bookies
                e = self._E
                classes = [[sends.setdefault(b, []) for b in self._write_set(k)]
                           for k in range(e)]
            pending, pmap = self._pending, self._pmap
            eid, length = self._next_id, self._length
            elems = self._digest.add_elements(self._prefix, eid, self._lac, length, datas)
            t_framed = time.perf_counter_ns() if tracer is not None else 0
            outstanding = 0
            for i, (d, elem) in enumerate(zip(datas, elems)):
                length += len(d)
                p = _PendingAdd(eid, elem, len(elem), length,
                                fut if i == last_i else None, now)
                if tracer is not None and tracer.traced(eid):
                    p.trace = tracer.start(self.ledger_id, eid, elem, t_call, t_admitted,
                                           t_framed)
                pending.append(p)
                pmap[eid] = p
                outstanding += p.size
                if send:
                    p.sent = True
                    for lst in classes[eid % e]:
                        lst.append(elem)
                eid += 1
            self._next_id, self._length = eid, length
            self._outstanding += outstanding
            self._last_append = now
        self._send(sends)
        return first

    def _settle_failure(self) -> None:
        """After a failure that does not settle the handle's fate (a transport or metadata
        error), read the metadata again (synced): if another client marked the ledger
        IN_RECOVERY or closed it, the handle was fenced and says so from now on. While the
        metadata store does not answer, the error stays as it is."""
        exc = self._error
        if exc is None or isinstance(exc, _SETTLED):
            return
        try:
            md, _ = self._ctx.read_metadata(self.ledger_id, settle=True)
        except BKError as read_exc:
            log.debug("ledger %d: metadata not readable yet: %s", self.ledger_id, read_exc)
            return
        if md.state is LedgerState.OPEN:
            return
        with self._lock:
            if self._error is exc:
                self._error = self._not_open_error(md)

    def _check_writable(self):
        if self._error is not None:
            raise self._error
        if self._closing or self._closed:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")

    def _send(self, sends: dict):
        for b, elems in sends.items():
            try:
                self._ctx.pool.get(b).send_adds(elems)
            except BKError as exc:
                self.on_bookie_failed(b, exc)

    # ---- acks --------------------------------------------------------------------------
    def on_add_responses(self, bookie_id: str, items) -> None:
        """Acks of ``bookie_id`` for ``[(entry_id, status), ...]`` (called by its stream)."""
        e, qw = self._E, self._Qw
        fatal = None
        retry = None
        with self._lock:
            idx = self._index.get(bookie_id)
            failed = False
            pmap = self._pmap
            for eid, status in items:
                p = pmap.get(eid)
                if p is None:
                    continue
                if status == 0:
                    # only acks of a current write-set member count
                    if idx is not None and has_entry(idx, eid, e, qw):
                        p.acked.add(bookie_id)
                        if p.trace is not None:
                            self._ctx.add_trace.acked(p.trace, len(p.acked) == self._Qa)
                elif status == errors.ETOOMANYREQUESTS:
                    # overloaded, not broken: resend to the same bookie a little later
                    # (if it never accepts, the add timeout replaces it)
                    if idx is not None and has_entry(idx, eid, e, qw):
                        if retry is None:
                            retry = []
                        retry.append(p.elem)
                elif status in _FATAL:
                    fatal = errors.error_for_status(
                        status, f"ledger {self.ledger_id}: bookie {bookie_id} answered "
                        f"{errors.status_name(status)} for entry {eid}"
                        + (" (the ledger was fenced by a recovering client)"
                           if status == errors.EFENCED else " (wrong password)"))
                    break
                elif idx is not None:
                    failed = True
                    err = errors.error_for_status(
                        status, f"bookie {bookie_id}: {errors.status_name(status)} on add")
            if fatal is not None:
                self._fail_all(fatal)
            elif failed:
                self._bookie_failed_locked(bookie_id, err)
            else:
                self._complete_locked()
        self._run_callbacks()
        if retry and fatal is None:
            self._ctx.scheduler.schedule(
                self._ctx.conf.overload_retry_delay,
                lambda: self._send({bookie_id: retry}) if self._index.get(bookie_id) is not None
                and self._error is None else None)

    def on_bookie_failed(self, bookie_id: str, error: BKError) -> None:
        fatal = isinstance(error, errors.UnauthorizedError)   # EUA: as an answer's (_FATAL)
        with self._lock:        # (a backlogged bookie is replaced even with nothing pending:
                                # what was queued for it is lost to it)
            if bookie_id in self._index and (
                    self._pending or isinstance(error, errors.BookieBackloggedError)):
                if fatal:
                    self._fail_all(error)
                else:
                    self._bookie_failed_locked(bookie_id, error)
        if fatal:
            self._run_callbacks()

    def _complete_locked(self):
        if self._changing:
            return
        pending, qa = self._pending, self._Qa
        popped = False
        metrics = self._ctx.metrics
        now = time.monotonic() if metrics is not None else 0.0
        while pending and len(pending[0].acked) >= qa:
            p = pending.popleft()
            del self._pmap[p.entry_id]
            if metrics is not None:
                metrics.added(now - p.t0, p.size)
            if p.trace is not None and self._ctx.add_trace is not None:
                self._ctx.add_trace.completed(p.trace)
                self._traced_done.append(p.trace)
            self._lac = p.entry_id
            self._lac_length = p.length
            self._outstanding -= p.size
            popped = True
            if p.future is not None:
                self._done_q.append((p.future, p.entry_id, None))
        if popped:
            self._space.notify_all()
            if not pending and self._lac_delay:
                # the add stream went idle: publish the LAC after the delay unless an add
                # comes first (it carries the LAC)
                self._idle_at = time.monotonic()
                if not self._lac_timer:
                    self._lac_timer = True
                    self._ctx.scheduler.schedule(self._lac_delay, self._on_lac_timer)

    def _run_callbacks(self):
        dq = self._done_q
        if not dq:
            return
        with self._cb_lock:         # resolve futures strictly in entry order
            while dq:
                try:
                    fut, eid, exc = dq.popleft()
                except IndexError:
                    break
                if fut.done():
                    continue
                if exc is None:
                    fut.set_result(eid)
                else:
                    fut.set_exception(exc)
                traced = self._traced_done
                if traced and exc is None and self._ctx.add_trace is not None:
                    covered = []
                    while traced and traced[0].entry_id <= eid:
                        covered.append(traced.popleft())
                    self._ctx.add_trace.called_back(covered)

    def _fail_all(self, exc: BKError):
        """Unrecoverable: fail every pending add and refuse further ones (lock held)."""
        if self._error is None:
            self._error = exc
            if self._pending:
                log.warning("ledger %d: write handle failed: %s", self.ledger_id, exc)
        for p in self._pending:
            if p.future is not None:
                self._done_q.append((p.future, p.entry_id, exc))
        if self._ctx.add_trace is not None:
            self._ctx.add_trace.forget([p.trace for p in self._pending if p.trace is not None])
        self._pending.clear()
        self._pmap.clear()
        self._outstanding = 0
        self._failed.clear()
        self._space.notify_all()

    def _abort(self, exc: BKError) -> None:
        """Fail every pending add and refuse new ones (the client is going away)."""
        with self._lock:
            self._fail_all(exc)
        self._run_callbacks()

    # ---- timeouts ------------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        """Called periodically: bookies that left an add unanswered too long are failed."""
        timeout = self._ctx.conf.add_timeout
        self._maybe_write_explicit_lac(now)
        with self._lock:
            if not self._pending or self._changing or self._error is not None:
                return
            slow = set()
            for p in self._pending:
                if now - p.t0 < timeout:
                    break
                if p.sent and len(p.acked) < self._Qa:
                    slow.update(b for b in self._write_set(p.entry_id) if b not in p.acked)
            for b in slow:
                self._ctx.health.suspect(b)
                self._bookie_failed_locked(b, OperationTimeoutError(
                    f"bookie {b}: add not acknowledged within {timeout}s"))

    def _maybe_write_explicit_lac(self, now: float) -> None:
        """The periodic path (from :meth:`_tick`): idle for ``explicit_lac_interval`` and no
        bookie stored the LAC -- the delayed send is off (``explicit_lac_delay=0``) or no
        bookie accepted it -- send it; at most once per interval."""
        interval = self._ctx.conf.explicit_lac_interval
        if not interval:
            return
        with self._lock:
            lac = self._lac
            if (lac <= self._lac_stored or self._pending or self._changing or self._lac_round
                    or self._error is not None or self._closed
                    or now - max(self._last_append, self._lac_round_at) < interval):
                return
            ensemble = self._start_lac_round_locked(lac, now)
        self._send_lac(lac, ensemble)

    def _on_lac_timer(self) -> None:
        """``explicit_lac_delay`` after the add stream went idle (the scheduler's thread)."""
        with self._lock:
            self._lac_timer = False
            lac = self._lac
            if (self._pending or self._changing or lac <= self._lac_sent
                    or self._error is not None or self._closed):
                return      # adds in flight carry the LAC (their acks start a new delay),
                            # or it was sent, or the handle is done
            if self._lac_round:
                return      # sent when the round in flight ends
            now = time.monotonic()
            wait = self._idle_at + self._lac_delay - now
            if wait > 0:    # idle again, more recently than when the timer was set
                self._lac_timer = True
                self._ctx.scheduler.schedule(wait, self._on_lac_timer)
                return
            ensemble = self._start_lac_round_locked(lac, now)
        self._send_lac(lac, ensemble)

    def _start_lac_round_locked(self, lac: int, now: float) -> list[str]:
        self._lac_round = True
        self._lac_sent = max(self._lac_sent, lac)
        self._lac_round_at = now
        self.explicit_lac_rounds += 1
        return list(self._ensemble)

    def _send_lac(self, lac: int, ensemble: list[str]) -> list:
        """Send WriteLac(lac) to ``ensemble``; the round ends when every bookie answered (or
        failed). Returns ``[(bookie, future)]``."""
        body = self._digest.frame_lac(lac)
        timeout = self._ctx.conf.read_timeout
        futs = []
        for b in ensemble:
            try:
                f = self._ctx.pool.get(b).write_lac(self.ledger_id, lac, self._master_key, body,
                                                    timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - the client is closing: a failed answer
                f = Future()
                f.set_exception(exc)
            futs.append((b, f))
        left = [len(futs)]
        stored = [False]
        guard = threading.Lock()

        def answered(f):
            try:
                ok = f.result().status == errors.EOK
            except Exception:  # noqa: BLE001 - a bookie that failed: ignored
                ok = False
            with guard:
                stored[0] = stored[0] or ok
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._lac_round_ended(lac, stored[0])

        for _, f in futs:
            f.add_done_callback(answered)
        return futs

    def _lac_round_ended(self, lac: int, stored: bool) -> None:
        with self._lock:
            self._lac_round = False
            if stored:
                self._lac_stored = max(self._lac_stored, lac)
            self._lac_done.notify_all()
            again = (self._lac_delay and self._lac > self._lac_sent and not self._pending
                     and not self._lac_timer)
            if again:       # the LAC moved while the round was in flight
                self._lac_timer = True
        if again:
            self._on_lac_timer()

    # ---- ensemble change -----------------------------------------------------------------
    def _bookie_failed_locked(self, bookie_id: str, error: BKError):
        if self._error is not None or bookie_id not in self._index:
            return
        self._failed[bookie_id] = error
        if not self._changing:
            self._changing = True
            self._ctx.executor.submit(self._ensemble_change_loop)

    def _ensemble_change_loop(self):
        try:
            while True:
                with self._lock:
                    failed = {b: e for b, e in self._failed.items() if b in self._index}
                    self._failed.clear()
                    if not failed or self._error is not None:
                        self._changing = False
                        sends = self._sends_after_change_locked(set())
                        self._complete_locked()
                        break
                    lac = self._lac
                for b in failed:
                    self._ctx.health.suspect(b)
                log.info("ledger %d: replacing %s (%s) at entry %d", self.ledger_id,
                         sorted(failed), "; ".join(str(e) for e in failed.values()), lac + 1)
                try:
                    md, version, replaced = self._change_ensemble_metadata(set(failed), lac)
                except BKError as exc:
                    with self._lock:
                        self._changing = False
                        self._fail_all(exc)
                    return
                with self._lock:
                    self._md, self._version = md, version
                    self._set_ensemble(md.last_ensemble())
                    self.ensemble_changes += 1
                    if self._ctx.metrics is not None:
                        self._ctx.metrics.ensemble_changes.inc()
                    sends = self._sends_after_change_locked(set(replaced.values()))
                self._send(sends)
            self._send(sends)
        except Exception as exc:  # noqa: BLE001 - never leave the handle stuck
            log.exception("ledger %d: ensemble change crashed", self.ledger_id)
            with self._lock:
                self._changing = False
                self._fail_all(exc if isinstance(exc, BKError) else BKError(repr(exc)))
        finally:
            self._run_callbacks()

    def _sends_after_change_locked(self, new_bookies: set) -> dict:
        """Drop acks of bookies no longer in an entry's write set; send each pending entry
        to the write-set members that have not got it (replacements, never-sent entries)."""
        sends: dict[str, list] = {}
        now = time.monotonic()
        for p in self._pending:
            ws = self._write_set(p.entry_id)
            if p.acked:
                p.acked.intersection_update(ws)
            targets = ws if not p.sent else [b for b in ws if b in new_bookies
                                             and b not in p.acked]
            if targets:
                p.sent = True
                p.t0 = now
                for b in targets:
                    sends.setdefault(b, []).append(p.elem)
        return sends

    def _change_ensemble_metadata(self, failed: set, lac: int):
        """CAS a fragment at lac+1 replacing ``failed``; return (md, version, {old: new})."""
        ctx = self._ctx
        exclude = set(failed)
        replaced: dict = {}

        def transform(md):
            if md.state is not LedgerState.OPEN:
                raise self._not_open_error(md)
            ensemble = md.last_ensemble()
            replaced.clear()
            writable = ctx.writable_bookies()
            new_ens = list(ensemble)
            suspects = {b for b in writable if ctx.health.is_suspect(b)}
            for i, b in enumerate(ensemble):
                if b in failed:
                    try:    # avoid bookies that recently failed, if possible
                        nb = placement.choose_replacement(writable, new_ens, i,
                                                          exclude | suspects)
                    except NotEnoughBookiesError:
                        nb = placement.choose_replacement(writable, new_ens, i, exclude)
                    new_ens[i] = nb
                    replaced[b] = nb
            if not replaced:
                raise NoChange()
            return md.with_ensemble(lac + 1, new_ens)

        result = ctx.update_metadata(self.ledger_id, transform, start=(self._md, self._version),
                               what=f"ledger {self.ledger_id}: ensemble change")
        if not result.changed:
            return result.value, result.version, {}
        log.info("ledger %d: new ensemble %s from entry %d (replaced %s)", self.ledger_id,
                 result.value.last_ensemble(), lac + 1, replaced)
        return result.value, result.version, dict(replaced)

    def _not_open_error(self, md) -> BKError:
        if md.state is LedgerState.CLOSED and self._closed and md.last_entry_id == self._lac:
            return LedgerClosedError(f"ledger {self.ledger_id} is closed")
        if md.state is LedgerState.IN_RECOVERY:
            return FencedError(f"ledger {self.ledger_id} is being recovered by another client "
                               "(metadata IN_RECOVERY); this writer is fenced")
        return FencedError(f"ledger {self.ledger_id} was recovered and closed by another "
                           f"client at entry {md.last_entry_id}; this writer is fenced")

    # ---- close ---------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Wait until every appended entry is acknowledged (or the handle failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._pending and self._error is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise OperationTimeoutError(
                        f"ledger {self.ledger_id}: {len(self._pending)} adds still pending")
                self._space.wait(min(1.0, remaining) if remaining is not None else 1.0)

    def flush_lac(self, timeout: float | None = None) -> int:
        """Make every appended entry visible to readers now; return the LAC published.

        Waits until every appended entry is acknowledged (:meth:`flush`), then sends the LAC
        to every bookie of the ensemble (WriteLac, after a round already in flight ended)
        and waits for their answers. On return at least Qa bookies of the write set of the
        LAC's entry stored it, so a tailing reader's long poll is woken and any LAC read
        with quorum coverage (``ReadHandle.read_last_add_confirmed``) sees it. Sent even if
        an earlier round carried the same LAC (this call is explicit); nothing is sent
        before any entry is acknowledged (returns -1).

        :raises OperationTimeoutError: adds still pending, or the answers not all in,
            after ``timeout`` seconds.
        :raises BookieUnavailableError: fewer than Qa of those bookies stored the LAC
            (the entries are still acknowledged; the LAC reaches readers with the next add,
            or the next explicit LAC).
        :raises BKError: the handle failed (its error), or it is closed (LedgerClosedError;
            readers then see its end in the metadata).
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def remaining():
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        self.flush(timeout)
        with self._lock:
            while self._lac_round and self._error is None:
                if deadline is not None and remaining() <= 0:
                    raise OperationTimeoutError(
                        f"ledger {self.ledger_id}: a WriteLac round still in flight")
                self._lac_done.wait(remaining())
            if self._error is not None:
                raise self._error
            if self._closed:
                raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
            lac = self._lac
            if lac < 0:
                return lac
            ensemble = self._start_lac_round_locked(lac, time.monotonic())
            write_set = set(self._write_set(lac))
        futs = self._send_lac(lac, ensemble)
        stored, problems = 0, []
        for b, f in futs:
            try:
                resp = f.result(remaining())
            except FutureTimeout:
                raise OperationTimeoutError(
                    f"ledger {self.ledger_id}: bookie {b} did not answer WriteLac within "
                    f"{timeout}s") from None
            except BKError as exc:
                problems.append(str(exc))
                continue
            if resp.status == errors.EOK:
                stored += b in write_set
            else:
                problems.append(f"bookie {b}: {errors.status_name(resp.status)}")
        if stored < self._Qa:
            raise BookieUnavailableError(
                f"ledger {self.ledger_id}: LAC {lac} stored by {stored} bookies of its write "
                f"set, fewer than Qa={self._Qa}: " + "; ".join(problems))
        return lac

    def close(self) -> None:
        """Wait for pending adds, then CAS the metadata to CLOSED at the LAC.

        A close whose outcome is settled is final: calling ``close`` again returns it -- it
        raises again if that close failed (FencedError: the ledger was being recovered by
        another client, whose end is not known here; LedgerClosedError: another client closed
        it elsewhere). A close that failed because the metadata store did not answer
        (MetadataConnectionError, OutcomeUnknownError) settled nothing: calling ``close``
        again tries again. Appends are refused from the first call on."""
        self.close_async().result()

    def close_async(self) -> Future:
        with self._lock:
            previous = self._close_future
            if previous is None or (previous.done() and previous.exception() is not None
                                    and not isinstance(previous.exception(), _SETTLED)):
                # first close, or one that failed without settling anything (the metadata
                # store did not answer): try again
                self._closing = True
                self._close_future = self._ctx.executor.submit(self._close)
            return self._close_future

    def _close(self) -> None:
        ctx = self._ctx
        try:
            self.flush(ctx.conf.close_flush_timeout)
        except OperationTimeoutError as exc:
            with self._lock:
                self._fail_all(exc)
            self._run_callbacks()
        with self._lock:
            lac, length = self._lac, self._lac_length

        def transform(md):
            if md.state is LedgerState.CLOSED:
                if md.last_entry_id == lac:
                    raise NoChange()
                raise LedgerClosedError(
                    f"ledger {self.ledger_id} was closed by another client at entry "
                    f"{md.last_entry_id}, but this writer acknowledged up to {lac}")
            if md.state is LedgerState.IN_RECOVERY:
                raise FencedError(f"ledger {self.ledger_id} is being recovered by another "
                                  "client; cannot close it as its writer")
            return md.with_closed(lac, length)

        outcome: BKError | None = None
        try:
            result = ctx.update_metadata(self.ledger_id, transform, start=(self._md, self._version),
                                   what=f"ledger {self.ledger_id}: close")
            with self._lock:
                self._md, self._version = result.value, result.version
        except BKError as exc:
            outcome = exc
            raise
        finally:
            # settled: closed, or found closed/recovered by another client. Otherwise (the
            # metadata store did not answer) the handle stays registered and close may be
            # called again; appends are refused either way.
            settled = outcome is None or isinstance(outcome, _SETTLED)
            with self._lock:
                self._closed = self._closed or settled
                self._fail_all(self._error or (
                    outcome if not settled else LedgerClosedError(
                        f"ledger {self.ledger_id} is closed")))
            self._run_callbacks()
            if settled:
                ctx.pool.unregister(self.ledger_id, self)
                ctx.unregister_writer(self)

    def __enter__(self) -> "LedgerHandle":
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except BKError:
            if exc_type is None:
                raise

    def __repr__(self):
        return (f"LedgerHandle(ledger_id={self.ledger_id}, lac={self._lac}, "
                f"ensemble={self._ensemble})")
