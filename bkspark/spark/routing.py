"""Routing rows to logs by a column: Kafka's ``topic`` habit, committed exactly once.

A write that names no log (no option ``log``/``topic``, no ``save(name)``) sends each row to
the log its ``topic`` column names (Kafka's sink) -- or its ``log`` column, the one a record
read gives, so a read of several logs writes back to the same logs. Option ``log`` given, the
column is ignored (as Kafka's ``topic`` option overrides the column).

What a routed write guarantees (:mod:`bkspark.spark.writer` does it):

* every task writes one ledger per log its rows name, registered with the write job under
  that log (:mod:`bkspark.spark.pending`);
* the driver commits all the job's ledgers, across all its logs, in ONE metadata transaction
  (:meth:`bkspark.log.LogStore.append_to_logs`): every log gets its rows, or none does; the
  idempotency key (``writerId``/``writerSequence``, or the streaming query and batch id) is
  kept by the writer's :func:`key_log`, changed in the same transaction; a lost answer is
  settled by any of the logs (or by the job's commit record), and an aborted job's ledgers
  are deleted log by log once proven unlisted;
* a row whose column is null, names no valid log or an internal one (``__`` names) fails
  its task before anything commits, and so does a job naming more than ``maxLogsPerWrite``
  logs; a commit too large for one metadata transaction fails naming that option.

This module is the pure part: which column routes, and splitting a batch by it.
"""
from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bkspark.errors import BadRequestError
from metadata.layout import INTERNAL_LOG_PREFIX as INTERNAL_PREFIX, check_log_name

#: the columns that name a row's log, in the order they are looked for
ROUTING_COLUMNS = ("topic", "log")


def routing_column(names) -> str:
    """The column naming each row's log (``topic``, else ``log``).

    :raises BadRequestError: neither is there, or both are (which one would be ambiguous)."""
    present = [c for c in ROUTING_COLUMNS if c in names]
    if not present:
        raise BadRequestError(
            "format('bookkeeper') writes need option 'log' (or save(\"name\")), or a 'topic' "
            f"column naming each row's log; got columns {list(names)}")
    if len(present) > 1:
        raise BadRequestError(
            "the rows have both a 'topic' and a 'log' column and no option 'log': which names "
            "each row's log is ambiguous; select one of them away (or set option 'log')")
    return present[0]


def check_routed_schema(schema, entry_format: str) -> str:
    """The routing column of a Spark write schema, checked; BadRequestError naming the fix."""
    from pyspark.sql.types import StringType
    column = routing_column([f.name for f in schema.fields])
    if entry_format != "record":
        raise BadRequestError(
            f"routing rows by their {column!r} column needs entryFormat=record (an arrow log "
            "holds one table: set option 'log')")
    kind = {f.name: f.dataType for f in schema.fields}[column]
    if not isinstance(kind, StringType):
        raise BadRequestError(f"column {column!r} names each row's log and must be a string, "
                              f"got {kind.simpleString()}")
    return column


def split(batch: pa.RecordBatch, column: str, limit: int) -> list[tuple[str, pa.RecordBatch]]:
    """The rows of ``batch`` grouped by the log ``column`` names, each group in batch order,
    groups in the order their log first appears (one stable sort of the rows, whatever the
    number of logs).

    :raises BadRequestError: a row's log is null, not a valid log name, an internal log
        (``__`` names: checkpoint stores, idempotency keys), or the batch names more than
        ``limit`` logs (option maxLogsPerWrite)."""
    names = batch.column(batch.schema.get_field_index(column))
    if names.null_count:
        raise BadRequestError(f"a row's {column!r} is null: a write without option 'log' sends "
                              f"each row to the log its {column!r} column names (fill it, or "
                              "set option 'log')")
    encoded = pc.dictionary_encode(names)
    logs = encoded.dictionary.to_pylist()
    check_log_count(len(logs), limit, "a batch of the write")
    for name in logs:
        try:
            check_log_name(name)
        except BadRequestError as exc:
            raise BadRequestError(f"a row's {column!r} names no valid log: {exc}") from None
        if name.startswith(INTERNAL_PREFIX):
            raise BadRequestError(f"a row's {column!r} names {name!r}, an internal log (names "
                                  f"starting {INTERNAL_PREFIX!r} hold the store's own state): "
                                  "rows cannot be routed there")
    if len(logs) == 1:
        return [(logs[0], batch)]
    order = pc.sort_indices(encoded.indices)            # (stable: rows keep their order)
    grouped = batch.take(order)
    counts = np.bincount(encoded.indices.to_numpy(zero_copy_only=False), minlength=len(logs))
    out, start = [], 0
    for i, count in enumerate(counts):
        out.append((logs[i], grouped.slice(start, int(count))))
        start += int(count)
    return out


#: the internal logs that keep routed writers' idempotency keys (:func:`key_log`)
KEY_LOGS = 256


def key_log(writer_id: str) -> str:
    """The log that keeps a routed writer's idempotency key (``writerId``, or a streaming
    query's id) and owner epoch: one of :data:`KEY_LOGS` internal logs, chosen by a hash of
    the id. Every commit of the writer changes it, in the commit's transaction, whichever
    logs the rows name; so it alone tells which sequence (batch) the writer committed last,
    its key is refreshed by every commit (never expiring in a log the writer rarely routes
    to), and a reset checkpoint is recognised whatever logs its batches name. A log's
    bound on writer keys applies to it as to any log (the 1,000 most recently used, 7 days
    idle): spread over 256 key logs, an active writer's key is pushed out only by some
    256,000 other routed writers within a week (then its commit is refused, never applied
    twice: :class:`~metadata.log_segments.WriterKeyExpiredError`)."""
    return f"{INTERNAL_PREFIX}routed-writers.{zlib.crc32(writer_id.encode()) % KEY_LOGS}"


def check_log_count(count: int, limit: int, where: str) -> None:
    """BadRequestError when ``where`` names more logs than option maxLogsPerWrite allows."""
    if count > limit:
        raise BadRequestError(
            f"{where} names {count} logs, more than option maxLogsPerWrite={limit} allows "
            "(each is an open ledger in a task and part of one commit): raise the option, or "
            "write fewer logs per job")
