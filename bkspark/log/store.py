"""Logs: named, ordered lists of ledgers kept in one versioned metadata record.

The record (``/logs/<name>``, :class:`metadata.log_metadata.LogMetadata`) is the only
shared state of a log and changes only by compare-and-set. Every entry of the list is a
ledger: ``{"ledger_id", "state": "open"|"closed", "last_entry_id", "length", "offset"}`` (the
end is recorded once the ledger is closed; ledger metadata stays the source of truth), plus
what a writer knows of its records (the Spark connector's ``min_ts`` / ``max_ts``, record
timestamps in microseconds, let a seek by time skip ledgers). ``offset`` numbers the log's
entries in order (:meth:`LogMetadata.offsets`): it is stamped on every change, kept by
truncation, and an overwrite continues from the replaced list's end, so an offset is never
given to two entries of one log.

Guarantees (those of "Ledgers to logs" in the protocol seed): ledgers keep their order;
every non-empty ledger stays in the list until truncated; at most one open ledger, the
last; a new writer fences the last two ledgers before appending its own, so an old writer
can never add past what the new one saw. Batch commits (:meth:`LogStore.append_ledgers`)
append already-closed ledgers atomically with an idempotency key, so replaying a commit is
a no-op.
"""
from __future__ import annotations

import logging
import re
from typing import Callable

from bkspark import errors
from bkspark.errors import BadRequestError, BadVersionError, NoNodeError, NodeExistsError, NoSuchLogError
from bkspark.log.position import EARLIEST, LATEST, Position
from metadata.layout import LOGS, log_path
from metadata.log_metadata import LogMetadata
from metadata.update import NoChange, Updated, prove_absent, settled_read, update_record

log = logging.getLogger("bkspark.log")

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")
CLOSED, OPEN = "closed", "open"


def check_log_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise BadRequestError(f"invalid log name {name!r}: use letters, digits, '.', '_' or '-' "
                              "(at most 200, not starting with . or -)")
    return name


def cursor_path(name: str, cursor: str) -> str:
    return f"{log_path(name)}/cursors/{check_log_name(cursor)}"


class LogStore:
    """Catalog and batch primitives of logs, plus factories for writers and readers.

    ``bk`` is a :class:`bkspark.client.BookKeeper`; new ledgers use the given replication
    settings and ``password``.

    Every change of a log's record goes through :meth:`update` (the metadata update loop of
    :mod:`metadata.update`): a write whose answer was lost is settled by a synced re-read,
    never guessed. A ledger is deleted only by :meth:`delete_unreferenced`, once a synced read
    and a compare-and-set of the record prove the log does not name it.
    """

    def __init__(self, bk, *, password: bytes = b"", ensemble_size: int = 3, write_quorum: int = 2,
                 ack_quorum: int = 2, digest: str = "crc32c") -> None:
        self.bk = bk
        self.store = bk.store
        self.password = password
        self.ledger_options = dict(ensemble_size=ensemble_size, write_quorum=write_quorum,
                                   ack_quorum=ack_quorum, digest=digest, password=password)

    # ---- catalog --------------------------------------------------------------------------

    def get(self, name: str) -> tuple[LogMetadata, int]:
        """(metadata, version) of a log; NoSuchLogError if it does not exist."""
        try:
            data, version = self.store.get(log_path(check_log_name(name)))
        except NoNodeError:
            raise NoSuchLogError(f"no log named {name!r}") from None
        return LogMetadata.deserialize(data), version

    def exists(self, name: str) -> bool:
        return self.store.exists(log_path(check_log_name(name))) is not None

    def create(self, name: str) -> LogMetadata:
        """Create an empty log if it does not exist yet; return its metadata. A create whose
        answer was lost is settled by a synced read (the log exists or it does not)."""
        md = LogMetadata(name=check_log_name(name))
        try:
            self.store.create(log_path(name), md.serialize())
            return md
        except NodeExistsError:
            return self.get(name)[0]
        except errors.MetadataConnectionError:
            try:
                data, _ = settled_read(self.store, log_path(name))
            except NoNodeError:
                return self.create(name)
            return LogMetadata.deserialize(data)

    def list_logs(self) -> list[str]:
        try:
            return sorted(self.store.children(LOGS))
        except NoNodeError:
            return []

    def logs_listing(self, ledger_id: int) -> list[str]:
        """The logs whose list names ``ledger_id`` (a scan of every log's record)."""
        names = []
        for name in self.list_logs():
            try:
                md, _ = self.get(name)
            except NoSuchLogError:
                continue
            if ledger_id in md.ledger_ids():
                names.append(name)
        return names

    def unlist_ledger(self, name: str, ledger_id: int) -> None:
        """Remove ``ledger_id`` from the log's list (its entries are no longer part of the
        log); the ledger itself is left as it is."""
        def change(md: LogMetadata) -> LogMetadata:
            if ledger_id not in md.ledger_ids():
                raise NoChange
            return md.without_ledgers([ledger_id])
        self.update(name, change, done=lambda md: ledger_id not in md.ledger_ids())

    def delete(self, name: str) -> None:
        """Delete a log: its record, its cursors, then its ledgers (once the record is gone no
        write can add to it, so the ledgers it named are unreferenced)."""
        md, version = self.get(name)
        for cursor in self._cursor_names(name):
            try:
                self.store.delete(cursor_path(name, cursor))
            except NoNodeError:
                pass
        try:
            self.store.delete(f"{log_path(name)}/cursors")
        except (NoNodeError, errors.NotEmptyError):
            pass
        try:
            self.store.delete(log_path(name), version=version)
        except errors.MetadataConnectionError:
            self.store.sync(log_path(name))
            if self.store.exists(log_path(name)) is not None:
                raise
        self._delete_ledgers(md.ledger_ids())

    def update(self, name: str, change: Callable[[LogMetadata], LogMetadata], *,
               create: bool = False, done: Callable[[LogMetadata], bool] | None = None,
               guard: tuple[str, int] | None = None) -> Updated[LogMetadata]:
        """Change the log's record through the metadata update loop (:func:`update_record`):
        ``change`` is re-run on the latest record after a conflict or a lost answer, may raise
        :class:`NoChange` to leave it as it is or any error to abort; ``done`` tells whether
        the change is already there (a lost answer's write applied). ``create``: create a
        missing log first, else NoSuchLogError. ``guard``: ``(path, version)`` of a record that
        must be unchanged when the change is stored (:class:`GuardChangedError` otherwise).

        :raises OutcomeUnknownError: an answer was lost and the record could not be re-read;
            the change may or may not be stored.
        """
        path = log_path(check_log_name(name))

        def transform(md: LogMetadata) -> LogMetadata:
            # offsets are stamped before the change (a truncation keeps the survivors') and
            # after it (appended ledgers get theirs)
            return change(md.with_offsets()).with_offsets()
        while True:
            try:
                return update_record(self.store, path, decode=LogMetadata.deserialize,
                                     encode=LogMetadata.serialize, transform=transform, done=done,
                                     what=f"log {name}", guard=guard)
            except NoNodeError:
                if not create:
                    raise NoSuchLogError(f"no log named {name!r}") from None
                self.create(name)

    def delete_unreferenced(self, name: str | list[str], ledger_ids) -> list[int]:
        """Delete those of ``ledger_ids`` that the log (each of the logs, given a list) does
        not name, proven by a synced read and a compare-and-set of its record
        (:func:`prove_absent`); return their ids. Ledgers a log names are kept, whatever the
        caller believed.

        :raises MetadataConnectionError: the store did not answer: nothing was deleted.
        """
        absent = set(ledger_ids)
        for each in [name] if isinstance(name, str) else name:
            absent = prove_absent(self.store, log_path(check_log_name(each)),
                                  lambda data: LogMetadata.deserialize(data).ledger_ids(),
                                  absent, what=f"log {each}: cleanup of unlisted ledgers")
        self._delete_ledgers(sorted(absent))
        return sorted(absent)

    # ---- batch primitives -----------------------------------------------------------------

    def closed_ledger_entry(self, ledger_id: int) -> dict:
        """The list entry of a ledger, which must be closed (recovering it if it is not)."""
        handle = self.bk.open_ledger(ledger_id, password=self.password, recovery=True)
        try:
            return {"ledger_id": ledger_id, "state": CLOSED,
                    "last_entry_id": handle.last_add_confirmed, "length": handle.length}
        finally:
            handle.close()

    def _closed_entries(self, ledger_ids, info: dict[int, dict] | None) -> list[dict]:
        entries = [self.closed_ledger_entry(lid) for lid in ledger_ids]
        for e in entries:
            e.update((info or {}).get(e["ledger_id"], {}))
        return entries

    def _seal_open_tail(self, md: LogMetadata) -> LogMetadata:
        """Recover (fence) every ledger of the list still marked open and record its end."""
        ledgers = []
        for entry in md.ledgers:
            if entry.get("state") != CLOSED:
                entry = self.closed_ledger_entry(entry["ledger_id"])
            ledgers.append(entry)
        return md.copy(ledgers=ledgers)

    def append_ledgers(self, name: str, ledger_ids: list[int], writer_id: str | None = None,
                       sequence: int | None = None, epoch: int | None = None,
                       guard: tuple[str, int] | None = None,
                       info: dict[int, dict] | None = None) -> bool:
        """Append closed ledgers to a log in one CAS; False if ``(writer_id, sequence)`` was applied.

        The ledgers must be closed (they are recovered if not). Empty ledgers are left out of
        the list and deleted. A log tail still open (a streaming writer) is fenced first: a
        batch commit takes the log over. With ``epoch``, a commit from an owner older than the
        last committed epoch of ``writer_id`` is refused with LogFencedError (split brain).

        A lost answer is settled from the stored list: the commit took effect exactly when its
        ledgers are listed. When an earlier commit of ``(writer_id, sequence)`` holds the place,
        this call's ledgers are deleted once proven unlisted.

        :raises OutcomeUnknownError: the answer was lost and the list could not be re-read;
            the ledgers are kept (the commit may have been applied).
        """
        check_log_name(name)
        if (writer_id is None) != (sequence is None):
            raise BadRequestError("writer_id and sequence go together")
        entries = self._closed_entries(ledger_ids, info)
        keep = [e for e in entries if e["last_entry_id"] >= 0]
        keep_ids = {e["ledger_id"] for e in keep}

        def listed(md: LogMetadata) -> bool:
            return bool(keep_ids) and keep_ids <= set(md.ledger_ids())

        def change(md: LogMetadata) -> LogMetadata:
            if writer_id is not None:
                if epoch is not None and md.properties.get(f"epoch:{writer_id}", -1) > epoch:
                    raise errors.LogFencedError(
                        f"log {name}: writer {writer_id} epoch {epoch} was superseded")
                if md.writers.get(writer_id, -1) >= sequence:
                    raise NoChange()
            present = set(md.ledger_ids())
            md = self._seal_open_tail(md)
            for entry in keep:
                if entry["ledger_id"] not in present:
                    md = md.with_ledger(entry["ledger_id"], **{k: v for k, v in entry.items() if k != "ledger_id"})
            if writer_id is not None:
                md = md.with_writer_sequence(writer_id, sequence)
                if epoch is not None:
                    md.properties[f"epoch:{writer_id}"] = epoch
            return md

        result = self.update(name, change, create=True, done=listed, guard=guard)
        if not result.changed:
            log.info("log %s: commit %s/%s already applied; deleting duplicate ledgers", name, writer_id, sequence)
            self.delete_unreferenced(name, ledger_ids)
            return False
        # empty ledgers: left out of every list this commit wrote, so no list names them
        self._delete_ledgers([e["ledger_id"] for e in entries if e["last_entry_id"] < 0])
        return True

    def overwrite(self, name: str, ledger_ids: list[int], writer_id: str | None = None,
                  sequence: int | None = None, guard: tuple[str, int] | None = None,
                  info: dict[int, dict] | None = None) -> bool:
        """Replace the whole ledger list in one CAS; the old ledgers are deleted afterwards
        (once proven unlisted). The new ledgers' offsets continue from the old list's end. A
        lost answer is settled as in :meth:`append_ledgers`."""
        entries = self._closed_entries(ledger_ids, info)
        keep_ids = {e["ledger_id"] for e in entries if e["last_entry_id"] >= 0}
        replaced: set[int] = set()

        def listed(md: LogMetadata) -> bool:
            return bool(keep_ids) and keep_ids <= set(md.ledger_ids())

        def change(md: LogMetadata) -> LogMetadata:
            if writer_id is not None and md.writers.get(writer_id, -1) >= sequence:
                raise NoChange()
            replaced.update(lid for lid in md.ledger_ids() if lid not in keep_ids)
            new = [dict(e) for e in entries if e["last_entry_id"] >= 0]
            if new and md.ledgers and md.ledgers[-1].get("offset") is not None:
                tail = md.ledgers[-1]
                new[0]["offset"] = tail["offset"] + self.ledger_end(tail) + 1
            md = md.copy(ledgers=new)
            if writer_id is not None:
                md = md.with_writer_sequence(writer_id, sequence)
            return md.validate()

        result = self.update(name, change, create=True, done=listed, guard=guard)
        if not result.changed:
            self.delete_unreferenced(name, ledger_ids)
            return False
        self.delete_unreferenced(name, replaced)
        # empty ledgers: left out of every list this commit wrote, so no list names them
        self._delete_ledgers([e["ledger_id"] for e in entries if e["last_entry_id"] < 0])
        return True

    def truncate(self, name: str, before: Position, force: bool = False) -> list[int]:
        """Remove ledgers wholly before ``before`` (then delete them, once proven unlisted);
        returns their ids.

        Refuses (BadRequestError) to pass the slowest durable cursor unless ``force``.
        """
        removed: list[int] = []
        candidates: dict[int, None] = {}        # in list order

        def change(md: LogMetadata) -> LogMetadata:
            ids = md.ledger_ids()
            if before.ledger_id not in ids:
                raise BadRequestError(f"log {name} has no ledger {before.ledger_id}")
            cut = ids.index(before.ledger_id)
            if not force:
                for cursor, position in self.cursors(name).items():
                    if position.ledger_id in ids and ids.index(position.ledger_id) < cut:
                        raise BadRequestError(
                            f"truncating log {name} before {before} would pass cursor {cursor!r} at "
                            f"{position}; move the cursor or use force=True")
            removed[:] = ids[:cut]
            candidates.update(dict.fromkeys(removed))
            if not removed:
                raise NoChange()
            return md.without_ledgers(removed)

        self.update(name, change)
        # what an attempt removed, also one whose answer was lost before a later attempt
        # found nothing left to remove
        deleted = set(self.delete_unreferenced(name, candidates))
        return [lid for lid in candidates if lid in deleted]

    def _delete_ledgers(self, ledger_ids) -> None:
        for lid in ledger_ids:
            try:
                self.bk.delete_ledger(lid)
            except errors.NoSuchLedgerError:
                pass
            except errors.BKError as exc:   # the bookies' GC removes data of deleted metadata
                log.warning("could not delete ledger %d: %s", lid, exc)

    # ---- positions ------------------------------------------------------------------------

    def readable_end(self, entry: dict, handle=None) -> tuple[int, bool]:
        """How far a ledger of the list may be read: ``(last readable entry id, final)``. The
        one rule for readers, positions and lags:

        * listed CLOSED: the end the list records (that of the CLOSED ledger metadata), final;
        * else the ledger metadata decides. CLOSED (the list records it next): its last entry,
          final. OPEN or IN_RECOVERY: the LAC, not final -- only acknowledged entries are
          visible, and the end that the writer's close or a new writer's recovery decides is
          at or beyond that LAC (a fenced ledger still answers reads).

        ``handle``: a read handle of the ledger to use (a tailing reader's, opened without
        recovery), whose LAC is refreshed if the ledger is not listed CLOSED; if it is listed
        CLOSED but the handle was opened while the ledger was OPEN, its metadata is re-read,
        so that it reads up to the closed end, beyond the LAC it saw. Without a handle, one is
        opened (without recovery) and closed here.

        :raises BKError: the list says CLOSED and even a settled read of the ledger metadata
            does not (the list is not the record of that ledger any more).
        """
        lid = entry["ledger_id"]
        if entry.get("state") == CLOSED:
            end = entry["last_entry_id"]
            if handle is not None and not handle.refresh() and not handle.refresh(settle=True):
                raise errors.BKError(
                    f"ledger {lid} is listed closed at entry {end}, but its metadata is "
                    f"{handle.metadata.state.name}")
            return end, True
        if handle is None:
            handle = self.bk.open_ledger(lid, password=self.password, recovery=False)
            try:
                return handle.last_add_confirmed, handle.is_closed
            finally:
                handle.close()
        if not handle.is_closed:
            handle.try_read_last_add_confirmed()
        return handle.last_add_confirmed, handle.is_closed

    def ledger_end(self, entry: dict) -> int:
        """Last readable entry id of a list entry (:meth:`readable_end`)."""
        return self.readable_end(entry)[0]

    def resolve(self, name: str, where) -> Position:
        """Turn EARLIEST / LATEST / a Position into the position of the next entry to read."""
        md, _ = self.get(name)
        if isinstance(where, Position):
            return where
        if where == EARLIEST:
            return Position(md.ledgers[0]["ledger_id"], 0) if md.ledgers else Position(-1, 0)
        if where == LATEST:
            if not md.ledgers:
                return Position(-1, 0)
            last = md.ledgers[-1]
            return Position(last["ledger_id"], self.ledger_end(last) + 1)
        raise BadRequestError(f"a start position is 'earliest', 'latest' or a Position, got {where!r}")

    def entry_counts(self, name: str) -> list[tuple[int, int]]:
        """(ledger id, readable entry count) for every ledger of the log, in order."""
        md, _ = self.get(name)
        return [(e["ledger_id"], self.ledger_end(e) + 1) for e in md.ledgers]

    # ---- cursors --------------------------------------------------------------------------

    def _cursor_names(self, name: str) -> list[str]:
        try:
            return sorted(self.store.children(f"{log_path(name)}/cursors"))
        except NoNodeError:
            return []

    def commit_cursor(self, name: str, cursor: str, position: Position) -> None:
        """Durably record ``cursor``'s position (the next entry it will read)."""
        import json
        data = json.dumps(position.to_json()).encode()
        path = cursor_path(name, cursor)
        self.get(name)
        while True:
            try:
                _, version = self.store.get(path)
            except NoNodeError:
                try:
                    self.store.create(path, data)
                    return
                except NodeExistsError:
                    continue
            try:
                self.store.set(path, data, version=version)
                return
            except (BadVersionError, NoNodeError):
                continue

    def cursor(self, name: str, cursor: str) -> Position | None:
        try:
            data, _ = self.store.get(cursor_path(name, cursor))
        except NoNodeError:
            return None
        return Position.from_json(data.decode())

    def cursors(self, name: str) -> dict[str, Position]:
        found = {}
        for cursor in self._cursor_names(name):
            position = self.cursor(name, cursor)
            if position is not None:
                found[cursor] = position
        return found

    def delete_cursor(self, name: str, cursor: str) -> None:
        try:
            self.store.delete(cursor_path(name, cursor))
        except NoNodeError:
            pass

    def cursor_lags(self, name: str) -> dict[str, tuple[Position, int]]:
        """Each cursor's position and lag: entries from the cursor to the end of the log."""
        counts = self.entry_counts(name)
        ids = [lid for lid, _ in counts]
        result = {}
        for cursor, position in self.cursors(name).items():
            if position.ledger_id in ids:
                i = ids.index(position.ledger_id)
                lag = max(0, counts[i][1] - position.entry_id) + sum(n for _, n in counts[i + 1:])
            else:                       # its ledger was truncated away: everything is ahead
                lag = sum(n for _, n in counts)
            result[cursor] = (position, lag)
        return result

    # ---- writers and readers --------------------------------------------------------------

    def open_writer(self, name: str, **options):
        """Take over writing to ``name`` (fencing any previous writer); see LogWriter."""
        from bkspark.log.writer import LogWriter
        return LogWriter(self, name, **options)

    def open_reader(self, name: str, start=EARLIEST, **options):
        """Read ``name`` in order from ``start`` (inclusive); see LogReader."""
        from bkspark.log.reader import LogReader
        return LogReader(self, name, start, **options)
