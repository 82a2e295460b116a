"""The single writer of a log.

Opening (the "Opening a log" steps of the protocol seed): read the ledger list, recover
(fence) the last two ledgers, create a new ledger, CAS-append it; on a CAS conflict start
over (with the same new ledger). No append is served before that CAS succeeded. Each
successful open also bumps the log's ``writer_epoch`` so owners can be ordered.

Appends go to the current ledger and are acknowledged with their :class:`Position` once
the ledger acknowledged them (Qa bookies, LAC order). If another writer took the log over,
the current ledger is fenced and the next append raises :class:`LogFencedError`; nothing
this writer was told succeeded is lost (the new owner recovered it).

Rolling (by size or age): stop, close the current ledger, then in one metadata transaction
record its end and append a fresh ledger. A CAS that finds the list no longer ending with our ledger means
we lost ownership. Every list change goes through :meth:`LogStore.update`: a change whose
answer was lost is settled from the stored list (the new ledger is listed or it is not),
and a new ledger is deleted only once proven unlisted (:meth:`LogStore.delete_unreferenced`).

Errors an append can see, and what they mean for the appends that were not acknowledged:

* :class:`LogFencedError` -- another writer took the log over (now, or while this one was
  cut off). Appends not acknowledged are *in doubt*: the new owner's recovery decided whether
  they are in the log. Every later call raises it again.
* any other error (:class:`MetadataConnectionError`, :class:`OutcomeUnknownError`,
  :class:`NotEnoughBookiesError`, :class:`OperationTimeoutError`, ...) -- the writer is cut off
  from the bookies or the metadata store. Its ledger stops taking appends; the next call
  checks the metadata again: if another writer took over it raises :class:`LogFencedError`,
  else it closes its ledger at the last acknowledged entry and continues in a new one (the
  appends that failed are then *not written*), or raises the error it still meets. A writer
  never keeps reporting a stale error once the metadata store answers.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from bkspark import errors
from bkspark.errors import LogFencedError
from bkspark.log.position import Position
from metadata.ledger_metadata import LedgerState
from metadata.log_entry import CLOSED, OPEN, LogLedger
from metadata.update import NoChange

if TYPE_CHECKING:
    from bkspark.log.store import LogStore

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
        self._fenced: LogFencedError | None = None
        self._roll_in_doubt = None              # a new ledger a roll may or may not have listed
        self.epoch = -1
        self._acquire()

    # ---- ownership ------------------------------------------------------------------------

    def _acquire(self) -> None:
        logs = self.logs
        logs.create(self.name)
        handle = logs.bk.create_ledger(**logs.ledger_options)
        sealed: dict[int, LogLedger] = {}       # ledgers recovered by this open (stay closed)

        def change(edit):
            for entry in edit.ledgers[-self.fence_last:] if self.fence_last else []:
                lid = entry.ledger_id
                if not entry.closed:
                    if lid not in sealed:
                        sealed[lid] = logs.closed_ledger_entry(lid)
                    edit.seal(sealed[lid])
            epoch = int(edit.properties.get("writer_epoch", 0)) + 1
            edit.append(handle.ledger_id, state=OPEN)
            edit.properties["writer_epoch"] = epoch

        def listed(edit):
            return edit.lists(handle.ledger_id)

        try:
            result = logs.update(self.name, change, done=listed)
        except BaseException:
            self._discard(handle)
            raise
        self._handle = handle
        self.epoch = int(result.value.properties["writer_epoch"])
        self._check_owner(result.value)
        self._opened_at, self._bytes = time.monotonic(), 0
        log.info("log %s: writer epoch %d writes ledger %d", self.name, self.epoch,
                 handle.ledger_id)

    def _check_owner(self, edit) -> None:
        """LogFencedError unless the list ends with this writer's ledger, still open: it was
        listed (through a lost answer) and another writer has taken over since."""
        last = edit.last()
        if last is None or last.ledger_id != self._handle.ledger_id or last.closed:
            self._fenced = LogFencedError(
                f"log {self.name}: another writer took over after ledger "
                f"{self._handle.ledger_id} was listed")
            raise self._fenced

    def _discard(self, handle) -> None:
        """Close a new ledger this writer could not (or may not) list, and delete it once the
        log is proven not to name it; if that cannot be proven now, it stays (an unlisted
        ledger costs space, a deleted listed one makes the log unreadable)."""
        try:
            handle.close()
        except errors.BKError as exc:
            log.info("log %s: closing unlisted ledger %d: %s", self.name, handle.ledger_id, exc)
        try:
            self.logs.delete_unreferenced(self.name, [handle.ledger_id])
        except errors.BKError as exc:
            log.warning("log %s: ledger %d may be listed or not (%s); keeping it", self.name,
                        handle.ledger_id, exc)

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
            if self._fenced is not None:
                raise self._fenced
            if self._handle.failure is not None or self._roll_in_doubt is not None:
                self._repair()
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
        self._fenced = LogFencedError(
            f"log {self.name}: this writer lost ownership (ledger {self._handle.ledger_id} "
            f"was fenced by a new writer): {exc}")
        return self._fenced

    def _repair(self) -> None:
        """The current ledger failed (cut off from bookies or metadata), or a roll's outcome
        is unknown: settle what happened from the metadata and continue in a new ledger, or
        raise (see the module docstring)."""
        log.info("log %s: ledger %d failed (%s) or a roll is in doubt; checking ownership",
                 self.name, self._handle.ledger_id, self._handle.failure)
        self.roll()

    def _maybe_roll(self) -> None:
        too_big = self._bytes >= self.roll_bytes
        too_old = self.roll_age_s is not None and time.monotonic() - self._opened_at >= self.roll_age_s
        if too_big or too_old:
            self.roll()

    def roll(self) -> None:
        """Close the current ledger and continue in a new one (one CAS). A roll whose outcome
        stayed unknown (the metadata store did not answer) is retried by the next call with
        the same new ledger, which is listed or not: the stored list decides."""
        with self._lock:
            if self._fenced is not None:
                raise self._fenced
            old = self._handle
            try:
                old.close()
            except _LOST as exc:
                raise self._lost(exc) from exc
            end = self._closed_end(old.ledger_id)
            handle = self._roll_in_doubt or self.logs.bk.create_ledger(**self.logs.ledger_options)
            self._roll_in_doubt = None

            def change(edit):
                last = edit.last()
                if last is None or last.ledger_id != old.ledger_id:
                    raise self._lost("another writer took over")
                _with_end(edit, end)
                edit.append(handle.ledger_id, state=OPEN)

            def listed(edit):
                return edit.lists(handle.ledger_id)

            try:
                result = self.logs.update(self.name, change, done=listed)
            except errors.MetadataConnectionError:
                self._roll_in_doubt = handle        # listed or not: the next call settles it
                raise
            except BaseException:
                self._discard(handle)
                raise
            self._handle = handle
            self._opened_at, self._bytes = time.monotonic(), 0
            self._check_owner(result.value)

    def _closed_end(self, ledger_id: int) -> LogLedger:
        """The list entry of a ledger this writer just closed, from its CLOSED metadata:
        the ledger metadata is the truth a log list records, never a handle's own view.

        Metadata that is not CLOSED (IN_RECOVERY: its end is not decided yet) is never
        recorded: this writer lost the ledger, and the recovering owner records its end."""
        md = self.logs.bk.ledger_metadata(ledger_id)
        if md.state is not LedgerState.CLOSED:
            raise self._lost(f"ledger {ledger_id} is {md.state.name}, not closed by this "
                             "writer; a new writer is recovering it")
        return LogLedger(ledger_id, state=CLOSED, last_entry_id=md.last_entry_id,
                         length=md.length)

    def flush(self, timeout: float | None = None) -> Position | None:
        """Make every record appended so far visible to tailing readers now; return the
        position of the last one (None if the current ledger has none).

        Waits for the appends to be acknowledged, then publishes the ledger's LAC to its
        bookies and waits for them (:meth:`LedgerHandle.flush_lac`). Without it an idle
        writer's last record becomes visible ``explicit_lac_delay`` later (ClientConfig), or
        with the next append. Raises what the appends would (:class:`LogFencedError` if
        another writer took the log over), or the ledger's error; ``timeout`` as in
        ``flush_lac``."""
        with self._lock:
            if self._closed:
                raise errors.BadRequestError(f"log writer of {self.name} is closed")
            if self._fenced is not None:
                raise self._fenced
            handle = self._handle
            try:
                lac = handle.flush_lac(timeout)
            except _LOST as exc:
                raise self._lost(exc) from exc
        return Position(handle.ledger_id, lac) if lac >= 0 else None

    def close(self) -> None:
        """Close the current ledger and record its end in the list (if still the owner)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._roll_in_doubt is not None:     # deleted only if proven unlisted
                self._discard(self._roll_in_doubt)
                self._roll_in_doubt = None
            handle = self._handle
            if self._fenced is not None:
                return      # the new owner (or the change that took the tail) recorded its end
            try:
                handle.close()
                end = self._closed_end(handle.ledger_id)
            except (*_LOST, LogFencedError, errors.NoSuchLedgerError):
                return      # the new owner records this ledger's end (or it left the log)

            def change(edit):
                entry = edit.entry(handle.ledger_id)
                if entry is None or entry.closed:
                    raise NoChange()
                _with_end(edit, end)

            self.logs.update(self.name, change)

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _with_end(edit, end: LogLedger) -> None:
    """Record a closed ledger's end in the list, unless the list already records one (a new
    owner that sealed the ledger wrote it first; both come from the same CLOSED metadata)."""
    entry = edit.entry(end.ledger_id)
    if entry is not None and not entry.closed:
        edit.seal(end)


def _path(name: str) -> str:
    from metadata.layout import log_path
    return log_path(name)
