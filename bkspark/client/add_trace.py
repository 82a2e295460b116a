"""Where an add's time goes: sampled per-stage timestamps of a client's adds (off by default).

:meth:`bkspark.client.BookKeeper.trace_adds` turns it on: one entry in ``every`` (by entry id)
of every ledger this client writes carries a :class:`Trace`, stamped with
``time.perf_counter_ns()`` as it passes each stage:

========== ========================================================================================
call       ``append*`` was called
admitted   it got the handle's lock and room under ``max_outstanding_bytes`` (back-pressure)
framed     its ``AddBatch`` element was built (digest, framing)
sent       its element was first / last handed to a bookie's socket (the add stream holds
           elements while a message is unanswered: self-clocking, see ``bookie_client``;
           with Qw > Qa the last may come after the first acknowledgement)
bookie     the bookie whose acknowledgement made ``Qa`` had read the message carrying it, and
           had stored it durably (stamps a bookie's data port sends back for a traced
           message, on its host's monotonic clock: comparable with these on one host only;
           None from a bookie that does not stamp, or over gRPC)
acked      the first acknowledgement of it, and the one that made ``Qa``, arrived on the ack
           threads (a message read from the socket)
handled    that Qa-th acknowledgement was handled (the ack thread got the handle's lock)
completed  it was completed in entry order (it waited for the entries before it)
callback   the future covering it was resolved
========== ========================================================================================

So each stall gets a named stage: back-pressure, the stream's self-clocking or a busy socket,
the bookies and the network (sent -> acked: a bookie's journal sync, TCP), the ack thread
waiting for a CPU or the GIL (acked -> handled), head-of-line order (handled -> completed),
the appender's own thread (completed -> callback). Collections of the cyclic garbage collector
are recorded too (``gc_pauses``), to be matched against late entries.

Bounded: at most ``capacity`` finished traces are kept (the oldest dropped), and at most as
many pauses. Cost when off: one attribute test per add call and per message. When on: a list
and a few dict operations per traced entry, and a scan of each message's elements while any
traced entry is unsent.
"""
from __future__ import annotations

import collections
import gc
import threading
import time

#: the stamps of a :class:`Trace`, in the order an add passes them
STAGES = ("call", "admitted", "framed", "sent_first", "sent_last", "bookie_received",
          "bookie_stored", "acked_first", "acked_quorum", "handled", "completed", "callback")


class Trace:
    """One traced entry: ``ledger_id``, ``entry_id`` and a stamp (ns) per :data:`STAGES` (None
    while not reached)."""

    __slots__ = ("ledger_id", "entry_id", "key") + STAGES

    def __init__(self, ledger_id: int, entry_id: int, call: int, admitted: int, framed: int):
        self.ledger_id, self.entry_id = ledger_id, entry_id
        self.key = -1               # id() of its element while unsent
        self.call, self.admitted, self.framed = call, admitted, framed
        self.sent_first = self.sent_last = self.acked_first = self.acked_quorum = None
        self.bookie_received = self.bookie_stored = None
        self.handled = self.completed = self.callback = None

    def stamps(self) -> dict:
        return {s: getattr(self, s) for s in STAGES}


class AddTracer:
    """The sampled traces of one client (module docstring)."""

    def __init__(self, every: int = 16, capacity: int = 200_000):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"trace every N-th entry: N must be an int >= 1, got {every!r}")
        self.every = every
        self.done: collections.deque[Trace] = collections.deque(maxlen=capacity)
        #: (start ns, end ns, generation) of the collector's passes while tracing
        self.gc_pauses: collections.deque[tuple] = collections.deque(maxlen=capacity)
        self._unsent: dict[int, tuple] = {}     # id(element) -> (element, its Trace)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._gc_start = 0
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        """Stop recording collections (the traces stay readable)."""
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass

    def _on_gc(self, phase: str, info: dict) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            self._gc_start = now
        else:
            self.gc_pauses.append((self._gc_start, now, info.get("generation")))

    # ---- stamps (called by the client's add path) ------------------------------------
    def traced(self, entry_id: int) -> bool:
        return entry_id % self.every == 0

    def start(self, ledger_id: int, entry_id: int, element, call: int, admitted: int,
              framed: int) -> Trace:
        t = Trace(ledger_id, entry_id, call, admitted, framed)
        t.key = id(element)         # (valid: the element is held until it is completed)
        with self._lock:
            self._unsent[t.key] = (element, t)
        return t

    def sent(self, parts) -> bool:
        """Elements ``parts`` are handed to a socket now; whether one is traced."""
        unsent = self._unsent
        if not unsent:
            return False
        now = time.perf_counter_ns()
        traced = False
        for p in parts:
            got = unsent.get(id(p))
            if got is not None and got[0] is p:
                t = got[1]
                if t.sent_first is None:
                    t.sent_first = now
                t.sent_last = now
                traced = True
        return traced

    def ack_arrived(self, received_ns: int = 0, stored_ns: int = 0) -> None:
        """An ack message was read on this thread now (its acks are handled next), with the
        bookie's stamps of the message it answers (0: none)."""
        local = self._local
        local.at = time.perf_counter_ns()
        local.bookie = (received_ns, stored_ns) if received_ns else None

    def acked(self, t: Trace, quorum: bool) -> None:
        """``t``'s entry was acknowledged by one bookie (``quorum``: the Qa-th): the
        acknowledgement arrived as the last :meth:`ack_arrived` of this thread said.
        ``acked_first`` is the earliest arrival: the ack threads handle acks in the order they
        take the handle's lock, not the order they read them, so the first handled may have
        been read after the one that made the quorum."""
        local = self._local
        at = getattr(local, "at", None) or time.perf_counter_ns()
        if t.acked_first is None or at < t.acked_first:
            t.acked_first = at
        if quorum and t.acked_quorum is None:
            t.acked_quorum = at
            t.handled = time.perf_counter_ns()
            bookie = getattr(local, "bookie", None)
            if bookie is not None:
                t.bookie_received, t.bookie_stored = bookie

    def completed(self, t: Trace) -> None:
        t.completed = time.perf_counter_ns()
        with self._lock:
            got = self._unsent.get(t.key)
            if got is not None and got[1] is t:
                del self._unsent[t.key]

    def forget(self, traces) -> None:
        """Traces of entries that failed (never completed): not kept."""
        with self._lock:
            for t in traces:
                got = self._unsent.get(t.key)
                if got is not None and got[1] is t:
                    del self._unsent[t.key]

    def called_back(self, traces) -> None:
        now = time.perf_counter_ns()
        for t in traces:
            t.callback = now
            self.done.append(t)

