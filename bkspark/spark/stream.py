"""Streaming source: offsets are per-log positions ``{"log": {"ledger": L, "entry": E}}``.

A position is the next entry to read (``{"ledger": -1, "entry": 0}``: the log was empty).
``latestOffset`` walks each log's ledger list from the start offset to the end (the open
ledger up to its LAC, never fencing the writer) and honours the read limit:
``maxEntriesPerTrigger`` (``ReadMaxRows``), ``ReadAllAvailable`` and ``Trigger.AvailableNow``
(the end is frozen by ``prepareForTriggerAvailableNow``). ``commit(end)`` moves the log
cursor ``queryId`` (default ``spark``), so ``LogStore.cursor_lags`` shows the query's lag.
"""
from __future__ import annotations

import logging

from pyspark.sql.datasource import DataSourceStreamReader

try:  # PySpark >= 4.2
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - older PySpark: no read limits
    ReadAllAvailable = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

from bkspark.errors import BKError, NoSuchLogError
from bkspark.log.position import EARLIEST, LATEST, Position
from bkspark.spark import conn, importguard
from bkspark.spark.reader import (EMPTY, LedgerRange, offset_for, read_range, resolve_start,
                                  spans, split_span, spread)

log = logging.getLogger("bkspark.spark")


def _pos(obj) -> Position:
    return Position(int(obj["ledger"]), int(obj["entry"]))


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
        self.cursor = opts.query_id or "spark"
        self._target: dict | None = None       # Trigger.AvailableNow end
        self._latest: dict | None = None

    # ---- helpers (driver side) ----------------------------------------------------------
    def _logs(self):
        return conn.log_store(self.opts)

    def _names(self, logs) -> list[str]:
        return self.opts.matching_logs(logs.list_logs())

    def _available(self, logs, name: str, start: Position, end: Position | None):
        try:
            md, _ = logs.get(name)
        except NoSuchLogError:
            return []
        return spans(logs, name, md, start, end, self.opts.fail_on_data_loss)

    # ---- DataSourceStreamReader ---------------------------------------------------------
    def initialOffset(self) -> dict:
        logs = self._logs()
        return {name: resolve_start(logs, name, offset_for(self.opts.starting, name, LATEST)).to_json()
                for name in self._names(logs)}

    def getDefaultReadLimit(self):
        if self.opts.max_entries_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_entries_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        logs = self._logs()
        target = {}
        for name in self._names(logs):
            target[name] = resolve_start(logs, name, LATEST).to_json()
        self._target = target

    def _end_of(self, logs, name, start: Position, cap: int | None, ranges) -> Position:
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

    def latestOffset(self, start: dict = None, limit=None) -> dict:
        logs = self._logs()
        start = start or {}
        names = self._names(logs)
        if self._target is not None:
            names = [n for n in names if n in self._target]
        ranges, starts = {}, {}
        for name in names:
            s = _pos(start[name]) if name in start else EMPTY   # a new log: from its start
            starts[name] = s
            end = None
            if self._target is not None:
                end = _pos(self._target[name])
                if end.ledger_id == -1:
                    ranges[name] = []
                    continue
            ranges[name] = self._available(logs, name, s, end)
        budget = None
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
        elif limit is None and self.opts.max_entries_per_trigger:
            budget = self.opts.max_entries_per_trigger
        caps = {n: None for n in names}
        if budget is not None:
            avail = {n: sum(last - first + 1 for _, first, last, _ in r) for n, r in ranges.items()}
            caps = allocate(avail, budget)
        out, latest = {}, {}
        for name in names:
            out[name] = self._end_of(logs, name, starts[name], caps[name], ranges[name]).to_json()
            unbounded = ranges[name] if self._target is None else \
                self._available(logs, name, starts[name], None)
            latest[name] = self._end_of(logs, name, starts[name], None, unbounded).to_json()
        for name, pos in start.items():          # keep logs that vanished from a pattern
            out.setdefault(name, pos)
            latest.setdefault(name, pos)
        self._latest = latest
        return out

    def reportLatestOffset(self):
        """Each log's real end when the batch was planned -- not the batch's end, which a
        read limit caps: the query's progress (``sources[].latestOffset`` beside
        ``endOffset``) shows the backlog."""
        return self._latest

    def partitions(self, start: dict, end: dict):
        logs = self._logs()
        parts = []
        for name, e in end.items():
            s = _pos(start[name]) if start and name in start else EMPTY
            e = _pos(e)
            if s == e or e.ledger_id == -1:
                continue
            for lid, first, last, entry in self._available(logs, name, s, e):
                for lid2, lo, hi in split_span(self.opts, lid, first, last, entry, self.fmt):
                    parts.append(LedgerRange(name, lid2, lo, hi))
        return spread(parts, self.opts.min_partitions)

    def read(self, partition):
        yield from read_range(self.opts, self.fmt, self.schema, partition)

    def commit(self, end: dict) -> None:
        logs = self._logs()
        for name, pos in end.items():
            p = _pos(pos)
            if p.ledger_id == -1:
                continue
            try:
                logs.commit_cursor(name, self.cursor, p)
            except (NoSuchLogError, BKError) as exc:
                log.warning("could not move cursor %s of log %s: %s", self.cursor, name, exc)

    def stop(self) -> None:
        pass
