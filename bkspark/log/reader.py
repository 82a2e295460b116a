"""Reading a log in order across its ledgers, and tailing its open ledger.

Closed ledgers are read to their last entry. The open ledger (the last, being written) is
read without fencing up to its LAC — only entries acknowledged to the writer are visible —
and then long-polled for more. When the writer rolls or is replaced, the ledger's metadata
turns CLOSED and the reader moves on to the next ledger of the list. All readers see the
same sequence.
"""
from __future__ import annotations

import time
from typing import Iterator, NamedTuple

from bkspark import errors
from bkspark.log.position import Position
from bkspark.log.store import CLOSED, LogStore


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

    def close(self) -> None:
        self._drop_handle()

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

    def _reached_end(self) -> bool:
        if self.end is None:
            return False
        ids = self.logs.get(self.name)[0].ledger_ids()
        if self.end.ledger_id not in ids or self.next.ledger_id not in ids:
            return self.next.ledger_id == self.end.ledger_id and self.next.entry_id >= self.end.entry_id
        a, b = ids.index(self.next.ledger_id), ids.index(self.end.ledger_id)
        return a > b or (a == b and self.next.entry_id >= self.end.entry_id)

    def read_batch(self, max_entries: int | None = None, timeout: float | None = None) -> list[LogRecord]:
        """Up to ``max_entries`` records from the current position; waits up to ``timeout``
        for new data at the tail (returns [] if none came)."""
        max_entries = max_entries or self.batch_size
        deadline = time.monotonic() + (self.poll_timeout_s if timeout is None else timeout)
        while True:
            if self._reached_end():
                return []
            md, _ = self.logs.get(self.name)
            ids = md.ledger_ids()
            if self.next.ledger_id == -1 and ids:            # the log was empty when we started
                self.next = Position(ids[0], 0)
            if self.next.ledger_id not in ids:
                if not ids:
                    if not self._wait(deadline):
                        return []
                    continue
                raise errors.BKError(f"log {self.name}: position {self.next} is no longer in the log "
                                     "(truncated)")
            index = ids.index(self.next.ledger_id)
            entry = md.ledgers[index]
            if entry.get("state") == CLOSED:
                last = entry["last_entry_id"]
            else:
                handle = self._open(entry["ledger_id"])
                last = handle.last_add_confirmed if handle.is_closed else handle.try_read_last_add_confirmed()
            if self.end is not None and self.end.ledger_id == self.next.ledger_id:
                last = min(last, self.end.entry_id - 1)
            if self.next.entry_id <= last:
                upto = min(last, self.next.entry_id + max_entries - 1)
                handle = self._open(entry["ledger_id"])
                records = [LogRecord(Position(entry["ledger_id"], e.entry_id), e.data)
                           for e in handle.read(self.next.entry_id, upto)]
                self.next = Position(entry["ledger_id"], upto + 1)
                return records
            closed = entry.get("state") == CLOSED or (self._handle_ledger == entry["ledger_id"]
                                                     and self._handle.is_closed)
            if closed or index + 1 < len(ids):
                if not closed:          # a later ledger exists: this one is (being) closed
                    self._drop_handle()
                    handle = self._open(entry["ledger_id"])
                    if not handle.is_closed:
                        if not self._wait(deadline):
                            return []
                        self._drop_handle()
                        continue
                    if self.next.entry_id <= handle.last_add_confirmed:
                        continue
                if index + 1 < len(ids):
                    self.next = Position(ids[index + 1], 0)
                    continue
            if not self.tail or not self._wait_for_lac(entry["ledger_id"], last, deadline):
                return []

    def _wait(self, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(0.1, remaining))
        return True

    def _wait_for_lac(self, ledger_id: int, lac: int, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        handle = self._open(ledger_id)
        handle.read_lac_long_poll(lac, min(remaining, 1.0))
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
