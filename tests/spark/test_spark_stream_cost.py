"""The streaming source's driver work per micro-batch follows what changed, not the number of
logs (issue 51): on a real cluster (3 bookies, the session's metadata store), with the
store's calls counted.

* an idle trigger over many logs is one listing and ONE pipelined read of all heads, and
  writes no cursor;
* a log that gains a ledger is read again (and only it), its cursor alone is written;
* a log whose tail ledger is open is read each trigger (its LAC may move without its list
  changing), and one re-created under the same name is not taken for the old one.
"""
from __future__ import annotations

import uuid

import pytest

from bkspark.spark import conn
from bkspark.spark.codec import encode_record, record_spark_schema
from bkspark.spark.options import parse_options
from bkspark.spark.stream import BookKeeperStreamReader, ReadAllAvailable

LOGS = 120


class Calls:
    """Counts the metadata store calls the driver makes (the real store answers them)."""

    READS = ("get", "get_many", "children", "exists")
    WRITES = ("set", "create", "delete", "transaction")

    def __init__(self, store, monkeypatch):
        self.n = {name: 0 for name in self.READS + self.WRITES}
        self.paths = 0          # paths asked by get_many
        for name in self.n:
            real = getattr(store, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                self.n[_name] += 1
                if _name == "get_many":
                    self.paths += len(args[0])
                return _real(*args, **kwargs)
            monkeypatch.setattr(store, name, counted)

    def reset(self):
        self.n = dict.fromkeys(self.n, 0)
        self.paths = 0

    def reads(self) -> int:
        return sum(self.n[k] for k in self.READS)

    def writes(self) -> int:
        return sum(self.n[k] for k in self.WRITES)


def _closed_ledger(logs, records: int) -> int:
    lh = logs.bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    for f in [lh.append_async(encode_record(b"r%d" % i)) for i in range(records)]:
        f.result()
    lh.close()
    return lh.ledger_id


@pytest.fixture(scope="module")
def many(logs):
    prefix = f"cost-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}-{i:04d}" for i in range(LOGS)]
    for name in names:
        logs.append_ledgers(name, [_closed_ledger(logs, 2)])
    return prefix, names


def _source(uri, prefix):
    opts = parse_options({"logPattern": f"{prefix}-.*", "startingOffsets": "earliest",
                          "queryId": "cost", "metadataServiceUri": uri})
    return BookKeeperStreamReader(opts, record_spark_schema())


def _batch(source, start):
    end = source.latestOffset(start, ReadAllAvailable())
    source.partitions(start, end)
    source.commit(end)
    return end


def test_an_idle_trigger_costs_one_read_of_all_heads_and_no_cursor_write(uri, logs, many,
                                                                          monkeypatch):
    prefix, names = many
    source = _source(uri, prefix)
    start = source.initialOffset()
    end = _batch(source, start)                        # reads everything, writes every cursor
    assert all(end[n]["entry"] == 2 for n in names)
    assert logs.cursor(names[7], "cost") is not None

    calls = Calls(conn.bookkeeper(uri, source.opts.client_settings).store, monkeypatch)
    assert _batch(source, end) == end                  # nothing new
    assert calls.n["get_many"] == 1 and calls.paths == LOGS, calls.n
    assert calls.reads() <= 3 and calls.writes() == 0, calls.n

    # one log gains a ledger: it alone is read again, its cursor alone written
    calls.reset()
    changed = names[LOGS // 2]
    logs.append_ledgers(changed, [_closed_ledger(logs, 3)])
    calls.reset()
    moved = _batch(source, end)
    assert [n for n in names if moved[n] != end[n]] == [changed]
    assert moved[changed]["entry"] == 3
    assert calls.reads() <= 30 < LOGS and calls.writes() == 1, calls.n   # its reads alone
    assert logs.cursor(changed, "cost").entry_id == 3


def test_an_open_tail_is_read_each_trigger_and_a_recreated_log_is_new(uri, logs, monkeypatch):
    prefix = f"tail-{uuid.uuid4().hex[:6]}"
    name = f"{prefix}-a"
    writer = logs.open_writer(name)
    writer.append(b"one")
    writer.flush()
    source = _source(uri, prefix)
    start = source.initialOffset()
    end = _batch(source, start)
    assert end[name]["entry"] == 1
    writer.append(b"two")                              # the LAC moves, the list does not
    writer.flush()
    end2 = _batch(source, end)
    assert end2[name] == {"ledger": end[name]["ledger"], "entry": 2}
    writer.close()

    # deleted and re-created with as many changes: the old position is no longer there
    other = f"{prefix}-b"
    logs.append_ledgers(other, [_closed_ledger(logs, 2)])
    at = _batch(source, end2)
    assert at[other]["entry"] == 2
    logs.delete(other)
    logs.append_ledgers(other, [_closed_ledger(logs, 2)])
    with pytest.raises(Exception, match="no longer in the log"):
        source.latestOffset(at, ReadAllAvailable())
