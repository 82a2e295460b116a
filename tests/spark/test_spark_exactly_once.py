"""Exactly-once promises of the streaming source and sink under faults (issue 45).

Each test reproduces a defect found on the user-level layers, on the session's real cluster
(3 bookies) and, where a query runs, real Spark:

* a batch planned by ``latestOffset`` is read whole by ``partitions`` even when no bookie
  of the open ledger answers then (before: the span was cut to what a fresh LAC read
  answered, -1 when none did, and the next batch started past the lost entries);
* a LAC that cannot be read is an error, never "nothing there yet";
* a query restarted on a lost checkpoint under the same ``queryId`` is refused with the fix
  named, instead of committing nothing for batch ids the log already holds.
"""
from __future__ import annotations

import time

import pytest

from bkspark import errors
from bkspark.log import EARLIEST, LATEST
from bkspark.spark.codec import record_spark_schema
from bkspark.spark.options import parse_options
from bkspark.spark.stream import BookKeeperStreamReader, ReadAllAvailable


def _source(uri, name, **extra):
    opts = parse_options({"log": name, "startingOffsets": "earliest",
                          "client.readTimeout": "1.5", "metadataServiceUri": uri, **extra})
    return BookKeeperStreamReader(opts, record_spark_schema())


def _paused(cluster):
    class Paused:
        def __enter__(self):
            for i in range(len(cluster.bookies)):
                cluster.pause(i)

        def __exit__(self, *exc):
            for i in range(len(cluster.bookies)):
                cluster.resume(i)
    return Paused()


def test_a_planned_batch_is_read_whole_when_no_bookie_answers_at_planning(bk_cluster, uri, logs,
                                                                          log_name):
    writer = logs.open_writer(log_name)
    for i in range(10):
        writer.append(b"r%d" % i)
    writer.flush()
    lid = writer.ledger_id
    source = _source(uri, log_name)
    start = source.initialOffset()
    end = source.latestOffset(start, ReadAllAvailable())
    assert end[log_name] == {"ledger": lid, "entry": 10}
    with _paused(bk_cluster):           # latestOffset fixed the end; the bookies go silent
        parts = source.partitions(start, end)
    assert [(p.ledger_id, p.first, p.last) for p in parts] == [(lid, 0, 9)]
    rows = [r for batch in source.read(parts[0]) for r in batch.to_pylist()]
    assert [r["value"] for r in rows] == [b"r%d" % i for i in range(10)]
    writer.close()


def test_a_lac_that_cannot_be_read_is_an_error_not_an_empty_log(bk_cluster, uri, logs, log_name):
    writer = logs.open_writer(log_name)
    for i in range(4):
        writer.append(b"r%d" % i)
    writer.flush()
    source = _source(uri, log_name)
    start = source.initialOffset()
    with _paused(bk_cluster):
        t0 = time.monotonic()
        with pytest.raises(errors.BKError, match="bookie"):
            source.latestOffset(start, ReadAllAvailable())
        with pytest.raises(errors.BKError, match="bookie"):
            logs.resolve(log_name, LATEST)
        assert time.monotonic() - t0 < 30
    # once the bookies answer, the same calls see every acknowledged entry
    end = source.latestOffset(start, ReadAllAvailable())
    assert end[log_name] == {"ledger": writer.ledger_id, "entry": 4}
    assert logs.resolve(log_name, LATEST).entry_id == 4
    assert logs.resolve(log_name, EARLIEST).entry_id == 0
    writer.close()
