"""Writes routed by the ``topic`` (or ``log``) column, exactly once (issue 50, item 5).

A job writes 5 logs; it is failed at every step -- a task after writing, the commit before
and after its append (what a lost answer looks like to Spark), a driver gone before its
commit, a row naming no valid log -- and retried: each row ends up in its log exactly once,
and no ledger is left behind. The commit's own lost answers at every metadata write are in
``tests/log/test_commit_to_many_logs.py``.
"""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

from bkspark.spark import pending, routing
from bkspark.spark.codec import encode_record
from bkspark.spark.options import parse_options
from bkspark.spark.writer import BookKeeperBatchWriter

from tests.spark.test_spark_batch import no_pending, rd, wr
from tests.spark.test_spark_streaming import run_to_end

pytestmark = [pytest.mark.spark, pytest.mark.integration]

LOGS = 5
ROWS = 300


def _frame(spark, prefix, rows=ROWS, parts=2):
    """``rows`` rows, row i to log ``prefix-(i % LOGS)``, value ``v<i>``."""
    return spark.range(0, rows, 1, parts).selectExpr(
        f"concat('{prefix}-', cast(id % {LOGS} as string)) as topic",
        "cast(id as string) as key", "concat('v', cast(id as string)) as value")


def _by_log(spark, uri, prefix, logs):
    """Each of the prefix's logs: its values, in the log's order (missing log: [])."""
    out = {}
    for i in range(LOGS):
        name = f"{prefix}-{i}"
        out[name] = ([r.value.decode() for r in rd(spark, uri).load(name).collect()]
                     if logs.exists(name) else [])
    return out


def _expected(prefix, rows=ROWS):
    out = {f"{prefix}-{i}": [] for i in range(LOGS)}
    for i in range(rows):
        out[f"{prefix}-{i % LOGS}"].append(f"v{i}")
    return out


def _assert_exactly_once(spark, uri, prefix, logs, rows=ROWS):
    got = _by_log(spark, uri, prefix, logs)
    assert {n: sorted(v) for n, v in got.items()} == \
        {n: sorted(v) for n, v in _expected(prefix, rows).items()}


def _ledgers_of(logs, prefix):
    return {lid for i in range(LOGS) if logs.exists(f"{prefix}-{i}")
            for lid in logs.get(f"{prefix}-{i}")[0].ledger_ids()}


def test_a_routed_job_failed_at_every_step_leaves_each_row_once(spark, uri, logs, log_name):
    prefix = log_name
    before = set(logs.bk.list_ledgers())
    df = _frame(spark, prefix)
    # a task fails after writing all its logs; its retry writes them again
    wr(df, uri, _testFault="failTask:1", writerId="job", writerSequence="0").save()
    _assert_exactly_once(spark, uri, prefix, logs)
    md = logs.get(f"{prefix}-0")[0]
    assert len(md.ledgers) == 2                 # one ledger per task per log
    assert logs.writer_sequence(routing.key_log("job"), "job") == 0     # (its one key log)
    assert logs.writer_sequence(f"{prefix}-3", "job") == -1
    # the commit fails after its append (Spark saw an error: a lost answer): the retry under
    # the same key appends nothing to any log
    with pytest.raises(Exception, match="_testFault"):
        wr(df, uri, _testFault="failCommitAfterAppend:0", writerId="job",
           writerSequence="1").save()
    wr(df, uri, writerId="job", writerSequence="1").save()
    doubled = {n: v + v for n, v in _expected(prefix).items()}
    got = _by_log(spark, uri, prefix, logs)
    assert {n: sorted(v) for n, v in got.items()} == {n: sorted(v) for n, v in doubled.items()}
    # a task fails on every attempt: the job fails, no log changes
    listed = _ledgers_of(logs, prefix)
    with pytest.raises(Exception, match="_testFault"):
        wr(df, uri, _testFault="failTaskAlways:0").save()
    assert _ledgers_of(logs, prefix) == listed
    assert set(logs.bk.list_ledgers()) - before == listed      # nothing left behind
    assert no_pending(logs)


def test_rows_naming_no_valid_log_fail_the_job_before_anything_commits(spark, uri, logs,
                                                                       log_name):
    prefix = log_name
    before = set(logs.bk.list_ledgers())
    good = _frame(spark, prefix, rows=50)
    for bad, match in [("cast(null as string)", "is null"),
                       ("'.hidden'", "names no valid log"),
                       ("'a/b'", "names no valid log"),
                       ("'__ckpt.spark-sink.q1'", "an internal log")]:
        df = good.unionByName(spark.range(1).selectExpr(
            f"{bad} as topic", "'k' as key", "'bad' as value"))
        with pytest.raises(Exception, match=match):
            wr(df.repartition(2), uri).save()
    with pytest.raises(Exception, match="maxLogsPerWrite=3"):
        wr(good, uri, maxLogsPerWrite="3").save()
    assert _ledgers_of(logs, prefix) == set()
    assert set(logs.bk.list_ledgers()) == before and no_pending(logs)


def test_split_groups_rows_by_log_in_order_linear_in_the_rows():
    """Pure: each group keeps its rows' order; 20,000 rows naming 20,000 logs split by one
    sort (a filter per log took seconds); more logs than the limit are refused first."""
    from bkspark.spark.routing import split
    topics = [f"t{i % 3}" for i in range(10)]
    batch = pa.record_batch([pa.array(topics), pa.array(range(10))], names=["topic", "n"])
    parts = split(batch, "topic", 3)
    assert [(name, rows.column(1).to_pylist()) for name, rows in parts] == \
        [("t0", [0, 3, 6, 9]), ("t1", [1, 4, 7]), ("t2", [2, 5, 8])]
    with pytest.raises(Exception, match="maxLogsPerWrite=2"):
        split(batch, "topic", 2)
    many = pa.record_batch([pa.array([f"l{i}" for i in range(20_000)]),
                            pa.array(range(20_000))], names=["topic", "n"])
    t = time.perf_counter()
    parts = split(many, "topic", 20_000)
    assert len(parts) == 20_000 and parts[123][1].column(1).to_pylist() == [123]
    assert time.perf_counter() - t < 5        # (linear: ~0.05 s; per-log filters: ~1 s+)


@pytest.mark.parametrize("columns, opts, match", [
    ("'x' as value", {}, "or a 'topic' column"),
    ("'x' as value, 'a' as topic, 'b' as log", {}, "ambiguous"),
    ("'x' as value, 1 as topic", {}, "must be a string"),
    ("'x' as value, 'a' as topic", {"entryFormat": "arrow"}, "needs entryFormat=record"),
    ("'x' as value, 'a' as topic", {"mode": "overwrite"}, "set option 'log'"),
])
def test_routed_writes_that_cannot_work_fail_at_planning(spark, uri, columns, opts, match):
    opts = dict(opts)
    mode = opts.pop("mode", "append")
    with pytest.raises(Exception, match=match):
        wr(spark.range(1).selectExpr(*columns.split(", ")), uri, mode=mode, **opts).save()


def test_the_log_column_of_a_read_writes_back_to_the_same_logs(spark, uri, logs, log_name):
    prefix = log_name
    wr(_frame(spark, prefix, rows=20), uri).save()
    back = rd(spark, uri, logPattern=f"{prefix}-[0-9]").load()
    copied = back.selectExpr(f"concat(log, '-copy') as log", "key", "value")
    wr(copied, uri).save()
    for i in range(LOGS):
        original = rd(spark, uri).load(f"{prefix}-{i}").collect()
        copy = rd(spark, uri).load(f"{prefix}-{i}-copy").collect()
        assert sorted(r.value for r in copy) == sorted(r.value for r in original) and copy


def test_an_abandoned_routed_job_is_reclaimed_log_by_log(uri, logs, log_name):
    """Tasks of a job wrote 5 logs and its driver is gone (nothing committed): reclaiming
    deletes every ledger, each proven unlisted by the log its registration names."""
    from pyspark.sql.types import StringType, StructField, StructType
    opts = parse_options({"metadataServiceUri": uri})
    schema = StructType([StructField("topic", StringType()), StructField("value", StringType())])
    writer = BookKeeperBatchWriter(opts, schema, overwrite=False)
    batch = pa.record_batch([pa.array([f"{log_name}-{i % LOGS}" for i in range(20)]),
                             pa.array([f"v{i}" for i in range(20)])], names=["topic", "value"])
    msg = writer.write(iter([batch]))
    assert len(msg.ledgers) == LOGS and set(msg.log_of.values()) == \
        {f"{log_name}-{i}" for i in range(LOGS)}
    (job,) = [j for j in pending.reclaim(logs, grace=0, log_name=pending.ROUTED, dry_run=True)
              if j.key == writer.job]
    assert job.verdict == "abandoned" and sorted(job.ledgers) == sorted(msg.ledgers)
    time.sleep(0.01)
    (job,) = [j for j in pending.reclaim(logs, grace=0, log_name=pending.ROUTED)
              if j.key == writer.job]
    assert job.verdict == "reclaimed" and sorted(job.deleted) == sorted(msg.ledgers)
    assert not set(msg.ledgers) & set(logs.bk.list_ledgers())
    with pytest.raises(pending.JobReclaimedError):      # its late commit is refused
        writer.commit([msg])


def _routed_pipeline(spark, uri, src, prefix, ckpt, fault=None):
    r = (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
         .option("log", src).option("startingOffsets", "earliest")
         .option("maxEntriesPerTrigger", "20"))
    out = r.load().selectExpr(
        f"concat('{prefix}-', cast(cast(cast(key as string) as int) % {LOGS} as string)) "
        "as topic", "key", "value")
    w = (out.writeStream.format("bookkeeper").option("metadataServiceUri", uri)
         .option("checkpointLocation", ckpt).option("queryId", f"route-{prefix}"))
    if fault:
        w = w.option("_testFault", fault)
    return w.trigger(availableNow=True).start()


def test_a_routed_stream_restarted_after_failed_commits_writes_each_row_once(
        spark, uri, logs, log_name, tmp_path):
    src, prefix, ckpt = log_name, log_name + "-out", str(tmp_path / "ckpt")
    with logs.open_writer(src) as writer:
        for i in range(100):
            writer.append(encode_record(f"v{i}".encode(), key=str(i).encode()))
    # batch 1's commit fails after its append, then batch 3's before its append; each
    # restart re-runs the failed batch
    for fault in ("failCommitAfterAppend:1", "failCommitBeforeAppend:3"):
        failed = _routed_pipeline(spark, uri, src, prefix, ckpt, fault=fault)
        with pytest.raises(Exception, match="_testFault"):
            failed.awaitTermination(300)
    run_to_end(_routed_pipeline(spark, uri, src, prefix, ckpt))
    _assert_exactly_once(spark, uri, prefix, logs, rows=100)
    assert logs.writer_sequence(routing.key_log(f"route-{prefix}"), f"route-{prefix}") == 4


def test_a_routed_sinks_batches_are_told_apart_whatever_logs_they_name(uri, logs, log_name):
    """The sink's key lives in its key log (routing.key_log), changed by every batch: a
    repeat of a batch routed elsewhere adds nothing, and another Spark query under the same
    queryId (a reset checkpoint) is refused even when its rows name other logs."""
    from pyspark.sql.types import StringType, StructField, StructType
    from bkspark.spark.writer import BookKeeperStreamWriter
    qid = f"q-{log_name}"
    sink = BookKeeperStreamWriter(
        parse_options({"metadataServiceUri": uri, "queryId": qid}),
        StructType([StructField("topic", StringType()), StructField("value", StringType())]))

    def task(spark_query, log, value):
        msg = sink.write(iter([pa.record_batch([pa.array([log]), pa.array([value])],
                                               names=["topic", "value"])]))
        msg.query_id, msg.run_id = spark_query, "run-1"
        return msg

    a, b = f"{log_name}-a", f"{log_name}-b"
    sink.commit([task("spark-1", a, "a0")], 0)
    sink.commit([task("spark-1", b, "b0")], 0)          # batch 0 again, routed elsewhere
    sink.commit([task("spark-1", b, "b1")], 1)
    sink.commit([task("spark-1", a, "ignored")], 1)
    sink.commit([task("spark-1", a, "")], 2)
    assert logs.writer_sequence(routing.key_log(qid), qid) == 2
    with pytest.raises(Exception, match="checkpoint was reset"):
        sink.commit([task("spark-2", f"{log_name}-c", "c0")], 0)
    assert not logs.exists(f"{log_name}-c") or not logs.get(f"{log_name}-c")[0].ledgers
    from bkspark.spark.codec import decode_record
    values = {n: [decode_record(bytes(e.data))[1] for lid in logs.get(n)[0].ledger_ids()
                  for e in logs.bk.open_ledger(lid, recovery=False).read(0)] for n in (a, b)}
    assert values == {a: [b"a0", b""], b: [b"b1"]}


def test_a_writer_id_that_switches_between_routing_and_one_log_never_appends_twice(
        uri, logs, log_name):
    """The same job run again under the same (writerId, writerSequence) with option 'log'
    added, or removed, appends nothing; a streaming query may not switch at all."""
    from pyspark.sql.types import StringType, StructField, StructType
    from bkspark.spark.writer import BookKeeperStreamWriter
    x, y = f"{log_name}-x", f"{log_name}-y"
    schema = StructType([StructField("topic", StringType()), StructField("value", StringType())])
    rows = pa.record_batch([pa.array([x, y]), pa.array(["r1", "r2"])], names=["topic", "value"])

    def job(seq, **where):
        opts = parse_options(dict(metadataServiceUri=uri, writerId=f"w-{log_name}",
                                  writerSequence=str(seq), **where))
        writer = BookKeeperBatchWriter(opts, schema, overwrite=False)
        writer.commit([writer.write(iter([rows]))])

    def values(name):
        return sorted(r for lid in logs.get(name)[0].ledger_ids()
                      for r in (bytes(e.data)[-2:] for e in
                                logs.bk.open_ledger(lid, recovery=False).read(0)))

    before = set(logs.bk.list_ledgers())
    job(0)                                      # routed: r1 to x, r2 to y
    job(0, log=x)                               # again, to one log: recognised
    assert (values(x), values(y)) == ([b"r1"], [b"r2"])
    job(1, log=x)                               # to one log: r1, r2 to x
    job(1)                                      # again, routed (x holds the key): recognised
    assert (values(x), values(y)) == ([b"r1", b"r1", b"r2"], [b"r2"])
    listed = set(logs.get(x)[0].ledger_ids()) | set(logs.get(y)[0].ledger_ids())
    assert set(logs.bk.list_ledgers()) - before == listed      # the repeats' ledgers deleted

    qid = f"switch-{log_name}"
    routed = BookKeeperStreamWriter(parse_options({"metadataServiceUri": uri, "queryId": qid}),
                                    schema)
    msg = routed.write(iter([rows]))
    msg.query_id, msg.run_id = "spark-q", "run"
    routed.commit([msg], 0)
    one = BookKeeperStreamWriter(parse_options({"metadataServiceUri": uri, "queryId": qid,
                                                "log": x}), schema)
    msg = one.write(iter([rows]))
    msg.query_id, msg.run_id = "spark-q", "run"
    with pytest.raises(Exception, match="a query keeps where its sink writes"):
        one.commit([msg], 0)
