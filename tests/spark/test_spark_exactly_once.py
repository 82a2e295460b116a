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


def _paused(cluster, store):
    """Every bookie stopped (SIGSTOP) inside the block; on leaving it, resumed and listed in
    the registry again (a pause past the session timeout costs a bookie its registration,
    and the next test's new ledger would find fewer than 3 writable bookies)."""
    class Paused:
        def __enter__(self):
            for i in range(len(cluster.bookies)):
                cluster.pause(i)

        def __exit__(self, *exc):
            for i in range(len(cluster.bookies)):
                cluster.resume(i)
            cluster.wait_registered(store)
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
    with _paused(bk_cluster, logs.bk.store):    # latestOffset fixed the end; bookies go silent
        parts = source.partitions(start, end)
    assert [(p.ledger_id, p.first, p.last) for p in parts] == [(lid, 0, 9)]
    rows = [r for batch in source.read(parts[0]) for r in batch.to_pylist()]
    assert [r["value"] for r in rows] == [b"r%d" % i for i in range(10)]
    writer.close()


def test_a_lac_that_cannot_be_read_is_an_error_not_an_empty_log(bk_cluster, uri, logs, log_name,
                                                                monkeypatch):
    from bkspark.spark import stream
    writer = logs.open_writer(log_name)
    for i in range(4):
        writer.append(b"r%d" % i)
    writer.flush()
    source = _source(uri, log_name)
    start = source.initialOffset()
    with _paused(bk_cluster, logs.bk.store):
        t0 = time.monotonic()
        # a trigger while the end cannot be read: the query stays where it is ...
        assert source.latestOffset(start, ReadAllAvailable()) == start
        # ... and fails once that lasts (LAC_UNAVAILABLE_LIMIT_S), naming the bookies
        monkeypatch.setattr(stream, "LAC_UNAVAILABLE_LIMIT_S", 0.0)
        with pytest.raises(errors.BKError, match="bookie"):
            source.latestOffset(start, ReadAllAvailable())
        with pytest.raises(errors.BKError, match="bookie"):
            logs.resolve(log_name, LATEST)      # (before: the position of entry 0)
        assert time.monotonic() - t0 < 30
    # once the bookies answer, the same calls see every acknowledged entry
    end = source.latestOffset(start, ReadAllAvailable())
    assert end[log_name] == {"ledger": writer.ledger_id, "entry": 4}
    assert logs.resolve(log_name, LATEST).entry_id == 4
    assert logs.resolve(log_name, EARLIEST).entry_id == 0
    writer.close()


def test_an_available_now_target_waits_for_an_end_that_cannot_be_read(bk_cluster, uri, logs,
                                                                       log_name, monkeypatch):
    """Trigger.AvailableNow fixes its target once: while no bookie of the open ledger
    answers, the source asks again instead of failing at once (before: a query started
    during a bookie's 2 s pause failed) -- and fails, naming the bookies, once that lasts
    LAC_UNAVAILABLE_LIMIT_S."""
    import threading
    from bkspark.spark import stream
    writer = logs.open_writer(log_name)
    for i in range(6):
        writer.append(b"r%d" % i)
    writer.flush()
    source = _source(uri, log_name)
    with _paused(bk_cluster, logs.bk.store):
        resumer = threading.Timer(4.0, lambda: [bk_cluster.resume(i)
                                                for i in range(len(bk_cluster.bookies))])
        resumer.start()
        t0 = time.monotonic()
        source.prepareForTriggerAvailableNow()
        waited = time.monotonic() - t0
        resumer.join()
    assert waited >= 3.5, waited
    assert source._target[log_name] == {"ledger": writer.ledger_id, "entry": 6}
    with _paused(bk_cluster, logs.bk.store):
        monkeypatch.setattr(stream, "LAC_UNAVAILABLE_LIMIT_S", 3.0)
        t0 = time.monotonic()
        with pytest.raises(errors.BookieUnavailableError, match="bookie"):
            _source(uri, log_name).prepareForTriggerAvailableNow()
        assert 3.0 <= time.monotonic() - t0 < 30
    writer.close()


def _pipeline(spark, uri, src, dst, ckpt, query_id):
    r = (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
         .option("log", src).option("startingOffsets", "earliest").option("queryId", query_id))
    return (r.load().select("value", "key").writeStream.format("bookkeeper")
            .option("metadataServiceUri", uri).option("log", dst).option("queryId", query_id)
            .option("checkpointLocation", ckpt).trigger(availableNow=True).start())


def _values(logs, name):
    with logs.open_reader(name, EARLIEST, tail=False) as reader:
        from bkspark.spark.codec import decode_record
        return [decode_record(r.data)[1] for r in reader]


def test_a_query_on_a_lost_checkpoint_under_the_same_query_id_is_refused(spark, uri, logs,
                                                                          log_name, tmp_path):
    src, dst = log_name, log_name + "-out"
    with logs.open_writer(src) as writer:
        for i in range(20):
            writer.append(b"a%d" % i)
    q = _pipeline(spark, uri, src, dst, str(tmp_path / "ckpt-1"), "q-" + log_name)
    q.awaitTermination(300)
    assert len(_values(logs, dst)) == 20
    with logs.open_writer(src) as writer:
        for i in range(10):
            writer.append(b"b%d" % i)
    # the checkpoint is lost: Spark numbers batches from 0 again under the same queryId
    again = _pipeline(spark, uri, src, dst, str(tmp_path / "ckpt-2"), "q-" + log_name)
    with pytest.raises(Exception, match="original checkpointLocation"):
        again.awaitTermination(300)
    assert len(_values(logs, dst)) == 20        # refused loudly, nothing appended
    # from its own checkpoint the query goes on exactly where it stopped
    q = _pipeline(spark, uri, src, dst, str(tmp_path / "ckpt-1"), "q-" + log_name)
    q.awaitTermination(300)
    out = _values(logs, dst)
    assert sorted(out) == sorted([b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(10)])
