"""Reading offloaded ledgers from their Parquet files (:mod:`bkspark.log.offload`) as the
connector's rows: one log read across both tiers.

Planning gives a range of an offloaded ledger its record (:attr:`LedgerRange.offloaded`, with
option ``readOffloaded``, default true); its task reads the files that hold the range's
entries with pyarrow -- only the row groups whose entry-id statistics meet the range, only the
columns the read schema needs -- and turns them into exactly the batches a read of the same
entries from the bookies yields (record, ``schema=kafka`` and Arrow reads alike), in entry
order. The boundary between the tiers is a ledger's: a ledger is read whole from one tier or
the other, so nothing is read twice or skipped where they meet, and an offload finishing
while a query runs changes only where a later plan reads a ledger from.

Failures: a file that cannot be opened (missing, unreadable, its footer corrupt) before the
range yielded anything is read through ``fallback`` instead -- from the bookies while they
keep their copy; once it is dropped, the ledger is data loss if the log no longer lists it
(cut meanwhile), else the task fails (:func:`bkspark.spark.reader.read_ranges`); a failure
later in a file (a page checksum) fails the task, as a bookie read that fails on every
replica does.
"""
from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from bkspark.log.offload import ARROW_COLUMNS, READ_BATCH_ROWS, Location, files_of, row_groups

log = logging.getLogger("bkspark.spark")

def _headers_to_kafka(col, to_type):
    """A ``map<string, binary>`` column as the Kafka source's ``array<struct<key, value>>``."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if col.offset:                  # (from_arrays takes no sliced null bitmap: a copy)
        col = col.take(pa.array(range(len(col)), pa.int64()))
    entries = pa.StructArray.from_arrays([col.keys, col.items], names=["key", "value"])
    out = pa.ListArray.from_arrays(col.offsets, entries, mask=col.is_null())
    return out.cast(to_type)


def to_target(batch: pa.RecordBatch, fmt_arrow: bool, kafka: bool, log_name: str,
              target: pa.Schema) -> pa.RecordBatch:
    """A batch read from an offloaded file as the read schema ``target``."""
    from bkspark.spark import codec
    n = batch.num_rows
    if fmt_arrow:           # (as an entry decodes: the written columns, then conformed)
        return codec.conform(batch.select(range(batch.num_columns - len(ARROW_COLUMNS))),
                             target)       # (by position: a writer may name a column so)
    cols = {name: batch.column(name) for name in batch.schema.names}
    log_col = pa.repeat(pa.scalar(log_name, pa.string()), n)
    if kafka:
        ts = cols["timestamp"]
        arrays = {"key": cols["key"], "value": cols["value"], "topic": log_col,
                  "partition": pa.repeat(pa.scalar(0, pa.int32()), n), "offset": cols["offset"],
                  "timestamp": ts,
                  "timestampType": pc.if_else(pc.is_null(ts), -1, 0).cast(pa.int32())}
        if "headers" in target.names:
            arrays["headers"] = _headers_to_kafka(cols["headers"], target.field("headers").type)
    else:
        arrays = dict(cols, log=log_col)
    return pa.RecordBatch.from_arrays(
        [arrays[f.name].cast(f.type) if arrays[f.name].type != f.type else arrays[f.name]
         for f in target], schema=target)


def read_offloaded(part, fmt_arrow: bool, kafka: bool, target: pa.Schema, fallback):
    """Yield the batches (exactly ``target``) of LedgerRange ``part`` read from its offloaded
    files (module docstring); ``fallback()`` yields them from the bookies instead, used when
    a file cannot be opened before anything was yielded."""
    import pyarrow.parquet as pq
    record = part.offloaded
    eid_col = "_entry_id" if fmt_arrow else "entry_id"
    yielded = False
    try:
        where = Location(record["location"])
        directory = where.log_dir(part.log)
        for f in files_of(record, part.first, part.last):
            pf = pq.ParquetFile(f"{directory}/{f['name']}", filesystem=where.fs,
                                page_checksum_verification=True)
            groups = row_groups(pf, eid_col, part.first, part.last)
            whole = f["first"] >= part.first and f["last"] <= part.last
            for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=groups):
                if not whole:
                    eids = batch.column(batch.num_columns - 1 if fmt_arrow else eid_col)
                    batch = batch.filter(pc.and_(pc.greater_equal(eids, part.first),
                                                 pc.less_equal(eids, part.last)))
                if batch.num_rows:
                    yielded = True
                    yield to_target(batch, fmt_arrow, kafka, part.log, target)
    except (OSError, pa.ArrowException, KeyError) as exc:
        if yielded:
            raise
        log.warning("log %s: ledger %d entries %d..%d: its offloaded files cannot be read "
                    "(%s); reading them from the bookies", part.log, part.ledger_id,
                    part.first, part.last, exc)
        yield from fallback(exc)
