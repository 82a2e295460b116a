"""Read planning of the connector over a fake log catalog (pure: no cluster, no Spark)."""
import pytest

from bkspark.errors import NoSuchLogError
from bkspark.log import Position
from bkspark.spark import conn
from bkspark.spark.codec import record_spark_schema
from bkspark.spark.options import parse_options
from bkspark.spark.reader import DataLossError, spans
from bkspark.spark.stream import (BookKeeperStreamReader, ReadAllAvailable, ReadMaxBytes,
                                  ReadMaxRows)
from metadata.log_entry import LogLedger
from metadata.log_metadata import LogMetadata


class FakeLogs:
    """Ledger lists by log name; the open ledger's LAC is ``lac``."""

    def __init__(self, lists, lac=None):
        self.lists, self.lac, self.cursors = lists, lac or {}, {}

    def list_logs(self):
        return sorted(self.lists)

    def get(self, name):
        if name not in self.lists:
            raise NoSuchLogError(name)
        return LogMetadata(name, ledgers=self.lists[name]), 0

    def exists(self, name):
        return name in self.lists

    def bounds(self, name):
        return 0, len(self.get(name)[0].ledgers)

    def head_marks(self, names):
        """A log's list as its mark: it changes whenever the list does."""
        return {n: repr(self.lists[n]) for n in names if n in self.lists}

    def segments(self, name, start=None, stop=None):
        md = self.get(name)[0].with_offsets()
        return [e.copy(seq=i) for i, e in enumerate(md.ledgers)][start:stop]

    def next_listed(self, name, after):
        return next(iter(self.segments(name, after + 1)), None)

    def last_listed(self, name):
        return next(iter(self.segments(name)[-1:]), None)

    def entry_of(self, name, ledger_id):
        return next((e for e in self.segments(name) if e.ledger_id == ledger_id), None)

    def readable_end(self, entry):
        if entry.closed:
            return entry.last_entry_id, True
        return self.lac.get(entry.ledger_id, -1), False

    def ledger_end(self, entry):
        return self.readable_end(entry)[0]

    def commit_cursor(self, name, cursor, position):
        self.cursors[(name, cursor)] = position


def closed(lid, n):
    return LogLedger(lid, state="closed", last_entry_id=n - 1, length=n * 10)


def opened(lid):
    return LogLedger(lid, state="open")


def test_spans_cross_ledgers_and_stop_at_end():
    logs = FakeLogs({"a": [closed(1, 5), closed(2, 0), opened(3)]}, lac={3: 6})
    assert [s[:3] for s in spans(logs, "a", Position(1, 3), None, True)] == [(1, 3, 4), (3, 0, 6)]
    assert [s[:3] for s in spans(logs, "a", Position(-1, 0), Position(3, 2), True)] == \
        [(1, 0, 4), (3, 0, 1)]
    assert spans(logs, "a", Position(3, 7), None, True) == []


def test_spans_data_loss():
    logs = FakeLogs({"a": [closed(4, 2)]})
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        spans(logs, "a", Position(1, 0), None, True)
    assert [s[:3] for s in spans(logs, "a", Position(1, 0), None, False)] == [(4, 0, 1)]


@pytest.fixture
def reader(monkeypatch):
    logs = FakeLogs({"a": [closed(1, 30), opened(2)], "b": [closed(5, 10)], "c": []},
                    lac={2: 9})
    monkeypatch.setattr(conn, "log_store", lambda opts: logs)

    def make(**kw):
        opts = parse_options(dict({"metadataServiceUri": "sqlite:///x", "logPattern": "[abc]"}, **kw))
        return BookKeeperStreamReader(opts, record_spark_schema()), logs
    return make


def test_stream_offsets_limits_and_cursor(reader):
    r, logs = reader(startingOffsets="earliest", maxEntriesPerTrigger="10", queryId="q")
    start = r.initialOffset()
    assert start == {"a": {"ledger": 1, "entry": 0}, "b": {"ledger": 5, "entry": 0},
                     "c": {"ledger": -1, "entry": 0}}
    assert r.getDefaultReadLimit() == ReadMaxRows(10)
    end = r.latestOffset(start, ReadMaxRows(10))          # 40 + 10 available, 10 allowed
    taken = {n: end[n]["entry"] - start[n]["entry"] for n in ("a", "b")}
    assert sum(taken.values()) == 10 and taken["a"] == 8 and end["c"] == start["c"]
    everything = r.latestOffset(start, ReadAllAvailable())
    assert everything["a"] == {"ledger": 2, "entry": 10} and everything["b"] == {"ledger": 5, "entry": 10}
    parts = [q for p in r.partitions(start, everything) for q in getattr(p, "ranges", [p])]
    assert sum(p.last - p.first + 1 for p in parts) == 50
    assert r.latestOffset(everything, ReadAllAvailable()) == everything     # nothing new
    r.commit(everything)
    assert logs.cursors[("a", "q")] == Position(2, 10)


def test_stream_available_now_freezes_the_end(reader):
    r, logs = reader(startingOffsets="latest")
    start = r.initialOffset()
    assert start["a"] == {"ledger": 2, "entry": 10}
    r.prepareForTriggerAvailableNow()
    logs.lac[2] = 20                                     # more data after the trigger began
    assert r.latestOffset(start, ReadAllAvailable()) == start


def test_stream_cursor_name_travels_in_the_offsets(reader):
    r, logs = reader(startingOffsets="earliest")
    start = r.initialOffset()
    name = start["@cursor"]
    assert name.startswith("spark-") and reader()[0].initialOffset()["@cursor"] != name
    end = r.latestOffset(start, ReadAllAvailable())
    assert end["@cursor"] == name
    fresh, _ = reader(startingOffsets="earliest")       # a restarted query: a new reader
    fresh.commit(end)
    assert logs.cursors[("a", name)] == Position(2, 10)
    legacy = {k: v for k, v in end.items() if k != "@cursor"}
    fresh.commit(legacy)                                 # a checkpoint from before: "spark"
    assert logs.cursors[("a", "spark")] == Position(2, 10)


def test_stream_byte_and_minimum_limits(reader):
    r, _ = reader(startingOffsets="earliest", maxBytesPerTrigger="100")   # 10 bytes an entry
    start = r.initialOffset()
    assert r.getDefaultReadLimit() == ReadMaxBytes(100)
    end = r.latestOffset(start, r.getDefaultReadLimit())
    taken = {n: end[n]["entry"] - start[n]["entry"] for n in ("a", "b")}
    assert sum(taken.values()) == 10
    backlog = r.reportLatestOffset()["@backlog"]
    assert backlog["entriesBehindLatest"] == 50 - 10 and backlog["logs"]["b"]["bytes"] == 80
    r, _ = reader(startingOffsets="earliest", minEntriesPerTrigger="51", maxTriggerDelay="1h")
    start = r.initialOffset()
    assert r.latestOffset(start, r.getDefaultReadLimit()) == start      # 50 < 51: wait
    r.opts.max_trigger_delay = 0.0                                      # the delay has passed
    assert r.latestOffset(start, r.getDefaultReadLimit())["b"] == {"ledger": 5, "entry": 10}
    r, _ = reader(startingOffsets="earliest", minEntriesPerTrigger="51", maxTriggerDelay="1h")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()                                   # not waited for
    assert r.latestOffset(start, r.getDefaultReadLimit())["b"] == {"ledger": 5, "entry": 10}


def test_split_span_makes_equal_pieces():
    from bkspark.spark.reader import split_span
    opts = parse_options({"metadataServiceUri": "sqlite:///x", "log": "a",
                          "entriesPerPartition": "64"})
    pieces = list(split_span(opts, 7, 0, 99, {}, "record"))
    assert pieces == [(7, 0, 49), (7, 50, 99)]           # not 64 + 36
    pieces = list(split_span(opts, 7, 5, 5, {}, "record"))
    assert pieces == [(7, 5, 5)]
    pieces = list(split_span(opts, 7, 0, 200, {}, "record"))
    assert [hi - lo + 1 for _, lo, hi in pieces] == [51, 51, 51, 48]
    assert pieces[0][1] == 0 and pieces[-1][2] == 200
    assert all(b[1] == a[2] + 1 for a, b in zip(pieces, pieces[1:]))
    assert list(split_span(opts, 7, 10, 9, {}, "record")) == []   # filters left nothing


def test_min_partitions_halves_the_largest_ranges_in_order():
    from bkspark.spark.reader import LedgerRange, spread
    parts = [LedgerRange("a", 1, 0, 99), LedgerRange("a", 2, 0, 9), LedgerRange("b", 3, 5, 5)]
    assert spread(parts, None) == parts and spread(parts, 3) == parts
    out = spread(parts, 5)
    assert [(p.log, p.ledger_id, p.first, p.last) for p in out] == [
        ("a", 1, 0, 24), ("a", 1, 25, 49), ("a", 1, 50, 99), ("a", 2, 0, 9), ("b", 3, 5, 5)]
    # every entry exactly once, ranges contiguous per ledger, at least 5 partitions
    assert len(out) == 5
    for lid, first, last in ((1, 0, 99), (2, 0, 9), (3, 5, 5)):
        mine = [p for p in out if p.ledger_id == lid]
        assert mine[0].first == first and mine[-1].last == last
        assert all(b.first == a.last + 1 for a, b in zip(mine, mine[1:]))
    # single-entry ranges cannot be split: as many partitions as entries, then stop
    tiny = [LedgerRange("a", 1, 0, 1), LedgerRange("a", 2, 7, 7)]
    assert [(p.ledger_id, p.first, p.last) for p in spread(tiny, 10)] == [(1, 0, 0), (1, 1, 1), (2, 7, 7)]


def test_small_ranges_are_packed_in_order_up_to_the_target(monkeypatch):
    """Spark's small-file rule over ledgers, balanced: consecutive ranges -- of one log or
    several -- share a partition, each counting its bytes + openCostInBytes, cut into about
    equal packs, as many as the parallelism asks (or maxPartitionBytes forces); pieces of one
    ledger that planning split stay apart; a range larger than a share stands alone and the
    rest stay balanced; minPartitions is honoured whatever the sizes; entriesPerPartition
    turns packing off."""
    from bkspark.spark import reader
    from bkspark.spark.reader import LedgerRange, PackedRanges, pack

    def shape(packs):
        return [len(p.ranges) if isinstance(p, PackedRanges) else 1 for p in packs]

    def flat(packs):
        return [r for p in packs for r in (p.ranges if isinstance(p, PackedRanges) else [p])]

    monkeypatch.setattr(reader, "assumed_parallelism", lambda: 16)
    opts = parse_options({"metadataServiceUri": "sqlite:///x", "log": "a",
                          "maxPartitionBytes": "10KiB", "openCostInBytes": "1KiB"})
    filler = [LedgerRange("z", 100 + i, 0, 0, 0, 0) for i in range(200)]   # 1 KiB each
    parts = ([LedgerRange("a", i, 0, 7, 0, 1024) for i in range(1, 9)]      # 2 KiB each
             + [LedgerRange("b", 20, 0, 99, 0, 50_000),                     # over the target
                LedgerRange("c", 30, 0, 9, 0, 512), LedgerRange("c", 30, 10, 19, 0, 512)]
             + filler)
    packs = pack(parts, opts)
    assert flat(packs) == parts                                 # every range, in order
    assert shape(packs)[:5] == [5, 3, 1, 1, 8]  # 5 x 2 KiB; 3 + ...; the big one alone;
    # c's first piece; its second piece apart from the first, packed with the filler
    assert isinstance(packs[0], PackedRanges) and not isinstance(packs[2], PackedRanges)
    assert max(shape(packs)[4:]) <= 10                         # 10 KiB at most a pack
    # the parallelism sets the packs: 100 ranges of 1 KiB (open) cost 100 KiB, 16 packs
    many = [LedgerRange("a", i, 0, 0, 0, 0) for i in range(100)]
    assert sorted(set(shape(pack(many, opts)))) == [6, 7] and len(pack(many, opts)) == 16
    # eight ledgers of ~10 MB on 2 slots: two packs of four (not 4 + 3 + 1: a third wave)
    monkeypatch.setattr(reader, "assumed_parallelism", lambda: 2)
    default = parse_options({"metadataServiceUri": "sqlite:///x", "log": "a"})
    eight = [LedgerRange("a", i, 0, 99, 0, 10_400_000 + 37_000 * (i % 3)) for i in range(8)]
    assert shape(pack(eight, default)) == [4, 4]
    # a range larger than a share: the others share the rest evenly
    big = [LedgerRange("a", 1, 0, 0, 0, 100 << 20)] + \
        [LedgerRange("a", i, 0, 0, 0, 1 << 20) for i in range(2, 22)]
    monkeypatch.setattr(reader, "assumed_parallelism", lambda: 3)
    assert shape(pack(big, default)) == [1, 10, 10]
    # packs cut short (a ledger's pieces) do not use up the budget: the rest stay balanced
    monkeypatch.setattr(reader, "assumed_parallelism", lambda: 4)
    pieces = [LedgerRange("a", 1, i, i, 0, 1 << 20) for i in range(4)] + \
        [LedgerRange("a", 2 + i, 0, 0, 0, 1 << 20) for i in range(100)]
    assert shape(pack(pieces, default)) == [1, 1, 1, 26, 26, 26, 23]
    # minPartitions, even when one range outweighs all others together
    uneven = parse_options({"metadataServiceUri": "sqlite:///x", "log": "a",
                            "minPartitions": "4"})
    lopsided = [LedgerRange("a", i, 0, 0, 0, 1 << 20) for i in range(3)] + \
        [LedgerRange("a", 9, 0, 0, 0, 100 << 20)]
    assert shape(pack(lopsided, uneven)) == [1, 1, 1, 1]
    fixed = parse_options({"metadataServiceUri": "sqlite:///x", "log": "a",
                           "entriesPerPartition": "2"})
    assert pack(many, fixed) == many
    assert pack([], opts) == []
    (one,) = pack(parts[:1], opts)
    assert one is parts[0]                                      # a pack of one is the range


def test_the_backlog_names_at_most_the_logs_most_behind():
    from bkspark.spark.stream import BACKLOG_LOGS
    behind = {f"l{i:03d}": (i, 10.0 * i) for i in range(BACKLOG_LOGS + 50)}
    backlog = BookKeeperStreamReader._backlog(behind)
    assert len(backlog["logs"]) == BACKLOG_LOGS and "l149" in backlog["logs"] \
        and "l049" not in backlog["logs"]
    assert backlog["entriesBehindLatest"] == sum(range(BACKLOG_LOGS + 50))   # totals: all
    few = {"a": (0, 0.0), "b": (3, 30.0)}
    assert set(BookKeeperStreamReader._backlog(few)["logs"]) == {"a", "b"}


def test_commit_writes_moved_and_behind_cursors_and_refreshes_the_rest(reader, monkeypatch):
    """A cursor is written when it moved or while the query is behind on its log (a log a
    read limit starves keeps a live cursor: retention holds its unread entries), else once
    an hour; a log read to its end costs no write."""
    from bkspark.spark import stream
    r, logs = reader(startingOffsets="earliest", maxEntriesPerTrigger="1", queryId="q")
    writes = []
    real = logs.commit_cursor
    monkeypatch.setattr(logs, "commit_cursor",
                        lambda name, cursor, pos: (writes.append(name), real(name, cursor, pos)))
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(1))        # one entry: "a" moves, "b" starves
    assert end["b"] == start["b"] and end["a"] != start["a"]
    r.commit(end)
    writes.clear()
    r.commit(end)                                      # again: "b" is still behind
    assert sorted(writes) == ["a", "b"]
    everything = r.latestOffset(end, ReadAllAvailable())
    r.commit(everything)
    writes.clear()
    r.latestOffset(everything, ReadAllAvailable())     # nothing new: no log behind
    r.commit(everything)
    assert writes == []
    monkeypatch.setattr(stream, "CURSOR_REFRESH_S", 0.0)
    r.commit(everything)                               # an hour later: written again
    assert sorted(writes) == ["a", "b"]


def test_an_offloaded_span_that_pushed_filters_empty_plans_nothing():
    """A span of an offloaded ledger is cut at its files' bounds; when pushed entry_id filters
    leave nothing of it, no range is planned (not one with first > last)."""
    from bkspark.spark.reader import plan_ranges
    opts = parse_options({"metadataServiceUri": "sqlite:///x", "log": "a"})
    files = [{"name": "f0", "first": 0, "last": 49}, {"name": "f1", "first": 50, "last": 99}]
    entry = LogLedger(7, state="CLOSED", last_entry_id=99, length=10_000, offset=0,
                      offloaded={"files": files})
    spans_ = [(7, 0, 99, entry)]
    assert [(p.first, p.last) for p in plan_ranges(opts, "record", "a", spans_)] == \
        [(0, 49), (50, 99)]
    assert [(p.first, p.last) for p in plan_ranges(opts, "record", "a", spans_,
                                                   lambda f, l: (max(f, 60), l))] == [(60, 99)]
    assert plan_ranges(opts, "record", "a", spans_, lambda f, l: (max(f, 120), min(l, 40))) == []
    assert plan_ranges(opts, "record", "a", spans_, lambda f, l: (max(f, 70), min(l, 60))) == []


def test_the_planner_assumes_the_cpus_it_may_run_on_at_most_16(monkeypatch):
    """The parallelism a read is packed for, when minPartitions does not say: the planning
    process's CPUs (local mode: the cores tasks run on), 1 to 16."""
    import os

    from bkspark.spark import reader
    for cpus, expected in ((set(), 1), ({0, 1}, 2), (set(range(64)), 16)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, c=cpus: c)
        assert reader.assumed_parallelism() == expected
