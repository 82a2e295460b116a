"""The single writer of a log.

Opening (the "Opening a log" steps of the protocol seed): read the ledger list, recover
(fence) the last two ledgers, create a new ledger, CAS-append it; on a CAS conflict start
over. No append is served before that CAS succeeded. Each successful open also bumps the
log's ``writer_epoch`` so owners can be ordered.

Appends go to the current ledger and are acknowledged with their :class:`Position` once
the ledger acknowledged them (Qa bookies, LAC order). If another writer took the log over,
the current ledger is fenced and the next append raises :class:`LogFencedError`; nothing
this writer was told succeeded is lost (the new owner recovered it).

Rolling (by size or age): stop, close the current ledger, then in one CAS record its end
and append a fresh ledger. A CAS that finds the list no longer ending with our ledger means
we lost ownership.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

from bkspark import errors
from bkspark.errors import LogFencedError
from bkspark.log.position import Position
from bkspark.log.store import CLOSED, OPEN, LogStore, _NoChange
from metadata.ledger_metadata import LedgerState

log = logging.getLogger("bkspark.log.writer")

_LOST = (errors.FencedError, errors.LedgerClosedError, errors.UnauthorizedError)


class LogWriter:
    def __init__(self, logs: LogStore, name: str, *, roll_bytes: int = 256 << 20,
                 roll_age_s: float | None = None, fence_last: int = 2) -> None:
        self.logs = logs
        self.name = name
        self.roll_bytes = roll_bytes
        self.roll_age_s = roll_age_s
        self.fence_last = fence_last
        self._lock = threading.RLock()
        self._handle = None
        self._opened_at = 0.0
        self._bytes = 0
        self._closed = False
        self.epoch = -1
        self._acquire()

    # ---- ownership ------------------------------------------------------------------------

    def _acquire(self) -> None:
        logs = self.logs
        logs.create(self.name)
        while True:
            md, version = logs.get(self.name)
            sealed = md
            for entry in md.ledgers[-self.fence_last:] if self.fence_last else []:
                if entry.get("state") != CLOSED:
                    sealed = sealed.with_ledger_updated(entry["ledger_id"], **{
                        k: v for k, v in logs.closed_ledger_entry(entry["ledger_id"]).items()
                        if k != "ledger_id"})
            handle = logs.bk.create_ledger(**logs.ledger_options)
            epoch = int(sealed.properties.get("writer_epoch", 0)) + 1
            new = sealed.with_ledger(handle.ledger_id, state=OPEN)
            new.properties["writer_epoch"] = epoch
            try:
                logs.store.set(_path(self.name), new.serialize(), version=version)
            except errors.BadVersionError:
                log.info("log %s changed while opening a writer; starting over", self.name)
                self._discard(handle)
                continue
            self._handle, self.epoch = handle, epoch
            self._opened_at, self._bytes = time.monotonic(), 0
            log.info("log %s: writer epoch %d writes ledger %d", self.name, epoch, handle.ledger_id)
            return

    def _discard(self, handle) -> None:
        try:
            handle.close()
        finally:
            self.logs._delete_ledgers([handle.ledger_id])

    @property
    def ledger_id(self) -> int:
        return self._handle.ledger_id

    # ---- appends --------------------------------------------------------------------------

    def append(self, data: bytes) -> Position:
        """Append one entry; returns its position once acknowledged. LogFencedError if taken over."""
        return self.append_async(data).result()

    def append_async(self, data: bytes) -> "Future[Position]":
        with self._lock:
            if self._closed:
                raise errors.BadRequestError(f"log writer of {self.name} is closed")
            self._maybe_roll()
            handle = self._handle
            self._bytes += len(data)
            try:
                inner = handle.append_async(data)
            except _LOST as exc:
                raise self._lost(exc) from exc
        outer: Future = Future()

        def done(f):
            try:
                outer.set_result(Position(handle.ledger_id, f.result()))
            except _LOST as exc:
                outer.set_exception(self._lost(exc))
            except BaseException as exc:  # noqa: BLE001 - hand every failure to the caller
                outer.set_exception(exc)

        inner.add_done_callback(done)
        return outer

    def _lost(self, exc) -> LogFencedError:
        return LogFencedError(f"log {self.name}: this writer lost ownership (ledger "
                              f"{self._handle.ledger_id} was fenced by a new writer): {exc}")

    def _maybe_roll(self) -> None:
        too_big = self._bytes >= self.roll_bytes
        too_old = self.roll_age_s is not None and time.monotonic() - self._opened_at >= self.roll_age_s
        if too_big or too_old:
            self.roll()

    def roll(self) -> None:
        """Close the current ledger and continue in a new one (one CAS)."""
        with self._lock:
            old = self._handle
            try:
                old.close()
            except _LOST as exc:
                raise self._lost(exc) from exc
            end = self._closed_end(old.ledger_id)
            handle = self.logs.bk.create_ledger(**self.logs.ledger_options)

            def change(md):
                ids = md.ledger_ids()
                if not ids or ids[-1] != old.ledger_id:
                    raise LogFencedError(f"log {self.name}: another writer took over")
                md = _with_end(md, old.ledger_id, end)
                return md.with_ledger(handle.ledger_id, state=OPEN)

            try:
                self.logs.update(self.name, change)
            except BaseException:
                self._discard(handle)
                raise
            self._handle = handle
            self._opened_at, self._bytes = time.monotonic(), 0

    def _closed_end(self, ledger_id: int) -> dict:
        """The list entry of a ledger this writer just closed, from its CLOSED metadata:
        the ledger metadata is the truth a log list records, never a handle's own view.

        Metadata that is not CLOSED (IN_RECOVERY: its end is not decided yet) is never
        recorded: this writer lost the ledger, and the recovering owner records its end."""
        md = self.logs.bk.ledger_metadata(ledger_id)
        if md.state is not LedgerState.CLOSED:
            raise LogFencedError(f"log {self.name}: ledger {ledger_id} is {md.state.name}, "
                                 "not closed by this writer; a new writer is recovering it")
        return {"state": CLOSED, "last_entry_id": md.last_entry_id, "length": md.length}

    def flush(self) -> None:
        """Make the last appended entry visible to tailing readers (explicit LAC)."""
        with self._lock:
            flush = getattr(self._handle, "flush_lac", None)
            if flush is not None:
                flush()

    def close(self) -> None:
        """Close the current ledger and record its end in the list (if still the owner)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handle = self._handle
            try:
                handle.close()
                end = self._closed_end(handle.ledger_id)
            except (*_LOST, LogFencedError):
                return      # the new owner records this ledger's end

            def change(md):
                if handle.ledger_id not in md.ledger_ids():
                    raise _NoChange()
                return _with_end(md, handle.ledger_id, end)

            self.logs.update(self.name, change)

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _with_end(md, ledger_id: int, end: dict):
    """Record a closed ledger's end in the list, unless the list already records one (a new
    owner that sealed the ledger wrote it first; both come from the same CLOSED metadata)."""
    for entry in md.ledgers:
        if entry["ledger_id"] == ledger_id and entry.get("state") == CLOSED:
            return md
    return md.with_ledger_updated(ledger_id, **end)


def _path(name: str) -> str:
    from metadata.layout import log_path
    return log_path(name)
