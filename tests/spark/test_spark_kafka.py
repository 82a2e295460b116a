"""Kafka's conventions on format("bookkeeper") against real bookies: schema=kafka, Kafka
offsets, seeks by time, Kafka's option names, one cursor per query, the backlog in the
progress, and the byte / minimum read limits (issue 28, items 3-5)."""
import datetime
import json
import time

import pytest

from bkspark.log import Position
from bkspark.spark import reader as spark_reader
from tests.spark.test_spark_streaming import run_to_end as finish

pytestmark = [pytest.mark.spark, pytest.mark.integration]

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def ms(minutes: int) -> int:
    return int((T0 + datetime.timedelta(minutes=minutes)).timestamp() * 1000)


def write_minutes(spark, uri, log_name, minutes):
    """One batch write (one ledger: one partition) of a record per minute, stamped T0+minute."""
    rows = [(f"m{m}", T0 + datetime.timedelta(minutes=m),
             [{"key": "src", "value": b"test"}]) for m in minutes]
    df = spark.createDataFrame(
        rows, "value string, timestamp timestamp, headers array<struct<key:string,value:binary>>")
    (df.coalesce(1).write.format("bookkeeper").option("metadataServiceUri", uri)
     .mode("append").save(log_name))


@pytest.fixture
def minutes_log(spark, uri, log_name):
    """Three ledgers: minutes 0-4, 5-9, 10-14."""
    for lo in (0, 5, 10):
        write_minutes(spark, uri, log_name, range(lo, lo + 5))
    return log_name


def kafka_read(spark, uri, **opts):
    r = spark.read.format("bookkeeper").option("metadataServiceUri", uri).option("schema", "kafka")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_schema_kafka_is_the_kafka_sources(spark, uri, minutes_log, logs):
    df = kafka_read(spark, uri, subscribe=minutes_log, includeHeaders="true")
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>")
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [r.offset for r in rows] == list(range(15))               # one long per log, in order
    assert [r.value.decode() for r in rows] == [f"m{m}" for m in range(15)]
    assert {(r.topic, r.partition, r.timestampType) for r in rows} == {(minutes_log, 0, 0)}
    assert rows[3].headers == [("src", b"test")]
    assert "headers" not in kafka_read(spark, uri, subscribe=minutes_log).columns
    # each ledger's list entry keeps the range of its records' timestamps
    md = logs.get(minutes_log)[0]
    assert [(e.min_ts // 1000, e.max_ts // 1000) for e in md.ledgers] == \
        [(ms(0), ms(4)), (ms(5), ms(9)), (ms(10), ms(14))]
    # a read written back: Kafka's columns are taken or ignored, the rows land once
    kafka_read(spark, uri, subscribe=minutes_log, includeHeaders="true").write \
        .format("bookkeeper").option("metadataServiceUri", uri).option("topic", minutes_log + "-c") \
        .mode("append").save()
    copy = kafka_read(spark, uri, subscribe=minutes_log + "-c").collect()
    assert sorted(r.value for r in copy) == sorted(r.value for r in rows)


def test_kafka_offsets_select_rows(spark, uri, minutes_log):
    def offsets(**kw):
        return sorted(r.offset for r in kafka_read(spark, uri, subscribe=minutes_log, **kw)
                      .select("offset").collect())
    assert offsets(startingOffsets=json.dumps({minutes_log: {"0": 4}}),
                   endingOffsets=json.dumps({minutes_log: {"0": 11}})) == list(range(4, 11))
    assert offsets(startingOffsets=json.dumps({minutes_log: {"0": -2}}),
                   endingOffsets=json.dumps({minutes_log: {"0": -1}})) == list(range(15))
    with pytest.raises(Exception, match="beyond"):
        offsets(startingOffsets=json.dumps({minutes_log: {"0": 99}}))


def test_seek_by_time(spark, uri, minutes_log, logs):
    def values(**kw):
        return [r.value.decode() for r in
                kafka_read(spark, uri, subscribe=minutes_log, **kw).orderBy("offset").collect()]
    assert values(startingTimestamp=str(ms(7))) == [f"m{m}" for m in range(7, 15)]
    assert values(startingTimestamp=str(ms(6) + 1), endingTimestamp=str(ms(11))) == \
        ["m7", "m8", "m9", "m10"]
    assert values(startingOffsetsByTimestamp=json.dumps({minutes_log: {"0": ms(13)}})) == \
        ["m13", "m14"]
    with pytest.raises(Exception, match="no record stamped at or after"):
        values(startingTimestamp=str(ms(60)))
    assert values(startingTimestamp=str(ms(60)), startingOffsetsByTimestampStrategy="latest") == []
    # the seek reads only the ledger holding the time: the others are pruned by their range
    md = logs.get(minutes_log)[0]
    opened = []
    real_open = logs.bk.open_ledger

    def counting_open(lid, *a, **kw):
        opened.append(lid)
        return real_open(lid, *a, **kw)
    logs.bk.open_ledger = counting_open
    try:
        found = spark_reader.seek_time(logs, md, (ms(7) + 1) * 1000)
    finally:
        del logs.bk.open_ledger
    assert found == Position(md.ledgers[1].ledger_id, 3)
    assert opened == [md.ledgers[1].ledger_id]


def stream(spark, uri, src, dst, ckpt, trigger, **opts):
    r = spark.readStream.format("bookkeeper").option("metadataServiceUri", uri) \
        .option("subscribe", src).option("startingOffsets", "earliest")
    for k, v in opts.items():
        r = r.option(k, v)
    w = (r.load().select("value").writeStream.format("bookkeeper")
         .option("metadataServiceUri", uri).option("log", dst).option("checkpointLocation", ckpt))
    return (w.trigger(availableNow=True) if trigger == "now"
            else w.trigger(processingTime=trigger)).start()


def fill(logs, log_name, count, payload):
    with logs.open_writer(log_name) as w:
        for _ in range(count):
            w.append(payload)


def test_each_query_moves_its_own_cursor(spark, uri, logs, log_name, tmp_path):
    """Two queries on one log without queryId: two cursors (item 5). A restarted query finds
    its own cursor again through its checkpoint; queryId names it."""
    with logs.open_writer(log_name) as w:
        for i in range(6):
            w.append(b"c%d" % i)
    # each commits a batch's end when it plans the next: a at 4 (2+2+2), b at 3 (3+3)
    finish(stream(spark, uri, log_name, log_name + "-a", str(tmp_path / "a"), "now",
                  maxOffsetsPerTrigger="2"))
    finish(stream(spark, uri, log_name, log_name + "-b", str(tmp_path / "b"), "now",
                  maxOffsetsPerTrigger="3"))
    cursors = logs.cursors(log_name)
    assert sorted(p.entry_id for p in cursors.values()) == [3, 4]
    assert all(c.startswith("spark-") for c in cursors)
    name_a = next(c for c, p in cursors.items() if p.entry_id == 4)
    with logs.open_writer(log_name) as w:
        for i in range(6, 9):
            w.append(b"c%d" % i)
    finish(stream(spark, uri, log_name, log_name + "-a", str(tmp_path / "a"), "now",
                  maxOffsetsPerTrigger="2"))
    first, second = logs.get(log_name)[0].ledger_ids()
    cursors = logs.cursors(log_name)
    assert len(cursors) == 2 and name_a in cursors     # no third cursor: a found its own
    assert cursors[name_a] == Position(second, 2)      # batches 0-1 and 2 of the new ledger
    finish(stream(spark, uri, log_name, log_name + "-b", str(tmp_path / "b"), "now",
                  queryId="named"))
    assert logs.cursors(log_name)["named"] == Position(first, 6)   # b's last batch's end


def test_progress_shows_entries_and_bytes_behind(spark, uri, logs, log_name, tmp_path):
    fill(logs, log_name, 20, b"x" * 100)
    q = finish(stream(spark, uri, log_name, log_name + "-o", str(tmp_path / "c"), "now",
                      maxOffsetsPerTrigger="5"))
    backlog = [json.loads(p["sources"][0]["latestOffset"])["@backlog"]
               for p in q.recentProgress if p["numInputRows"]]
    assert [b["entriesBehindLatest"] for b in backlog] == [15, 10, 5, 0]
    assert [b["logs"][log_name]["entries"] for b in backlog] == [15, 10, 5, 0]
    assert backlog[0]["maxOffsetsBehindLatest"] == 15
    assert 15 * 100 <= backlog[0]["bytesBehindLatest"] <= 15 * 200      # an estimate


def test_max_bytes_per_trigger(spark, uri, logs, log_name, tmp_path):
    fill(logs, log_name, 12, b"y" * 1000)
    q = finish(stream(spark, uri, log_name, log_name + "-o", str(tmp_path / "d"), "now",
                      maxBytesPerTrigger="4500"))
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 12 and max(sizes) <= 4 and len(sizes) >= 3


def wait_for(cond, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_min_entries_per_trigger_waits_for_entries_or_the_delay(spark, uri, logs, log_name,
                                                                 tmp_path):
    dst = log_name + "-o"

    def out_rows():
        return logs.entry_counts(dst) if logs.exists(dst) else []

    with logs.open_writer(log_name) as w:
        for i in range(3):
            w.append(b"z%d" % i)
        q = stream(spark, uri, log_name, dst, str(tmp_path / "e"), "100 milliseconds",
                   minOffsetsPerTrigger="5", maxTriggerDelay="1h")
        try:
            wait_for(lambda: len(q.recentProgress) >= 5, "five triggers")
            assert sum(p["numInputRows"] for p in q.recentProgress) == 0     # 3 < 5: waits
            for i in range(3, 5):
                w.append(b"z%d" % i)
            wait_for(lambda: sum(n for _, n in out_rows()) == 5, "the batch of 5")
        finally:
            q.stop()
    # with a short delay, fewer entries go once it has passed
    other = log_name + "-2"
    with logs.open_writer(other) as w:
        w.append(b"lone")
    q = stream(spark, uri, other, other + "-o", str(tmp_path / "f"), "100 milliseconds",
               minOffsetsPerTrigger="100", maxTriggerDelay="1s")
    try:
        wait_for(lambda: logs.exists(other + "-o") and logs.entry_counts(other + "-o"),
                 "the delayed batch")
    finally:
        q.stop()
