"""Entry encodings of the connector (pure: no Spark session, no cluster).

``entryFormat=record`` — one row per entry, in the record format of
:mod:`bkspark.log.records` (entries of other producers read as ``value``).

``entryFormat=arrow`` — an entry is one Arrow IPC *record batch message* (no schema: the
schema is kept once, in the ledger's custom metadata, see :func:`arrow_ledger_metadata`).
Its body buffers may be compressed (LZ4 frame or ZSTD, Arrow's own IPC body compression: the
message says which, so readers need no option). Decoding is zero-copy over the entry's bytes
when the body is not compressed.
"""
from __future__ import annotations

import json

import pyarrow as pa

# (the record entry format is the log layer's: bkspark.log.records)
from bkspark.log.arrow_entries import encode_arrow, fresh  # noqa: F401  (this interface)
from bkspark.log.records import (  # noqa: F401  (part of this module's interface)
    F_HDR, F_KEY, F_NULL_VALUE, F_TS, MAGIC, VERSION, decode_record, encode_record)

# ledger custom-metadata keys
MD_FORMAT = "bkspark.entryFormat"
MD_ARROW_SCHEMA = "bkspark.arrow.schema"
MD_SPARK_SCHEMA = "bkspark.spark.schema"
MD_WRITER = "bkspark.writer"

RECORD_DDL = ("log string, ledger_id long, entry_id long, key binary, value binary, "
              "timestamp timestamp, headers map<string,binary>")

TS_TYPE = pa.timestamp("us", tz="UTC")
HEADERS_TYPE = pa.map_(pa.string(), pa.binary())


def record_spark_schema():
    """The read schema of ``entryFormat=record`` as a Spark StructType."""
    from pyspark.sql.types import (
        BinaryType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )
    return StructType([
        StructField("log", StringType(), True),
        StructField("ledger_id", LongType(), True),
        StructField("entry_id", LongType(), True),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("headers", MapType(StringType(), BinaryType(), True), True),
    ])


def kafka_spark_schema(include_headers: bool):
    """The read schema of ``schema=kafka``: exactly that of Spark's Kafka source (``headers``
    only with ``includeHeaders``). ``topic`` is the log, ``partition`` is 0, ``offset`` the
    entry's log offset, ``timestampType`` 0 (CreateTime) for a record with a timestamp and -1
    for an entry without one (timestamp null)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )
    fields = [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType([
            StructField("key", StringType(), True),
            StructField("value", BinaryType(), True)]), True), True))
    return StructType(fields)


# ---- record entries ---------------------------------------------------------------------

def records_to_batch(rows, schema: pa.Schema) -> pa.RecordBatch:
    """A RecordBatch of the record read schema from ``(log, ledger_id, entry_id, data)``
    rows (of any ledgers: a packed partition's small ledgers make one batch)."""
    logs, lids, eids, keys, values, tss, hdrs = [], [], [], [], [], [], []
    for log, lid, eid, data in rows:
        k, v, ts, h = decode_record(data)
        logs.append(log)
        lids.append(lid)
        eids.append(eid)
        keys.append(k)
        values.append(v)
        tss.append(ts)
        hdrs.append(h)
    arrays = [
        pa.array(logs, pa.string()),
        pa.array(lids, pa.int64()),
        pa.array(eids, pa.int64()),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(tss, pa.int64()).cast(schema.field("timestamp").type),
        pa.array(hdrs, schema.field("headers").type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def records_to_kafka_batch(rows, schema: pa.Schema) -> pa.RecordBatch:
    """A RecordBatch of the Kafka read schema (:func:`kafka_spark_schema`) from ``(log,
    offset, data)`` rows (the log offset of each entry: its ledger's base + entry id)."""
    logs, offsets, keys, values, tss, types, hdrs = [], [], [], [], [], [], []
    for log, offset, data in rows:
        k, v, ts, h = decode_record(data)
        logs.append(log)
        offsets.append(offset)
        keys.append(k)
        values.append(v)
        tss.append(ts)
        types.append(-1 if ts is None else 0)
        hdrs.append(None if h is None else [{"key": n, "value": hv} for n, hv in h])
    n = len(offsets)
    arrays = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(logs, pa.string()),
        pa.array([0] * n, pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array(tss, pa.int64()).cast(schema.field("timestamp").type),
        pa.array(types, pa.int32()),
    ]
    if "headers" in schema.names:
        arrays.append(pa.array(hdrs, schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# ---- record writes: Spark input -> entries --------------------------------------------------

RECORD_WRITE_COLUMNS = ("value", "key", "headers", "timestamp")
#: columns of a read (record or Kafka schema) that a write does not store, so a read writes
#: back; ``topic`` / ``log`` name each row's log when option 'log' is not set
#: (:mod:`bkspark.spark.routing`), else they are ignored (as Kafka's sink with 'topic' set)
RECORD_IGNORED_COLUMNS = ("log", "ledger_id", "entry_id", "topic", "partition", "offset",
                          "timestampType")


def check_record_write_schema(schema) -> None:
    """Raise BadRequestError unless ``schema`` (Spark StructType) can be written as records."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        MapType,
        StringType,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    from bkspark.errors import BadRequestError
    names = {f.name: f.dataType for f in schema.fields}
    if "value" not in names:
        raise BadRequestError("entryFormat=record writes need a 'value' column (binary or string); "
                              f"got columns {list(names)}")
    extra = [n for n in names if n not in RECORD_WRITE_COLUMNS + RECORD_IGNORED_COLUMNS]
    if extra:
        raise BadRequestError(f"entryFormat=record writes take columns value, key, headers, "
                              f"timestamp; unexpected columns {extra} (select them away, or use "
                              "entryFormat=arrow to store whole rows)")
    for col in ("value", "key"):
        if col in names and not isinstance(names[col], (BinaryType, StringType)):
            raise BadRequestError(f"column {col!r} must be binary or string, got {names[col].simpleString()}")
    if "timestamp" in names and not isinstance(names["timestamp"], (TimestampType, TimestampNTZType)):
        raise BadRequestError(f"column 'timestamp' must be a timestamp, got {names['timestamp'].simpleString()}")
    if "headers" in names:
        t = names["headers"]
        ok = (isinstance(t, MapType) and isinstance(t.keyType, StringType)
              and isinstance(t.valueType, (BinaryType, StringType)))
        if isinstance(t, ArrayType) and isinstance(t.elementType, StructType):
            fields = {f.name: f.dataType for f in t.elementType.fields}
            ok = (set(fields) == {"key", "value"} and isinstance(fields["key"], StringType)
                  and isinstance(fields["value"], (BinaryType, StringType)))
        if not ok:
            raise BadRequestError("column 'headers' must be map<string,binary|string> or "
                                  f"array<struct<key:string,value:binary>>, got {t.simpleString()}")


def record_time_range(batch: pa.RecordBatch, now_us: int) -> tuple[int, int]:
    """(min, max) record timestamp :func:`batch_to_records` gives the rows of ``batch``."""
    if "timestamp" not in batch.schema.names or batch.num_rows == 0:
        return now_us, now_us
    import pyarrow.compute as pc
    col = batch.column(batch.schema.names.index("timestamp")).cast(pa.int64())
    mm = pc.min_max(col).as_py()
    lo = [x for x in (mm["min"], now_us if col.null_count else None) if x is not None]
    hi = [x for x in (mm["max"], now_us if col.null_count else None) if x is not None]
    return min(lo), max(hi)


def batch_to_records(batch: pa.RecordBatch, now_us: int) -> list[bytes]:
    """Encode every row of an input RecordBatch (columns of RECORD_WRITE_COLUMNS) as an entry."""
    names = batch.schema.names
    n = batch.num_rows

    def col(name):
        if name not in names:
            return None
        return batch.column(names.index(name))

    values = col("value").to_pylist()
    k = col("key")
    keys = k.to_pylist() if k is not None else [None] * n
    t = col("timestamp")
    if t is not None:
        tss = t.cast(pa.int64()).to_pylist()     # already microseconds since the epoch (UTC)
        tss = [now_us if x is None else x for x in tss]
    else:
        tss = [now_us] * n
    h = col("headers")
    if h is None:
        hdrs = [None] * n
    else:
        hdrs = []
        for row in h.to_pylist():
            if row is None:
                hdrs.append(None)
            elif isinstance(row, list) and row and isinstance(row[0], dict):
                hdrs.append([(x["key"], x["value"]) for x in row])
            else:
                hdrs.append(row)          # map -> list of (key, value) pairs
    return [encode_record(v, k2, ts, hd) for v, k2, ts, hd in zip(values, keys, tss, hdrs)]


# ---- arrow entries ----------------------------------------------------------------------

def arrow_ledger_metadata(arrow_schema: pa.Schema, spark_schema_json: str, writer: str = "") -> dict:
    md = {MD_FORMAT: b"arrow", MD_ARROW_SCHEMA: arrow_schema.serialize().to_pybytes(),
          MD_SPARK_SCHEMA: spark_schema_json.encode()}
    if writer:
        md[MD_WRITER] = writer.encode()
    return md


def record_ledger_metadata(writer: str = "") -> dict:
    md = {MD_FORMAT: b"record"}
    if writer:
        md[MD_WRITER] = writer.encode()
    return md


def ledger_arrow_schema(custom_metadata: dict) -> pa.Schema | None:
    raw = (custom_metadata or {}).get(MD_ARROW_SCHEMA)
    if raw is None:
        return None
    return pa.ipc.read_schema(pa.py_buffer(raw))


def ledger_spark_schema_json(custom_metadata: dict) -> str | None:
    raw = (custom_metadata or {}).get(MD_SPARK_SCHEMA)
    return None if raw is None else bytes(raw).decode()


def split_batch(batch: pa.RecordBatch, max_bytes: int):
    """Pieces of ``batch`` of about ``max_bytes`` each: ``batch`` itself if it is no larger,
    else its slices copied into fresh buffers (:func:`bkspark.log.arrow_entries.fresh`: an
    entry in that form is given back byte for byte by its offloaded rows; a slice is not)."""
    n = batch.num_rows
    if n == 0:
        return
    size = batch.nbytes
    if size <= max_bytes or n == 1:
        yield batch
        return
    rows = max(1, int(n * max_bytes / size))
    for start in range(0, n, rows):
        yield fresh([batch.slice(start, rows)])


def decode_arrow(data, schema: pa.Schema) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(pa.py_buffer(data) if not isinstance(data, pa.Buffer) else data,
                                    schema)


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly the schema ``target`` (same columns; types differing only in
    nullability, field metadata or timestamp zone are re-labelled, not copied)."""
    if batch.schema.equals(target):
        return batch
    if batch.schema.names != target.names:
        missing = [n for n in target.names if n not in batch.schema.names]
        if missing:
            raise ValueError(f"stored batches lack columns {missing}")
        batch = pa.RecordBatch.from_arrays([batch.column(n) for n in target.names],
                                           names=target.names)
    try:
        return pa.RecordBatch.from_arrays(batch.columns, schema=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return batch.cast(target)


def schema_json(spark_schema) -> str:
    return json.dumps(json.loads(spark_schema.json()), sort_keys=True)
