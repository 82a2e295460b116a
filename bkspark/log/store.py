"""Logs: named, ordered lists of ledgers, kept as segmented metadata records.

A log is a small head record (``/logs/<name>``) plus one record per ledger of its list
(format 2, :mod:`metadata.log_segments`); every change is one metadata transaction that
sets the head at the version it read, so changes are ordered and atomic and their size does
not depend on the list's length. Each entry of the list is a ledger: ``{"ledger_id", "state":
"open"|"closed", "last_entry_id", "length", "offset"}`` (the end is recorded once the ledger is
closed; ledger metadata stays the source of truth), plus what a writer knows of its records
(the Spark connector's ``min_ts`` / ``max_ts``, record timestamps in microseconds, let a seek
by time skip ledgers). ``offset`` numbers the log's entries in order
(:meth:`LogMetadata.offsets`): it is stamped when a ledger is appended after a closed one,
kept by truncation, and an overwrite continues from the replaced list's end, so an offset is
never given to two entries of one log. Logs written as one record (format 1) are read as they
are and converted on their first change (or ``bkspark shell convert-logs``).

Guarantees (those of "Ledgers to logs" in the protocol seed): ledgers keep their order;
every non-empty ledger stays in the list until truncated; at most one open ledger, the
last; a new writer fences the last two ledgers before appending its own, so an old writer
can never add past what the new one saw. Batch commits (:meth:`LogStore.append_ledgers`)
append already-closed ledgers atomically with an idempotency key, so replaying a commit is
a no-op.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Callable

from bkspark import errors
from bkspark.errors import BadRequestError, BadVersionError, NoNodeError, NodeExistsError, NoSuchLogError
from bkspark.log.position import EARLIEST, LATEST, Position
from bkspark.log.reader import LogReader
from bkspark.log import segments as seg
from bkspark.log import retention as ret
from bkspark.log import offload as off
from bkspark.log.offload import delete_files as delete_offloaded_files
from bkspark.log.offload import summary as offload_summary
from bkspark.log.retention import RetentionPolicy
from bkspark.log.writer import LogWriter
from metadata.layout import LOGS, check_log_name, is_log_name, log_path
from metadata.log_entry import CLOSED, LogLedger
from metadata.log_metadata import LogMetadata
from metadata.log_segments import (
    FORMAT_VERSION,
    LogHead,
    decode_segment,
    expired_writers_path,
    format_version,
    ledger_index_path,
    ledgers_index_path,
    new_stamp,
    segment_path,
    segments_path,
)
from metadata.store import TransactionTooLargeError
from metadata.update import (MAX_CONFLICTS, NoChange, Updated, prove_absent, settled_read,
                             update_record)

log = logging.getLogger("bkspark.log")



def cursor_path(name: str, cursor: str) -> str:
    return f"{log_path(name)}/cursors/{check_log_name(cursor)}"


#: logs whose heads, then end segments, :meth:`LogStore.stats_many` reads in one pipelined
#: read each (what it holds in memory at once is bounded by it)
STATS_CHUNK = 512


# ---- figures from a list's ends: the one rule of LogStore.stats, stats_many, cursor_lags ----

def offset_span(first: LogLedger | None, tail: list[LogLedger],
                end_of: Callable[[LogLedger], int]) -> tuple[int, int] | None:
    """``(first, end)``: the log offsets of a list's first entry and of the entry after its
    last readable one, from its ends -- ``first``, its first listed entry (None: it lists
    nothing), and ``tail``, the listed entries among its last :data:`~bkspark.log.segments.TAIL`
    segments, in order. ``end`` is the offset stamp of the tail's last stamped entry plus the
    readable entries of it and of those after it (``end_of``: an entry's last readable entry
    id, :meth:`LogStore.ledger_end`; for an open ledger that is a LAC read, made only here).
    None where a stamp is missing (format-1 logs before their first commit): the entries are
    then counted over the whole list."""
    if first is None or first.offset is None:
        return None
    base = max((i for i, e in enumerate(tail) if e.offset is not None), default=None)
    if base is None:
        return None
    return first.offset, tail[base].offset + sum(end_of(e) + 1 for e in tail[base:])


def stamped_bytes(first: LogLedger | None, tail: list[LogLedger]) -> int | None:
    """Bytes of a list's closed ledgers from the ``byte_offset`` stamps of its ends (``first``
    and ``tail`` as :func:`offset_span` takes them): the end of the tail's last stamped closed
    entry less the first entry's stamp (an unlisted ledger between them is counted). None
    where the stamps do not tell (a list whose oldest segments predate them, or that lists
    nothing): the caller sums the whole list."""
    stamped = [e for e in tail if e.closed and e.byte_offset is not None]
    if first is None or not stamped or first.byte_offset is None \
            or first.byte_offset > stamped[-1].byte_offset:
        return None
    return stamped[-1].byte_offset + stamped[-1].sealed_length() - first.byte_offset


def cursor_lag(position: Position, at: LogLedger | None, span: tuple[int, int]) -> int:
    """Entries from a cursor at ``position`` to the end of a log whose offsets are ``span``
    (:func:`offset_span`): ``at`` is the listed entry of the position's ledger (None: it is not
    listed any more, and the whole log is ahead of the cursor)."""
    if at is None or at.offset is None:
        return span[1] - span[0]
    read = max(0, position.entry_id)
    if at.entry_count() is not None:
        read = min(read, at.entry_count())
    return span[1] - min(span[1], at.offset + read)


def _cursor_record(data: bytes) -> tuple[Position, int | None]:
    """A stored cursor record: its position, and when it moved (ms; None: recorded before
    cursors carried the time)."""
    import json
    obj = json.loads(data.decode())
    t = obj.get("t") if isinstance(obj, dict) else None
    return Position.from_json(obj), t if isinstance(t, int) else None


class LogStore:
    """Catalog and batch primitives of logs, plus factories for writers and readers.

    ``bk`` is a :class:`bkspark.client.BookKeeper`; new ledgers use the given replication
    settings and ``password``.

    Every change of a log goes through :meth:`update` (the update loop of
    :func:`bkspark.log.segments.commit_edits`): a change whose answer was lost is settled from
    the stored head after a sync, never guessed. A ledger is deleted only by
    :meth:`delete_unreferenced`, once a synced read and a compare-and-set of the head prove
    the log does not list it.
    """

    def __init__(self, bk, *, password: bytes = b"", ensemble_size: int = 3, write_quorum: int = 2,
                 ack_quorum: int = 2, digest: str = "crc32c") -> None:
        self.bk = bk
        self.store = bk.store
        self.password = password
        self.ledger_options = dict(ensemble_size=ensemble_size, write_quorum=write_quorum,
                                   ack_quorum=ack_quorum, digest=digest, password=password)
        self._lists = seg.SegmentCache()

    # ---- catalog --------------------------------------------------------------------------

    def _head(self, name: str, *, settle: bool = False) -> tuple[LogHead | LogMetadata, int]:
        """The log's head (format 2) or whole record (format 1), and its version."""
        try:
            data, version = seg.read_head(self.store, check_log_name(name), settle=settle)
        except NoNodeError:
            raise NoSuchLogError(f"no log named {name!r}") from None
        return self.parse_head(name, data), version

    def get(self, name: str) -> tuple[LogMetadata, int]:
        """The whole list of a log as (metadata, head version); NoSuchLogError if it does not
        exist. The list comes from this store's copy, brought up to date from the head (one
        read, plus the segments that changed)."""
        def read():
            head, version = self._head(name)
            if isinstance(head, LogMetadata):
                return head, version, None
            return head, version, self._lists.entries(self.store, name, head)
        head, version, entries = seg.reread(read)
        if isinstance(head, LogMetadata):
            return head, version
        return LogMetadata(name=name, ledgers=[e.copy(seq=None) for e in entries],
                           writers={w: k["seq"] for w, k in head.writers.items()},
                           properties=dict(head.properties)), version

    def segments(self, name: str, start: int | None = None,
                 stop: int | None = None) -> list[LogLedger]:
        """The list entries of segments ``start .. stop-1`` (default: all listed), each with
        its ``seq``, read without reading the rest of the list."""
        def read():
            head, _ = self._head(name)
            if isinstance(head, LogMetadata):
                return [e.copy(seq=i) for i, e in enumerate(head.with_offsets().ledgers)][start:stop]
            lo = head.first if start is None else max(head.first, start)
            hi = head.next if stop is None else min(head.next, stop)
            return [e for e in seg.read_segments(self.store, name, lo, hi) if e.listed]
        return seg.reread(read)

    def view(self, name: str) -> tuple[int, int, int]:
        """``(first, next, version)``: the list is the segments ``first .. next-1`` (some may
        be unlisted ledgers, which :meth:`segments` leaves out) as of the head's ``version``."""
        head, version = self._head(name)
        if isinstance(head, LogMetadata):
            return 0, len(head.ledgers), version
        return head.first, head.next, version

    def bounds(self, name: str) -> tuple[int, int]:
        return self.view(name)[:2]

    def next_listed(self, name: str, after: int) -> LogLedger | None:
        """The first listed entry after segment ``after`` (None: none yet), reading segments
        in chunks that double (unlisted ones are skipped), never the whole list."""
        first, nxt = self.bounds(name)
        lo, step = max(first, after + 1), 1
        while lo < nxt:
            chunk = self.segments(name, lo, min(nxt, lo + step))
            if chunk:
                return chunk[0]
            lo, step = lo + step, min(step * 2, 256)
        return None

    def last_listed(self, name: str) -> LogLedger | None:
        """The last listed entry (None: the list is empty), read from the end the same way."""
        first, nxt = self.bounds(name)
        hi, step = nxt, 1
        while hi > first:
            chunk = self.segments(name, max(first, hi - step), hi)
            if chunk:
                return chunk[-1]
            hi, step = hi - step, min(step * 2, 256)
        return None

    def entry_of(self, name: str, ledger_id: int) -> LogLedger | None:
        """The list entry of ``ledger_id`` with its ``seq`` (None if the log does not list
        it): two reads, whatever the list's length."""
        head, _ = self._head(name)
        if isinstance(head, LogMetadata):
            ids = head.ledger_ids()
            return head.with_offsets().ledgers[ids.index(ledger_id)].copy(seq=ids.index(ledger_id)) \
                if ledger_id in ids else None
        return seg.lookup(self.store, name, head, ledger_id)

    def exists(self, name: str) -> bool:
        try:
            self._head(name)
            return True
        except NoSuchLogError:
            return False

    def create(self, name: str, retention: RetentionPolicy | None = None) -> None:
        """Create an empty log if it does not exist yet (with ``retention``, its policy:
        :mod:`bkspark.log.retention`; default keep everything). An existing log is left as
        it is, and only its head is read (a writer or a Spark write of every micro-batch
        calls this: its cost must not grow with the list). A create whose answer was lost is
        settled by a synced read (the log exists or it does not)."""
        check_log_name(name)
        props = {} if retention is None else {ret.PROPERTY: retention.to_property()}
        head = LogHead(name=name, uid=new_stamp(), stamp=new_stamp(), properties=props)
        txn = self.store.transaction()
        txn.create(log_path(name), head.serialize())
        txn.create(segments_path(name), b"")
        txn.create(ledgers_index_path(name), b"")
        try:
            txn.commit()
            return
        except NodeExistsError:
            pass
        except errors.MetadataConnectionError:
            try:
                settled_read(self.store, log_path(name))
            except NoNodeError:
                return self.create(name, retention)
        try:
            self._head(name)
        except seg.LogDeletedError:     # (a NoSuchLogError too: first)
            self._finish_delete(name)
            return self.create(name, retention)
        except NoSuchLogError:          # deleted meanwhile: the name is free again
            return self.create(name, retention)

    def retention(self, name: str) -> RetentionPolicy | None:
        """The log's retention policy (None: none set, everything is kept)."""
        head, _ = self._head(name)
        return RetentionPolicy.from_property(head.properties.get(ret.PROPERTY))

    def set_retention(self, name: str, policy: RetentionPolicy | None) -> None:
        """Set (None: remove) the log's retention policy; the retention service applies it
        from its next pass (:mod:`bkspark.log.retention`)."""
        def change(edit: seg.LogEdit) -> None:
            now = edit.properties.get(ret.PROPERTY)
            if policy is None and now is None or policy is not None and now == policy.to_property():
                raise NoChange()
            if policy is None:
                edit.properties.pop(ret.PROPERTY)
            else:
                edit.properties[ret.PROPERTY] = policy.to_property()
        self.update(name, change)

    def properties(self, name: str) -> dict:
        """The log's head properties (its policies among them), as stored now."""
        head, _ = self._head(name)
        return dict(head.properties)

    def offload_policy(self, name: str) -> "off.OffloadPolicy | None":
        """The log's offload policy (None: nothing is offloaded; :mod:`bkspark.log.offload`)."""
        return off.OffloadPolicy.from_property(self.properties(name).get(off.PROPERTY))

    def set_offload(self, name: str, policy: "off.OffloadPolicy | None") -> None:
        """Set (None: remove) the log's offload policy; the retention service applies it from
        its next pass. Files already offloaded stay, and stay recorded. A location the policy
        named before is kept in :data:`bkspark.log.offload.PREVIOUS`, to be swept of what a
        crash left there (:func:`bkspark.log.offload.sweep_locations`)."""
        now_ms = self.store.clock.now_ms()

        def change(edit: seg.LogEdit) -> None:
            now = edit.properties.get(off.PROPERTY)
            if policy is None and now is None or policy is not None and now == policy.to_property():
                raise NoChange()
            try:
                before = off.OffloadPolicy.from_property(now)
            except BadRequestError:
                before = None           # (another version's: nothing to sweep it by)
            if before is not None and (policy is None or not off.same_place(policy.location,
                                                                            before.location)):
                off.left_location(edit.properties, before.location, now_ms)
            if policy is not None:
                off.returned_to(edit.properties, policy.location)
            if policy is None:
                edit.properties.pop(off.PROPERTY)
            else:
                edit.properties[off.PROPERTY] = policy.to_property()
        self.update(name, change)

    def writer_sequence(self, name: str, writer_id: str) -> int:
        """The last sequence committed under ``writer_id`` (-1: none the log remembers); one
        read of the head."""
        head, _ = self._head(name)
        if isinstance(head, LogMetadata):
            return head.writers.get(writer_id, -1)
        return head.writer_seq(writer_id)

    def _tail(self, name: str) -> tuple[LogLedger | None, list[LogLedger]]:
        """The first listed entry and the listed entries among the last few segments."""
        first, nxt = self.bounds(name)
        return self.next_listed(name, first - 1), self.segments(name, max(first, nxt - seg.TAIL), nxt)

    def closed_bytes(self, name: str) -> int:
        """Bytes of the log's closed ledgers: two reads from the ``byte_offset`` stamps of its
        ends (:mod:`metadata.log_segments`); a list whose oldest segments predate the stamps
        is summed whole. (An unlisted ledger between the ends is counted.)"""
        first, tail = self._tail(name)
        size = stamped_bytes(first, tail)
        return size if size is not None else sum(e.sealed_length() for e in self.segments(name))

    def offset_range(self, name: str) -> tuple[int, int] | None:
        """``(first, end)``: the log offsets of its first entry and of the entry after its last
        readable one (open ledgers: up to their LAC), from the stamps of its ends; None where a
        stamp is missing (format-1 logs before their first commit)."""
        return offset_span(*self._tail(name), self.ledger_end)

    def stats(self, name: str) -> dict:
        """What the shell shows of a log: ``segments`` (of the list, unlisted ledgers
        included), ``entries``, ``bytes`` (of closed ledgers), ``first_offset`` /
        ``end_offset`` (None where the list's offset stamps are missing), ``retention`` (its
        policy's property; None: keep everything) and its offload figures
        (:func:`bkspark.log.offload.summary`) -- :meth:`stats_many` of this one log: its
        head, then its first and last segments (two reads, whatever the log's length), plus
        the LAC of an open ledger at its end.

        :raises NoSuchLogError: there is no such log (or it is being deleted)."""
        got = self.stats_many([name])[name]
        if isinstance(got, errors.BKError):
            raise got
        return got

    def stats_many(self, names: list[str], *,
                   cursors: bool = False) -> dict[str, dict | errors.BKError]:
        """:meth:`stats` of each log of ``names`` (by name, in the order given); with
        ``cursors``, each doc also has ``cursor_lags``, what :meth:`cursor_lags` gives. The logs
        are read :data:`STATS_CHUNK` at a time, in rounds whose number does not grow with
        theirs:

        1. their heads, one pipelined read (:meth:`raw_heads`);
        2. each list's ends -- its first segment and its last
           :data:`~bkspark.log.segments.TAIL` -- one pipelined read across the logs;
        3. the LAC of each open ledger at a list's end (one per log being written);
        4. with ``cursors``: which logs have cursors (their ``cursors`` node, present once a
           cursor was committed: one pipelined read), the cursor names of those that do (one
           ``children`` read each: the store lists one node at a time), the cursor records (one
           pipelined read), and where each cursor's ledger is listed: among the ends without a
           read, else through its ledger-index record (one pipelined read) and its segment (a
           read each).

        A log whose ends these reads do not give is read on its own (:meth:`_stats_of`, then
        :meth:`cursor_lags`), following its list the way those reads do: a format-1 record, a
        first segment that is an unlisted ledger, a segment record gone since its head was
        read (the log changed meanwhile). A list whose oldest segments predate the offset
        stamps is read whole (:func:`offset_span`, :func:`stamped_bytes`), as by :meth:`stats`.

        Failure semantics: a log whose figures cannot be read gets the error instead of its doc
        -- :class:`NoSuchLogError` when it does not exist (deleted since it was listed, or being
        deleted), :class:`BadRequestError` for an invalid name, else the error of its own reads
        (a LAC, a corrupt record); a read of a whole chunk that fails (the store does not
        answer) raises."""
        names = list(names)
        out: dict[str, dict | errors.BKError] = {}
        for i in range(0, len(names), STATS_CHUNK):
            out.update(self._stats_chunk(names[i:i + STATS_CHUNK], cursors))
        return {name: out[name] for name in names}

    def _stats_chunk(self, names: list[str], cursors: bool) -> dict[str, dict | errors.BKError]:
        """:meth:`stats_many` of a few logs (its rounds 1 to 4)."""
        out: dict[str, dict | errors.BKError] = {}
        valid = []
        for name in dict.fromkeys(names):
            try:
                valid.append(check_log_name(name))
            except BadRequestError as exc:
                out[name] = exc
        raw = self.raw_heads(valid)
        heads: dict[str, LogHead] = {}
        alone: list[str] = []                   # read on their own
        for name in valid:
            try:
                if name not in raw:
                    raise NoSuchLogError(f"no log named {name!r}")
                head = self.parse_head(name, raw[name][1])
            except errors.BKError as exc:
                out[name] = exc
                continue
            if isinstance(head, LogMetadata):
                alone.append(name)
            else:
                heads[name] = head
        seqs = {name: self._end_seqs(head) for name, head in heads.items()}
        got = iter(self._get_many([segment_path(n, s) for n in heads for s in seqs[n]]))
        ends: dict[str, tuple[LogLedger | None, list[LogLedger]]] = {}
        for name, head in heads.items():
            records = {s: next(got) for s in seqs[name]}
            try:
                found = self._ends(head, records)
                if found is None:
                    alone.append(name)
                    continue
                ends[name] = found
                out[name] = self._summary(head, *found, lambda name=name: self.segments(name))
            except errors.BKError as exc:
                out[name] = exc
        for name in alone:
            try:
                out[name] = self._stats_of(name)
            except errors.BKError as exc:
                out[name] = exc
        if cursors:
            self._add_cursor_lags(out, heads, ends)
        return out

    @staticmethod
    def _end_seqs(head: LogHead) -> list[int]:
        """The segments that give a list's ends (:func:`offset_span`): its first and its last
        :data:`~bkspark.log.segments.TAIL` (none: the list is empty)."""
        start = max(head.first, head.next - seg.TAIL)
        return ([head.first] if head.first < start else []) + list(range(start, head.next))

    @staticmethod
    def _ends(head: LogHead, records: dict[int, tuple[bytes, int] | None]
              ) -> tuple[LogLedger | None, list[LogLedger]] | None:
        """A list's ends, ``(first listed entry, the listed entries among its last TAIL
        segments)``, from the records of :meth:`_end_seqs` read after ``head``; None where they
        do not give them: a record gone (the log changed since ``head``), or a first segment
        that is an unlisted ledger (the first listed entry is further on).

        :raises MetadataFormatError: a corrupt record."""
        if any(item is None for item in records.values()):
            return None
        entries = {s: decode_segment(item[0], s) for s, item in records.items()}
        if not entries:
            return None, []
        first = entries[head.first]
        if not first.listed:
            return None
        start = max(head.first, head.next - seg.TAIL)
        return first, [e for s, e in entries.items() if s >= start and e.listed]

    def _stats_of(self, name: str) -> dict:
        """:meth:`stats` of one log from reads of its own that follow its list wherever it
        leads (the fallback of :meth:`stats_many`): its head, its first listed entry (past
        unlisted segments, in chunks that double) and its last segments, each read again while
        the list changes under it."""
        head, _ = self._head(name)
        return self._summary(head, *self._tail(name), lambda: self.segments(name))

    def _summary(self, head: LogHead | LogMetadata, first: LogLedger | None,
                 tail: list[LogLedger], whole: Callable[[], list[LogLedger]]) -> dict:
        """:meth:`stats` of a log from its head (format 2, or a format-1 record), its ends
        (:func:`offset_span`) and ``whole()`` -- its listed entries, read only where the ends'
        stamps do not tell. Reads the LAC of an open ledger at the end (of every open one when
        the list is counted whole)."""
        lo, hi = (0, len(head.ledgers)) if isinstance(head, LogMetadata) \
            else (head.first, head.next)
        span = offset_span(first, tail, self.ledger_end)
        size = stamped_bytes(first, tail)
        listed = [] if first is None or span is not None and size is not None else whole()
        entries = span[1] - span[0] if span else sum(self.ledger_end(e) + 1 for e in listed)
        if size is None:
            size = sum(e.sealed_length() for e in listed)
        policy = RetentionPolicy.from_property(head.properties.get(ret.PROPERTY))
        return {"segments": hi - lo, "entries": entries, "bytes": size,
                "first_offset": span[0] if span else None, "end_offset": span[1] if span else None,
                "retention": policy.to_property() if policy else None,
                **offload_summary(head.properties, span[0] if span else None,
                                  span[1] if span else None,
                                  None if first is None else first.byte_offset)}

    def _add_cursor_lags(self, out: dict, heads: dict[str, LogHead],
                         ends: dict[str, tuple[LogLedger | None, list[LogLedger]]]) -> None:
        """Round 4 of :meth:`stats_many`: each doc of ``out`` gets its ``cursor_lags`` (``heads``
        and ``ends``: what rounds 1 and 2 read); a log whose cursors cannot be read gets the
        error instead of its doc."""
        docs = [name for name, doc in out.items() if isinstance(doc, dict)]
        present = self._get_many([f"{log_path(name)}/cursors" for name in docs])
        wanted: list[tuple[str, str]] = []      # (log, cursor) of the logs read together
        for name, item in zip(docs, present):
            try:
                if item is not None and (name not in ends or out[name]["end_offset"] is None):
                    out[name]["cursor_lags"] = self.cursor_lags(name)
                    continue
                out[name]["cursor_lags"] = {}
                if item is not None:            # (None: no cursor was ever committed)
                    wanted += [(name, cursor) for cursor in self._cursor_names(name)]
            except errors.BKError as exc:
                out[name] = exc
        positions: dict[str, dict[str, Position]] = {}
        records = self._get_many([cursor_path(name, c) for name, c in wanted])
        for (name, cursor), item in zip(wanted, records):
            if not isinstance(out[name], dict):
                continue
            at = positions.setdefault(name, {})
            try:
                if item is not None:            # (else deleted since it was listed)
                    at[cursor] = _cursor_record(item[0])[0]
            except errors.BKError as exc:
                out[name] = exc
        # the listed entry of each cursor's ledger: among the ends, else through the index
        listed: dict[tuple[str, int], LogLedger | None] = {}
        todo: list[tuple[str, int]] = []
        for name, at in positions.items():
            first, tail = ends[name]
            known = {e.ledger_id: e for e in ([first] if first is not None else []) + tail}
            for position in at.values():
                key = (name, position.ledger_id)
                if position.ledger_id in known:
                    listed[key] = known[position.ledger_id]
                elif key not in listed:
                    listed[key] = None
                    todo.append(key)
        index = self._get_many([ledger_index_path(name, lid) for name, lid in todo])
        for (name, lid), item in zip(todo, index):
            try:
                listed[(name, lid)] = seg.lookup(self.store, name, heads[name], lid, index=item)
            except errors.BKError as exc:
                out[name] = exc
        for name, at in positions.items():
            doc = out[name]
            if isinstance(doc, dict):
                span = (doc["first_offset"], doc["end_offset"])
                doc["cursor_lags"] = {c: (p, cursor_lag(p, listed[(name, p.ledger_id)], span))
                                      for c, p in at.items()}

    def _get_many(self, paths: list[str]) -> list[tuple[bytes, int] | None]:
        """``store.get_many`` of ``paths``; nothing asked when there are none."""
        return self.store.get_many(paths) if paths else []

    def list_logs(self) -> list[str]:
        """The names of every log, sorted. A child of ``/logs`` whose name is not a log's
        (written there by another tool) is left out, logged: one such node must not stop a
        pass over all logs."""
        try:
            children = self.store.children(LOGS)
        except NoNodeError:
            return []
        names = sorted(n for n in children if is_log_name(n))
        if len(names) != len(children):
            log.warning("%s holds %d nodes that are not logs (invalid names, e.g. %r): left "
                        "out", LOGS, len(children) - len(names),
                        next(n for n in children if not is_log_name(n)))
        return names

    def head_marks(self, names: list[str]) -> dict[str, tuple[int, bytes]]:
        """A mark of each existing log's head (absent logs left out) -- its version and a
        digest of the record, which names the log's incarnation (``uid``) -- from one
        pipelined read (``get_many``) of all the heads, whatever their number. A log's list
        changes only with its head, so an unchanged mark means an unchanged list (closed
        ledgers are immutable; an open one's LAC is not part of the list), also across a
        delete and re-create of the name."""
        return {n: mark for n, (mark, _) in self.raw_heads(names).items()}

    def raw_heads(self, names: list[str]) -> dict[str, tuple[tuple[int, bytes], bytes]]:
        """``{name: (mark, record)}`` of each existing log (:meth:`head_marks`), the record
        not parsed (:meth:`parse_head`): one pipelined read of all the heads."""
        got = self.store.get_many([log_path(check_log_name(n)) for n in names])
        return {n: ((item[1], hashlib.blake2b(item[0], digest_size=16).digest()), item[0])
                for n, item in zip(names, got) if item is not None}

    @staticmethod
    def parse_head(name: str, data: bytes) -> LogHead | LogMetadata:
        """A head record as :meth:`raw_heads` read it: a format-2 :class:`LogHead`, or a
        format-1 log's whole :class:`LogMetadata`.

        :raises NoSuchLogError: the log is being deleted."""
        if format_version(data) != FORMAT_VERSION:
            return LogMetadata.deserialize(data)
        head = LogHead.deserialize(data)
        if head.properties.get(seg.DELETED):
            raise seg.LogDeletedError(f"no log named {name!r} (it is being deleted)")
        return head

    def lists(self, name: str, ledger_id: int) -> bool:
        """Whether the log lists ``ledger_id`` (one or two reads: the ledger index)."""
        head, _ = self._head(name)
        if isinstance(head, LogMetadata):
            return ledger_id in head.ledger_ids()
        return seg.lookup(self.store, name, head, ledger_id) is not None

    def logs_listing(self, ledger_id: int) -> list[str]:
        """The logs whose list names ``ledger_id`` (a ledger-index lookup in every log)."""
        names = []
        for name in self.list_logs():
            try:
                if self.lists(name, ledger_id):
                    names.append(name)
            except NoSuchLogError:
                continue
        return names

    def unlist_ledger(self, name: str, ledger_id: int, force: bool = False) -> None:
        """Remove ``ledger_id`` from the log's list (its entries are no longer part of the
        log); the ledger itself is left as it is. An open ledger is fenced first
        (:meth:`_seal_open_tail`; ``force``: even when it cannot be). Its offloaded Parquet
        files are deleted once the change is stored."""
        sealed: dict[int, LogLedger | None] = {}
        offloaded: list[dict] = []

        def change(edit: seg.LogEdit) -> None:
            entry = edit.entry(ledger_id)
            if entry is None:
                raise NoChange
            if not entry.closed:
                self._seal_open_tail(edit, sealed, before=entry.seq + 1, force=force)
            offloaded[:] = [entry.offloaded] if entry.offloaded is not None else []
            edit.unlist(ledger_id)
        self.update(name, change, done=lambda edit: not edit.lists(ledger_id))
        if offloaded:
            delete_offloaded_files(name, {ledger_id: offloaded[0]})

    def convert(self, name: str) -> bool:
        """Convert a format-1 log to format 2 now (it happens anyway at its first change);
        False if it was converted already."""
        head, _ = self._head(name)
        if not isinstance(head, LogMetadata):
            return False
        def nothing(edit: seg.LogEdit) -> None:
            raise NoChange()
        self.update(name, nothing)
        return True

    def delete(self, name: str, force: bool = False) -> None:
        """Delete a log: fence the writer of its open ledger, mark its head deleted (no change
        can be committed to it from then on), remove its records and cursors, the head, then
        its ledgers (no list names them any more) and their offloaded Parquet files.
        ``force``: even when the open ledger cannot be fenced now (its bookies do not
        answer)."""
        head, _ = self._head(name)
        if not isinstance(head, LogMetadata):
            sealed: dict[int, LogLedger | None] = {}

            def mark(edit: seg.LogEdit) -> None:
                self._seal_open_tail(edit, sealed, force=force)     # its writer learns it
                edit.properties[seg.DELETED] = True
            try:
                self.update(name, mark)
            except seg.LogDeletedError:
                pass                    # marked already (by another delete, or a lost answer)
        self._finish_delete(name)

    def _finish_delete(self, name: str) -> None:
        path = log_path(name)
        try:
            data, version = settled_read(self.store, path)
        except NoNodeError:
            return
        ids: list[int] = []
        if format_version(data) != FORMAT_VERSION:
            ids = LogMetadata.deserialize(data).ledger_ids()
        else:
            head = LogHead.deserialize(data)
            if not head.properties.get(seg.DELETED):
                raise BadRequestError(f"log {name} is not being deleted")
            # (an interrupted deletion may have removed some already; its ledgers went first)
            gone = seg.read_segments(self.store, name, head.gc, head.next, missing_ok=True)
            ids = [e.ledger_id for e in gone if e.seq >= head.first and e.listed]
            self._delete_ledgers(ids)
            delete_offloaded_files(name, {e.ledger_id: e.offloaded for e in gone
                                          if e.offloaded is not None and e.ledger_id in ids})
            ids = []
            for e in gone:
                self._delete_node(segment_path(name, e.seq))
                self._delete_node(ledger_index_path(name, e.ledger_id))
        for parent in (segments_path(name), ledgers_index_path(name),
                       expired_writers_path(name)):
            self._delete_tree(parent)       # (and leftovers of an interrupted conversion)
        for cursor in self._cursor_names(name):
            self._delete_node(cursor_path(name, cursor))
        self._delete_tree(f"{path}/cursors")
        try:
            self.store.delete(path, version=version)
        except errors.MetadataConnectionError:
            self.store.sync(path)
            if self.store.exists(path) is not None:
                raise
        except NoNodeError:
            pass
        self._delete_ledgers(ids)

    def _delete_node(self, path: str) -> None:
        try:
            self.store.delete(path)
        except NoNodeError:
            pass

    def _delete_tree(self, path: str) -> None:
        try:
            children = self.store.children(path)
        except NoNodeError:
            return
        for child in children:
            self._delete_tree(f"{path}/{child}")
        self._delete_node(path)

    def update(self, name: str, change: Callable[[seg.LogEdit], None], *,
               create: bool = False, done: Callable[[seg.LogEdit], bool] | None = None,
               guard: tuple[str, int] | None = None,
               mark: str | None = None) -> Updated[seg.LogEdit]:
        """Change the log through the update loop (:func:`bkspark.log.segments.commit_edits`):
        ``change`` edits a :class:`~bkspark.log.segments.LogEdit` (it is re-run on the latest
        head after a conflict or a lost answer), may raise :class:`NoChange` to leave the log
        as it is or any error to abort; ``done`` tells whether the change is already there (a
        lost answer's write applied). ``create``: create a missing log first, else
        NoSuchLogError. ``guard``: ``(path, version)`` of a record that must be unchanged when
        the change is stored (:class:`GuardChangedError` otherwise). ``mark``: a path only this
        change creates (in its transaction), which settles a lost answer for good. A format-1
        log is converted first.

        :raises OutcomeUnknownError: an answer was lost and the log could not be re-read;
            the change may or may not be stored.
        """
        result = self.update_logs([name], lambda edits: change(edits[name]), create=create,
                                  done=None if done is None else (lambda edits: done(edits[name])),
                                  guard=guard, mark=mark)
        # (no edit: the log was deleted after a lost answer that ``mark`` proved applied)
        return Updated(result.value.get(name), result.version.get(name, -1), result.changed)

    def update_logs(self, names: list[str], change: Callable[[dict[str, seg.LogEdit]], None],
                    *, create: bool = False,
                    done: Callable[[dict[str, seg.LogEdit]], bool] | None = None,
                    guard: tuple[str, int] | None = None,
                    mark: str | None = None) -> Updated[dict[str, seg.LogEdit]]:
        """:meth:`update` of several logs in one transaction
        (:func:`bkspark.log.segments.commit_edits`): ``change`` and ``done`` take the edits by
        log name; all of the logs change, or none."""
        for name in names:
            check_log_name(name)

        def on_v1(name: str, data: bytes, version: int) -> None:
            seg.convert_v1(self.store, name, data, version)
        while True:
            try:
                return seg.commit_edits(self.store, names, change, done=done, guard=guard,
                                        mark=mark, on_v1=on_v1)
            except NoNodeError:
                missing = [n for n in names if self.store.exists(log_path(n)) is None]
                if not missing:
                    raise
                if not create:
                    raise NoSuchLogError(f"no log named {missing[0]!r}") from None
                for name in missing:
                    self.create(name)

    def delete_unreferenced(self, name: str | list[str], ledger_ids) -> list[int]:
        """Delete those of ``ledger_ids`` that the log (each of the logs, given a list) does
        not name, proven by a synced read and a compare-and-set of its head; return their
        ids. Ledgers a log names are kept, whatever the caller believed.

        :raises MetadataConnectionError: the store did not answer: nothing was deleted.
        """
        absent = set(ledger_ids)
        for each in [name] if isinstance(name, str) else name:
            absent = self._prove_absent(check_log_name(each), absent)
        self._delete_ledgers(sorted(absent))
        return sorted(absent)

    def _prove_absent(self, name: str, candidates: set) -> set:
        """Which of ``candidates`` the log does not list, for good: read after a sync, then
        compare-and-set the head's bytes at the version read -- any change issued before (a
        lost answer's included) can no longer pass its version check."""
        path = log_path(name)
        if not candidates:
            return set()
        for _ in range(MAX_CONFLICTS):
            try:
                data, version = settled_read(self.store, path)
            except NoNodeError:
                return candidates
            if format_version(data) != FORMAT_VERSION:
                return prove_absent(self.store, path,
                                    lambda d: LogMetadata.deserialize(d).ledger_ids(), candidates,
                                    what=f"log {name}: cleanup of unlisted ledgers")
            head = LogHead.deserialize(data)
            # (their index records in one pipelined read: an attempt must be quick, or commits
            # racing for the head starve it)
            ids = sorted(candidates)
            index = self.store.get_many([ledger_index_path(name, lid) for lid in ids])
            absent = {lid for lid, item in zip(ids, index)
                      if seg.lookup(self.store, name, head, lid, item) is None}
            if not absent:
                return absent
            try:
                self.store.set(path, data, version=version)
                return absent
            except BadVersionError:
                continue
            except NoNodeError:
                return candidates
        raise errors.MetadataError(f"log {name}: cleanup of unlisted ledgers: the log kept "
                                   "changing; decided nothing")

    # ---- batch primitives -----------------------------------------------------------------

    def closed_ledger_entry(self, ledger_id: int) -> LogLedger:
        """The list entry of a ledger, which must be closed (recovering it if it is not)."""
        handle = self.bk.open_ledger(ledger_id, password=self.password, recovery=True)
        try:
            return LogLedger(ledger_id, state=CLOSED, last_entry_id=handle.last_add_confirmed,
                             length=handle.length)
        finally:
            handle.close()

    def _closed_entries(self, ledger_ids, info: dict[int, dict] | None) -> list[LogLedger]:
        """Entries of closed ledgers, with the fields ``info`` gives each (timestamps, a
        writer's own keys: :meth:`LogLedger.set`)."""
        return [self.closed_ledger_entry(lid).set(**(info or {}).get(lid, {})) for lid in ledger_ids]

    def _seal_open_tail(self, edit: seg.LogEdit, sealed: dict[int, LogLedger | None] | None = None,
                        before: int | None = None, force: bool = False) -> None:
        """Recover (fence) every ledger at the end of the list still marked open (of segments
        before ``before`` only, if given) and record its end (only the last two can be open:
        a writer may still write the second-to-last while listing the last).

        The one rule of every change that takes the log's tail away from its writer (a batch
        commit, an overwrite, a truncation or deletion reaching the tail, an unlist): the
        writer's ledger is fenced first, so its next append fails with LogFencedError, as
        after a takeover -- never an acknowledgement of an entry the log no longer holds.
        ``sealed``: ends recovered by an earlier attempt of the same change (a conflict re-runs
        it; a ledger once recovered stays closed). A ledger whose metadata is gone is not
        sealed (nothing can fence it); ``force``: one that cannot be recovered now (its bookies
        do not answer) is left unsealed too, else that error is raised, naming ``force``."""
        sealed = {} if sealed is None else sealed
        for entry in edit.ledgers:
            if not entry.closed and (before is None or entry.seq < before):
                lid = entry.ledger_id
                if lid not in sealed:
                    try:
                        sealed[lid] = self.closed_ledger_entry(lid)
                    except errors.NoSuchLedgerError:
                        # its metadata is gone: no writer can change its ensemble or close
                        # it, and there is no end to record -- nothing to fence
                        log.warning("log %s: open ledger %d has no metadata; not sealed",
                                    edit.name, lid)
                        sealed[lid] = None
                    except errors.MetadataError:
                        raise
                    except errors.BKError as exc:
                        if not force:
                            raise errors.BKError(
                                f"log {edit.name}: cannot fence the writer of its open ledger "
                                f"{lid} ({exc}); once its bookies answer, try again -- or pass "
                                "force=True (shell: --force) to go on without fencing it (its "
                                "writer may then be told appends succeeded that the log no "
                                "longer holds)") from exc
                        log.warning("log %s: open ledger %d not fenced (forced): %s",
                                    edit.name, lid, exc)
                        sealed[lid] = None
                if sealed[lid] is not None:
                    edit.seal(sealed[lid])

    def append_ledgers(self, name: str, ledger_ids: list[int], writer_id: str | None = None,
                       sequence: int | None = None, epoch: int | None = None,
                       guard: tuple[str, int] | None = None,
                       info: dict[int, dict] | None = None, writer_started_ms: int | None = None,
                       mark: str | None = None) -> bool:
        """Append closed ledgers to a log in one transaction; False if ``(writer_id, sequence)``
        was applied.

        The ledgers must be closed (they are recovered if not). Empty ledgers are left out of
        the list and deleted. A log tail still open (a streaming writer) is fenced first: a
        batch commit takes the log over. With ``epoch``, a commit from an owner older than the
        last committed epoch of ``writer_id`` is refused with LogFencedError (split brain).
        ``writer_started_ms``: when the writer started (wall clock, ms, taken before its first
        commit attempt): a writer the log does not know is refused without it once any
        idempotency key has expired (:class:`~metadata.log_segments.WriterKeyExpiredError`).

        A lost answer is settled by the commit's own stamp among the head's recent ones
        (:mod:`metadata.log_segments`), or by ``mark`` (a path this commit alone creates, in its
        transaction: a Spark job's commit record) -- never by whether its ledgers are listed
        now, which a truncation since may have undone. When an earlier commit of
        ``(writer_id, sequence)`` holds the place, this call's ledgers are deleted once proven
        unlisted.

        :raises OutcomeUnknownError: the answer was lost and the list could not be re-read;
            the ledgers are kept (the commit may have been applied).
        :raises ClockSkewError: this host's clock disagrees with the metadata store's, so the
            commit's stamps cannot be taken (:mod:`metadata.clock`); nothing was applied.
        """
        return self.append_to_logs({name: ledger_ids}, writer_id, sequence, epoch, guard, info,
                                   writer_started_ms, mark)

    def append_to_logs(self, ledgers: dict[str, list[int]], writer_id: str | None = None,
                       sequence: int | None = None, epoch: int | None = None,
                       guard: tuple[str, int] | None = None,
                       info: dict[int, dict] | None = None, writer_started_ms: int | None = None,
                       mark: str | None = None, key_log: str | None = None) -> bool:
        """:meth:`append_ledgers` to several logs at once (``ledgers``: log -> its closed
        ledgers), in ONE transaction: every log lists its ledgers, or none does (a Spark job
        routing rows by their ``topic`` column). Missing logs are created.

        ``(writer_id, sequence)`` and ``epoch`` are kept by ``key_log`` alone when given (a log
        that takes no ledgers, changed by every commit of the writer: the writer's one
        authority, whichever logs its commits name -- a routed Spark writer's), else by every
        log of the commit. The commit counts as applied (False, nothing appended) when a log
        of the commit holds the key at ``sequence`` or later -- the transaction that put it
        there was the whole of that commit. A commit too large for the store's transactions
        is refused (TransactionTooLargeError) before any writer is fenced. ``guard``,
        ``mark`` and the settlement of a lost answer (by any of the logs' heads, else
        ``mark``) are as for one log.

        :raises OutcomeUnknownError: see :meth:`append_ledgers`.
        """
        names = [check_log_name(n) for n in ledgers]
        if not names and key_log is None:
            raise BadRequestError("a commit names at least one log")
        if (writer_id is None) != (sequence is None):
            raise BadRequestError("writer_id and sequence go together")
        if key_log is not None:
            if writer_id is None or key_log in ledgers:
                raise BadRequestError("key_log keeps a writer's key: it needs writer_id and "
                                      "takes no ledgers")
            ledgers = dict(ledgers, **{check_log_name(key_log): []})
            names.append(key_log)
        targets = [n for n in names if n != key_log]
        entries = {n: self._closed_entries(ledgers[n], info) for n in names}
        keep = {n: [e for e in entries[n] if e.last_entry_id >= 0] for n in names}
        keep_ids = {n: [e.ledger_id for e in keep[n]] for n in names}
        sealed: dict[int, LogLedger] = {}

        def listed(edits: dict[str, seg.LogEdit]) -> bool:
            for n, edit in edits.items():
                edit.prefetch(keep_ids[n])
            return any(keep_ids.values()) and all(
                edit.lists(lid) for n, edit in edits.items() for lid in keep_ids[n])

        def change(edits: dict[str, seg.LogEdit]) -> None:
            keepers = [edits[key_log]] if key_log is not None else list(edits.values())
            if writer_id is not None:
                for edit in keepers:
                    last_epoch = edit.head.writer_epoch(writer_id)
                    if epoch is not None and last_epoch is not None and last_epoch > epoch:
                        raise errors.LogFencedError(
                            f"log {edit.name}: writer {writer_id} epoch {epoch} was superseded")
                # a target holding the key (a commit of the writer without key_log: the
                # same writer id once wrote that log by option 'log') counts too
                if any(edit.writer_seq(writer_id) >= sequence for edit in edits.values()):
                    raise NoChange()
                for edit in keepers:
                    edit.check_writer(writer_id, writer_started_ms)
            for n in targets:                   # (refusals first: they leave the tails alone)
                edits[n].check_appendable(keep_ids[n])
            limit = self.store.max_transaction_bytes
            if limit is not None:
                size = sum(seg.append_bytes(edits[n], keep[n]) for n in names)
                if size > limit:
                    raise TransactionTooLargeError(
                        f"a commit of {sum(len(keep[n]) for n in targets)} ledgers to "
                        f"{len(targets)} log(s) needs about {size} bytes in one metadata "
                        f"transaction, more than the store's {limit}: commit fewer ledgers "
                        "at once (Spark: fewer tasks per write -- coalesce() -- or, routing "
                        "by a column, fewer logs per write: option maxLogsPerWrite)")
            for n in targets:
                edit = edits[n]
                self._seal_open_tail(edit, sealed)
                edit.prefetch(keep_ids[n])
                for entry in keep[n]:
                    if not edit.lists(entry.ledger_id):
                        edit.append(entry)
            if writer_id is not None:
                for edit in keepers:
                    edit.set_writer(writer_id, sequence, epoch, started_ms=writer_started_ms)

        result = self.update_logs(names, change, create=True, done=listed, guard=guard,
                                  mark=mark)
        if not result.changed:
            log.info("logs %s: commit %s/%s already applied; deleting duplicate ledgers",
                     ", ".join(targets), writer_id, sequence)
            for n in targets:
                self.delete_unreferenced(n, ledgers[n])
            return False
        # empty ledgers: left out of every list this commit wrote, so no list names them
        self._delete_ledgers([e.ledger_id for n in names for e in entries[n]
                              if e.last_entry_id < 0])
        return True

    def overwrite(self, name: str, ledger_ids: list[int], writer_id: str | None = None,
                  sequence: int | None = None, guard: tuple[str, int] | None = None,
                  info: dict[int, dict] | None = None, writer_started_ms: int | None = None,
                  mark: str | None = None) -> bool:
        """Replace the whole ledger list in one transaction (the old segments are truncated,
        their records removed in batches afterwards); the old ledgers are deleted too
        (once proven unlisted), with the Parquet files of those offloaded. The new ledgers'
        offsets continue from the old list's end. A lost answer is settled as in :meth:`append_ledgers`."""
        entries = self._closed_entries(ledger_ids, info)
        keep = [e for e in entries if e.last_entry_id >= 0]
        keep_ids = [e.ledger_id for e in keep]
        replaced: set[int] = set()
        offloaded: dict[int, dict] = {}         # of the replaced ledgers, as the change read
        sealed: dict[int, LogLedger] = {}

        def listed(edit: seg.LogEdit) -> bool:
            return bool(keep_ids) and all(edit.lists(lid) for lid in keep_ids)

        def change(edit: seg.LogEdit) -> None:
            if writer_id is not None and edit.writer_seq(writer_id) >= sequence:
                raise NoChange()
            if writer_id is not None:
                edit.check_writer(writer_id, writer_started_ms)
            edit.check_appendable(keep_ids)
            # the writer of an open tail learns it was replaced, as after a takeover: its
            # ledger is fenced (recovered) and sealed before the list stops naming it
            self._seal_open_tail(edit, sealed)
            old = seg.read_segments(self.store, name, edit.head.first, edit.head.next)
            replaced.update(e.ledger_id for e in old if e.listed)
            offloaded.clear()
            offloaded.update({e.ledger_id: e.offloaded for e in old
                              if e.listed and e.offloaded is not None})
            tail = edit.last()
            start = None if tail is None or tail.offset is None \
                else tail.offset + self.ledger_end(tail) + 1
            edit.truncate_before(edit.head.next)
            edit.prefetch(keep_ids)
            for i, entry in enumerate(keep):
                if i == 0 and start is not None:
                    edit.append(entry, offset=start)
                else:
                    edit.append(entry)
            if writer_id is not None:
                edit.set_writer(writer_id, sequence, started_ms=writer_started_ms)

        result = self.update(name, change, create=True, done=listed, guard=guard,
                             mark=mark)
        if not result.changed:
            self.delete_unreferenced(name, ledger_ids)
            return False
        gone = self.delete_unreferenced(name, replaced - set(keep_ids))
        delete_offloaded_files(name, {lid: offloaded[lid] for lid in gone if lid in offloaded})
        # empty ledgers: left out of every list this commit wrote, so no list names them
        self._delete_ledgers([e.ledger_id for e in entries if e.last_entry_id < 0])
        self.collect_truncated(name)
        return True

    def truncate(self, name: str, before: Position, force: bool = False) -> list[int]:
        """Remove ledgers wholly before ``before`` (then delete them, once proven unlisted);
        returns their ids.

        Refuses (BadRequestError) to pass the slowest durable cursor unless ``force``.
        """
        # what the change needs is read once, before it: under a steady stream of commits an
        # attempt must be as quick as theirs or it keeps losing the race for the head
        target = self.entry_of(name, before.ledger_id)
        if target is None:
            raise BadRequestError(f"log {name} has no ledger {before.ledger_id}")
        cut = target.seq
        if not force:
            for cursor, position in self.cursors(name).items():
                at = self.entry_of(name, position.ledger_id)
                if at is not None and at.seq < cut:
                    raise BadRequestError(
                        f"truncating log {name} before {before} would pass cursor {cursor!r} at "
                        f"{position}; move the cursor or use force=True")
        return self.truncate_segments(name, cut)

    def truncate_segments(self, name: str, cut: int) -> list[int]:
        """Unlist the segments before ``cut`` in one transaction (nothing if the list starts
        there already), then delete their ledgers once proven unlisted and remove their
        records (:meth:`collect_truncated`), and the Parquet files of those offloaded
        (:func:`bkspark.log.offload.delete_files`); returns their ids.
        Cursors are not consulted (:meth:`truncate` and :mod:`bkspark.log.retention` decide
        that)."""
        candidates: dict[int, None] = {}        # in list order
        known: dict[int, int | None] = {}       # seq -> its listed ledger (None: unlisted)
        start: list[int] = []                   # the list's first segment the cut saw

        sealed: dict[int, LogLedger] = {}

        def change(edit: seg.LogEdit) -> None:
            if cut <= edit.head.first:
                raise NoChange()
            start[:] = [edit.head.first]
            self._seal_open_tail(edit, sealed, before=cut)
            todo = [q for q in range(edit.head.first, cut) if q not in known]
            if todo:
                for e in seg.read_segments(self.store, name, todo[0], todo[-1] + 1):
                    known[e.seq] = e.ledger_id if e.listed else None
            candidates.update(dict.fromkeys(known[q] for q in range(edit.head.first, cut)
                                            if known.get(q) is not None))
            edit.truncate_before(cut)

        if self.update(name, change).changed:
            # this change's compare-and-set is the proof: no change built on an older head
            # can be applied after it, and a ledger is listed once, so none of these (all
            # before ``cut``) is listed from then on -- no second proof (which commits racing
            # for the head would starve) is needed
            self._delete_ledgers(list(candidates))
            removed = list(candidates)
        else:
            # nothing left to remove: maybe an attempt whose answer was lost removed them,
            # maybe another truncation did -- delete what a proof shows unlisted
            deleted = set(self.delete_unreferenced(name, candidates))
            removed = [lid for lid in candidates if lid in deleted]
        if removed and start:       # (their records stay until collected: read them now --
            # no change can mark a segment offloaded once the list stops naming it)
            gone = set(removed)
            delete_offloaded_files(name, {
                e.ledger_id: e.offloaded for e in seg.read_segments(
                    self.store, name, start[0], cut, missing_ok=True)
                if e.offloaded is not None and e.ledger_id in gone})
        self.collect_truncated(name)
        return removed

    def collect_truncated(self, name: str) -> int:
        """Remove the records of truncated segments, :data:`GC_BATCH` per transaction; returns
        the transactions committed. A truncation only moves the head's bounds (its transaction
        must be as quick as the commits racing it), so its records are removed here, by the
        truncating caller and by every retention pass -- not by commits, whose attempts would
        lengthen and collide. Each batch is read before its transaction (those records no
        longer change): an attempt reads the head only. Gives up quietly (logged) while
        commits keep winning the head; the next truncation or pass goes on from there."""
        done = 0
        try:
            while (leftovers := seg.read_leftovers(self.store, name)) is not None:
                if self.update(name, lambda edit: edit.collect(leftovers)).changed:
                    done += 1
        except (NoNodeError, NoSuchLogError, seg.LogDeletedError):
            pass                        # the log is gone (deleted meanwhile)
        except errors.MetadataError as exc:
            if isinstance(exc, errors.MetadataConnectionError):
                raise
            log.info("log %s: collection of truncated records paused: %s", name, exc)
        return done

    def _delete_ledgers(self, ledger_ids) -> None:
        """Delete ledgers no list names any more (their metadata, in batched transactions:
        the bookies' GC removes the data); a store that stops answering leaves the rest
        undeleted, logged."""
        ids = list(ledger_ids)
        if not ids:
            return
        try:
            self.bk.delete_ledgers(ids)
        except errors.BKError as exc:
            log.warning("could not delete %d ledgers (%d..%d): %s", len(ids), min(ids),
                        max(ids), exc)

    # ---- positions ------------------------------------------------------------------------

    def readable_end(self, entry: LogLedger, handle=None) -> tuple[int, bool]:
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
        lid = entry.ledger_id
        if entry.closed:
            end = entry.last_entry_id
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

    def ledger_end(self, entry: LogLedger) -> int:
        """Last readable entry id of a list entry (:meth:`readable_end`)."""
        return self.readable_end(entry)[0]

    def resolve(self, name: str, where) -> Position:
        """Turn EARLIEST / LATEST / a Position into the position of the next entry to read
        (an empty log: ``Position(-1, 0)``), reading the list's ends, not all of it."""
        if isinstance(where, Position):
            return where
        if where == EARLIEST:
            edge = self.next_listed(name, -1)
            return Position(-1, 0) if edge is None else Position(edge.ledger_id, 0)
        if where == LATEST:
            edge = self.last_listed(name)
            return Position(-1, 0) if edge is None else Position(edge.ledger_id, self.ledger_end(edge) + 1)
        raise BadRequestError(f"a start position is 'earliest', 'latest' or a Position, got {where!r}")

    def entry_counts(self, name: str) -> list[tuple[int, int]]:
        """(ledger id, readable entry count) for every ledger of the log, in order."""
        md, _ = self.get(name)
        return [(e.ledger_id, self.ledger_end(e) + 1) for e in md.ledgers]

    # ---- cursors --------------------------------------------------------------------------

    def _cursor_names(self, name: str) -> list[str]:
        try:
            return sorted(self.store.children(f"{log_path(name)}/cursors"))
        except NoNodeError:
            return []

    def commit_cursor(self, name: str, cursor: str, position: Position) -> None:
        """Durably record ``cursor``'s position (the next entry it will read), and when it
        moved (``t``, the store's time in ms: a cursor idle for long holds retention back no
        more). :raises ClockSkewError: this host's clock disagrees with the store's
        (:mod:`metadata.clock`); nothing is written."""
        import json
        moved = self.store.clock.stamp_ms(f"cursor {cursor} of log {name}")    # (metadata.clock)
        data = json.dumps({**position.to_json(), "t": moved}).encode()
        path = cursor_path(name, cursor)
        self._head(name)
        update_record(self.store, path, decode=bytes, encode=bytes, transform=lambda _old: data,
                      missing=bytes, what=f"cursor {cursor} of log {name}")

    def cursor(self, name: str, cursor: str) -> Position | None:
        try:
            data, _ = self.store.get(cursor_path(name, cursor))
        except NoNodeError:
            return None
        return Position.from_json(data.decode())

    def cursors(self, name: str) -> dict[str, Position]:
        return {c: position for c, (position, _) in self.cursor_records(name).items()}

    def cursor_records(self, name: str) -> dict[str, tuple[Position, int | None]]:
        """Each cursor's position and when it last moved (ms; None: recorded before cursors
        carried the time), in one pipelined read."""
        names = self._cursor_names(name)
        found = {}
        for cursor, item in zip(names, self.store.get_many([cursor_path(name, c) for c in names])):
            if item is not None:
                found[cursor] = _cursor_record(item[0])
        return found

    def delete_cursor(self, name: str, cursor: str) -> None:
        try:
            self.store.delete(cursor_path(name, cursor))
        except NoNodeError:
            pass

    def cursor_lags(self, name: str) -> dict[str, tuple[Position, int]]:
        """Each cursor's position and lag: entries from the cursor to the end of the log (a
        cursor whose ledger is not listed any more: the whole log). From the offset stamps,
        a few reads per cursor; a log without them is read whole. (A log without cursors: its
        cursor names only. Many logs at once: :meth:`stats_many`.)"""
        cursors = self.cursors(name)
        if not cursors:
            return {}
        span = self.offset_range(name)
        if span is not None:
            return {c: (p, cursor_lag(p, self.entry_of(name, p.ledger_id), span))
                    for c, p in cursors.items()}
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
        return LogWriter(self, name, **options)

    def open_reader(self, name: str, start=EARLIEST, **options):
        """Read ``name`` in order from ``start`` (inclusive); see LogReader."""
        return LogReader(self, name, start, **options)
