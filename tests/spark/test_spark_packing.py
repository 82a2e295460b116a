"""Small ledgers packed into few partitions (issue 51): order, offsets and exactly-once kept."""
from __future__ import annotations

import pytest

from bkspark.spark.codec import encode_record

from tests.spark.test_spark_batch import rd
from tests.spark.test_spark_streaming import run_to_end

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _small_ledgers(logs, name, count, rows, tag=""):
    """``count`` closed ledgers of ``rows`` records each, listed in log ``name``; the values
    in log order."""
    ids, values = [], []
    for i in range(count):
        lh = logs.bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        for j in range(rows):
            value = f"{tag}{name}:{i}:{j}"
            lh.append(encode_record(value.encode(), key=str(i).encode()))
            values.append(value)
        lh.close()
        ids.append(lh.ledger_id)
    logs.append_ledgers(name, ids)
    return values


def test_many_small_ledgers_of_several_logs_are_read_by_few_tasks_in_order(spark, uri, logs,
                                                                          log_name):
    names = [f"{log_name}-{k}" for k in range(3)]
    expected = {n: _small_ledgers(logs, n, 40, 3) for n in names}
    df = rd(spark, uri, logPattern=f"{log_name}-[0-9]", minPartitions="1").load()
    assert df.rdd.getNumPartitions() == 1              # 120 ledgers, 3 logs: one partition
    rows = df.collect()                                # (one partition: in its order)
    # by default one pack per CPU the planner may run on (local mode: the task slots)
    from bkspark.spark.reader import assumed_parallelism
    assert rd(spark, uri, logPattern=f"{log_name}-[0-9]").load().rdd \
        .getNumPartitions() == assumed_parallelism()
    assert [r.value.decode() for r in rows] == [v for n in names for v in expected[n]]
    # Kafka's offsets run on across the packed ledgers of each log
    kafka = rd(spark, uri, logPattern=f"{log_name}-[0-9]", schema="kafka",
               minPartitions="1").load().collect()
    for n in names:
        mine = [r for r in kafka if r.topic == n]
        assert [r.offset for r in mine] == list(range(120))
        assert [r.value.decode() for r in mine] == expected[n]
    # a smaller target: more partitions, each row still once
    split = rd(spark, uri, logPattern=f"{log_name}-[0-9]", openCostInBytes="4MiB",
               minPartitions="1").load()
    assert split.rdd.getNumPartitions() == 4           # 120 x 4 MiB over 128 MiB: 4 of 30
    assert sorted(r.value.decode() for r in split.collect()) == \
        sorted(v for n in names for v in expected[n])
    assert rd(spark, uri, logPattern=f"{log_name}-[0-9]", minPartitions="6").load() \
        .rdd.getNumPartitions() >= 6


def test_a_stream_of_many_small_ledgers_is_copied_exactly_once(spark, uri, logs, log_name,
                                                                tmp_path):
    src, dst, ckpt = log_name, log_name + "-copy", str(tmp_path / "ckpt")
    values = _small_ledgers(logs, src, 60, 2)

    def copy():
        return (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
                .option("log", src).option("startingOffsets", "earliest")
                .option("maxEntriesPerTrigger", "50").load()
                .select("key", "value")
                .writeStream.format("bookkeeper").option("metadataServiceUri", uri)
                .option("log", dst).option("checkpointLocation", ckpt)
                .trigger(availableNow=True).start())
    run_to_end(copy())
    values += _small_ledgers(logs, src, 30, 2, tag="more-")
    run_to_end(copy())
    got = [r.value.decode() for r in rd(spark, uri).load(dst).collect()]
    assert sorted(got) == sorted(values) and len(got) == 180


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_ledger_removed_while_its_pack_is_read_is_data_loss_not_a_read_error(
        uri, logs, log_name, bk_cluster, fail_on_data_loss, monkeypatch):
    """A pack reads its ledgers' metadata together, then their entries one after the other:
    a ledger its log truncates (retention) in between -- metadata gone, entries collected by
    the bookies -- is what failOnDataLoss says (DataLossError, or skipped), as a ledger
    removed before the task started, never a NoSuchEntryError."""
    from bkspark.log import Position
    from bkspark.spark import codec, conn, reader
    from bkspark.spark.options import parse_options
    from bkspark.testing.cluster import bookie_http
    values = _small_ledgers(logs, log_name, 6, 2)
    ids = logs.get(log_name)[0].ledger_ids()
    opts = parse_options({"metadataServiceUri": uri, "log": log_name, "minPartitions": "1",
                          "failOnDataLoss": str(fail_on_data_loss).lower()})
    schema = codec.record_spark_schema()
    (part,) = reader.BookKeeperBatchReader(opts, schema).partitions()
    assert [r.ledger_id for r in part.ranges] == ids

    bk = conn.bookkeeper(opts.metadata_uri, opts.client_settings)
    real_open = type(bk).open_ledgers

    def open_then_truncate(self, ledger_ids, password=b""):
        handles = real_open(self, ledger_ids, password)
        logs.truncate(log_name, Position(ids[3], 0), force=True)  # drops the first three
        for b in bk_cluster.bookies:
            assert bookie_http(b, "/api/v1/bookie/gc", "POST", {}, timeout=60)[0] == 200
        return handles
    monkeypatch.setattr(type(bk), "open_ledgers", open_then_truncate)
    read = reader.read_range(opts, "record", schema, part)
    if fail_on_data_loss:
        with pytest.raises(reader.DataLossError, match=f"ledger {ids[0]} .* was removed"):
            list(read)
    else:
        got = [v.decode() for b in read for v in b.column("value").to_pylist()]
        assert got == values[6:]            # the three ledgers left, whole
