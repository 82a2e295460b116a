"""Reading and changing a log's segmented metadata (:mod:`metadata.log_segments`).

* :class:`LogEdit` -- what a change sees and does: the head, the last few segments (loaded
  when asked for), lookups of any ledger through the ledger index, and edits (append, seal,
  unlist, truncate, writer keys, properties) that become one transaction.
* :func:`commit_edits` -- the update loop: read the heads, run the change, commit heads +
  edits in one transaction conditional on the heads' versions; conflicts re-run the change, a
  lost answer is settled from a head's bytes (each write stamps it) after a sync. Usually of
  one log; of several when they change together (a Spark job's commit to every log its rows
  name).
* :class:`SegmentCache` -- a LogStore's copies of whole lists, brought up to date from the
  head (new segments, a re-read of the last one) instead of re-read whole.
* :func:`convert_v1` -- turns a format-1 record into format 2, crash-safe: segment and index
  records are written first (a format-1 reader ignores them), then one compare-and-set of the
  record at the version the conversion read makes it a head; a change of the format-1 record
  meanwhile fails that set and the conversion starts over.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from bkspark import errors
from bkspark.errors import (
    BadRequestError,
    BadVersionError,
    MetadataConnectionError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
)
from metadata.layout import log_path
from metadata.log_entry import CLOSED, LogLedger
from metadata.log_metadata import LogMetadata
from metadata.log_segments import (
    APPLIED,
    FORMAT_VERSION,
    ExpiredWriters,
    NOT_APPLIED,
    RECENT_CHANGES,
    UNKNOWN,
    change_outcome,
    GC_BATCH,
    LogHead,
    WriterKeyExpiredError,
    decode_segment,
    encode_segment,
    expire_writers,
    expired_writers_path,
    expired_writers_shard_path,
    may_be_expired,
    format_version,
    ledger_index_path,
    ledgers_index_path,
    new_stamp,
    next_byte_offset,
    next_offset,
    segment_path,
    segments_path,
    stamp_closed,
)
from metadata.update import (NoChange, OutcomeUnknownError, Updated, after_conflict,
                             after_lost_answer, transaction_applied)

log = logging.getLogger("bkspark.log")

#: segments a change sees at the end of the list without asking (a writer fences the last two)
TAIL = 4
#: segments at the end of a list that may still change (be sealed) once listed
OPEN_TAIL = 2
DELETED = "__deleted"   # head property of a log being deleted


class LogDeletedError(errors.NoSuchLogError):
    """The log is being deleted (its head says so)."""


class LedgerTruncatedError(BadRequestError):
    """A change would list a ledger again that the log listed and truncated away (a truncated
    ledger is deleted once its truncation is stored: listing it again would make the log
    name a deleted ledger)."""


def truncated_leftover(head: LogHead, index: tuple[bytes, int]) -> bool:
    """Whether a ledger-index record is the leftover of a truncated segment (its seq lies
    before the list's start and its record is not collected yet)."""
    try:
        return int(index[0]) < head.first
    except ValueError:
        return False


def read_head(store, name: str, *, settle: bool = False) -> tuple[bytes, int]:
    path = log_path(name)
    if settle:
        store.sync(path)
    return store.get(path)


class ListChangedError(BadVersionError):
    """Segment records a reader expected from the head it read are gone: a change committed
    since (a truncation, whose leftovers were removed) -- read the head again. (A
    BadVersionError, so the update loop takes it as the conflict it is.)"""


def read_segments(store, name: str, start: int, stop: int, *,
                  missing_ok: bool = False) -> list[LogLedger]:
    """The segment records ``start .. stop-1``, which the head the caller read lists
    (``missing_ok``: those still there).

    :raises ListChangedError: some are gone (removed by a change since that head)."""
    if stop <= start:
        return []
    got = store.get_many([segment_path(name, s) for s in range(start, stop)])
    out = []
    for seq, item in zip(range(start, stop), got):
        if item is None and missing_ok:
            continue
        if item is None:
            raise ListChangedError(f"log {name}: segment {seq} is gone though the head read "
                                   f"lists {start}..{stop - 1}: the log changed meanwhile")
        out.append(decode_segment(item[0], seq))
    return out


def reread(fn: Callable, attempts: int = 20):
    """``fn()``, again while the list changes under it (:class:`ListChangedError`); after
    ``attempts`` the records are taken to be damaged."""
    for _ in range(attempts - 1):
        try:
            return fn()
        except ListChangedError:
            continue
    try:
        return fn()
    except ListChangedError as exc:
        raise MetadataError(f"{exc} -- still after {attempts} re-reads: the log's metadata is "
                            "damaged (a segment record the head lists is missing)") from None


class LogEdit:
    """One attempt of a change of a log (see the module docstring). ``ledgers`` is the *end*
    of the list -- the last :data:`TAIL` listed segments plus what this edit appended -- not the
    whole list: ask :meth:`lists` / :meth:`entry` about any other ledger."""

    def __init__(self, store, name: str, head: LogHead, version: int):
        self.store, self.name, self.version = store, name, version
        self.head = head
        self.properties = head.properties
        self._tail: list[LogLedger] | None = None
        self._looked: dict[int, LogLedger | None] = {}     # ledger id -> its listed entry
        self._appended: list[LogLedger] = []
        self._appended_ids: dict[int, LogLedger] = {}
        self._index: dict[int, tuple[bytes, int] | None] = {}   # ledger-index records read
        self._changed: dict[int, LogLedger] = {}       # seq -> entry (listed before this edit)
        self._unlisted: list[LogLedger] = []
        self._index_versions: dict[int, int] = {}      # leftover index records to overwrite
        self._collected: list[tuple] = []              # deletes of truncated segments' records
        # the filter of expired writer ids: (generation, shard) -> (bits, version) as read;
        # the records this edit changes; the generations whose parent record it creates
        self._filter: dict[tuple[int, int], tuple] = {}
        self._filter_changed: set[tuple[int, int]] = set()
        self._filter_parents: dict[int, bool] = {}      # generation -> its parent is missing

    # ---- what is listed ---------------------------------------------------------------
    @property
    def ledgers(self) -> list[LogLedger]:
        if self._tail is None:
            start = max(self.head.first, self.head.next - TAIL)
            self._tail = [e for e in read_segments(self.store, self.name, start, self.head.next)
                          if e.listed]
        return [e for e in self._tail if e.seq >= self.head.first and e.listed] + self._appended

    def last(self) -> LogLedger | None:
        tail = self.ledgers
        return tail[-1] if tail else None

    def prefetch(self, ledger_ids) -> None:
        """Read the ledger-index records of ``ledger_ids`` together (one pipelined round), for
        the :meth:`lists` / :meth:`append` calls about them that follow."""
        todo = [lid for lid in dict.fromkeys(ledger_ids) if lid not in self._index]
        for lid, item in zip(todo, self.store.get_many([ledger_index_path(self.name, lid) for lid in todo])):
            self._index[lid] = item

    def _index_record(self, ledger_id: int) -> tuple[bytes, int] | None:
        if ledger_id not in self._index:
            self.prefetch([ledger_id])
        return self._index[ledger_id]

    def entry(self, ledger_id: int) -> LogLedger | None:
        """The listed entry of ``ledger_id`` (None if the log does not list it)."""
        if ledger_id in self._appended_ids:
            return self._appended_ids[ledger_id]
        for e in self.ledgers:
            if e.ledger_id == ledger_id:
                return e
        if ledger_id not in self._looked:
            self._looked[ledger_id] = lookup(self.store, self.name, self.head, ledger_id,
                                             self._index_record(ledger_id))
        e = self._looked[ledger_id]
        return None if e is None or e.seq < self.head.first or not e.listed else e

    def lists(self, ledger_id: int) -> bool:
        return self.entry(ledger_id) is not None

    def writer_seq(self, writer_id: str) -> int:
        return self.head.writer_seq(writer_id)

    # ---- edits --------------------------------------------------------------------------
    def append(self, ledger: int | LogLedger, **info) -> LogLedger:
        """List a ledger (an id, or a copy of an entry) at the end, with the fields ``info``
        sets; its offsets are stamped when the previous ledger's end is known
        (:mod:`metadata.log_segments`). BadRequestError if it is listed already."""
        entry = (ledger.copy() if isinstance(ledger, LogLedger) else LogLedger(ledger)).set(**info)
        ledger_id = entry.ledger_id
        if self.lists(ledger_id):
            raise BadRequestError(f"log {self.name}: ledger {ledger_id} listed twice")
        prev = self.last()
        entry.seq = self.head.next
        self._stamp(prev, entry)
        self._stamp_closed(entry)
        index = self._index_record(ledger_id)
        if index is not None:
            if truncated_leftover(self.head, index):
                self._refuse_truncated(ledger_id, index)
            self._index_versions[ledger_id] = index[1]     # a leftover: overwritten
        self.head.next += 1
        self._appended.append(entry)
        self._appended_ids[ledger_id] = entry
        return entry

    def update(self, ledger_id: int, **info) -> LogLedger:
        """Change a listed ledger's entry (sealing it: state, end); BadRequestError if it is not
        listed. Only the last segment may change this way (the rule of the format)."""
        entry = self.entry(ledger_id)
        if entry is None:
            raise BadRequestError(f"log {self.name} has no ledger {ledger_id}")
        entry.set(**info)
        if "state" in info:
            self._stamp_closed(entry)
        self._changed_entry(entry)
        self._stamp_offsets()
        return entry

    def mark_offloaded(self, ledger_id: int, record: dict) -> LogLedger:
        """Record a listed ledger's offload (:mod:`bkspark.log.offload`); BadRequestError if it
        is not listed. Unlike :meth:`update` it does not raise ``rev``: copies of the list
        (:class:`SegmentCache`) stay valid without the mark -- a pass marking old segments
        every minute must not make every reader re-read the whole list -- so a reader that must
        see marks reads segments (``LogStore.segments``, as Spark's planning does). One that
        misses a mark reads the ledger from the bookies, which keep their copy."""
        entry = self.entry(ledger_id)
        if entry is None:
            raise BadRequestError(f"log {self.name} has no ledger {ledger_id}")
        entry.offloaded = record
        if not any(e is entry for e in self._appended):
            self._changed[entry.seq] = entry
        return entry

    def _stamp_closed(self, entry: LogLedger) -> None:
        """Stamp a newly closed entry's ``closed_ms`` with the store's time (metadata.clock:
        refused with ClockSkewError while this host's clock disagrees with it)."""
        if entry.closed and entry.closed_ms is None:
            stamp_closed(entry, self.store.clock.stamp_ms(
                f"listing ledger {entry.ledger_id} closed in log {self.name}"))

    def seal(self, end: LogLedger) -> LogLedger:
        """Record a listed ledger closed at the end ``end`` gives (its state, last entry and
        length, taken from its CLOSED ledger metadata)."""
        return self.update(end.ledger_id, state=CLOSED, last_entry_id=end.last_entry_id,
                           length=end.length)

    def _changed_entry(self, entry: LogLedger) -> None:
        if any(e is entry for e in self._appended):
            return
        if entry.seq < self.head.next - len(self._appended) - OPEN_TAIL:
            self.head.rev += 1          # not among the last two: copies must be re-read whole
        self._changed[entry.seq] = entry

    @staticmethod
    def _stamp(prev: LogLedger | None, entry: LogLedger) -> bool:
        """Stamp the offsets of ``entry`` that ``prev`` (the ledger listed before) makes
        known; whether any was stamped."""
        stamped = False
        offset, byte_offset = next_offset(prev), next_byte_offset(prev)
        if offset is not None and entry.offset is None:
            entry.offset = offset
            stamped = True
        if byte_offset is not None and entry.byte_offset is None:
            entry.byte_offset = byte_offset
            stamped = True
        return stamped

    def _stamp_offsets(self) -> None:
        """Give the ledgers at the end of the list the offsets that sealing the ones before
        them made known (a ledger listed after one still open had none)."""
        prev = None
        for e in self.ledgers:
            if prev is not None and self._stamp(prev, e):
                self._changed_entry(e)
            prev = e

    def unlist(self, ledger_id: int) -> None:
        """Remove one ledger from anywhere in the list (its entries leave the log)."""
        entry = self.entry(ledger_id)
        if entry is None:
            raise BadRequestError(f"log {self.name} has no ledger {ledger_id}")
        if any(e is entry for e in self._appended):
            raise BadRequestError(f"log {self.name}: ledger {ledger_id} is being appended by "
                                  "this change; leave it out instead")
        entry.unlisted = True
        self._unlisted.append(entry)
        self.head.rev += 1

    def truncate_before(self, seq: int) -> None:
        """Unlist the segments before ``seq`` (their records are removed in batches)."""
        if not self.head.first <= seq <= self.head.next:
            raise BadRequestError(f"log {self.name}: cannot truncate before segment {seq} "
                                  f"(the list is {self.head.first}..{self.head.next - 1})")
        self.head.first = seq

    def set_writer(self, writer_id: str, seq: int, epoch: int | None = None, *,
                   started_ms: int | None = None) -> None:
        """Record ``writer_id``'s last committed sequence (and owner epoch); ``started_ms``:
        when the writer started, for a writer the log does not know (module docstring of
        :mod:`metadata.log_segments`). :raises WriterKeyExpiredError: :meth:`check_writer`;
        ClockSkewError: the key's time cannot be stamped (:mod:`metadata.clock`)."""
        self.check_writer(writer_id, started_ms)
        t = self.store.clock.stamp_ms(f"the idempotency key of writer {writer_id!r} in log "
                                      f"{self.name}")           # (metadata.clock)
        key = {"seq": seq, "t": t, "n": self.version + 1,      # (the head's next version)
               "epoch": epoch if epoch is not None else self.head.writer_epoch(writer_id)}
        self.head.writers[writer_id] = key
        for gone in expire_writers(self.head, key["t"], keep=writer_id):
            self._record_expired(gone)

    def check_writer(self, writer_id: str, started_ms: int | None = None) -> None:
        """WriterKeyExpiredError if a commit of ``writer_id`` could repeat one already applied
        (its key expired: module docstring of :mod:`metadata.log_segments`). A change calls
        it before anything else it does (before fencing a tail: a refused commit must leave
        the log as it was)."""
        if writer_id not in self.head.writers and self.head.expired["count"]:
            if self._filter_holds(writer_id):
                raise WriterKeyExpiredError(
                    f"log {self.name}: the idempotency key of writer {writer_id!r} expired "
                    "(keys idle for 7 days, or beyond the 1,000 most recently used, expire) "
                    "and the log cannot tell which sequence it committed last: this commit "
                    "could repeat one already applied, so it is refused. Commit under a writer "
                    "id this log has never seen (Spark: a new writerId / queryId). (A new "
                    "writer id is refused like this with a small probability: take another.)")
            if may_be_expired(self.head, writer_id, started_ms):
                raise WriterKeyExpiredError(
                    f"log {self.name}: writer {writer_id!r} is not known to the log and "
                    f"{self.head.expired['count']} idempotency key(s) have expired since it "
                    "may have started (keys idle for 7 days, or beyond the 1,000 most recently "
                    "used, expire): this commit could repeat one already applied, so it is "
                    "refused. Commit under a new writer id (Spark: a new queryId / writerId).")

    def check_appendable(self, ledger_ids) -> None:
        """LedgerTruncatedError if one of ``ledger_ids`` was listed and truncated away (see
        :meth:`append`; a change checks before it fences a tail)."""
        self.prefetch(ledger_ids)
        for lid in ledger_ids:
            index = self._index[lid]
            if index is not None and truncated_leftover(self.head, index):
                self._refuse_truncated(lid, index)

    def _refuse_truncated(self, ledger_id: int, index: tuple[bytes, int]) -> None:
        raise LedgerTruncatedError(
            f"log {self.name}: ledger {ledger_id} was listed and truncated away (segment "
            f"{int(index[0])}; the list starts at {self.head.first}): a ledger is listed once, "
            "never again (its deletion may be under way)")

    def _filter_read(self, keys: list[tuple[int, int]]) -> None:
        """Read the records ``(generation, shard)`` of the filter of expired writer ids this
        edit has not read yet (one round trip)."""
        missing = [k for k in keys if k not in self._filter]
        if not missing:
            return
        got = self.store.get_many([expired_writers_shard_path(self.name, shard, g)
                                   for g, shard in missing])
        for key, item in zip(missing, got):
            self._filter[key] = (item[0], item[1]) if item is not None else (None, None)

    def _filter_holds(self, writer_id: str) -> bool:
        """Whether a generation of the filter of expired writer ids may hold ``writer_id``."""
        keys = [(g, ExpiredWriters.shard(writer_id, g))
                for g in range(ExpiredWriters.generations(self.head.expired.get("filtered", 0)))]
        self._filter_read(keys)
        return any(ExpiredWriters.holds(self._filter[k][0], writer_id, k[0]) for k in keys)

    def _record_expired(self, writer_id: str) -> None:
        """Add an expired key's writer id to the filter's current generation (in this edit's
        transaction)."""
        filtered = self.head.expired.get("filtered", 0)
        g = ExpiredWriters.generation(filtered)
        if g not in self._filter_parents:
            self._filter_parents[g] = \
                self.store.exists(expired_writers_path(self.name, g)) is None
            # (generation g >= 1 lives under generation 0's parent: it exists, g0 is full)
        key = (g, ExpiredWriters.shard(writer_id, g))
        self._filter_read([key])
        bits, version = self._filter[key]
        self._filter[key] = (ExpiredWriters.add(bits, writer_id, g), version)
        self._filter_changed.add(key)
        self.head.expired["filtered"] = filtered + 1

    # ---- the transaction --------------------------------------------------------------
    def operations(self) -> list[tuple]:
        """The transaction's operations after the head's set, in order."""
        ops: list[tuple] = []
        for seq, entry in sorted(self._changed.items()):
            ops.append(("set", segment_path(self.name, seq), encode_segment(entry)))
        for entry in self._unlisted:
            ops.append(("set", segment_path(self.name, entry.seq), encode_segment(entry)))
            ops.append(("delete", ledger_index_path(self.name, entry.ledger_id)))
        for entry in self._appended:
            ops.append(("create", segment_path(self.name, entry.seq), encode_segment(entry)))
            idx = ledger_index_path(self.name, entry.ledger_id)
            data = str(entry.seq).encode()
            if entry.ledger_id in self._index_versions:
                ops.append(("set", idx, data, self._index_versions[entry.ledger_id]))
            else:
                ops.append(("create", idx, data))
        ops.extend(self._collected)
        for g, missing in sorted(self._filter_parents.items()):
            if missing:
                ops.append(("create", expired_writers_path(self.name, g), b""))
        for g, shard in sorted(self._filter_changed):
            bits, version = self._filter[(g, shard)]
            path = expired_writers_shard_path(self.name, shard, g)
            ops.append(("create", path, bits) if version is None
                       else ("set", path, bits, version))
        return ops

    def collect(self, leftovers: "Leftovers") -> None:
        """Remove the records of truncated segments that ``leftovers`` read (their index records
        too where they still point at them: deleted at the version read, so one that an
        append re-pointed meanwhile fails the transaction instead). NoChange when another
        change removed them first."""
        head = self.head
        if head.gc != leftovers.start:
            raise NoChange()
        for entry, item in zip(leftovers.segments, leftovers.index):
            self._collected.append(("delete", segment_path(self.name, entry.seq)))
            if item is not None and item[0] == str(entry.seq).encode():
                self._collected.append(("delete", ledger_index_path(self.name, entry.ledger_id),
                                        item[1]))
        head.gc = leftovers.stop


@dataclass
class Leftovers:
    """Records of truncated segments ``start .. stop-1`` and their index records, read before
    the change that removes them (:meth:`LogEdit.collect`): they no longer change, so the
    attempt that races commits for the head reads nothing but the head."""
    start: int
    stop: int
    segments: list
    index: list


def read_leftovers(store, name: str, batch: int = GC_BATCH) -> Leftovers | None:
    """The next ``batch`` records of truncated segments of the log (None: none left)."""
    data, _ = read_head(store, name)
    if format_version(data) != FORMAT_VERSION:
        return None
    head = LogHead.deserialize(data)
    stop = min(head.first, head.gc + batch)
    if head.gc >= stop:
        return None
    gone = read_segments(store, name, head.gc, stop, missing_ok=True)
    index = store.get_many([ledger_index_path(name, e.ledger_id) for e in gone])
    return Leftovers(head.gc, stop, gone, index)


def lookup(store, name: str, head: LogHead, ledger_id: int,
           index: tuple[bytes, int] | None | bool = False) -> LogLedger | None:
    """The segment listing ``ledger_id`` through the ledger index (None: not listed).
    ``index``: its index record as already read (``None``: absent), else it is read here."""
    if index is False:
        index = store.get_many([ledger_index_path(name, ledger_id)])[0]
    if index is None:
        return None
    try:
        seq = int(index[0])
    except ValueError:
        raise errors.MetadataFormatError(f"log {name}: corrupt ledger index record of ledger "
                                         f"{ledger_id}: {index[0][:40]!r}") from None
    if not head.first <= seq < head.next:
        return None
    try:
        entry = decode_segment(store.get(segment_path(name, seq))[0], seq)
    except NoNodeError:
        return None
    return entry if entry.ledger_id == ledger_id and entry.listed else None


def append_bytes(edit: LogEdit, entries: list[LogLedger]) -> int:
    """About what a transaction that lists ``entries`` at the end of the edit's log carries
    (:func:`metadata.store.transaction_bytes`): its head, their segment and index records,
    and the last :data:`OPEN_TAIL` segments sealed -- known before the change fences any
    writer, so a commit too large for the store is refused before it touches a log."""
    from metadata.store import transaction_bytes
    ops = [("set", log_path(edit.name), edit.head.serialize())]
    for i, entry in enumerate(entries):
        seq = edit.head.next + i
        ops.append(("create", segment_path(edit.name, seq), encode_segment(entry)))
        ops.append(("create", ledger_index_path(edit.name, entry.ledger_id), str(seq).encode()))
    ops += ops[1:2 * OPEN_TAIL + 1:2]         # (a sealed segment is about an appended one)
    return transaction_bytes(ops)


def _apply(store, edits: dict[str, LogEdit], guard, mark: str | None = None) -> None:
    """Commit the edits in one transaction: [guard check,] for each log its head set at the
    version read, then its operations [, then create ``mark``]."""
    txn = store.transaction()
    if guard is not None:
        txn.check(guard[0], guard[1])
    for name, edit in edits.items():
        ops = edit.operations()         # (may move the head's gc bound: before serialising)
        edit.head.restamp()
        txn.set(log_path(name), edit.head.serialize(), version=edit.version)
        for op in ops:
            if op[0] == "create":
                txn.create(op[1], op[2], makepath=False)
            elif op[0] == "set":
                txn.set(op[1], op[2], version=op[3] if len(op) > 3 else -1)
            else:
                txn.delete(op[1], version=op[2] if len(op) > 2 else -1)
    if mark is not None:
        txn.create(mark, b"")
    txn.commit()


def _outcome(heads: dict, in_doubt: dict) -> str:
    """What the heads (read after a sync) tell of a transaction whose answer was lost, which
    wrote ``in_doubt[name] = (stamp, version read, uid)`` to each log: the transaction is
    all-or-nothing, so one log's answer is every log's."""
    outcomes = {change_outcome(heads[n][0], heads[n][1], *in_doubt[n]) for n in heads}
    for settled in (APPLIED, NOT_APPLIED):
        if settled in outcomes:
            return settled
    return UNKNOWN


def commit_edits(store, names, change: Callable[[dict[str, LogEdit]], None], *,
                 done: Callable[[dict[str, LogEdit]], bool] | None = None,
                 guard: tuple[str, int] | None = None, mark: str | None = None,
                 on_v1: Callable[[str, bytes, int], None] | None = None
                 ) -> Updated[dict[str, LogEdit]]:
    """The update loop of format-2 logs, changed together in one transaction (module
    docstring): read every head, run ``change`` on their :class:`LogEdit`s (name -> edit; it
    edits them in place or raises NoChange: none changes), commit every head + its edits in
    one transaction conditional on every head's version. ``done`` tells whether the change is
    already stored (checked before every attempt, and after a lost answer that the heads'
    recent stamps cannot settle: it may only answer True on proof). ``on_v1(name, data,
    version)`` converts a format-1 record met on the way. ``guard`` as in
    :func:`metadata.update.update_record`. ``mark``: a path that only this change creates (in
    its transaction; a Spark job's commit record): a lost answer is then settled by whether it
    exists, however many changes came since (:func:`metadata.update.transaction_applied`).
    A lost answer is settled by any of the logs (all or none of them hold the change).

    :returns: ``Updated`` whose ``value`` is the edits and ``version`` each head's version.
    :raises NoNodeError: a log does not exist. :raises OutcomeUnknownError: an answer was
        lost and the heads could not be re-read.
    """
    from metadata.update import check_guard
    names = list(dict.fromkeys(names))
    what = f"log {names[0]}" if len(names) == 1 else f"logs {', '.join(names)}"
    conflicts = unknowns = 0
    in_doubt: dict[str, tuple[str, int, str]] | None = None   # name -> (stamp, version, uid)
    while True:
        heads: dict[str, tuple[LogHead, int]] = {}
        converted = False
        missing: list[str] = []
        for name in names:
            try:
                data, version = read_head(store, name, settle=in_doubt is not None)
            except NoNodeError:
                if in_doubt is None:
                    raise
                missing.append(name)        # deleted since a lost answer: settled below
                continue
            except MetadataConnectionError as exc:
                if in_doubt is None:
                    raise
                raise OutcomeUnknownError(
                    f"{what}: the answer to a change was lost and the log cannot be re-read, "
                    f"so whether it was applied is unknown (retry once the metadata store "
                    f"answers): {exc}") from exc
            if format_version(data) != FORMAT_VERSION:
                if on_v1 is None:
                    raise errors.MetadataFormatError(
                        f"log {name}: format-1 record met where none may be")
                on_v1(name, data, version)
                converted = True
                break
            heads[name] = (LogHead.deserialize(data), version)
        if converted:
            continue
        edits = {name: LogEdit(store, name, head, version)
                 for name, (head, version) in heads.items()}
        versions = {name: version for name, (_, version) in heads.items()}
        if missing:
            # a log deleted (maybe created again) after the lost answer: what it held is
            # gone, and the change must not be made again on another log of that name --
            # unless the other logs or the mark tell that it was not applied
            outcome = _outcome(heads, in_doubt)
            if outcome == UNKNOWN and mark is not None:
                outcome = APPLIED if transaction_applied(store, mark) else NOT_APPLIED
            if outcome == APPLIED:
                log.info("%s: the change whose answer was lost had been applied (log %s "
                         "deleted since)", what, missing[0])
                return Updated(edits, versions, True)
            if outcome == NOT_APPLIED:
                raise NoNodeError(f"log {missing[0]} was deleted")
            raise OutcomeUnknownError(
                f"{what}: the answer to a change was lost and log {missing[0]} was deleted "
                "before it could be re-read; whether the change was applied is unknown")
        if in_doubt is not None:
            outcome = _outcome(heads, in_doubt)
            if outcome == UNKNOWN and mark is not None:
                outcome = APPLIED if transaction_applied(store, mark) else NOT_APPLIED
            if outcome == APPLIED:
                log.info("%s: the change whose answer was lost had been applied", what)
                return Updated(edits, versions, True)
            if outcome == UNKNOWN and not (done is not None and done(edits)):
                raise OutcomeUnknownError(
                    f"{what}: the answer to a change was lost and {RECENT_CHANGES}+ changes "
                    "came since, so whether it was applied is unknown (its ledgers are kept; "
                    "a commit with an idempotency key can simply be retried)")
            in_doubt = None
        for name, (head, _) in heads.items():
            if head.properties.get(DELETED):
                raise LogDeletedError(f"no log named {name!r} (it is being deleted)")
        if done is not None and done(edits):
            return Updated(edits, versions, True)
        try:
            change(edits)
        except NoChange:
            return Updated(edits, versions, False)
        try:
            _apply(store, edits, guard, mark)
            for edit in edits.values():
                edit.version += 1
            return Updated(edits, {n: e.version for n, e in edits.items()}, True)
        except (BadVersionError, NodeExistsError, NoNodeError) as exc:
            # another change came first (a head moved, or a record it adds or removes is
            # there or gone): re-read and decide again
            if guard is not None:
                check_guard(store, guard, what)
            conflicts += 1
            after_conflict(conflicts, what, str(exc))
        except MetadataConnectionError as exc:
            unknowns += 1
            in_doubt = {n: (e.head.stamp, versions[n], e.head.uid)    # what _apply wrote
                        for n, e in edits.items()}
            after_lost_answer(unknowns, what, exc)


# ---- whole lists, kept up to date --------------------------------------------------------

@dataclass
class _Copy:
    uid: str
    rev: int
    first: int
    next: int
    entries: list[LogLedger]   # listed entries of segments first .. next-1 (unlisted left out)


class SegmentCache:
    """Copies of whole lists, per log: brought up to date from the head -- the segments
    appended since, a re-read of the copy's last two (they may have been sealed) -- or re-read
    whole when the head says a middle segment changed (``rev``) or the log is another one
    (``uid``). Bounded: at most ``max_logs`` lists (least recently used dropped)."""

    def __init__(self, max_logs: int = 64):
        self.max_logs = max_logs
        self._lock = threading.Lock()
        self._copies: dict[str, _Copy] = {}

    def entries(self, store, name: str, head: LogHead) -> list[LogLedger]:
        with self._lock:
            old = self._copies.pop(name, None)
        if old is None or old.uid != head.uid or old.rev != head.rev or old.first > head.first \
                or old.next > head.next or old.next <= head.first:
            entries = read_segments(store, name, head.first, head.next)
        else:
            again = max(head.first, old.next - OPEN_TAIL)      # (may have been sealed since)
            keep = [e for e in old.entries if head.first <= e.seq < again]
            entries = keep + read_segments(store, name, again, head.next)
        entries = [e for e in entries if e.listed]
        with self._lock:
            self._copies[name] = _Copy(head.uid, head.rev, head.first, head.next, entries)
            while len(self._copies) > self.max_logs:
                self._copies.pop(next(iter(self._copies)))
        return entries


# ---- format 1 -> format 2 -------------------------------------------------------------------

def convert_v1(store, name: str, data: bytes, version: int) -> None:
    """Convert a format-1 record read at ``version`` (module docstring). Returns once the
    record is a head (this conversion's or another's), or when the format-1 record changed
    meanwhile (the caller reads it again and comes back). Every record is written by a
    transaction that also checks the format-1 record is still at ``version``: a conversion
    that read an older record (another client's, slower) can never overwrite or remove what
    a newer one wrote."""
    v1 = LogMetadata.deserialize(data).with_offsets()
    path = log_path(name)
    for parent in (segments_path(name), ledgers_index_path(name)):
        try:
            store.create(parent, b"")
        except NodeExistsError:
            pass
    entries = [e.copy(seq=i) for i, e in enumerate(v1.ledgers)]
    try:
        for i in range(0, len(entries), 100):
            _put_records(store, path, version, name, entries[i:i + 100])
        _remove_leftovers(store, path, version, name, len(entries))
        props = dict(v1.properties)
        t = store.clock.now_ms()
        writers = {wid: {"seq": s, "t": t, "epoch": props.pop(f"epoch:{wid}", None)}
                   for wid, s in v1.writers.items()}
        head = LogHead(name=name, uid=new_stamp(), first=0, next=len(entries), gc=0, rev=0,
                       writers=writers, properties=props, stamp=new_stamp())
        store.set(path, head.serialize(), version=version)
        log.info("log %s converted from format 1 (one record, %d ledgers) to format 2 (head + "
                 "one record per ledger)", name, len(entries))
    except (BadVersionError, NoNodeError, NodeExistsError, MetadataConnectionError):
        pass    # changed, converted or deleted meanwhile, or no answer: the caller reads again


def _put_records(store, path: str, version: int, name: str, entries: list[LogLedger]) -> None:
    """Write segment and index records (create, or overwrite a leftover of an earlier
    attempt) in one transaction checking the format-1 record at ``version``."""
    records = []
    for entry in entries:
        records.append((segment_path(name, entry.seq), encode_segment(entry)))
        records.append((ledger_index_path(name, entry.ledger_id), str(entry.seq).encode()))
    there = store.get_many([p for p, _ in records])
    txn = store.transaction()
    txn.check(path, version)
    for (p, data), old in zip(records, there):
        if old is None:
            txn.create(p, data, makepath=False)
        else:
            txn.set(p, data, version=old[1])
    txn.commit()


def _remove_leftovers(store, path: str, version: int, name: str, start: int) -> None:
    """Remove segment records from ``start`` on (an earlier attempt's, when the list was
    longer), checking the format-1 record at ``version``."""
    while True:
        chunk = list(range(start, start + 100))
        there = [q for q, old in zip(chunk, store.get_many([segment_path(name, q) for q in chunk]))
                 if old is not None]
        if not there:
            return
        txn = store.transaction()
        txn.check(path, version)
        for q in there:
            txn.delete(segment_path(name, q))
        txn.commit()
        start += 100
