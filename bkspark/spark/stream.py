"""Streaming source: offsets are per-log positions ``{"log": {"ledger": L, "entry": E}}``.

A position is the next entry to read (``{"ledger": -1, "entry": 0}``: the log was empty).
``latestOffset`` walks each log's ledger list from the start offset to the end (the open
ledger up to its LAC, never fencing the writer) and honours the read limits:
``maxEntriesPerTrigger`` (``ReadMaxRows``), ``maxBytesPerTrigger`` (estimated from the
ledgers' recorded lengths), ``minEntriesPerTrigger`` + ``maxTriggerDelay`` (no batch until
that many entries or that long), ``ReadAllAvailable`` (no limit) and
``Trigger.AvailableNow`` (the end is frozen by ``prepareForTriggerAvailableNow``; the minimum
is not waited for).

``commit(end)`` moves one log cursor per query, so ``LogStore.cursor_lags`` shows each
query's lag and truncation never passes an unread entry of any query. Its name is option
``queryId``, else ``spark-<random>`` drawn by the query's first ``initialOffset`` and carried
in every offset under the key ``@cursor`` (Spark keeps offsets in the query's checkpoint, so
a restarted query finds its cursor again; a PySpark stream reader is not told the query's
id). Offsets of queries started before cursors were named this way carry no ``@cursor`` and
keep the cursor ``spark``.

``reportLatestOffset`` gives each log's real end (the progress's ``latestOffset``, beside the
batch's ``endOffset``) and, under the key ``@backlog``, what the query is behind after this
batch: entries and estimated bytes in total and per log (the :data:`BACKLOG_LOGS` most behind
when a query reads more logs), with the Kafka source's
``min/avg/maxOffsetsBehindLatest`` -- PySpark 4.3 gives a Python stream reader no
``metrics()`` hook (its JVM stream does not implement ``ReportsSourceMetrics``), so this is
where the progress can show the backlog.
"""
from __future__ import annotations

import heapq
import logging
import time
import uuid

from pyspark.sql.datasource import DataSourceStreamReader

try:  # PySpark >= 4.2
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxBytes,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older PySpark: no read limits
    ReadAllAvailable = ReadMaxBytes = ReadMaxRows = ReadMinRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

from bkspark.errors import BKError, BookieUnavailableError, NoSuchLogError
from bkspark.log.position import LATEST, Position
from bkspark.spark import conn, importguard
from bkspark.spark.reader import (
    EMPTY,
    entry_bytes,
    pack,
    plan_ranges,
    offset_for,
    read_range,
    resolve_start,
    spread,
    walk,
)

log = logging.getLogger("bkspark.spark")


CURSOR_KEY = "@cursor"          # offsets' key of the query's cursor name ('@': no log name)
BACKLOG_KEY = "@backlog"        # reportLatestOffset's key of the backlog
LEGACY_CURSOR = "spark"
#: logs the backlog names one by one at most (the most behind; every log when no more)
BACKLOG_LOGS = 100
#: seconds after which a cursor that did not move is written again (its time: the query is
#: alive -- far within retention's cursor_active_ms, 7 days by default)
CURSOR_REFRESH_S = 3600.0
#: seconds a log's end may stay unreadable (no bookie answers its LAC) before the query fails
LAC_UNAVAILABLE_LIMIT_S = 120.0


def _pos(obj) -> Position:
    return Position(int(obj["ledger"]), int(obj["entry"]))


def _logs_of(offset: dict | None) -> dict:
    """The per-log positions of an offset (without its ``@`` keys)."""
    return {k: v for k, v in (offset or {}).items() if not k.startswith("@")}


def _count(ranges) -> int:
    return sum(last - first + 1 for _, first, last, _ in ranges)


def _estimated_bytes(ranges) -> float:
    size = entry_bytes(ranges)
    return sum((last - first + 1) * size[lid] for lid, first, last, _ in ranges)


def _entries_within_bytes(ranges, budget: float) -> int:
    """How many entries of ``ranges``, in order, fit in ``budget`` bytes (at least one)."""
    size = entry_bytes(ranges)
    taken = 0
    for lid, first, last, _ in ranges:
        n = last - first + 1
        fit = int(budget // size[lid]) if size[lid] > 0 else n
        if fit < n:
            return max(1, taken + fit)
        taken += n
        budget -= n * size[lid]
    return taken


def allocate(available: dict, budget: int) -> dict:
    """Split ``budget`` entries over logs proportionally to what each has available."""
    total = sum(available.values())
    if total <= budget:
        return dict(available)
    share = {k: (v * budget) // total for k, v in available.items()}
    left = budget - sum(share.values())
    for k in sorted(available, key=lambda k: -(available[k] - share[k])):
        if left <= 0:
            break
        if share[k] < available[k]:
            share[k] += 1
            left -= 1
    return share


class BookKeeperStreamReader(importguard.Guarded, DataSourceStreamReader,
                             SupportsTriggerAvailableNow):
    def __init__(self, opts, schema):
        self.opts = opts
        self.schema = schema
        self.fmt = opts.entry_format
        self._target: dict | None = None       # Trigger.AvailableNow end
        self._latest: dict | None = None
        self._last_trigger = time.monotonic()   # minEntriesPerTrigger: waiting since
        self._unreadable: dict[str, float] = {}  # log -> since when its end cannot be read
        # log -> (head mark, position) of a log read to its settled end (:func:`walk`):
        # while its head keeps that mark, nothing is available beyond that position
        self._settled: dict[str, tuple] = {}
        # (cursor, {log: (position, monotonic time)}): the cursor positions this reader wrote
        self._committed: tuple[str, dict] = ("", {})
        self._behind_logs: set[str] = set()     # logs with entries past the last batch

    # ---- helpers (driver side) ----------------------------------------------------------
    def _logs(self):
        return conn.log_store(self.opts)

    def _names(self, logs) -> list[str]:
        return self.opts.matching_logs(logs.list_logs())

    def _available(self, logs, name: str, start: Position, end: Position | None, *,
                   planned: bool = False):
        return self._walk(logs, name, start, end, planned=planned)[0]

    def _walk(self, logs, name: str, start: Position, end: Position | None, *,
              planned: bool = False) -> tuple[list, bool]:
        try:
            return walk(logs, name, start, end, self.opts.fail_on_data_loss, planned=planned)
        except NoSuchLogError:
            return [], False

    def _available_now(self, logs, name: str, start: Position, end: Position | None,
                       mark=None):
        """What ``latestOffset`` may add of one log: :meth:`_available`, except that a log
        whose open ledger's LAC cannot be read (no bookie of its ensemble answers) stays
        where it is for this trigger -- its offset does not move, so nothing is skipped or
        claimed empty -- until it has been unreadable for :data:`LAC_UNAVAILABLE_LIMIT_S`;
        then the error fails the query (as Kafka's source does after its retries).

        ``mark``: the log's head mark (:meth:`LogStore.head_marks`), read before this call.
        A log read to its settled end under the same mark, with ``start`` at that end, has
        nothing new: it is not read again (an idle log costs its share of one pipelined
        read per trigger)."""
        if end is None and self._quiet(name, mark, start.to_json()):
            return []
        try:
            ranges, settled = self._walk(logs, name, start, end)
        except BookieUnavailableError as exc:
            self._tolerate_unreadable(name, exc, f"the query stays at {tuple(start)} this "
                                                 "trigger")
            return []
        self._unreadable.pop(name, None)
        if end is None and mark is not None and settled:
            self._settled[name] = (mark, self._end_of(start, None, ranges).to_json())
        else:
            self._settled.pop(name, None)
        return ranges

    def _quiet(self, name: str, mark, position: dict | None) -> bool:
        """Whether log ``name``, whose head has ``mark``, has nothing beyond ``position`` (an
        offset's JSON): it was read to its settled end, there, under the same mark."""
        return mark is not None and self._settled.get(name) == (mark, position)

    def _tolerate_unreadable(self, name: str, exc: BookieUnavailableError, doing: str) -> None:
        """The one rule for a log whose end cannot be read: tolerated (logged, with what
        the query does meanwhile) until it has been so for :data:`LAC_UNAVAILABLE_LIMIT_S`,
        then ``exc`` is raised and fails the query."""
        since = self._unreadable.setdefault(name, time.monotonic())
        if time.monotonic() - since >= LAC_UNAVAILABLE_LIMIT_S:
            raise exc
        log.warning("log %s: its end cannot be read now, %s: %s", name, doing, exc)

    def _latest_end(self, logs, name: str) -> Position:
        """A log's end now, for a Trigger.AvailableNow run's target. The target is fixed
        once, so a log whose end cannot be read is asked again (backing off from 0.5 to 5 s)
        instead of being held for a trigger; after :data:`LAC_UNAVAILABLE_LIMIT_S` the error
        fails the query. The end is never guessed: a guess would skip or claim empty what
        was acknowledged."""
        pause = 0.5
        while True:
            try:
                end = resolve_start(logs, name, LATEST)
            except BookieUnavailableError as exc:
                self._tolerate_unreadable(name, exc, f"asked again in {pause:.1f} s")
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
                continue
            self._unreadable.pop(name, None)
            return end

    def _cursor(self, offset: dict | None) -> str:
        return self.opts.query_id or (offset or {}).get(CURSOR_KEY) or LEGACY_CURSOR

    # ---- DataSourceStreamReader ---------------------------------------------------------
    def initialOffset(self) -> dict:
        logs = self._logs()
        out = {name: resolve_start(logs, name, offset_for(self.opts.starting, name, LATEST),
                                   fail_on_data_loss=self.opts.fail_on_data_loss,
                                   no_match=self.opts.timestamp_strategy).to_json()
               for name in self._names(logs)}
        if not self.opts.query_id:
            out[CURSOR_KEY] = f"spark-{uuid.uuid4().hex[:16]}"
        return out

    def getDefaultReadLimit(self):
        """The limit Spark hands back to :meth:`latestOffset` (one; PySpark has no composite
        limit): every limit option applies unless Spark asks for all (``ReadAllAvailable``)."""
        if ReadMaxRows is None:
            return None
        o = self.opts
        if o.max_entries_per_trigger:
            return ReadMaxRows(o.max_entries_per_trigger)
        if o.max_bytes_per_trigger:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_entries_per_trigger:
            return ReadMinRows(o.min_entries_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the run's target: every matching log's end now (:meth:`_latest_end`, which
        waits out a log whose end cannot be read, up to its limit)."""
        logs = self._logs()
        target = {}
        for name in self._names(logs):
            target[name] = self._latest_end(logs, name).to_json()
        self._target = target

    @staticmethod
    def _end_of(start: Position, cap: int | None, ranges) -> Position:
        if not ranges or cap == 0:
            return start
        taken = 0
        end = start
        for lid, first, last, _ in ranges:
            n = last - first + 1
            if cap is not None and taken + n >= cap:
                return Position(lid, first + (cap - taken))
            taken += n
            end = Position(lid, last + 1)
        return end

    def _caps(self, ranges: dict, limit) -> dict | None:
        """Entries each log may give this batch (None: all), or None for "no batch yet"."""
        names = list(ranges)
        caps = {n: None for n in names}
        if ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable):
            return caps
        avail = {n: _count(r) for n, r in ranges.items()}
        o = self.opts
        if (o.min_entries_per_trigger and self._target is None
                and sum(avail.values()) < o.min_entries_per_trigger
                and time.monotonic() - self._last_trigger < o.max_trigger_delay):
            return None
        budget = o.max_entries_per_trigger
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
        if budget is not None:
            caps = allocate(avail, budget)
        if o.max_bytes_per_trigger:
            est = {n: _estimated_bytes(r) for n, r in ranges.items()}
            share = allocate({n: int(b) for n, b in est.items()}, o.max_bytes_per_trigger)
            for n in names:
                if avail[n]:
                    by_bytes = _entries_within_bytes(ranges[n], share[n])
                    caps[n] = by_bytes if caps[n] is None else min(caps[n], by_bytes)
        return caps

    def latestOffset(self, start: dict = None, limit=None) -> dict:
        logs = self._logs()
        start = start or {}
        positions = _logs_of(start)
        names = self._names(logs)
        if self._target is not None:
            names = [n for n in names if n in self._target]
        marks = logs.head_marks(names)       # (read before the logs: see _available_now)
        self._settled = {n: v for n, v in self._settled.items() if n in marks}
        ranges, starts, quiet = {}, {}, set()
        for name in names:
            if self._target is None and self._quiet(name, marks.get(name), positions.get(name)):
                quiet.add(name)         # (no Position made: 10,000 idle logs stay cheap)
                ranges[name] = []
                continue
            s = _pos(positions[name]) if name in positions else EMPTY   # a new log: from its start
            starts[name] = s
            end = None
            if self._target is not None:
                end = _pos(self._target[name])
                if end.ledger_id == -1 or end == s:
                    ranges[name] = []
                    continue
            ranges[name] = self._available_now(logs, name, s, end, marks.get(name))
        caps = self._caps(ranges, limit)
        waiting = caps is None
        if waiting:
            caps = {n: 0 for n in names}
        out, latest, behind = {}, {}, {}
        for name in names:
            if name in quiet:
                out[name] = latest[name] = positions[name]
                behind[name] = (0, 0.0)
                continue
            out[name] = self._end_of(starts[name], caps[name], ranges[name]).to_json()
            unbounded = ranges[name] if self._target is None else \
                self._available_now(logs, name, starts[name], None, marks.get(name))
            latest[name] = self._end_of(starts[name], None, unbounded).to_json()
            behind[name] = self._behind(unbounded, _pos(out[name]))
        for name, pos in positions.items():          # keep logs that vanished from a pattern
            out.setdefault(name, pos)
            latest.setdefault(name, pos)
        if CURSOR_KEY in start:
            out[CURSOR_KEY] = latest[CURSOR_KEY] = start[CURSOR_KEY]
        if not waiting and _logs_of(out) != positions:
            self._last_trigger = time.monotonic()
        latest[BACKLOG_KEY] = self._backlog(behind)
        self._latest = latest
        self._behind_logs = {n for n, (entries, _) in behind.items() if entries}
        return out

    @staticmethod
    def _behind(ranges, end: Position) -> tuple[int, float]:
        """(entries, estimated bytes) of ``ranges`` at or after ``end``."""
        size = entry_bytes(ranges)
        entries, nbytes, past = 0, 0.0, False
        for lid, first, last, _ in ranges:
            if not past and lid == end.ledger_id:
                first, past = max(first, end.entry_id), True
            elif not past:
                continue
            n = max(0, last - first + 1)
            entries += n
            nbytes += n * size[lid]
        return entries, nbytes

    @staticmethod
    def _backlog(behind: dict) -> dict:
        per = [n for n, _ in behind.values()]
        return {
            "entriesBehindLatest": sum(per),
            "bytesBehindLatest": int(sum(b for _, b in behind.values())),
            "minOffsetsBehindLatest": min(per) if per else 0,
            "avgOffsetsBehindLatest": sum(per) / len(per) if per else 0.0,
            "maxOffsetsBehindLatest": max(per) if per else 0,
            "logs": {name: {"entries": n, "bytes": int(b)} for name, (n, b) in (
                behind.items() if len(behind) <= BACKLOG_LOGS else
                heapq.nlargest(BACKLOG_LOGS, behind.items(), key=lambda kv: kv[1]))},
        }

    def reportLatestOffset(self):
        """Each log's real end when the batch was planned -- not the batch's end, which a
        read limit caps -- and the backlog behind it (``@backlog``; module doc)."""
        return self._latest

    def partitions(self, start: dict, end: dict):
        logs = self._logs()
        before = _logs_of(start)
        parts = []
        for name, e in _logs_of(end).items():
            if before.get(name) == e:
                continue
            s = _pos(before[name]) if name in before else EMPTY
            e = _pos(e)
            if s == e or e.ledger_id == -1:
                continue
            # the batch's end was fixed by latestOffset (maybe before a driver restart):
            # plan exactly [s, e), whatever a LAC read answers now (spans: ``planned``)
            parts += plan_ranges(self.opts, self.fmt, name,
                                 self._available(logs, name, s, e, planned=True))
        return pack(spread(parts, self.opts.min_partitions), self.opts)

    def read(self, partition):
        yield from read_range(self.opts, self.fmt, self.schema, partition)

    def commit(self, end: dict) -> None:
        """Move the query's cursor of each log to ``end``. Written: after a (re)start (or
        under another cursor name) every log's; then those whose position moved, those the
        query is still behind on (its cursor's time says the query is alive, so retention
        keeps what it has not read -- a log a read limit starves included), and any not
        written for :data:`CURSOR_REFRESH_S` (a cursor deleted meanwhile comes back). An
        idle log read to its end costs no write. A cursor that could not be written is
        written at the next commit."""
        logs = self._logs()
        cursor = self._cursor(end)
        committed = self._committed[1] if self._committed[0] == cursor else {}
        now = time.monotonic()
        for name, pos in _logs_of(end).items():
            written = committed.get(name)
            if written is not None and written[0] == pos and name not in self._behind_logs \
                    and now - written[1] < CURSOR_REFRESH_S:
                continue
            p = _pos(pos)
            if p.ledger_id == -1:
                continue
            try:
                logs.commit_cursor(name, cursor, p)
                committed[name] = (pos, now)
            except (NoSuchLogError, BKError) as exc:
                committed.pop(name, None)
                log.warning("could not move cursor %s of log %s: %s", cursor, name, exc)
        self._committed = (cursor, {n: w for n, w in committed.items() if n in end})

    def stop(self) -> None:
        pass
