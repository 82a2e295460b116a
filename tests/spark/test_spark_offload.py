"""Offload seen from Spark (issue 52): the offload options of a write set the log's policy, and
Spark's own ``parquet`` source reads the offloaded directory as the log's rows -- one log, or
every log offloaded to a location as one table with a ``log`` column."""
import time

import pyarrow as pa

import pytest

from bkspark import errors
from bkspark.log import offload
from bkspark.recovery import offload as offload_pass

from tests.spark.test_spark_batch import rd, wr

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _offload_now(logs, name):
    time.sleep(0.01)                # (offloadAfter=1ms: every closed ledger is due)
    assert offload_pass.run(logs, name)


def test_spark_parquet_reads_the_offloaded_log_as_its_rows(spark, uri, logs, tmp_path):
    names = [f"off-{i}-{int(time.time() * 1000) % 10**8}" for i in range(2)]
    for i, name in enumerate(names):
        df = spark.createDataFrame(
            [(f"k{j % 4}".encode(), f"{name}:{j}".encode()) for j in range(100 * (i + 1))],
            "key binary, value binary").repartition(3)
        wr(df, uri, log=name, offloadLocation=f"file://{tmp_path}", offloadAfter="1ms").save()
        assert logs.offload_policy(name).location == f"file://{tmp_path}"
        _offload_now(logs, name)
    for name in names:
        want = sorted((r.key, r.value, r.ledger_id, r.entry_id)
                      for r in rd(spark, uri, log=name).load().collect())
        got = spark.read.parquet(f"{tmp_path}/log={name}")
        assert sorted((r.key, r.value, r.ledger_id, r.entry_id) for r in got.collect()) == want
        assert [r.offset for r in got.orderBy("offset").collect()] == list(range(len(want)))
    both = spark.read.parquet(str(tmp_path))            # partition discovery: a log column
    counts = {r["log"]: r["count"] for r in both.groupBy("log").count().collect()}
    assert counts == {names[0]: 100, names[1]: 200}


def test_arrow_logs_offload_their_columns(spark, uri, logs, log_name, tmp_path):
    df = spark.range(0, 500).selectExpr("id", "cast(id * 2 as string) as s").repartition(2)
    wr(df, uri, log=log_name, entryFormat="arrow", offloadLocation=str(tmp_path),
       offloadAfter="1ms").save()
    _offload_now(logs, log_name)
    got = spark.read.parquet(f"{tmp_path}/log={log_name}")
    assert got.columns == ["id", "s", "_offset", "_ledger_id", "_entry_id"]
    assert sorted((r.id, r.s) for r in got.collect()) == [(i, str(i * 2)) for i in range(500)]


def test_offload_options_that_disagree_with_the_log_fail_naming_the_fix(
        spark, uri, logs, log_name, tmp_path):
    df = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception, match="needs 'offloadAfter' and/or 'offloadBeyond'"):
        wr(df, uri, log=log_name, offloadLocation=str(tmp_path)).save()
    wr(df, uri, log=log_name, offloadLocation=str(tmp_path), offloadAfter="1h").save()
    with pytest.raises(Exception, match="change its policy with `bkspark shell set-offload"):
        wr(df, uri, log=log_name, offloadLocation=str(tmp_path), offloadAfter="2h").save()
    with pytest.raises(errors.BadRequestError, match="is relative"):
        offload.OffloadPolicy.parse("rel", after="1h")


# ---- one log across both tiers -------------------------------------------------------------

def _half_offloaded(spark, uri, logs, name, tmp_path, **write_opts):
    """A log of 4 ledgers x 50 records (with keys, times and headers), the first two offloaded."""
    from bkspark.log.offload import OffloadPolicy
    from bkspark.recovery.offload import run
    import datetime
    for part in range(4):
        df = spark.createDataFrame(
            [(f"k{j % 5}".encode(), f"{part}:{j}".encode(),
              datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
              + datetime.timedelta(seconds=part * 50 + j), [("h", f"{j}".encode())])
             for j in range(50)],
            "key binary, value binary, timestamp timestamp, headers array<struct<key:string,value:binary>>"
        ).coalesce(1)
        wr(df, uri, log=name, **write_opts).save()
    logs.set_offload(name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)
    assert len(run(logs, name, max_ledgers=2)) == 2


@pytest.mark.parametrize("schema", ["record", "kafka"])
def test_a_read_across_the_tiers_equals_a_read_from_the_bookies(
        spark, uri, logs, log_name, tmp_path, schema):
    from bkspark.log.offload import Location
    import pyarrow.parquet as pq
    _half_offloaded(spark, uri, logs, log_name, tmp_path)
    extra = {"schema": "kafka", "includeHeaders": "true"} if schema == "kafka" else {}
    both = rd(spark, uri, log=log_name, **extra).load().collect()
    bookies = rd(spark, uri, log=log_name, readOffloaded="false", **extra).load().collect()
    assert len(both) == 200 and both == bookies                  # same rows, same order
    # ... and the offloaded part really came from Parquet: a file changed on purpose shows
    first = logs.segments(log_name)[0]
    path = f"{Location(str(tmp_path)).log_dir(log_name)}/{first.offloaded['files'][0]['name']}"
    t = pq.read_table(path)
    pq.write_table(t.set_column(t.schema.get_field_index("value"), "value",
                                pa.array([b"from-parquet"] * t.num_rows, pa.binary())), path)
    values = [r.value for r in rd(spark, uri, log=log_name, **extra).load().collect()]
    assert values.count(b"from-parquet") == 50 and values[50:] == [r.value for r in bookies[50:]]
    assert [r.value for r in rd(spark, uri, log=log_name, readOffloaded="false",
                                **extra).load().collect()] == [r.value for r in bookies]


def test_arrow_reads_across_the_tiers_and_a_missing_file_is_read_from_the_bookies(
        spark, uri, logs, log_name, tmp_path):
    import os
    from bkspark.log.offload import Location, OffloadPolicy
    from bkspark.recovery.offload import run
    for part in range(3):
        df = spark.range(part * 100, part * 100 + 100).selectExpr("id", "id % 7 as m").coalesce(1)
        wr(df, uri, log=log_name, entryFormat="arrow").save()
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)
    assert len(run(logs, log_name, max_ledgers=2)) == 2
    read = lambda **o: [tuple(r) for r in rd(spark, uri, log=log_name, entryFormat="arrow",  # noqa: E731
                                             **o).load().collect()]
    want = read(readOffloaded="false")
    assert sorted(want) == [(i, i % 7) for i in range(300)] and read() == want
    second = logs.segments(log_name)[1]
    os.remove(f"{Location(str(tmp_path)).log_dir(log_name)}/{second.offloaded['files'][0]['name']}")
    assert read() == want                                   # (from the bookies: their copy)


def test_a_stream_starting_in_the_offloaded_tier_reads_across_it_exactly_once_while_offload_and_retention_run(  # noqa: E501
        spark, uri, logs, log_name, tmp_path):
    """The query starts at the log's start, in the offloaded tier; while it runs, a thread
    appends ledgers, and the service offloads them, drops the bookies' copy at once
    (keep_on_bookies 0) and cuts what the query's cursor has read (retention by size,
    cursors holding it). The sink's log ends with every record once, in order."""
    import threading
    from bkspark.log.offload import OffloadPolicy
    from bkspark.log.retention import RetentionPolicy
    from bkspark.recovery.offload import run
    from bkspark.recovery.retention import RetentionService
    from tests.spark.test_spark_streaming import pipeline

    def add(i):
        with logs.open_writer(log_name) as w:
            for j in range(20):
                w.append(f"m{i:02d}-{j:02d}".encode())
    for i in range(4):
        add(i)
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path / "off"), after_ms=1,
                                             keep_on_bookies_ms=0))
    time.sleep(0.01)
    assert len(run(logs, log_name)) >= 3
    dst = log_name + "-out"
    logs.create(dst)
    q = pipeline(spark, uri, log_name, dst, str(tmp_path / "ckpt"), available_now=False,
                 startingOffsets="earliest", maxEntriesPerTrigger="15", queryId="q")
    service = RetentionService(logs.bk, "test-stream-offload")
    stop = threading.Event()
    errors_seen = []

    def churn():
        try:
            i = 4
            while not stop.is_set():
                if i < 10:
                    add(i)
                    i += 1
                if logs.cursor(log_name, "q") is not None and logs.retention(log_name) is None:
                    logs.set_retention(log_name, RetentionPolicy(bytes=1))
                service.run_once()
                time.sleep(0.3)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors_seen.append(exc)
    t = threading.Thread(target=churn)
    t.start()
    try:
        deadline = time.time() + 240
        want = [f"M{i:02d}-{j:02d}" for i in range(10) for j in range(20)]
        got = []
        while time.time() < deadline:
            got = [r.value.decode() for r in rd(spark, uri, log=dst).load().collect()]
            if len(got) >= len(want) or not q.isActive:
                break
            time.sleep(2)
    finally:
        stop.set()
        t.join()
        q.stop()
    assert not errors_seen, errors_seen
    assert got == want
    assert service.offloaded_ledgers >= 4 and service.removed >= 1
    assert service.dropped_ledgers >= 1         # (files the only copy while it ran)


# ---- the bookies' copy dropped --------------------------------------------------------------

def _drop(logs, name, tmp_path, bookies=None):
    """Drop the bookies' copy of the offloaded ledgers of ``name`` now (and, given
    ``bookies``, have them collect it); their ids."""
    from bkspark.testing.cluster import bookie_http
    policy = logs.offload_policy(name)
    logs.set_offload(name, offload.OffloadPolicy(policy.location, after_ms=1,
                                                 keep_on_bookies_ms=0))
    dropped = offload_pass.drop_copies(logs, name)
    for b in bookies or ():
        assert bookie_http(b, "/api/v1/bookie/gc", "POST", {}, timeout=60)[0] == 200
    return dropped


@pytest.mark.parametrize("schema", ["record", "kafka"])
def test_a_log_whose_bookies_copy_is_dropped_reads_the_same_rows(
        spark, uri, logs, log_name, tmp_path, schema):
    import datetime
    _half_offloaded(spark, uri, logs, log_name, tmp_path)
    extra = {"schema": "kafka", "includeHeaders": "true"} if schema == "kafka" else {}
    before = rd(spark, uri, log=log_name, readOffloaded="false", **extra).load().collect()
    assert len(_drop(logs, log_name, tmp_path)) == 2
    assert rd(spark, uri, log=log_name, **extra).load().collect() == before
    with pytest.raises(Exception, match="readOffloaded=false cannot read it: drop that option"):
        rd(spark, uri, log=log_name, readOffloaded="false", **extra).load().collect()
    # a start by time inside a dropped ledger: its records' times read from its files
    at = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc) + \
        datetime.timedelta(seconds=20, milliseconds=500)
    got = rd(spark, uri, log=log_name, startingTimestamp=str(int(at.timestamp() * 1000)),
             **extra).load().collect()
    assert got == before[21:]
    if schema == "record":          # a file of the only copy lost: the read fails, says why
        import os
        first = logs.segments(log_name)[0]
        os.remove(f"{offload.Location(str(tmp_path)).log_dir(log_name)}/"
                  f"{first.offloaded['files'][0]['name']}")
        with pytest.raises(Exception, match="its offloaded files, its only copy .* cannot be "
                                            "read"):
            rd(spark, uri, log=log_name).load().collect()


def test_a_range_planned_before_the_drop_is_read_from_the_files_not_lost(
        uri, logs, log_name, tmp_path, bk_cluster):
    """A task planned while the bookies held the ledgers runs after their copy was dropped and
    collected: it reads the rest from the files (not a DataLossError, not a row twice)."""
    from bkspark.spark import codec, reader
    from bkspark.spark.options import parse_options
    from tests.spark.test_spark_packing import _small_ledgers
    logs.create(log_name)
    values = _small_ledgers(logs, log_name, 3, 40)
    opts = parse_options({"metadataServiceUri": uri, "log": log_name, "minPartitions": "1"})
    schema = codec.record_spark_schema()
    (part,) = reader.BookKeeperBatchReader(opts, schema).partitions()
    assert all(r.offloaded is None for r in part.ranges)
    logs.set_offload(log_name, offload.OffloadPolicy(str(tmp_path), after_ms=1))
    _offload_now(logs, log_name)
    assert len(_drop(logs, log_name, tmp_path, bk_cluster.bookies)) == 2
    got = [v.decode() for b in reader.read_range(opts, "record", schema, part)
           for v in b.column("value").to_pylist()]
    assert got == values


def test_a_task_whose_open_saw_an_older_view_reads_a_listed_ledger_not_data_loss(
        uri, logs, log_name, monkeypatch):
    """The task's open of a ledger answers "no such ledger" (a ZooKeeper server behind the
    planner's): a synced read of the log lists it on the bookies, so it is opened again and
    read, neither skipped (failOnDataLoss=false) nor reported removed."""
    from bkspark.spark import codec, conn, reader
    from bkspark.spark.options import parse_options
    from tests.spark.test_spark_packing import _small_ledgers
    logs.create(log_name)
    values = _small_ledgers(logs, log_name, 3, 20)
    opts = parse_options({"metadataServiceUri": uri, "log": log_name, "minPartitions": "1",
                          "failOnDataLoss": "false"})
    schema = codec.record_spark_schema()
    (part,) = reader.BookKeeperBatchReader(opts, schema).partitions()
    bk = conn.bookkeeper(opts.metadata_uri, opts.client_settings)
    real_open = type(bk).open_ledgers
    lagging = [part.ranges[1].ledger_id]

    def lagging_open(self, ledger_ids, password=b""):
        got = real_open(self, ledger_ids, password)
        return [None if lid in lagging and not lagging.remove(lid) else h
                for lid, h in zip(ledger_ids, got)]
    monkeypatch.setattr(type(bk), "open_ledgers", lagging_open)
    got = [v.decode() for b in reader.read_range(opts, "record", schema, part)
           for v in b.column("value").to_pylist()]
    assert got == values and not lagging
