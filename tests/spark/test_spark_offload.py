"""Offload seen from Spark (issue 52): the offload options of a write set the log's policy, and
Spark's own ``parquet`` source reads the offloaded directory as the log's rows -- one log, or
every log offloaded to a location as one table with a ``log`` column."""
import time

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
