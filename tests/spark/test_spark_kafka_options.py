"""Kafka's option names and offsets forms (pure parsing: no cluster, no Spark session)."""
import pytest

from bkspark.errors import BadRequestError
from bkspark.log.position import EARLIEST, LATEST
from bkspark.spark.options import AtOffset, AtTime, parse_options

URI = "sqlite:///tmp/x.db"


def parse(**kw):
    kw.setdefault("metadataServiceUri", URI)
    return parse_options(kw)


def test_kafka_names_mean_this_sources_options():
    o = parse(subscribe="a,b", maxOffsetsPerTrigger="5", minOffsetsPerTrigger="2",
              maxTriggerDelay="30s", includeHeaders="true", schema="kafka")
    assert o.logs == ["a", "b"] and o.max_entries_per_trigger == 5
    assert o.min_entries_per_trigger == 2 and o.max_trigger_delay == 30.0
    assert o.include_headers and o.schema == "kafka"
    assert parse(subscribePattern="ev.*").log_pattern == "ev.*"
    assert parse(assign='{"a": [0], "b": [0]}').logs == ["a", "b"]
    assert parse(topic="out").single_log() == "out"           # the sink's name for the log
    assert parse(log="a", maxBytesPerTrigger="1000").max_bytes_per_trigger == 1000


@pytest.mark.parametrize("value,seconds", [("15m", 900), ("500ms", 0.5), ("2h", 7200),
                                           ("1500", 1.5)])
def test_max_trigger_delay_durations(value, seconds):
    assert parse(log="a", maxTriggerDelay=value).max_trigger_delay == seconds


def test_kafka_offsets_json_and_timestamps():
    o = parse(subscribe="a,b", startingOffsets='{"a": {"0": 7}, "b": {"0": -2}}',
              endingOffsets='{"a": {"0": -1}}')
    assert o.starting == {"a": AtOffset(7), "b": EARLIEST} and o.ending == {"a": LATEST}
    assert parse(log="a", startingTimestamp="1700000000000").starting == AtTime(1700000000000)
    o = parse(logs="a,b", startingOffsetsByTimestamp='{"a": {"0": 5}}', endingTimestamp="9")
    assert o.starting == {"a": AtTime(5)} and o.ending == AtTime(9)
    assert parse(log="a", startingOffsetsByTimestampStrategy="LATEST").timestamp_strategy == "latest"


@pytest.mark.parametrize("kw,match", [
    ({"kafka.bootstrap.servers": "h:9092"}, "Kafka option; .*'metadataServiceUri'"),
    ({"kafka.security.protocol": "SSL"}, "Kafka option; .*client.tlsCaFile"),
    ({"kafka.group.id": "g"}, "Kafka option; .*'queryId'"),
    ({"groupIdPrefix": "g"}, "Kafka option; .*'queryId'"),
    ({"subscribe": "b"}, "'log' and 'subscribe' are exclusive"),
    ({"maxOffsetsPerTrigger": "3", "maxEntriesPerTrigger": "3"}, "mean the same"),
    ({"startingOffsets": '{"a": {"1": 3}}'}, "one partition"),
    ({"startingOffsets": '{"a": {"0": -3}}'}, "-2 .earliest."),
    ({"startingOffsets": "earliest", "startingTimestamp": "5"}, "exclusive"),
    ({"startingOffsetsByTimestamp": '{"a": 5}'}, "startingOffsetsByTimestamp"),
    ({"startingOffsetsByTimestamp": '{"zz": {"0": 5}}'}, "names logs that are not read"),
    ({"maxTriggerDelay": "soon"}, "duration"),
    ({"schema": "avro"}, "'schema' must be"),
    ({"schema": "kafka", "entryFormat": "arrow"}, "record entries"),
    ({"startingTimestamp": "5", "entryFormat": "arrow"}, "seeking by time"),
    ({"startingOffsetsByTimestampStrategy": "nearest"}, "'error' or 'latest'"),
    ({"includeHeaders": "sometimes"}, "includeHeaders"),
])
def test_bad_kafka_options_say_what_to_do(kw, match):
    kw.setdefault("log", "a") if "subscribe" in kw or "log" not in kw else None
    with pytest.raises(BadRequestError, match=match):
        parse(**kw)


def test_assign_must_name_partition_zero():
    with pytest.raises(BadRequestError, match="one partition, 0"):
        parse(assign='{"a": [1]}')
