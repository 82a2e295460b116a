"""Streaming source and exactly-once sink of format("bookkeeper") against real bookies."""
import os

import pyarrow as pa
import pytest

from bkspark.errors import LogFencedError
from bkspark.log import Position
from bkspark.spark.options import parse_options
from bkspark.spark.writer import BookKeeperStreamWriter

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def pipeline(spark, uri, src, dst, ckpt, fault=None, available_now=True, name=None, **src_opts):
    from pyspark.sql import functions as F
    r = spark.readStream.format("bookkeeper").option("metadataServiceUri", uri).option("log", src)
    for k, v in src_opts.items():
        r = r.option(k, v)
    out = r.load().select(F.upper(F.col("value").cast("string")).alias("value"), "key")
    w = (out.writeStream.format("bookkeeper").option("metadataServiceUri", uri).option("log", dst)
         .option("checkpointLocation", ckpt))
    if fault:
        w = w.option("_testFault", fault)
    if name:            # Spark hands writeStream.queryName to the sink as option 'queryName'
        w = w.queryName(name)
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="200 milliseconds")
    return w.start()


def run_to_end(query):
    try:
        query.awaitTermination(300)
    finally:
        if query.isActive:
            query.stop()
    return query


def out_values(spark, uri, log):
    return [r.value.decode() for r in
            spark.read.format("bookkeeper").option("metadataServiceUri", uri).load(log).collect()]


def test_pipeline_read_limit_cursor_and_exactly_once_restarts(spark, uri, logs, log_name, tmp_path):
    src, dst, ckpt = log_name, log_name + "-out", str(tmp_path / "ckpt")
    with logs.open_writer(src) as writer:
        for i in range(31):
            writer.append(f"m{i}".encode())
        # 1: a clean run; maxEntriesPerTrigger splits the backlog into micro-batches
        q = run_to_end(pipeline(spark, uri, src, dst, ckpt, startingOffsets="earliest",
                                maxEntriesPerTrigger="10", queryId="pipe"))
        sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
        assert sizes and max(sizes) <= 10 and sum(sizes) >= 30
        first = sorted(out_values(spark, uri, dst))
        assert first == sorted(f"M{i}" for i in range(len(first))) or len(set(first)) == len(first)
        assert len(first) == sum(sizes)
        # the source moved its cursor (committed while planning the next micro-batch)
        assert logs.cursor(src, "pipe") is not None
        assert "pipe" in logs.cursor_lags(src)
        # 2: the sink's commit of the next batch fails right AFTER appending (driver "killed"
        #    between the log append and Spark's commit record); the restart re-runs that batch
        for i in range(31, 45):
            writer.append(f"m{i}".encode())
        bid = len(q.recentProgress)
        failed = pipeline(spark, uri, src, dst, ckpt, fault=f"failCommitAfterAppend:{bid}",
                          startingOffsets="earliest", maxEntriesPerTrigger="10", queryId="pipe")
        with pytest.raises(Exception, match="_testFault"):
            failed.awaitTermination(300)
        run_to_end(pipeline(spark, uri, src, dst, ckpt, startingOffsets="earliest",
                            maxEntriesPerTrigger="10", queryId="pipe"))
        second = out_values(spark, uri, dst)
        assert len(second) == len(set(second)) and len(second) >= 43
        # 3: the commit fails BEFORE appending: the batch's task ledgers are orphans, the restart
        #    writes the batch again, and the orphans are deleted
        for i in range(45, 50):
            writer.append(f"m{i}".encode())
        ledgers_before = set(logs.bk.list_ledgers())
        bid = max(logs.get(dst)[0].writers.values()) + 1
        failed = pipeline(spark, uri, src, dst, ckpt, fault=f"failCommitBeforeAppend:{bid}",
                          startingOffsets="earliest", queryId="pipe")
        with pytest.raises(Exception, match="_testFault"):
            failed.awaitTermination(300)
        run_to_end(pipeline(spark, uri, src, dst, ckpt, startingOffsets="earliest", queryId="pipe"))
        third = out_values(spark, uri, dst)
        assert len(third) == len(set(third)) and len(third) >= 48
        assert sorted(third) == sorted(f"M{i}" for i in range(len(third)))
        leaked = set(logs.bk.list_ledgers()) - ledgers_before - set(logs.get(dst)[0].ledger_ids())
        leaked -= set(logs.get(src)[0].ledger_ids())
        ckpt_logs = [n for n in logs.list_logs() if n.startswith("__ckpt.")]
        for n in ckpt_logs:
            leaked -= set(logs.get(n)[0].ledger_ids())
        assert not leaked


def test_tailing_the_open_ledger(spark, uri, logs, log_name, tmp_path):
    src, dst = log_name, log_name + "-tail"
    with logs.open_writer(src) as writer:
        writer.append(b"first")
        q = pipeline(spark, uri, src, dst, str(tmp_path / "ckpt"), available_now=False,
                     name="tailing " + src, startingOffsets="earliest", queryId="tail")
        try:
            assert q.name == "tailing " + src
            for i in range(12):
                writer.append(f"t{i}".encode())
            q.processAllAvailable()
            seen = out_values(spark, uri, dst)
            # everything acknowledged up to the open ledger's LAC, exactly once, no fencing
            assert len(seen) >= 12 and len(seen) == len(set(seen))
            writer.append(b"more")                    # the writer was never fenced
            writer.append(b"more2")
            q.processAllAvailable()
            assert "MORE" in out_values(spark, uri, dst)
        finally:
            q.stop()


def test_new_run_of_a_query_fences_the_old_one(uri, logs, log_name):
    opts = parse_options({"metadataServiceUri": uri, "log": log_name, "queryId": "q-" + log_name})
    from pyspark.sql.types import BinaryType, StructField, StructType
    sink = BookKeeperStreamWriter(opts, StructType([StructField("value", BinaryType())]))

    def task(run, value):
        msg = sink.write(iter([pa.record_batch([pa.array([value])], names=["value"])]))
        msg.run_id = run
        return msg

    sink.commit([task("run-1", b"a")], 0)
    sink.commit([task("run-2", b"b")], 1)          # a second instance starts: takes over
    with pytest.raises(LogFencedError, match="superseded"):
        sink.commit([task("run-1", b"zombie")], 2)
    sink.commit([task("run-2", b"c")], 2)
    sink.commit([task("run-2", b"c-again")], 2)    # a re-run of batch 2 adds nothing
    data = [bytes(e.data) for lid in logs.get(log_name)[0].ledger_ids()
            for e in logs.bk.open_ledger(lid, recovery=False).read(0)]
    from bkspark.spark.codec import decode_record
    assert [decode_record(d)[1] for d in data] == [b"a", b"b", b"c"]


def test_streaming_bad_options(spark, uri, log_name):
    r = (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
         .option("log", log_name).option("endingOffsets", "latest"))
    with pytest.raises(Exception, match="endingOffsets"):
        r.load().writeStream.format("console").start().awaitTermination(60)


def test_arrow_pipeline_keeps_schema_and_rows_through_compressed_entries(spark, uri, log_name,
                                                                         tmp_path):
    """An arrow log (LZ4 entries, the default) streamed through a transform into an arrow log
    written with ZSTD: the output has the transformed schema and every row once."""
    from pyspark.sql import functions as F
    src, dst = log_name, log_name + "-out"
    df = spark.range(0, 3000, numPartitions=2).selectExpr(
        "id", "concat('name-', cast(id % 17 as string)) as name",
        "if(id % 5 = 0, null, named_struct('x', id, 'tags', array('a', cast(id as string)))) as s")
    (df.write.format("bookkeeper").option("metadataServiceUri", uri).option("entryFormat", "arrow")
       .mode("append").save(src))
    stream = (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
              .option("log", src).option("entryFormat", "arrow")
              .option("startingOffsets", "earliest").load())
    q = (stream.withColumn("double", F.col("id") * 2).writeStream.format("bookkeeper")
         .option("metadataServiceUri", uri).option("log", dst).option("entryFormat", "arrow")
         .option("compression", "zstd").option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    run_to_end(q)
    back = (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
            .option("entryFormat", "arrow").load(dst))
    expected = df.withColumn("double", F.col("id") * 2)
    assert back.schema == expected.schema
    assert sorted(back.collect(), key=lambda r: r.id) == sorted(expected.collect(), key=lambda r: r.id)


def test_progress_shows_the_backlog_beyond_a_read_limit(spark, uri, logs, log_name, tmp_path):
    """20 entries read 5 at a time: each micro-batch's progress reports the log's real end as
    latestOffset (the backlog), not the capped end of the batch (issue 28, item 4)."""
    import json
    with logs.open_writer(log_name) as writer:
        for i in range(20):
            last = writer.append(f"b{i}".encode())
    q = run_to_end(pipeline(spark, uri, log_name, log_name + "-out", str(tmp_path / "ckpt"),
                            startingOffsets="earliest", maxEntriesPerTrigger="5"))
    batches = [p["sources"][0] for p in q.recentProgress if p["numInputRows"]]
    assert [b["numInputRows"] for b in batches] == [5, 5, 5, 5]
    log_end = {"ledger": last.ledger_id, "entry": last.entry_id + 1}
    for b in batches:
        assert json.loads(b["latestOffset"])[log_name] == log_end
    assert json.loads(batches[0]["endOffset"])[log_name] != log_end      # capped at 5
