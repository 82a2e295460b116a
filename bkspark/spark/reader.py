"""Reading logs: planning ledger ranges, filter pushdown, and the batch reader.

A log is an ordered list of ledgers. A read from position ``start`` (the next entry to read)
to ``end`` (exclusive; ``None`` = the current end) becomes one span per ledger: closed ledgers
to their recorded last entry, the open (last) ledger to its LAC, read without fencing, so a
read never disturbs a writer. Large spans are split into several input partitions. Every
partition carries all that ``read()`` needs (it runs on an executor from a pickled copy).
"""
from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceReader, InputPartition

from bkspark.errors import BadRequestError, BKError, NoSuchLedgerError, NoSuchLogError
from bkspark.log.offload import Location, files_of, on_bookies, read_entries
from bkspark.log.position import EARLIEST, LATEST, Position
from bkspark.spark import codec, conn, importguard
from bkspark.spark.offloaded import read_offloaded
from bkspark.spark.options import ARROW, RECORD, AtOffset, AtTime
from metadata.layout import log_path
from metadata.log_entry import LogLedger

log = logging.getLogger("bkspark.spark")

EMPTY = Position(-1, 0)                  # "before the first ledger" (an empty log)
RECORD_ENTRIES_PER_PARTITION = 100_000
# Spark's spark.sql.files.maxPartitionBytes default.  Fewer, larger partitions: every Python data
# source task pays ~0.1 s of fixed setup in local mode (a no-op source's 4 partitions on 2 cores
# took two such waves), and bench/spark.py --full read its 2 x 104 MB ledgers 17-25% faster as 2
# partitions than as 4 of 64 MiB.  minPartitions splits further when cores would stay idle.
ARROW_BYTES_PER_PARTITION = 128 << 20
ARROW_ENTRIES_PER_PARTITION = 64
RECORD_BATCH_ROWS = 4096
#: an entry's estimated size when no closed ledger of its log says (record entries)
UNKNOWN_ENTRY_BYTES = 1024
#: ledgers of a pack opened together (one pipelined metadata read)
OPEN_BATCH = 128
#: a pack's small ranges (:data:`READ_AHEAD_BYTES`) are requested in batches (RangeBatch:
#: each bookie's requests of a batch in one send, on one connection, answered in order) of
#: at most this many ranges ...
READ_BATCH = 64
#: ... and this many recorded bytes; the next batch is sent when the one before starts
#: being read, so at most two batches' answers wait in the socket buffers and the bookie is
#: never blocked long sending one (a bookie closes a connection whose answer is not read
#: within its send timeout)
READ_BATCH_BYTES = 1 << 20
#: a range is requested in a batch only when its recorded size is at most this (a larger one
#: is requested when it is reached, the ranges before it read first)
READ_AHEAD_BYTES = 256 << 10


class DataLossError(BKError):
    """Data a query was to read is gone (its ledger was truncated away or overwritten)."""


@dataclass
class LedgerRange(InputPartition):
    """Entries ``first..last`` (inclusive) of ledger ``ledger_id`` of log ``log``; ``offset``:
    the log offset of the ledger's entry 0 (:meth:`LogMetadata.offsets`; schema=kafka);
    ``size``: its bytes as the log's list records them (None: not known -- an open ledger);
    ``offloaded``: the ledger's offload record when the range is read from its Parquet files
    (:mod:`bkspark.spark.offloaded`), else None."""

    log: str
    ledger_id: int
    first: int
    last: int
    offset: int | None
    size: int | None
    offloaded: dict | None

    def __init__(self, log: str, ledger_id: int, first: int, last: int,  # noqa: D107
                 offset: int | None = 0, size: int | None = None, offloaded: dict | None = None):
        super().__init__((log, ledger_id, first, last))
        self.log, self.ledger_id, self.first, self.last = log, ledger_id, first, last
        self.offset, self.size, self.offloaded = offset, size, offloaded


@dataclass
class PackedRanges(InputPartition):
    """Ledger ranges one task reads, in order (:func:`pack`): many small ledgers -- of one
    log or of several -- cost one task, not one each."""

    ranges: list

    def __init__(self, ranges: list):  # noqa: D107
        super().__init__(tuple((r.log, r.ledger_id, r.first, r.last) for r in ranges))
        self.ranges = list(ranges)


# ---- planning ---------------------------------------------------------------------------

def ledger_last(logs, entry: dict) -> int:
    """Last readable entry of a list entry (closed: recorded; open: LAC, without fencing)."""
    return logs.ledger_end(entry)


def spans(logs, name: str, start: Position, end: Position | None, fail_on_data_loss: bool,
          ledger_ok=None, *, planned: bool = False) -> list[tuple[int, int, int, dict]]:
    """(ledger_id, first, last, list entry) for the entries of ``name`` in [start, end); each
    list entry carries its ``offset``. Reads the segments from ``start``'s ledger to ``end``'s
    (the end of the log without one), not the rest of the list.

    Without ``end`` the span stops after the first ledger whose end is not final (an open
    ledger, read to its LAC): a position past it could never be reached again by the entries
    its writer acknowledges later. ``planned``: ``end`` was fixed by an earlier planning of
    this very batch (a streaming offset): it is final, and the entries before it are read
    whatever the LAC reads now -- they were confirmed when it was planned (a LAC read now
    may answer lower, or not at all, and a batch cut short would be skipped for good).
    Otherwise an ``end`` is also bounded by what is readable now (a user's ending position
    beyond the LAC must not read unconfirmed entries).

    :raises BKError: the LAC of an open ledger could not be read (no bookie answered).
    """
    return walk(logs, name, start, end, fail_on_data_loss, ledger_ok, planned=planned)[0]


def walk(logs, name: str, start: Position, end: Position | None, fail_on_data_loss: bool,
         ledger_ok=None, *, planned: bool = False) -> tuple[list, bool]:
    """``(spans, settled)``: :func:`spans`, and whether the walk reached the end of the list
    and found every ledger's end final there (no ``end``; the list empty or its last ledger
    closed). Settled, nothing beyond the spans can be read until the log's list changes --
    which changes its head's version (closed ledgers are immutable)."""
    first_seq, next_seq = logs.bounds(name)
    if first_seq == next_seq or (end is not None and end.ledger_id == -1):
        return [], end is None
    at = None if start.ledger_id == -1 else logs.entry_of(name, start.ledger_id)
    if start.ledger_id != -1 and at is None:
        msg = (f"log {name!r}: ledger {start.ledger_id} of position {tuple(start)} is no longer in "
               "the log (truncated or overwritten)")
        if fail_on_data_loss:
            raise DataLossError(msg + "; set failOnDataLoss=false to continue from the log's start")
        log.warning("%s; continuing from the start of the log", msg)
    si = first_seq if at is None else at.seq
    start_entry = 0 if at is None else start.entry_id
    if end is None:
        ei = next_seq - 1
    else:
        stop = logs.entry_of(name, end.ledger_id)
        if stop is None:
            raise DataLossError(f"log {name!r}: ledger {end.ledger_id} of end position {tuple(end)} "
                                "is not in the log")
        ei = stop.seq
    out = []
    settled = end is None
    entries = logs.segments(name, si, ei + 1)
    for entry in entries:
        lid = entry.ledger_id
        first = start_entry if entry.seq == si else 0
        if planned and end is not None and entry.seq == ei and not entry.closed:
            last, final = end.entry_id - 1, True
        else:
            last, final = logs.readable_end(entry)
        if end is not None and entry.seq == ei:
            last = min(last, end.entry_id - 1)
        if first <= last and (ledger_ok is None or ledger_ok(lid)):
            out.append((lid, first, last, entry))
        if end is None and not final:
            return out, False
    return out, settled


def resolve_start(logs, name: str, where, *, fail_on_data_loss: bool = True,
                  no_match: str = "error") -> Position:
    """Position of the next entry to read (empty log: EMPTY) for earliest / latest / a
    Position / a Kafka offset (:class:`AtOffset`) / a time (:class:`AtTime`: the first record
    stamped at or after it; when there is none, ``no_match`` says: ``"error"``, or
    ``"latest"``, the log's end -- what an ending time means)."""
    try:
        # (by offset or time: the whole list; a start or end position: two reads)
        md = logs.get(name)[0] if isinstance(where, (AtOffset, AtTime)) else None
        logs.bounds(name)
    except NoSuchLogError:
        return EMPTY
    if isinstance(where, AtOffset):
        return position_of_offset(logs, name, md, where.offset, fail_on_data_loss)
    if isinstance(where, AtTime):
        found = seek_time(logs, md, where.ms * 1000)
        if found is not None:
            return found
        if no_match == "error":
            raise BadRequestError(
                f"log {name!r} holds no record stamped at or after {where.ms} ms since the "
                "epoch: set startingOffsetsByTimestampStrategy=latest to start at its end")
        where = LATEST
    if isinstance(where, Position):
        if logs.entry_of(name, where.ledger_id) is not None:
            return where
        msg = (f"log {name!r} has no ledger {where.ledger_id} (offset {tuple(where)}): it was "
               "removed (retention, truncation, overwrite) or never was in the log")
        if fail_on_data_loss:
            raise DataLossError(msg + "; set failOnDataLoss=false to start at the log's start")
        log.warning("%s; starting at the log's start", msg)
        where = EARLIEST
    if where not in (EARLIEST, LATEST):
        raise BadRequestError(f"bad offset {where!r}")
    edge = logs.last_listed(name) if where == LATEST else logs.next_listed(name, -1)
    if edge is None:
        return EMPTY
    if where == EARLIEST:
        return Position(edge.ledger_id, 0)
    return Position(edge.ledger_id, ledger_last(logs, edge) + 1)


def position_of_offset(logs, name: str, md, offset: int, fail_on_data_loss: bool) -> Position:
    """The position of the entry of log offset ``offset`` (the log's end: the next entry)."""
    md = md.with_offsets()
    if not md.ledgers:
        raise BadRequestError(f"log {name!r} is empty: it has no offset {offset}")
    bases = md.offsets()
    if offset < bases[0]:
        msg = (f"log {name!r}: offset {offset} was truncated away (the log starts at offset "
               f"{bases[0]})")
        if fail_on_data_loss:
            raise DataLossError(msg + "; set failOnDataLoss=false to start at the log's start")
        log.warning("%s; starting at the log's start", msg)
        return Position(md.ledgers[0].ledger_id, 0)
    for i, (entry, base) in enumerate(zip(md.ledgers, bases)):
        nxt = bases[i + 1] if i + 1 < len(bases) else None
        if nxt is not None and offset >= nxt:
            continue
        last = ledger_last(logs, entry)
        if offset <= base + last:
            return Position(entry.ledger_id, offset - base)
        if nxt is not None:                  # a gap left by a removed ledger: the next one
            return Position(md.ledgers[i + 1].ledger_id, 0)
        if offset == base + last + 1:        # the end of the log
            return Position(entry.ledger_id, offset - base)
        raise BadRequestError(f"log {name!r} ends at offset {base + last + 1}; offset "
                              f"{offset} is beyond it")
    raise AssertionError("unreachable")


def seek_time(logs, md, ts_us: int, chunk: int = 1024) -> Position | None:
    """The first record of the log stamped at or after ``ts_us`` (record timestamps; entries
    without one are passed over), or None. Ledgers whose recorded ``max_ts`` is earlier are
    skipped without reading, one whose ``min_ts`` is not earlier starts at its entry 0; the
    others are read in order until a record qualifies."""
    for entry in md.ledgers:
        if entry.max_ts is not None and entry.max_ts < ts_us:
            continue
        lid = entry.ledger_id
        if entry.min_ts is not None and entry.min_ts >= ts_us:
            return Position(lid, 0)
        last = ledger_last(logs, entry)
        if last < 0:
            continue
        for eid, data in _ledger_entries(logs, md.name, entry, last, chunk):
            ts = codec.decode_record(data)[2]
            if ts is not None and ts >= ts_us:
                return Position(lid, eid)
    return None


def _ledger_entries(logs, name: str, entry: LogLedger, last: int, chunk: int):
    """``(entry id, data)`` of listed ledger ``entry``'s entries ``0..last``, from the
    bookies, ``chunk`` a read -- or from its offloaded files once they are its only copy,
    also when the copy is dropped while it is read (decided on a synced re-read of its
    segment when the bookies fail it; the files go on from the next entry)."""
    first = 0
    if on_bookies(entry.offloaded):
        try:
            rh = logs.bk.open_ledger(entry.ledger_id, password=logs.password, recovery=False)
            try:
                for lo in range(0, last + 1, chunk):
                    hi = min(last, lo + chunk - 1)
                    read = rh.read if hi <= rh.last_add_confirmed else rh.read_unconfirmed
                    for e in read(lo, hi):
                        yield e.entry_id, e.view
                        first = e.entry_id + 1
            finally:
                rh.close()
            return
        except BKError:
            logs.store.sync(log_path(name))
            fresh = logs.entry_of(name, entry.ledger_id)
            if fresh is None or on_bookies(fresh.offloaded):
                raise
            entry = fresh
    if first <= last:
        yield from read_entries(Location(entry.offloaded["location"]), name, entry.offloaded,
                                first, last)


def offset_for(spec, name: str, default: str):
    """The per-log offset spec of startingOffsets / endingOffsets."""
    if spec is None:
        return default
    if isinstance(spec, dict):
        return spec.get(name, default)
    return spec


def split_span(opts, lid: int, first: int, last: int, entry: LogLedger, fmt: str):
    """Cut one ledger span into partition-sized ranges."""
    per = opts.entries_per_partition
    if per is None:
        if fmt == ARROW:
            n_total = entry.entry_count() or 0
            length = entry.sealed_length()
            if n_total > 0 and length > 0:
                per = max(1, int(ARROW_BYTES_PER_PARTITION * n_total / length))
            else:
                per = ARROW_ENTRIES_PER_PARTITION
        else:
            per = RECORD_ENTRIES_PER_PARTITION
    # equal-sized pieces (64+36 entries would leave one Spark core idle at the end)
    count = last - first + 1
    if count <= 0:             # nothing left (e.g. pushed filters exclude the whole span)
        return
    pieces = -(-count // per)
    per = -(-count // pieces)
    lo = first
    while lo <= last:
        hi = min(last, lo + per - 1)
        yield lid, lo, hi
        lo = hi + 1


def entry_bytes(ranges, unknown: float = None) -> dict[int, float]:
    """Estimated bytes per entry of each ledger of ``ranges`` (``(ledger_id, first, last,
    list entry)``): a closed ledger's recorded length over its entries; an open one's, the
    average of the closed ones, else ``unknown`` (:data:`UNKNOWN_ENTRY_BYTES`)."""
    per, known = {}, []
    for lid, _, _, entry in ranges:
        n = entry.entry_count() or 0
        if n > 0 and entry.sealed_length():
            per[lid] = entry.length / n
            known.append(per[lid])
    default = sum(known) / len(known) if known else (unknown or UNKNOWN_ENTRY_BYTES)
    return {lid: per.get(lid, default) for lid, _, _, _ in ranges}


def plan_ranges(opts, fmt: str, name: str, spans_, clip=None) -> list:
    """The LedgerRanges of a log's spans: each span split to partition size
    (:func:`split_span`; ``clip``: pushed filters narrowing it first), with its estimated
    bytes (:func:`entry_bytes`; an open ledger of an arrow log with no closed one counts
    ``maxEntryBytes`` an entry). A span of an offloaded ledger read from its files is split
    at their bounds instead, a range a file (a split inside a file would read its row groups
    once per range), unless ``entriesPerPartition`` says otherwise."""
    per = entry_bytes(spans_, opts.max_entry_bytes if fmt == ARROW else None)
    out = []
    for lid, first, last, entry in spans_:
        if clip is not None:
            first, last = clip(first, last)
            if first > last:        # pushed filters leave nothing of this span
                continue
        offloaded = entry.offloaded if opts.read_offloaded else None
        if offloaded is None and not on_bookies(entry.offloaded):
            raise BadRequestError(
                f"log {name!r}: ledger {lid} is offloaded and its files are its only copy "
                "(the bookies' was dropped, as the log's offload policy says), so "
                "readOffloaded=false cannot read it: drop that option")
        if offloaded is not None and opts.entries_per_partition is None:
            pieces = [(lid, max(first, f["first"]), min(last, f["last"]))
                      for f in files_of(offloaded, first, last)]
        else:
            pieces = split_span(opts, lid, first, last, entry, fmt)
        for lid2, lo, hi in pieces:
            out.append(LedgerRange(name, lid2, lo, hi, entry.offset,
                                   int((hi - lo + 1) * per[lid]), offloaded))
    return out


#: the most task slots the planner assumes (:func:`assumed_parallelism`): a data source cannot
#: see the cluster's cores, so a read smaller than 16 x ``maxPartitionBytes`` is spread over
#: at most 16 packs unless ``minPartitions`` says more
MAX_ASSUMED_PARALLELISM = 16


def assumed_parallelism() -> int:
    """The task slots a read is planned for when ``minPartitions`` is not set: the CPUs this
    (planning) process may run on, at most :data:`MAX_ASSUMED_PARALLELISM`.

    Spark divides a file scan by the cluster's cores, which a Python data source's planner
    cannot see; it runs in a Python worker on the driver and inherits its CPU affinity. With
    ``local[*]`` those are the task slots; with ``local[N]`` on a machine of more CPUs, or in
    a container whose CPU quota (not its affinity) limits it, there are more packs than slots
    (tasks run in waves, as before this rule); on a cluster whose cores outnumber the
    driver's, a read smaller than cores x ``maxPartitionBytes`` is spread over fewer tasks
    than there are cores. In each of those, set ``minPartitions`` to the slots.

    Fewer, fuller tasks matter because every Python data source task costs a fixed ~50-65 ms
    on a 2-vCPU machine (the package README's performance notes), so a ``local[2]`` read
    planned as 8 tasks instead of 2 spends a quarter of its time starting tasks."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):        # (not Linux)
        cpus = os.cpu_count() or MAX_ASSUMED_PARALLELISM
    return max(1, min(MAX_ASSUMED_PARALLELISM, cpus))


def pack(parts: list, opts) -> list:
    """Group consecutive ranges into partitions -- Spark's rule for small files, with the
    packs balanced: each range costs its bytes plus ``openCostInBytes``; a read of ``total``
    is cut into ``max(total / maxPartitionBytes, min(P, total / openCostInBytes))`` packs of
    about equal cost, P the parallelism (``minPartitions``, else
    :func:`assumed_parallelism`): a range joins the pack its cost's midpoint falls in, each
    pack's share taken anew from what is left over the packs still to make (so a range
    larger than a share leaves the rest balanced, and a pack cut short counts as the part
    of a pack it holds). A pack never holds more than ``maxPartitionBytes`` unless it is one
    range, and pieces of one ledger that planning split are never joined again. Order is
    kept: a pack holds consecutive ranges of the plan, so many small ledgers, of one log or
    several, are read by few tasks in order. With ``minPartitions`` the largest packs are then halved
    until there are that many (when there are that many ranges). A pack of one range is that
    range. With ``entriesPerPartition`` nothing is packed (the user chose each partition's
    entries)."""
    if not parts or opts.entries_per_partition is not None:
        return parts
    cost = [(p.size if p.size is not None else UNKNOWN_ENTRY_BYTES * (p.last - p.first + 1))
            + opts.open_cost_bytes for p in parts]
    left = sum(cost)
    parallelism = opts.min_partitions or assumed_parallelism()
    packs = max(-(-left // opts.max_partition_bytes),
                min(parallelism, left // opts.open_cost_bytes), 1)
    budget, share = packs, left / packs     # packs still to make, each one's cost
    out, current, used = [], [], 0
    for p, c in zip(parts, cost):
        joined = current and current[-1].ledger_id == p.ledger_id
        full = used + c / 2 > share
        if current and (joined or full or used + c > opts.max_partition_bytes):
            out.append(current)
            left -= used
            # (a pack cut short -- a ledger's pieces, the byte cap -- uses up only its part
            # of the budget: the rest stay near their share)
            budget -= 1 if full else min(1.0, used / share)
            share = left / max(1.0, budget)
            current, used = [], 0
        current.append(p)
        used += c
    out.append(current)
    while opts.min_partitions and len(out) < opts.min_partitions:
        i = max(range(len(out)), key=lambda k: len(out[k]))
        if len(out[i]) < 2:
            break
        half = len(out[i]) // 2
        out[i:i + 1] = [out[i][:half], out[i][half:]]
    return [group[0] if len(group) == 1 else PackedRanges(group) for group in out]


def spread(parts: list, min_partitions: int | None) -> list:
    """Split the ranges with the most entries in halves until there are ``min_partitions``
    (Kafka's ``minPartitions``) or no range has two entries left; order is kept (by log, ledger,
    entry)."""
    if not min_partitions or len(parts) >= min_partitions:
        return parts
    parts = list(parts)
    while len(parts) < min_partitions:
        i = max(range(len(parts)), key=lambda k: parts[k].last - parts[k].first)
        p = parts[i]
        if p.last <= p.first:
            break
        mid = p.first + (p.last - p.first + 1) // 2
        half = None if p.size is None else p.size // 2
        parts[i:i + 1] = [LedgerRange(p.log, p.ledger_id, p.first, mid - 1, p.offset, half,
                                      p.offloaded),
                          LedgerRange(p.log, p.ledger_id, mid, p.last, p.offset, half,
                                      p.offloaded)]
    return parts


# ---- filter pushdown ---------------------------------------------------------------------

class Pushed:
    """Conjunction of pushed filters on log / ledger_id / entry_id (record format)."""

    def __init__(self):
        self.logs: set | None = None
        self.ledgers: set | None = None
        self.ledger_lo, self.ledger_hi = None, None
        self.entry_lo, self.entry_hi = 0, None

    def accept(self, f) -> bool:
        from pyspark.sql import datasource as ds
        attr = getattr(f, "attribute", None)
        if not isinstance(attr, tuple) or len(attr) != 1 or attr[0] not in ("log", "ledger_id", "entry_id"):
            return False
        col = attr[0]
        if col == "log":
            if isinstance(f, ds.EqualTo) and isinstance(f.value, str):
                vals = {f.value}
            elif isinstance(f, ds.In) and all(isinstance(v, str) for v in f.value):
                vals = set(f.value)
            else:
                return False
            self.logs = vals if self.logs is None else self.logs & vals
            return True
        if isinstance(f, ds.In):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in f.value):
                return False
            if col == "ledger_id":
                self.ledgers = set(f.value) if self.ledgers is None else self.ledgers & set(f.value)
                return True
            return False           # entry_id IN (...) is left to Spark
        value = getattr(f, "value", None)
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        lo = hi = None
        if isinstance(f, ds.EqualTo):
            lo = hi = value
        elif isinstance(f, ds.GreaterThan):
            lo = value + 1
        elif isinstance(f, ds.GreaterThanOrEqual):
            lo = value
        elif isinstance(f, ds.LessThan):
            hi = value - 1
        elif isinstance(f, ds.LessThanOrEqual):
            hi = value
        else:
            return False
        if col == "ledger_id":
            if lo is not None:
                self.ledger_lo = lo if self.ledger_lo is None else max(self.ledger_lo, lo)
            if hi is not None:
                self.ledger_hi = hi if self.ledger_hi is None else min(self.ledger_hi, hi)
        else:
            if lo is not None:
                self.entry_lo = max(self.entry_lo, lo)
            if hi is not None:
                self.entry_hi = hi if self.entry_hi is None else min(self.entry_hi, hi)
        return True

    def log_ok(self, name: str) -> bool:
        return self.logs is None or name in self.logs

    def ledger_ok(self, lid: int) -> bool:
        return ((self.ledgers is None or lid in self.ledgers)
                and (self.ledger_lo is None or lid >= self.ledger_lo)
                and (self.ledger_hi is None or lid <= self.ledger_hi))

    def clip(self, first: int, last: int):
        first = max(first, self.entry_lo)
        if self.entry_hi is not None:
            last = min(last, self.entry_hi)
        return first, last


# ---- reading ----------------------------------------------------------------------------

def read_range(opts, fmt: str, schema, part):
    """Yield RecordBatches (exactly ``to_arrow_schema(schema)``) of one partition: a
    LedgerRange, or the ranges of a PackedRanges in order."""
    yield from read_ranges(opts, fmt, schema,
                           part.ranges if isinstance(part, PackedRanges) else [part])


def _entries(rh, part: LedgerRange, batch=None):
    """The range's entries, its requests sent now (or by ``batch.send()``): planned from a
    LAC read, so confirmed -- read beyond this fresh handle's LAC (unknown: not read)
    without the bound."""
    if part.last <= rh.last_add_confirmed:
        return rh.read(part.first, part.last, batch)
    return rh.read_unconfirmed(part.first, part.last, batch)


def _opened(bk, opts, ranges: list):
    """``(part, handle or None)`` of ``ranges`` in order: the ledgers opened
    :data:`OPEN_BATCH` at a time (one pipelined metadata read; no LAC read: the ranges were
    planned from one, their entries are confirmed, and bookies that do not answer one now
    must not fail a read they can still serve). None: the ledger is gone."""
    for start in range(0, len(ranges), OPEN_BATCH):
        batch = ranges[start:start + OPEN_BATCH]
        ids = list(dict.fromkeys(r.ledger_id for r in batch))
        handles = dict(zip(ids, bk.open_ledgers(ids, opts.password)))
        for part in batch:
            yield part, handles[part.ledger_id]


def _started(opened):
    """``(part, handle, entries or the BKError that stopped their start)`` of ``opened``, in
    order. Small ranges are requested in batches (:data:`READ_BATCH`,
    :data:`READ_BATCH_BYTES`; one send per bookie), the next batch sent before the one
    before it is yielded, so the bookies serve it while that one is decoded; a larger range
    is requested when it is reached, the batches before it yielded first. (2026-11-28,
    bench/many_logs.py: 10-27% less time than 4 ranges requested ahead one by one; see
    bkspark/spark/README.md.)"""
    from bkspark.client.read_handle import RangeBatch
    ready: list = []                # sent: yielded once the batch after it is sent
    filling: list = []
    batch, size = RangeBatch(), 0
    for part, rh in opened:
        if part.size is None or part.size > READ_AHEAD_BYTES:
            batch.send()
            yield from ready
            yield from filling
            ready, filling, batch, size = [], [], RangeBatch(), 0
            yield part, rh, _start(rh, part)
            continue
        filling.append((part, rh, _start(rh, part, batch)))
        size += part.size
        if len(filling) >= READ_BATCH or size >= READ_BATCH_BYTES:
            batch.send()
            yield from ready
            ready, filling, batch, size = filling, [], RangeBatch(), 0
    batch.send()
    yield from ready
    yield from filling


def _start(rh, part: LedgerRange, batch=None):
    """The range's entries (:func:`_entries`), or the BKError that stopped their start
    (None: the ledger is gone, ``rh`` None)."""
    if rh is None:
        return None
    try:
        return _entries(rh, part, batch)
    except BKError as exc:
        return exc


def read_ranges(opts, fmt: str, schema, ranges: list):
    """Yield RecordBatches (exactly ``to_arrow_schema(schema)``) of ``ranges``, in order.

    The ranges are read one after the other, small ones requested in batches ahead
    (:func:`_started`; reading several at once on threads took ~2 ms a ledger: 2026-11-27,
    bench/many_logs.py). The record rows of small ledgers make batches together. A ledger
    deleted since planning (retention, mid-pack) is what failOnDataLoss says; any other
    failure is the read's. Ranges of offloaded ledgers are read from their Parquet files
    (:mod:`bkspark.spark.offloaded`), in their place in the order."""
    from pyspark.sql.pandas.types import to_arrow_schema
    conn.freeze_worker_heap()
    target = to_arrow_schema(schema, timezone="UTC")
    for offloaded, group in itertools.groupby(ranges, key=lambda r: r.offloaded is not None):
        group = list(group)
        if not offloaded:
            yield from _read_from_bookies(opts, fmt, target, group)
            continue
        for part in group:
            yield from _read_files(opts, fmt, target, part)


def _read_files(opts, fmt: str, target, part, only_copy: bool = False):
    """:func:`read_ranges` of one range of an offloaded ledger (``part.offloaded``): from its
    files; if those cannot be opened, from the bookies (a ledger no longer there: what
    :func:`_gone` says) -- unless the files are known to be its ``only_copy``: then the read
    fails."""
    def fallback(exc):
        if only_copy:
            raise BKError(f"log {part.log}: ledger {part.ledger_id} entries {part.first}.."
                          f"{part.last}: its offloaded files, its only copy (the bookies' was "
                          f"dropped), cannot be read: {exc}") from exc
        return _read_from_bookies(opts, fmt, target, [part])
    yield from read_offloaded(part, fmt == ARROW, opts.schema == "kafka", target, fallback)


def _read_from_bookies(opts, fmt: str, target, ranges: list, again: bool = False):
    """:func:`read_ranges` of ranges read from the bookies (``again``: a range :func:`_gone`
    found listed and on the bookies, opened once more)."""
    bk = conn.bookkeeper(opts.metadata_uri, opts.client_settings)
    to_batch = codec.records_to_kafka_batch if opts.schema == "kafka" else codec.records_to_batch
    rows: list = []                         # record rows not yet in a batch
    for part, rh, entries in _started(_opened(bk, opts, ranges)):
        done = [part.first]                 # the range's first entry not yielded yet
        try:
            if rh is None:
                raise NoSuchLedgerError(f"no such ledger: {part.ledger_id}")
            if isinstance(entries, BKError):
                raise entries
            if fmt == ARROW:
                yield from _arrow_batches(target, part, rh, entries, done)
                continue
            for row in _record_rows(opts, part, entries):
                rows.append(row)        # (small ledgers' rows make one batch together)
                done[0] += 1
                if len(rows) >= RECORD_BATCH_ROWS:
                    yield to_batch(rows, target)
                    rows = []
        except BKError:
            if rh is not None:          # (decided on a synced read: a lagging server's
                bk.store.sync(log_path(part.log))   # view must not fail what is dropped)
                if _exists(bk, part.ledger_id):
                    raise
            if rows:
                yield to_batch(rows, target)
                rows = []
            yield from _gone(opts, fmt, target, part, done[0], again)
    if rows:
        yield to_batch(rows, target)


def _gone(opts, fmt: str, target, part: LedgerRange, resume: int, again: bool = False):
    """A planned ledger is gone from the bookies, its entries before ``resume`` read. Decided
    on a synced read of its segment: its bookies' copy dropped after its offload -- the rest
    of the range is read from its files; still listed on the bookies (a server's older view
    said it was not there) -- it is opened once more; not listed -- it was removed from the
    log (:func:`removed_since_planning`)."""
    logs = conn.log_store(opts)
    logs.store.sync(log_path(part.log))
    entry = logs.entry_of(part.log, part.ledger_id)
    if entry is None:
        removed_since_planning(opts, part)
        return
    if on_bookies(entry.offloaded):
        if again:
            raise BKError(f"log {part.log!r}: ledger {part.ledger_id} is listed, but the "
                          "bookies and its metadata do not serve it; read again")
        if resume <= part.last:
            yield from _read_from_bookies(opts, fmt, target, [LedgerRange(
                part.log, part.ledger_id, resume, part.last, part.offset, part.size, None)],
                again=True)
        return
    if resume <= part.last:
        yield from _read_files(opts, fmt, target, LedgerRange(
            part.log, part.ledger_id, resume, part.last, part.offset, part.size,
            entry.offloaded), only_copy=True)


def _exists(bk, ledger_id: int) -> bool:
    try:
        bk.ledger_metadata(ledger_id)
        return True
    except NoSuchLedgerError:
        return False


def _arrow_batches(target, part: LedgerRange, rh, entries, done: list):
    """RecordBatches of one range of arrow entries (each entry one batch, not copied);
    ``done[0]``: the first entry not yielded yet."""
    stored = codec.ledger_arrow_schema(rh.metadata.custom_metadata)
    if stored is None:
        raise BadRequestError(
            f"ledger {part.ledger_id} of log {part.log!r} was not written with "
            "entryFormat=arrow (no Arrow schema in its metadata); read it with "
            "entryFormat=record")
    for e in entries:
        batch = codec.decode_arrow(e.view, stored)     # no copy of the payload
        done[0] = e.entry_id + 1
        if batch.num_rows:
            yield codec.conform(batch, target)


def _record_rows(opts, part: LedgerRange, entries):
    """The rows :func:`codec.records_to_batch` (or, schema=kafka,
    :func:`codec.records_to_kafka_batch`) takes, of one range of record entries."""
    if opts.schema == "kafka":
        if part.offset is None:      # the ledger before it is still open (never listed so)
            raise BadRequestError(f"log {part.log!r}: the offset of ledger "
                                  f"{part.ledger_id} is not known yet; read it again")
        return ((part.log, part.offset + e.entry_id, e.data) for e in entries)
    return ((part.log, part.ledger_id, e.entry_id, e.data) for e in entries)


def removed_since_planning(opts, part: LedgerRange) -> None:
    """A planned ledger is gone: the log's retention (or a truncation) removed it after the
    query planned this read -- a log deletes a ledger only once no list names it. Kafka's
    rule for offsets deleted under a query: DataLossError, or with failOnDataLoss=false a
    warning and nothing read from it."""
    msg = (f"log {part.log!r}: ledger {part.ledger_id} (entries {part.first}..{part.last}) was "
           "removed from the log after this read was planned (by its retention policy or a "
           "truncation), so its entries are lost to this read")
    if opts.fail_on_data_loss:
        raise DataLossError(msg + "; set failOnDataLoss=false to skip what was removed, or "
                            "read again (a new plan starts at the log's start)")
    log.warning("%s; skipped (failOnDataLoss=false)", msg)


class BookKeeperBatchReader(importguard.Guarded, DataSourceReader):
    """``spark.read.format("bookkeeper")``: one partition per ledger range."""

    def __init__(self, opts, schema):
        self.opts = opts
        self.schema = schema
        self.fmt = opts.entry_format
        self.pushed = Pushed()

    def partitions(self):
        opts = self.opts
        logs = conn.log_store(opts)
        names = opts.matching_logs(logs.list_logs())
        parts = []
        for name in names:
            if not self.pushed.log_ok(name):
                continue
            if not logs.exists(name):
                if opts.log_pattern is None:
                    raise BadRequestError(f"option 'log': no log named {name!r}")
                continue
            start = resolve_start(logs, name, offset_for(opts.starting, name, EARLIEST),
                                  fail_on_data_loss=opts.fail_on_data_loss,
                                  no_match=opts.timestamp_strategy)
            end_spec = offset_for(opts.ending, name, LATEST)
            end = None if end_spec == LATEST else resolve_start(
                logs, name, end_spec, fail_on_data_loss=opts.fail_on_data_loss, no_match=LATEST)
            parts += plan_ranges(opts, self.fmt, name,
                                 spans(logs, name, start, end, opts.fail_on_data_loss,
                                       self.pushed.ledger_ok), self.pushed.clip)
        return pack(spread(parts, opts.min_partitions), opts)

    def read(self, partition):
        if not isinstance(partition, (LedgerRange, PackedRanges)):
            # partitions() found nothing to read (an empty log, `latest`, filters that prune
            # every ledger): PySpark then runs one task with a bare InputPartition(None)
            return
        yield from conn.profiled("read", read_range(self.opts, self.fmt, self.schema, partition))


class BookKeeperFilteringReader(BookKeeperBatchReader):
    """The batch reader plus ``pushFilters`` (ledger_id / entry_id / log), record format only.

    PySpark refuses a reader that implements ``pushFilters`` while
    ``spark.sql.python.filterPushdown.enabled`` is false, and a data source cannot read that
    setting; :func:`make_batch_reader` therefore returns this class only when called by
    Spark's filter-pushdown worker (which exists only when the setting is on).
    """

    def pushFilters(self, filters):
        if self.fmt != RECORD:
            return list(filters)
        return [f for f in filters if not self.pushed.accept(f)]


def _called_for_pushdown() -> bool:
    import sys
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back
    return False


def make_batch_reader(opts, schema):
    cls = BookKeeperFilteringReader if _called_for_pushdown() else BookKeeperBatchReader
    return cls(opts, schema)
