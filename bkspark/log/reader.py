"""Reading a log in order across its ledgers, and tailing its open ledger.

How far a ledger is read is decided in one place, :meth:`LogStore.readable_end`: a ledger
listed CLOSED to its recorded end; otherwise the ledger metadata decides -- CLOSED: its last
entry; OPEN or IN_RECOVERY: the LAC (read without fencing; only entries acknowledged to the
writer are visible), then long-polled for more. When the writer rolls, or a new writer takes
the log over (fencing and recovering the ledger), the ledger is closed at an end that may be
beyond the LAC this reader saw: its read handle, opened while the ledger was OPEN, is
refreshed, the entries up to the closed end are returned, and the reader moves on to the next
ledger of the list. All readers see the same sequence.

A reader follows the list segment by segment (:mod:`metadata.log_segments`): each batch reads
the log's head and the current ledger's segment, whatever the list's length.

A ledger whose bookies' copy was dropped after its offload (:mod:`bkspark.log.offload`) is
read from its Parquet files, which give back its entries byte for byte; a reader whose bookie
read fails because the copy was dropped meanwhile re-reads the ledger's segment (synced) and
goes on from the files. No entry is skipped or read twice where the tiers meet: a ledger is
read from one tier or the other, at the same positions.

A tailing reader watches the log's head record while it waits: a roll or a takeover changes it,
which ends a long poll at once (bookies do not answer a long poll for a close).
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Iterator, NamedTuple

from bkspark import errors
from bkspark.log.offload import Location, on_bookies, read_entries
from bkspark.log.position import Position
from metadata.layout import log_path
from metadata.log_entry import LogLedger

if TYPE_CHECKING:
    from bkspark.log.store import LogStore

log = logging.getLogger("bkspark.log.reader")


class LogRecord(NamedTuple):
    position: Position
    data: bytes


class LogReader:
    """Iterates records from ``start`` (inclusive). ``end`` (exclusive) stops the iteration;
    without it, iteration tails the log forever (or until ``idle_timeout`` without data)."""

    def __init__(self, logs: LogStore, name: str, start, *, end: Position | None = None,
                 tail: bool = True, poll_timeout_s: float = 1.0, idle_timeout: float | None = None,
                 batch_size: int = 1000) -> None:
        self.logs = logs
        self.name = name
        self.next = logs.resolve(name, start)
        self.end = end
        self.tail = tail
        self.poll_timeout_s = poll_timeout_s
        self.idle_timeout = idle_timeout
        self.batch_size = batch_size
        self._handle = None
        self._handle_ledger = None
        #: ``((ledger id, next entry), its entries)``: the pass over a dropped ledger's files
        self._files = None
        self._watch: _ListWatch | None = None
        self._unwatch = None
        self._seq: int | None = None        # segment of self.next's ledger, when known
        self._end_seq: int | None = None    # segment of end's ledger (-1: not listed)

    def close(self) -> None:
        self._drop_handle()
        self._drop_files()
        if self._unwatch is not None:
            self._unwatch()
        self._watch = self._unwatch = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _drop_handle(self):
        if self._handle is not None:
            self._handle.close()
        self._handle = self._handle_ledger = None

    def _open(self, ledger_id: int):
        if self._handle_ledger != ledger_id:
            self._drop_handle()
            self._handle = self.logs.bk.open_ledger(ledger_id, password=self.logs.password, recovery=False)
            self._handle_ledger = ledger_id
        return self._handle

    def _locate(self, first: int, nxt: int) -> LogLedger | None:
        """The listed entry of the ledger of ``self.next`` (with its ``seq``), or None: read
        at the segment this reader knows it at (one record), else found through the log's
        ledger index -- never by reading the list."""
        if self._seq is not None and first <= self._seq < nxt:
            got = self.logs.segments(self.name, self._seq, self._seq + 1)
            if got and got[0].ledger_id == self.next.ledger_id:
                return got[0]
        entry = self.logs.entry_of(self.name, self.next.ledger_id)
        self._seq = None if entry is None else entry.seq
        return entry

    def _read_files(self, entry: LogLedger, upto: int) -> list[LogRecord]:
        """Entries ``self.next``..``upto`` of ``entry``, a ledger whose files are its only
        copy, read from them (byte for byte what the bookies held:
        :func:`bkspark.log.offload.read_entries`). One pass over the files serves the
        batches of a reader going forward through the ledger (kept between batches: a row
        group is decoded once, not once a batch). :raises BKError: they cannot be read."""
        rec = entry.offloaded
        first = self.next.entry_id
        key = (entry.ledger_id, first)
        if self._files is None or self._files[0] != key:
            self._drop_files()
            self._files = (key, read_entries(Location(rec["location"]), self.name, rec, first,
                                             entry.last_entry_id))
        entries = self._files[1]
        try:
            got = [LogRecord(Position(entry.ledger_id, eid), data)
                   for eid, data in itertools.islice(entries, upto - first + 1)]
        except Exception as exc:  # noqa: BLE001 - pyarrow's and the filesystem's errors
            self._drop_files()
            if isinstance(exc, errors.BKError):
                raise
            raise errors.BKError(f"log {self.name}: ledger {entry.ledger_id} entries "
                                 f"{first}..{upto}: its offloaded files, its only copy, cannot "
                                 f"be read: {exc}") from exc
        if [r.position.entry_id for r in got] != list(range(first, upto + 1)):
            self._drop_files()
            raise errors.BKError(f"log {self.name}: ledger {entry.ledger_id}: its offloaded "
                                 f"files do not hold entries {first}..{upto} in order")
        self._files = ((entry.ledger_id, upto + 1), entries)
        return got

    def _drop_files(self) -> None:
        if self._files is not None:
            self._files[1].close()
        self._files = None

    def _dropped_meanwhile(self, entry: LogLedger) -> bool:
        """Whether the bookies' copy of ``entry``'s ledger was dropped since the list was read
        (a read of it failed): decided on a synced read of its segment."""
        self._drop_handle()
        self.logs.store.sync(log_path(self.name))
        got = self.logs.entry_of(self.name, entry.ledger_id)
        return got is not None and not on_bookies(got.offloaded)

    def _reached_end(self) -> bool:
        if self.end is None:
            return False
        if self.next.ledger_id == self.end.ledger_id:
            return self.next.entry_id >= self.end.entry_id
        if self._end_seq is None:
            end = self.logs.entry_of(self.name, self.end.ledger_id)
            self._end_seq = -1 if end is None else end.seq
        if self._seq is None and self.next.ledger_id != -1:
            self._locate(*self.logs.bounds(self.name))
        return self._end_seq >= 0 and self._seq is not None and self._seq > self._end_seq

    def read_batch(self, max_entries: int | None = None, timeout: float | None = None) -> list[LogRecord]:
        """Up to ``max_entries`` records from the current position; waits up to ``timeout``
        for new data at the tail (returns [] if none came). Reads the head and the current
        ledger's segment, whatever the length of the list."""
        max_entries = max_entries or self.batch_size
        deadline = time.monotonic() + (self.poll_timeout_s if timeout is None else timeout)
        while True:
            if self._reached_end():
                return []
            first, nxt, version = self.logs.view(self.name)
            if self.next.ledger_id == -1:                    # the log was empty when we started
                edge = self.logs.next_listed(self.name, first - 1)
                if edge is None:
                    if not self._wait(deadline, version):
                        return []
                    continue
                self.next, self._seq = Position(edge.ledger_id, 0), edge.seq
            entry = self._locate(first, nxt)
            if entry is None:
                if first == nxt:
                    if not self._wait(deadline, version):
                        return []
                    continue
                raise errors.BKError(f"log {self.name}: position {self.next} is no longer in the log "
                                     "(truncated)")
            lid = entry.ledger_id
            dropped = not on_bookies(entry.offloaded)       # (closed: its files hold it)
            if dropped:
                last, final = entry.last_entry_id, True
            else:
                # the cached handle of this ledger, if any (refreshed if the list says
                # CLOSED); a ledger not listed CLOSED is read through one, to follow its LAC
                try:
                    handle = self._open(lid) if not entry.closed else (
                        self._handle if self._handle_ledger == lid else None)
                    last, final = self.logs.readable_end(entry, handle)
                except errors.BKError:
                    if not self._dropped_meanwhile(entry):
                        raise
                    continue                        # (read from its files now)
            if self.end is not None and self.end.ledger_id == lid:
                last = min(last, self.end.entry_id - 1)
            if self.next.entry_id <= last:
                upto = min(last, self.next.entry_id + max_entries - 1)
                try:
                    records = self._read_files(entry, upto) if dropped else [
                        LogRecord(Position(lid, e.entry_id), e.data)
                        for e in self._open(lid).read(self.next.entry_id, upto)]
                except errors.BKError:
                    if dropped or not self._dropped_meanwhile(entry):
                        raise
                    continue                        # (read from its files now)
                self.next = Position(lid, upto + 1)
                return records
            if final:
                later = self.logs.next_listed(self.name, entry.seq)
                if later is not None:
                    self.next, self._seq = Position(later.ledger_id, 0), later.seq
                    continue
                # closed and last: its writer closed it and has not listed the next one yet
                # (or the log is not written any more); the list changes when it does
                if not self.tail or not self._wait(deadline, version, step=1.0):
                    return []
                continue
            if entry.seq + 1 < nxt:
                # not closed but a later ledger is listed: a writer is closing it
                # (recovering it); its metadata shows the end first
                if self._open(lid).refresh():
                    continue
                if not self._wait(deadline, version):
                    return []
                continue
            if not self.tail or not self._wait_for_lac(lid, last, deadline, version):
                return []

    def _wake_event(self, version: int) -> threading.Event | None:
        """A fresh event for one wait at the tail, set when the log's record changes after
        ``version`` (already set if it has); None if the record cannot be watched."""
        if self._watch is None:
            try:
                self._watch = _ListWatch(self.logs.store, log_path(self.name))
            except errors.BKError as exc:
                log.info("log %s: cannot watch the log's record (%s); polling", self.name, exc)
                return None
            self._unwatch = weakref.finalize(self, self._watch.cancel)   # also if never closed
        return self._watch.event_after(version)

    def _wait(self, deadline: float, version: int, step: float = 0.1) -> bool:
        """Wait up to ``step`` (not past the deadline), less if the log's record changes."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        wake = self._wake_event(version) if self.tail else None
        if wake is None:
            time.sleep(min(step, remaining))
        else:
            wake.wait(min(step, remaining))
        return True

    def _wait_for_lac(self, ledger_id: int, lac: int, deadline: float, version: int) -> bool:
        """Long-poll the open ledger for a LAC past ``lac``; ended early when the log's record
        changes (a roll or a takeover closed the ledger)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        wake = self._wake_event(version)
        self._open(ledger_id).read_lac_long_poll(lac, min(remaining, 1.0), wake=wake)
        return True

    def __iter__(self) -> Iterator[LogRecord]:
        idle_since = time.monotonic()
        while True:
            batch = self.read_batch()
            if batch:
                idle_since = time.monotonic()
                yield from batch
            elif self._reached_end() or not self.tail or (
                    self.idle_timeout is not None and time.monotonic() - idle_since >= self.idle_timeout):
                return


class _ListWatch:
    """A watch on a log's record for a tailing reader: the newest version seen, and the event
    of the reader's current wait, set when a newer version shows up. Holds no reference to
    the reader (a reader dropped without close() cancels it when collected)."""

    def __init__(self, store, path: str) -> None:
        self._lock = threading.Lock()
        self._seen = -1
        self._event: threading.Event | None = None
        self.cancel = store.watch_data(path, self._changed)

    def _changed(self, data, version) -> None:
        with self._lock:
            if version is not None:
                self._seen = max(self._seen, version)
            event = self._event
        if event is not None:
            event.set()

    def event_after(self, version: int) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._event = event
            if self._seen > version:
                event.set()
        return event
