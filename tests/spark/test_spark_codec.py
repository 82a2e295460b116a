"""Entry encodings (record and arrow) and the streaming read-limit split (pure)."""
import pyarrow as pa
import pytest

from bkspark.spark import codec
from bkspark.spark.stream import allocate


def test_record_round_trip_all_fields():
    data = codec.encode_record(b"v" * 1000, key="k", timestamp_us=1_700_000_000_123_456,
                               headers={"a": b"1", "b": None, "ü": "x"})
    assert data[:4] == codec.MAGIC
    key, value, ts, headers = codec.decode_record(data)
    assert (key, value, ts) == (b"k", b"v" * 1000, 1_700_000_000_123_456)
    assert headers == [("a", b"1"), ("b", None), ("ü", b"x")]


def test_record_nulls_and_empty_values():
    assert codec.decode_record(codec.encode_record(None)) == (None, None, None, None)
    assert codec.decode_record(codec.encode_record(b"", key=b"")) == (b"", b"", None, None)
    assert len(codec.encode_record(b"x")) == 7          # 6-byte header + value


def test_foreign_entries_read_as_plain_values():
    for raw in (b"", b"hello", b'{"json": 1}', b"\xffBK", b"\xffBKR\x09zzz"):
        assert codec.decode_record(raw) == (None, raw, None, None)


def test_records_to_batch_matches_schema():
    from pyspark.sql.pandas.types import to_arrow_schema
    target = to_arrow_schema(codec.record_spark_schema(), timezone="UTC")
    entries = [("lg", 7, 0, codec.encode_record(b"a", key=b"k", timestamp_us=5,
                                                headers={"h": b"x"})),
               ("lg", 7, 1, b"plain"), ("other", 9, 0, b"o")]
    batch = codec.records_to_batch(entries, target)
    assert batch.schema.equals(target)
    rows = batch.to_pylist()
    assert rows[0]["log"] == "lg" and rows[0]["ledger_id"] == 7 and rows[1]["entry_id"] == 1
    assert rows[0]["headers"] == [("h", b"x")] and rows[1]["value"] == b"plain"
    assert rows[1]["key"] is None and rows[1]["timestamp"] is None
    assert (rows[2]["log"], rows[2]["ledger_id"]) == ("other", 9)     # rows of several ledgers


def test_arrow_entries_round_trip_zero_copy_and_split():
    batch = pa.record_batch({
        "id": pa.array(range(1000), pa.int64()),
        "s": pa.array([None if i % 7 == 0 else f"s{i}" for i in range(1000)]),
        "nested": pa.array([[{"a": i, "b": [1.5, None]}] for i in range(1000)]),
        "blob": pa.array([bytes(500) for _ in range(1000)], pa.binary()),
    })
    md = codec.arrow_ledger_metadata(batch.schema, '{"type": "struct", "fields": []}')
    schema = codec.ledger_arrow_schema(md)
    assert schema.equals(batch.schema)
    pieces = list(codec.split_batch(batch, 64 << 10))
    assert len(pieces) > 1 and sum(p.num_rows for p in pieces) == 1000
    decoded = [codec.decode_arrow(memoryview(codec.encode_arrow(p)).tobytes(), schema) for p in pieces]
    assert pa.Table.from_batches(decoded).equals(pa.Table.from_batches([batch]))


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compressed_arrow_entries_decode_without_being_told(compression):
    batch = pa.record_batch({
        "id": pa.array(range(5000), pa.int64()),
        "s": pa.array([None if i % 7 == 0 else f"row-{i % 50}" for i in range(5000)]),
        "nested": pa.array([{"a": i % 3, "b": [1.5, None]} for i in range(5000)]),
        "blob": pa.array([b"abcd" * 64 if i % 2 else None for i in range(5000)], pa.binary()),
        "empty": pa.array([b""] * 5000, pa.binary()),
    })
    plain = codec.encode_arrow(batch)
    packed = codec.encode_arrow(batch, compression)
    assert packed.size * 4 < plain.size                 # repetitive data: much smaller
    back = codec.decode_arrow(memoryview(packed).tobytes(), batch.schema)
    assert back.equals(batch)
    tiny = batch.slice(0, 0)
    assert codec.decode_arrow(codec.encode_arrow(tiny, compression), batch.schema).equals(tiny)


def test_conform_relabels_timestamp_zone_and_nullability():
    src = pa.record_batch([pa.array([1, 2], pa.timestamp("us", tz="Etc/UTC"))], names=["t"])
    target = pa.schema([pa.field("t", pa.timestamp("us", tz="UTC"), nullable=True)])
    out = codec.conform(src, target)
    assert out.schema.equals(target) and out.column(0).cast(pa.int64()).to_pylist() == [1, 2]


def test_allocate_read_limit():
    assert allocate({"a": 5, "b": 5}, 100) == {"a": 5, "b": 5}
    share = allocate({"a": 90, "b": 10, "c": 0}, 10)
    assert sum(share.values()) == 10 and share["a"] >= 8 and share["c"] == 0
    assert sum(allocate({"a": 1, "b": 1, "c": 1}, 2).values()) == 2


def test_worker_heap_freeze_leaves_other_processes_alone():
    """Only PySpark's worker processes get their heap frozen; the driver (the user's own
    process, like this one) keeps every object collectable."""
    import gc

    from bkspark.spark import conn
    before = gc.get_freeze_count()
    conn.freeze_worker_heap()
    assert gc.get_freeze_count() == before == 0
