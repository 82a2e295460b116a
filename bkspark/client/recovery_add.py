"""RECOVERY_ADD: writing entries that already exist elsewhere onto bookies.

Two callers, one sender. Ledger recovery writes every recovered entry back to its write set
and needs Qa acknowledgements (:mod:`bkspark.client.recovery`); the replicator copies a
fragment's entries to the replacement of a lost bookie and needs that bookie's
acknowledgement of every entry (:mod:`bkspark.recovery.replicator`). Both send through
:class:`RecoveryAdds`, the only sender of the RECOVERY_ADD flag, which a bookie accepts on a
fenced ledger (``af_rejection`` in ``bookie_native/module.c``): what lets recovery finish a
ledger whose writer was fenced out.

Path. Over the per-bookie add streams (encoded like a writer's adds, ``batch`` to a send)
when no write handle of this client owns the ledger's ack sink: the :class:`RecoveryAdds`
registers itself as the sink while it lives. Otherwise -- this client also writes the ledger
-- with unary ``Add`` calls, whose answers come back on their own futures.

Answers. Each entry sent is a :class:`WriteBack`, done once ``qa`` bookies of its set
acknowledged it (``ok``) or once that can no longer happen. An acknowledgement means the
bookie holds the entry durably (its journal was synced before it answered). ETOOMANYREQUESTS
is busy, not broken: the entry goes to that bookie again after ``retry_delay``. EFENCED and
EUA are ``fatal`` (replacing the bookie would not help). A bookie that has not answered
within ``timeout`` of the entry's send failed (:meth:`WriteBack.expire`). Nothing here changes
metadata: what the answers allow is the caller's decision.
"""
from __future__ import annotations

import threading
import time

from bkspark import errors
from bkspark.errors import BKError
from bkspark.proto import wire

#: answers that end a write-back for good: the bookie refuses this ledger, not this moment
FATAL_ADD = (errors.EFENCED, errors.EUA)


class WriteBack:
    """The RECOVERY_ADD of one entry to a set of bookies (see the module docstring)."""

    __slots__ = ("adds", "entry_id", "bookies", "qa", "t0", "answered", "acks", "fails",
                 "fatal", "payload", "done", "_listeners")

    def __init__(self, adds: "RecoveryAdds", entry_id: int, bookies, qa: int, payload):
        self.adds = adds
        self.entry_id = entry_id
        self.bookies = list(bookies)
        self.qa = qa
        self.t0 = time.monotonic()
        self.answered: dict[str, bool] = {}
        self.acks = 0                         # bookies that acknowledged it
        self.fails: dict[str, str] = {}       # bookie -> why it failed
        self.fatal: str | None = None         # the first fatal answer: never replaced
        self.payload = payload                # what a resend sends; dropped once done
        self.done = False
        self._listeners: list | None = None

    @property
    def ok(self) -> bool:
        return self.acks >= self.qa

    @property
    def deadline(self) -> float:
        return self.t0 + self.adds.timeout

    def answer(self, bookie: str, ok: bool, note: str = "", fatal: bool = False) -> None:
        """``bookie``'s answer (the first one counts)."""
        adds = self.adds
        with adds.cond:
            if bookie not in self.bookies or bookie in self.answered:
                return
            self.answered[bookie] = ok
            if ok:
                self.acks += 1
            else:
                self.fails[bookie] = note
                if fatal and self.fatal is None:
                    self.fatal = f"{bookie}: {note}"
            if self.done or (self.acks < self.qa
                             and len(self.fails) <= len(self.bookies) - self.qa):
                return
            listeners = self._finish_locked()
        for fn in listeners:
            fn(self)

    def expire(self) -> None:
        """The timeout passed: the bookies that did not answer failed."""
        for b in self.bookies:
            self.answer(b, False, f"no answer within {self.adds.timeout:g}s")
        with self.adds.cond:
            if self.done:
                return
            listeners = self._finish_locked()
        for fn in listeners:
            fn(self)

    def _finish_locked(self) -> list:
        self.done = True
        self.payload = None
        self.adds._forget_locked(self)
        if self.adds._waiting:
            self.adds.cond.notify_all()
        listeners, self._listeners = self._listeners or [], None
        return listeners

    def overloaded(self, bookie: str) -> None:
        """``bookie`` answered ETOOMANYREQUESTS: send it the entry again a little later
        (if it never takes it, the timeout fails it)."""
        with self.adds.cond:
            if self.done or bookie not in self.bookies or bookie in self.answered:
                return
        self.adds.ctx.scheduler.schedule(self.adds.retry_delay, lambda: self._resend(bookie))

    def _resend(self, bookie: str) -> None:
        payload = self.payload
        if payload is not None:
            self.adds._resend(self, bookie, payload)

    def add_listener(self, fn) -> None:
        """Call ``fn(self)`` once done (now, if it is)."""
        with self.adds.cond:
            if not self.done:
                if self._listeners is None:
                    self._listeners = []
                self._listeners.append(fn)
                return
        fn(self)

    def failures(self) -> dict[str, str]:
        """{bookie: why} of the bookies that failed so far."""
        with self.adds.cond:
            return dict(self.fails)

    def notes(self) -> list[str]:
        return [f"{b}: {n}" for b, n in self.failures().items()]

    def wait(self) -> bool:
        """Wait until done, at most until the deadline (then :meth:`expire`); return
        :attr:`ok`. The caller must have flushed (:meth:`RecoveryAdds.flush`)."""
        if self.done:
            return self.ok
        adds, cond = self.adds, self.adds.cond
        with cond:
            while not self.done:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    break
                adds._waiting += 1
                try:
                    cond.wait(left)
                finally:
                    adds._waiting -= 1
        if not self.done:
            self.expire()
        return self.ok


class RecoveryAdds:
    """RECOVERY_ADDs of one ledger's entries (see the module docstring): :meth:`add`, then
    :meth:`flush` before waiting, and :meth:`close` at the end (always).

    ``batch``: entries buffered for a bookie before they are sent on its stream (1: at
    once). ``timeout``: how long an entry's bookies have to answer; ``retry_delay``: the wait
    before an entry goes again to a bookie that said ETOOMANYREQUESTS."""

    _opening = threading.Lock()     # two copies of one ledger at once race for its sink

    def __init__(self, ctx, ledger_id: int, master_key: bytes, *, timeout: float,
                 retry_delay: float, batch: int = 1):
        self.ctx = ctx
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.timeout = timeout
        self.retry_delay = retry_delay
        self.batch = max(1, int(batch))
        self.prefix = wire.request_prefix(ledger_id, master_key)
        self.cond = threading.Condition()
        self._entries: dict[int, WriteBack] = {}           # streamed and not done
        self._waiting = 0                                   # threads in WriteBack.wait
        self._buffered: dict[str, list] = {}                # bookie -> [(wb, elem)]
        pool = ctx.pool
        with RecoveryAdds._opening:
            self.streamed = ledger_id not in pool.sinks
            if self.streamed:
                pool.register(ledger_id, self)

    # ---- sending ---------------------------------------------------------------------------
    def add(self, entry_id: int, body: bytes, bookies, qa: int) -> WriteBack:
        """Send entry ``entry_id`` (``body``: its digest-framed bytes) to every one of
        ``bookies``; done once ``qa`` of them acknowledged it."""
        if not self.streamed:
            wb = WriteBack(self, entry_id, bookies, qa, bytes(body))
            for b in wb.bookies:
                self._send_unary(wb, b, wb.payload)
            return wb
        # every bookie gets the payload in hand: Qa fast acks can finish the write-back (and
        # drop wb.payload) before the last bookie's send
        payload = wire.encode_add(self.prefix, entry_id, wire.RECOVERY_ADD, [body])
        wb = WriteBack(self, entry_id, bookies, qa, payload)
        full = []
        with self.cond:
            # an entry written again (after a recovery ensemble change): acks of the earlier
            # sends count for the new one too -- an ack means the bookie has it
            self._entries[entry_id] = wb
            if self.batch > 1:
                for b in wb.bookies:
                    buffered = self._buffered.setdefault(b, [])
                    buffered.append((wb, payload))
                    if len(buffered) >= self.batch:
                        full.append((b, self._buffered.pop(b)))
        if self.batch == 1:
            full = [(b, [(wb, payload)]) for b in wb.bookies]
        for b, items in full:
            self._send_stream(b, items)
        return wb

    def _resend(self, wb: WriteBack, bookie: str, payload) -> None:
        """Send ``wb``'s entry to ``bookie`` again, now (a busy bookie's turn came)."""
        if self.streamed:
            self._send_stream(bookie, [(wb, payload)])
        else:
            self._send_unary(wb, bookie, payload)

    def _send_stream(self, bookie: str, items) -> None:
        try:
            self.ctx.pool.get(bookie).send_adds([elem for _, elem in items])
        except BKError as exc:
            for wb, _ in items:
                wb.answer(bookie, False, str(exc))

    def _send_unary(self, wb: WriteBack, bookie: str, body: bytes) -> None:
        timeout = max(0.1, wb.deadline - time.monotonic())
        try:
            f = self.ctx.pool.get(bookie).add(self.ledger_id, wb.entry_id, body,
                                              self.master_key, flags=wire.RECOVERY_ADD,
                                              timeout=timeout)
        except BKError as exc:
            wb.answer(bookie, False, str(exc))
            return
        f.add_done_callback(lambda fut: self._on_unary_answer(wb, bookie, fut))

    def _on_unary_answer(self, wb: WriteBack, bookie: str, fut) -> None:
        try:
            status = fut.result().status
        except BKError as exc:
            wb.answer(bookie, False, str(exc))
            return
        self._on_status(wb, bookie, status)

    @staticmethod
    def _on_status(wb: WriteBack, bookie: str, status: int) -> None:
        if status == errors.ETOOMANYREQUESTS:
            wb.overloaded(bookie)
        else:
            wb.answer(bookie, status == errors.EOK, errors.status_name(status),
                      fatal=status in FATAL_ADD)

    def flush(self) -> None:
        """Send what is buffered."""
        with self.cond:
            buffered, self._buffered = self._buffered, {}
        for bookie, items in buffered.items():
            self._send_stream(bookie, items)

    def close(self) -> None:
        """Stop hearing answers (the ledger's sink is free again); what was buffered and
        not flushed is never sent."""
        if self.streamed:
            self.ctx.pool.unregister(self.ledger_id, self)
        with self.cond:
            self._buffered.clear()

    def _forget_locked(self, wb: WriteBack) -> None:
        if self._entries.get(wb.entry_id) is wb:
            del self._entries[wb.entry_id]

    # ---- the ledger's ack sink (called on the streams' reader threads) --------------------------
    def on_add_responses(self, bookie_id: str, items) -> None:
        entries = self._entries
        for eid, status in items:
            wb = entries.get(eid)
            if wb is not None:
                self._on_status(wb, bookie_id, status)

    def on_bookie_failed(self, bookie_id: str, error) -> None:
        with self.cond:
            wbs = list(self._entries.values())
        for wb in wbs:
            wb.answer(bookie_id, False, str(error))
