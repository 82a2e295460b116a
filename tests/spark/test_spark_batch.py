"""Batch reads and writes of format("bookkeeper") in local[2] against real bookies."""
import datetime
import decimal
import json
import os
import sys

import pytest

from bkspark.log import Position
from bkspark.spark.pending import PENDING_ROOT

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def rd(spark, uri, **opts):
    r = spark.read.format("bookkeeper").option("metadataServiceUri", uri)
    for k, v in opts.items():
        r = r.option(k, v)
    return r


def wr(df, uri, mode="append", **opts):
    w = df.write.format("bookkeeper").option("metadataServiceUri", uri).mode(mode)
    for k, v in opts.items():
        w = w.option(k, v)
    return w


def no_pending(logs):
    try:
        jobs = logs.store.children(PENDING_ROOT)
    except Exception:  # noqa: BLE001 - no registry at all
        return True
    return all(not logs.store.children(f"{PENDING_ROOT}/{j}") for j in jobs)


def test_record_round_trip_exact(spark, uri, log_name, logs):
    big = bytes(range(256)) * 4096                     # 1 MiB value
    rows = [(f"k{i}".encode() if i % 3 else None,
             big if i == 5 else (None if i == 7 else f"value-{i}".encode()),
             {"h": f"{i}".encode(), "n": None} if i % 2 else None)
            for i in range(40)]
    df = spark.createDataFrame(rows, "key binary, value binary, headers map<string,binary>")
    wr(df.repartition(2), uri).save(log_name)
    back = rd(spark, uri).load(log_name)
    assert back.schema.simpleString() == ("struct<log:string,ledger_id:bigint,entry_id:bigint,"
                                          "key:binary,value:binary,timestamp:timestamp,"
                                          "headers:map<string,binary>>")
    got = back.collect()
    assert sorted(((r.key, r.value, r.headers) for r in got), key=repr) == \
        sorted(rows, key=repr)
    assert {r.log for r in got} == {log_name} and all(r.timestamp is not None for r in got)
    md, _ = logs.get(log_name)
    assert len(md.ledgers) == 2                         # one ledger per task
    positions = {(r.ledger_id, r.entry_id) for r in got}
    assert len(positions) == 40 and no_pending(logs)


def test_record_write_string_value_and_timestamp(spark, uri, log_name):
    ts = datetime.datetime(2024, 1, 2, 3, 4, 5, 678901)
    df = spark.createDataFrame([("k", "héllo", ts, [("a", b"1")])],
                               "key string, value string, timestamp timestamp, "
                               "headers array<struct<key:string,value:binary>>")
    wr(df, uri).save(log_name)
    (r,) = rd(spark, uri).load(log_name).collect()
    assert (r.key, r.value, r.timestamp, r.headers) == (b"k", "héllo".encode(), ts, {"a": b"1"})


def test_a_row_stamped_far_ahead_of_the_stores_time_fails_the_write(spark, uri, log_name, logs):
    """Issue 47: a record's timestamp from a host whose clock is ahead is bounded on write
    (Kafka's message.timestamp.after.max.ms): more than maxTimestampAheadMs (1 h) ahead of
    the metadata store's time fails the write with the option named; rows without one get the
    store's time."""
    import time as _time
    ahead = datetime.datetime.fromtimestamp(_time.time() + 2 * 3600)
    df = spark.createDataFrame([("v", ahead)], "value string, timestamp timestamp")
    with pytest.raises(Exception, match="maxTimestampAheadMs"):
        wr(df, uri).save(log_name)
    assert not logs.exists(log_name) or rd(spark, uri).load(log_name).count() == 0
    wr(df, uri, maxTimestampAheadMs=str(3 * 3600 * 1000)).save(log_name)
    wr(spark.createDataFrame([("now",)], "value string"), uri).save(log_name)
    got = {r.value: r.timestamp for r in rd(spark, uri).load(log_name).collect()}
    assert got[b"v"] == ahead
    assert abs(got[b"now"].timestamp() - _time.time()) < 120


ARROW_SCHEMA = ("id long, name string, score double, ok boolean, amount decimal(20,4), day date, "
                "at timestamp, tags array<string>, attrs map<string,int>, "
                "point struct<x:int,y:struct<z:string>>, events array<struct<k:string,v:long>>, "
                "blob binary")


def arrow_rows(n, blob_size=100):
    out = []
    for i in range(n):
        out.append((
            i, None if i % 5 == 0 else f"name-{i}", i * 0.5, None if i % 3 == 0 else i % 2 == 0,
            decimal.Decimal(i) / 7 if i % 4 else None, datetime.date(2020, 1, 1 + i % 28),
            datetime.datetime(2021, 6, 1, 12, 0, i % 60), [f"t{i}", None] if i % 2 else None,
            {"a": i, "b": None} if i % 3 else {}, (i, (f"z{i}",)) if i % 6 else None,
            [(f"k{i}", i), (None, None)], bytes([i % 256]) * blob_size if i % 9 else None))
    return out


def test_arrow_round_trip_exact_schema_and_rows(spark, uri, log_name, logs):
    rows = arrow_rows(500)
    rows[3] = rows[3][:-1] + (b"\x07" * (3 << 20),)   # a 3 MiB value: its own entry
    df = spark.createDataFrame(rows, ARROW_SCHEMA)
    wr(df.repartition(2), uri, entryFormat="arrow", maxEntryBytes=str(256 << 10)).save(log_name)
    back = rd(spark, uri, entryFormat="arrow").load(log_name)
    assert back.schema == df.schema
    assert sorted(back.collect(), key=lambda r: r.id) == sorted(df.collect(), key=lambda r: r.id)
    counts = logs.entry_counts(log_name)
    assert len(counts) == 2 and sum(n for _, n in counts) > 2     # batches split into entries
    from bkspark.spark.reader import assumed_parallelism    # one per ledger, as slots allow
    assert back.rdd.getNumPartitions() == min(2, assumed_parallelism())
    wide = rd(spark, uri, entryFormat="arrow", minPartitions="5").load(log_name)
    assert wide.rdd.getNumPartitions() == min(5, sum(n for _, n in counts))
    assert sorted(wide.collect(), key=lambda r: r.id) == sorted(df.collect(), key=lambda r: r.id)


def test_arrow_compressed_entries_round_trip_and_store_fewer_bytes(spark, uri, log_name, logs):
    df = spark.createDataFrame(arrow_rows(3000), ARROW_SCHEMA).repartition(2).cache()
    stored = {}
    for compression in ("none", "lz4", "zstd"):
        name = f"{log_name}-{compression}"
        wr(df, uri, entryFormat="arrow", compression=compression).save(name)
        back = rd(spark, uri, entryFormat="arrow").load(name)   # reads need no option
        assert back.schema == df.schema
        assert sorted(back.collect(), key=lambda r: r.id) == sorted(df.collect(), key=lambda r: r.id)
        md, _ = logs.get(name)
        stored[compression] = sum(e.length for e in md.ledgers)
    assert stored["zstd"] * 2 < stored["none"] and stored["lz4"] * 2 < stored["none"], stored
    with pytest.raises(Exception, match="'compression' applies to entryFormat=arrow"):
        wr(df.selectExpr("name as value"), uri, compression="zstd").save(log_name)
    df.unpersist()


def test_arrow_non_nullable_schema_kept_and_append_schema_checked(spark, uri, log_name):
    df = spark.range(1000).selectExpr("id", "id * 2 as twice")      # id is NOT NULL
    wr(df, uri, entryFormat="arrow").save(log_name)
    back = rd(spark, uri, entryFormat="arrow").load(log_name)
    assert back.schema == df.schema
    assert back.agg({"twice": "sum"}).collect()[0][0] == 999 * 1000
    with pytest.raises(Exception, match="cannot append"):
        wr(spark.range(3).selectExpr("cast(id as string) as s"), uri, entryFormat="arrow").save(log_name)


def test_task_failing_once_is_retried_and_rows_written_once(spark, uri, log_name, logs):
    before = set(logs.bk.list_ledgers())
    df = spark.range(0, 200, numPartitions=2).selectExpr("cast(id as string) as value")
    wr(df, uri, _testFault="failTask:1").save(log_name)
    values = sorted(int(r.value) for r in rd(spark, uri).load(log_name).collect())
    assert values == list(range(200))
    md, _ = logs.get(log_name)
    new = set(logs.bk.list_ledgers()) - before
    assert new == set(md.ledger_ids())                 # the failed attempt's ledger is gone
    assert no_pending(logs)


def test_failed_job_leaves_log_unchanged(spark, uri, log_name, logs):
    wr(spark.createDataFrame([("keep",)], "value string"), uri).save(log_name)
    before_md, _ = logs.get(log_name)
    before = set(logs.bk.list_ledgers())
    df = spark.range(0, 100, numPartitions=2).selectExpr("cast(id as string) as value")
    with pytest.raises(Exception, match="_testFault"):
        wr(df, uri, _testFault="failTaskAlways:1").save(log_name)
    after_md, _ = logs.get(log_name)
    assert after_md.ledgers == before_md.ledgers
    assert [r.value for r in rd(spark, uri).load(log_name).collect()] == [b"keep"]
    assert set(logs.bk.list_ledgers()) <= before       # every task ledger deleted
    assert no_pending(logs)


@pytest.mark.parametrize("fmt", ["record", "arrow"])
def test_reads_with_nothing_to_read_return_no_rows(spark, uri, log_name, logs, fmt):
    """An empty log, startingOffsets=latest, or a pushed filter that prunes every ledger:
    partitions() plans nothing and PySpark runs one task with a bare InputPartition(None);
    the read returns 0 rows (issue 27, item 1)."""
    df = spark.createDataFrame([("a",), ("b",)], "value string")
    if fmt == "record":
        logs.create(log_name)
        assert rd(spark, uri).load(log_name).count() == 0          # empty log
    wr(df, uri, entryFormat=fmt).save(log_name)
    assert rd(spark, uri, entryFormat=fmt, startingOffsets="latest").load(log_name).count() == 0
    if fmt == "record":
        pruned = rd(spark, uri).load(log_name).where("ledger_id = 999999")
        assert pruned.count() == 0 and pruned.collect() == []
    assert rd(spark, uri, entryFormat=fmt).load(log_name).count() == 2


def test_abort_after_an_applied_commit_deletes_nothing_the_log_lists(spark, uri, log_name, logs):
    """The commit's append was applied but Spark saw it fail (what a lost answer looks like):
    Spark calls abort, which must keep the ledgers the log lists. Every row, the earlier
    batch's included, stays readable, and a retry of the job with its writer key adds
    nothing twice."""
    wr(spark.createDataFrame([("earlier",)], "value string"), uri).save(log_name)
    df = spark.range(0, 50, numPartitions=2).selectExpr("cast(id as string) as value")
    with pytest.raises(Exception, match="_testFault"):
        wr(df, uri, writerId="job-1", writerSequence="0",
           _testFault="failCommitAfterAppend:0").save(log_name)
    md, _ = logs.get(log_name)
    for lid in md.ledger_ids():
        logs.bk.ledger_metadata(lid)                    # every listed ledger exists
    values = sorted(r.value.decode() for r in rd(spark, uri).load(log_name).collect())
    assert values == sorted(["earlier"] + [str(i) for i in range(50)])
    wr(df, uri, writerId="job-1", writerSequence="0").save(log_name)     # the user's retry
    assert rd(spark, uri).load(log_name).count() == 51
    assert no_pending(logs)


def test_overwrite_replaces_and_writer_key_is_idempotent(spark, uri, log_name, logs):
    wr(spark.createDataFrame([("a",), ("b",)], "value string"), uri).save(log_name)
    old = logs.get(log_name)[0].ledger_ids()
    wr(spark.createDataFrame([("c",)], "value string"), uri, mode="overwrite").save(log_name)
    assert [r.value for r in rd(spark, uri).load(log_name).collect()] == [b"c"]
    assert not set(old) & set(logs.bk.list_ledgers())  # replaced ledgers deleted
    for _ in range(2):                                   # the re-run appends nothing
        wr(spark.createDataFrame([("d",)], "value string"), uri,
           writerId="daily-etl", writerSequence="20240101").save(log_name)
    assert sorted(r.value for r in rd(spark, uri).load(log_name).collect()) == [b"c", b"d"]


def test_retention_set_by_the_first_write_and_readers_behind_its_cut(spark, uri, log_name, logs):
    from bkspark.log.retention import RetentionPolicy, enforce
    df = spark.range(0, 30, numPartitions=3).selectExpr("cast(id as string) as value")
    wr(df, uri, retentionSize="20", retentionPassCursors="true").save(log_name)
    assert logs.retention(log_name) == RetentionPolicy(bytes=20, pass_cursors=True)
    # appends with the same policy are fine; another policy fails, naming the fix
    wr(spark.createDataFrame([("x",)], "value string"), uri, retentionSize="20",
       retentionPassCursors="true").save(log_name)
    with pytest.raises(Exception, match="shell set-retention"):
        wr(spark.createDataFrame([("y",)], "value string"), uri, retentionTime="7d").save(log_name)
    ids = logs.get(log_name)[0].ledger_ids()
    assert len(ids) == 4
    logs.commit_cursor(log_name, "behind", Position(ids[0], 0))
    assert enforce(logs, log_name).removed == ids[:2]          # passes the cursor
    behind = json.dumps({log_name: {"ledger": ids[0], "entry": 3}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        rd(spark, uri, startingOffsets=behind).load(log_name).collect()
    rows = rd(spark, uri, startingOffsets=behind, failOnDataLoss="false").load(log_name).collect()
    assert sorted(r.value for r in rows) == sorted([str(i).encode() for i in range(20, 30)] + [b"x"])
    # a task whose ledger the cut removed after the read was planned (what a read racing
    # the retention service meets): Kafka's rule, not "no such ledger"
    from bkspark.spark import codec
    from bkspark.spark.options import RECORD, parse_options
    from bkspark.spark.reader import DataLossError, LedgerRange, read_range
    planned = LedgerRange(log_name, ids[0], 0, 9, 0)
    opts = parse_options({"metadataServiceUri": uri})
    with pytest.raises(DataLossError, match=f"ledger {ids[0]} .* was removed from the log after "
                                            "this read was planned.*failOnDataLoss=false"):
        list(read_range(opts, RECORD, codec.record_spark_schema(), planned))
    opts = parse_options({"metadataServiceUri": uri, "failOnDataLoss": "false"})
    assert list(read_range(opts, RECORD, codec.record_spark_schema(), planned)) == []


def test_pushdown_offsets_and_multi_log_reads(spark, uri, log_name, logs):
    df = spark.range(0, 30, numPartitions=3).selectExpr("cast(id as string) as value")
    wr(df, uri).save(log_name)
    other = log_name + "-b"
    wr(spark.createDataFrame([("x",)], "value string"), uri).save(other)
    ids = logs.get(log_name)[0].ledger_ids()
    base = rd(spark, uri).load(log_name)
    got = base.filter(f"ledger_id = {ids[1]} and entry_id >= 2 and entry_id < 5").collect()
    assert [(r.ledger_id, r.entry_id) for r in got] == [(ids[1], 2), (ids[1], 3), (ids[1], 4)]
    assert base.filter(f"ledger_id in ({ids[0]}, {ids[2]})").count() == 20
    ranged = rd(spark, uri, startingOffsets=json.dumps({log_name: {"ledger": ids[0], "entry": 5}}),
                endingOffsets=json.dumps({log_name: {"ledger": ids[2], "entry": 1}})).load(log_name)
    assert ranged.count() == 5 + 10 + 1
    both = rd(spark, uri, logs=f"{log_name},{other}").load()
    assert both.count() == 31 and both.filter(f"log = '{other}'").count() == 1
    assert rd(spark, uri, logPattern=f"{log_name}(-b)?").load().count() == 31


def test_read_while_writer_is_writing_does_not_fence(spark, uri, log_name, logs):
    writer = logs.open_writer(log_name)
    try:
        for i in range(20):
            writer.append(f"m{i}".encode())
        seen = [r.value for r in rd(spark, uri).load(log_name).orderBy("entry_id").collect()]
        # the open ledger is read to its LAC: a prefix of what was acknowledged, in order
        assert seen == [f"m{i}".encode() for i in range(len(seen))] and len(seen) >= 19
        writer.append(b"after")                          # the reader did not fence the writer
        writer.append(b"after2")
        later = rd(spark, uri).load(log_name).count()
        assert later >= 21
    finally:
        writer.close()


def test_zero_config_registration_and_default_uri(spark, log_name, logs):
    # the session never called register(); no metadataServiceUri: the running local cluster's
    spark.createDataFrame([("z",)], "value string").write.format("bookkeeper") \
        .mode("append").save(log_name)
    assert spark.read.format("bookkeeper").load(log_name).count() == 1
    from bkspark.spark import register
    other = spark.newSession()
    register(other)
    assert other.read.format("bookkeeper").load(log_name).count() == 1


def test_zero_config_module_is_visible_to_pysparks_scan_from_anywhere(tmp_path):
    # PySpark's lookup (pyspark/sql/worker/lookup_data_sources.py) imports every top-level
    # module that pkgutil.iter_modules() lists with a "pyspark_" prefix. The test session puts
    # the repository on PYTHONPATH for its workers; a user's process does not: check the
    # install itself, from another directory with a clean environment.
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import pkgutil, importlib; "
            "names = [m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')]; "
            "assert 'pyspark_bookkeeper' in names, names; "
            "print(importlib.import_module('pyspark_bookkeeper').DefaultSource.name())")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "bookkeeper"


@pytest.mark.parametrize("opts,match", [
    ({"log": "x", "noSuchOption": "1"}, "(?i)unknown option .nosuchoption"),
    ({"log": "x", "startingOfsets": "earliest"},
     "unknown option 'startingofsets' .*did you mean 'startingOffsets'"),
    ({"log": "x", "entryFormat": "csv"}, "entryFormat"),
    ({"log": "x", "startingOffsets": "soon"}, "startingOffsets"),
    ({"metadataServiceUri": ""}, "metadataServiceUri"),
    ({}, "'log'"),
])
def test_bad_read_options_fail_at_planning(spark, uri, opts, match):
    r = spark.read.format("bookkeeper")
    if "metadataServiceUri" not in opts:
        r = r.option("metadataServiceUri", uri)
    for k, v in opts.items():
        r = r.option(k, v)
    with pytest.raises(Exception, match=match):
        r.load().collect()


def _jobs_run_by(spark, action) -> tuple[Exception, list[int]]:
    """Run ``action`` in a job group of its own; the error it raised and the jobs it ran."""
    import uuid
    group = uuid.uuid4().hex
    spark.sparkContext.setJobGroup(group, "planning check")
    try:
        action()
    except Exception as exc:  # noqa: BLE001  (the caller checks which)
        return exc, list(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    raise AssertionError("expected the action to fail")


def test_writes_the_cluster_cannot_take_fail_at_planning(spark, uri, log_name, logs, bk_cluster):
    """A password other than the log's, or an ensemble larger than the writable bookies: an
    error naming the problem before any task runs (not after every task attempt failed)."""
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    wr(df, uri).option("password", "pw").save(log_name)
    written = len(logs.get(log_name)[0].ledgers)
    exc, jobs = _jobs_run_by(spark, lambda: wr(df, uri).save(log_name))     # password ""
    assert "another password" in str(exc) and jobs == [], (jobs, exc)
    exc, jobs = _jobs_run_by(spark, lambda: wr(df, uri).option("password", "pw").option(
        "ensembleSize", "4").save(log_name))
    assert "'ensembleSize' is 4 but the cluster" in str(exc) and jobs == [], (jobs, exc)
    assert all(b in str(exc) for b in bk_cluster.bookie_ids)
    assert len(logs.get(log_name)[0].ledgers) == written     # nothing was added
    wr(df, uri).option("password", "pw").save(log_name)      # the right password appends
    assert len(logs.get(log_name)[0].ledgers) == 2 * written


def test_bad_write_input_and_missing_log(spark, uri, log_name):
    with pytest.raises(Exception, match="'value' column"):
        wr(spark.createDataFrame([(1,)], "x int"), uri).save(log_name)
    with pytest.raises(Exception, match="unexpected columns"):
        wr(spark.createDataFrame([("v", 1)], "value string, x int"), uri).save(log_name)
    with pytest.raises(Exception, match="no log named"):
        rd(spark, uri).load(log_name + "-missing").collect()
