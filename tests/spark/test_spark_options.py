"""Option parsing of format("bookkeeper") (pure: no cluster, no Spark session)."""
import pytest

from bkspark.errors import BadRequestError
from bkspark.log import Position
from bkspark.spark.options import ARROW, parse_options

URI = "sqlite:///tmp/x.db"


def parse(**kw):
    kw.setdefault("metadataServiceUri", URI)
    return parse_options(kw)


def test_defaults_and_case_insensitive_names():
    o = parse_options({"METADATASERVICEURI": URI, "Log": "events", "entryformat": "ARROW",
                       "maxentriespertrigger": "7", "FailOnDataLoss": "false"})
    assert o.logs == ["events"] and o.entry_format == ARROW
    assert o.max_entries_per_trigger == 7 and o.fail_on_data_loss is False
    assert (o.ensemble_size, o.write_quorum, o.ack_quorum, o.digest) == (3, 2, 2, "crc32c")


def test_retention_options_of_the_log_a_write_creates():
    from bkspark.log.retention import RetentionPolicy
    assert parse(log="a", retentionTime="7d").retention == RetentionPolicy(ms=7 * 86_400_000)
    assert parse(log="a", retentionSize="1GiB", retentionPassCursors="true").retention == \
        RetentionPolicy(bytes=1 << 30, pass_cursors=True)
    assert parse(log="a").retention is None
    with pytest.raises(BadRequestError, match="option 'retentionTime' 'a week'"):
        parse(log="a", retentionTime="a week")
    with pytest.raises(BadRequestError, match="'retentionPassCursors' goes with"):
        parse(log="a", retentionPassCursors="true")
    with pytest.raises(BadRequestError, match="retentionSize"):
        parse(log="a", **{"retention.bytes": "100"})


def test_unknown_option_is_named():
    with pytest.raises(BadRequestError, match="unknown option 'subscriber'.*did you mean "
                                              "'subscribe'"):
        parse(log="a", subscriber="x")


@pytest.mark.parametrize("given,meant", [
    ("maxentriespertriger", "maxEntriesPerTrigger"),     # Spark passes names lower-cased
    ("startingOffset", "startingOffsets"),
    ("ensemblesize ", "ensembleSize"),
    ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),    # Kafka's name for it
])
def test_unknown_option_suggests_the_closest_known_one(given, meant):
    with pytest.raises(BadRequestError, match=f"unknown option {given!r}.*did you mean {meant!r}"):
        parse(log="a", **{given: "1"})


def test_unknown_client_option_suggests_the_closest_field():
    from bkspark.client import BookKeeper
    with pytest.raises(BadRequestError, match="unknown BookKeeper option 'add_timout': did you "
                                              "mean 'add_timeout'"):
        BookKeeper("sqlite:///nonexistent/x.db", add_timout=3)


@pytest.mark.parametrize("opt,value,match", [
    ("entryFormat", "parquet", "entryFormat"),
    ("maxEntriesPerTrigger", "0", "maxEntriesPerTrigger"),
    ("maxEntriesPerTrigger", "ten", "maxEntriesPerTrigger"),
    ("failOnDataLoss", "maybe", "failOnDataLoss"),
    ("digestType", "md5", "digestType"),
    ("startingOffsets", "yesterday", "startingOffsets"),
    ("startingOffsets", '{"a": {"ledger": 1}}', "startingOffsets"),
    ("endingOffsets", '{"b": {"ledger": 1, "entry": 0}}', "endingOffsets"),
    ("ensembleSize", "1", "ensembleSize"),
    ("maxEntryBytes", str(64 << 20), "maxEntryBytes"),
    ("minPartitions", "0", "minPartitions"),
    ("minPartitions", "many", "minPartitions"),
    ("log", "bad name!", "log"),
    ("logPattern", "(", "logPattern"),
    ("writerId", "w1", "writerSequence"),
    ("compression", "snappy", "compression"),
])
def test_invalid_values_name_the_option(opt, value, match):
    kw = {"log": "a"}
    kw[opt] = value
    with pytest.raises(BadRequestError, match=match):
        parse(**kw)


def test_offsets_json_and_keywords():
    o = parse(logs="a, b", startingOffsets='{"a": {"ledger": 5, "entry": 3}, "b": "latest"}',
              endingOffsets="latest")
    assert o.logs == ["a", "b"]
    assert o.starting == {"a": Position(5, 3), "b": "latest"} and o.ending == "latest"


def test_log_selection_is_exclusive_and_required_for_writes():
    with pytest.raises(BadRequestError, match="exclusive"):
        parse(log="a", logs="b,c")
    with pytest.raises(BadRequestError, match="exactly one log"):
        parse(logs="a,b").single_log()
    assert parse(path="p").single_log() == "p"
    o = parse(logPattern="ev-.*")
    assert o.matching_logs(["ev-1", "ev-2", "other", "__ckpt.x"]) == ["ev-1", "ev-2"]


def test_metadata_uri_default_and_error():
    assert parse_options({"log": "a"}, default_uri=lambda: URI).metadata_uri == URI
    with pytest.raises(BadRequestError, match="metadataServiceUri"):
        parse_options({"log": "a"}, default_uri=lambda: None)


def test_quorum_invariant():
    with pytest.raises(BadRequestError, match="ackQuorumSize"):
        parse(log="a", ensembleSize="3", writeQuorumSize="2", ackQuorumSize="3")
    o = parse(log="a", ensembleSize="5", writeQuorumSize="3", ackQuorumSize="2", password="pw")
    assert o.ledger_options() == dict(ensemble_size=5, write_quorum=3, ack_quorum=2, digest="crc32c")
    assert o.password == b"pw"


def test_compression_is_for_arrow_entries():
    assert parse(log="a", entryFormat="arrow", compression="ZSTD").compression == "zstd"
    assert parse(log="a", entryFormat="arrow", compression="lz4").compression == "lz4"
    assert parse(log="a", entryFormat="arrow", compression="none").compression is None
    assert parse(log="a", entryFormat="arrow").compression == "lz4"         # the default
    assert parse(log="a", compression="none").compression is None
    assert parse(log="a").compression is None                             # record entries
    with pytest.raises(BadRequestError, match="'compression' applies to entryFormat=arrow"):
        parse(log="a", compression="zstd")
