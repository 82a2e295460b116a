"""Writing logs exactly once: task ledgers, then one atomic append by the driver.

Every Spark task writes its rows to a new ledger of its own, closes it and names it in its
commit message. Nothing reaches the log until the driver's ``commit`` appends all the
ledgers named in the messages with one compare-and-set of the log's ledger list
(:meth:`LogStore.append_ledgers`, or :meth:`LogStore.overwrite` for ``mode("overwrite")``):
a job leaves the log with all of its rows or none.

Ledgers of failed or superseded task attempts are never named in a commit message, so they
never reach the log. To delete them too, each task registers its ledger with the write job
(:mod:`bkspark.spark.pending`) right after creating it; ``commit`` and ``abort`` delete every
registered ledger that is not part of the log, and the ledgers of a job whose driver died
are reclaimed by the next write to the log (or ``bkspark shell gc-pending``). A batch
commit is guarded by its job record, so a job reclaimed as abandoned can never commit.

Streaming sink (:class:`BookKeeperStreamWriter`): the same task ledgers; ``commit(messages,
batchId)`` appends them with ``writer_id`` = the query id and ``sequence`` = the batch id,
so re-running a batch after a crash appends nothing twice. The sink's
:class:`~bkspark.log.CheckpointStore` (``spark-sink.<query id>``) records which Spark run
owns the query: a new run takes over (fencing the old owner's store and, through the epoch
passed to ``append_ledgers``, the old owner's commits); a superseded run can never commit
again.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from bkspark import errors
from bkspark.errors import BadRequestError, LogFencedError, NoSuchLogError
from bkspark.spark import codec, conn, importguard, pending
from bkspark.spark.options import ARROW
from metadata.clock import elapsed
from metadata.update import GuardChangedError

log = logging.getLogger("bkspark.spark")

MAX_BATCHES_IN_FLIGHT = 32


class InjectedFault(errors.BKError):
    """A failure requested by the test-only ``_testFault`` option."""


@dataclass
class BKCommitMessage(WriterCommitMessage):
    ledgers: list = field(default_factory=list)
    entries: int = 0
    rows: int = 0
    bytes: int = 0
    partition: int = -1
    attempt: int = 0
    query_id: str | None = None     # Spark's streaming query id (sink tasks)
    run_id: str | None = None       # Spark's streaming run id (sink tasks)
    min_ts: int | None = None       # record timestamps written (microseconds; record format)
    max_ts: int | None = None


def faults(opts) -> dict:
    """Test-only ``_testFault`` (comma list): ``failTask:P`` (partition P's first attempt fails
    after writing), ``failTaskAlways:P``, ``failCommitBeforeAppend:B`` /
    ``failCommitAfterAppend:B`` (the sink's commit of batch B fails before / after appending;
    a batch write's commit fails after appending with any B): a commit that raises after its
    append is what a lost answer looks like to Spark. ``hangTask:P``: partition P's task
    stops after its first rows are acknowledged (until killed: a driver killed mid-write).
    ``stallTask:P``: partition P's first attempt (of a sink: in batch 0) pauses 120 s after its
    first rows are acknowledged -- time to kill its executor (the registration names the
    task's process, ``pid``)."""
    out = {}
    for item in (opts.test_fault or "").split(","):
        if ":" in item:
            k, v = item.split(":", 1)
            out[k.strip()] = int(v)
    return out


# ---- the task side ----------------------------------------------------------------------

def _check_timestamps_ahead(opts, newest_us: int, now_us: int) -> None:
    """A row stamped further ahead of the store's time than ``maxTimestampAheadMs`` fails the
    write (Kafka's ``message.timestamp.after.max.ms``): a record from the future would place
    its ledger wrongly for ``startingTimestamp`` reads. Record times never delete anything
    (retention judges the store's stamps: metadata.clock)."""
    ahead_ms = (newest_us - now_us) // 1000
    if ahead_ms > opts.max_timestamp_ahead_ms:
        raise BadRequestError(
            f"a row's timestamp is {ahead_ms / 1000:.0f} s ahead of the metadata store's time, "
            f"more than option maxTimestampAheadMs={opts.max_timestamp_ahead_ms} allows: fix "
            "the 'timestamp' column (or the clock of the host that produced it), or raise "
            "maxTimestampAheadMs")


def write_task(opts, fmt: str, spark_schema_json: str, pending_key: str, iterator,
               info: dict, writer_label: str) -> BKCommitMessage:
    """Write the task's batches into one new ledger; close it; describe it."""
    from pyspark import TaskContext
    conn.freeze_worker_heap()
    tc = TaskContext.get()
    partition = tc.partitionId() if tc else -1
    attempt = tc.attemptNumber() if tc else 0
    fault = faults(opts)
    fail_task = fault.get("failTask")
    if fault.get("failTaskAlways") == partition:
        fail_task, attempt_to_fail = partition, attempt
    else:
        attempt_to_fail = 0
    bk = conn.bookkeeper(opts.metadata_uri, opts.client_settings)
    lh = alive = None
    inflight: deque = deque()
    msg = BKCommitMessage(partition=partition, attempt=attempt)
    now_us = bk.store.clock.now_ms() * 1000     # records without a timestamp: the store's time
    try:
        for batch in iterator:
            if batch.num_rows == 0:
                continue
            if fmt == ARROW:
                entries = [memoryview(codec.encode_arrow(b, opts.compression))
                           for b in codec.split_batch(batch, opts.max_entry_bytes)]
            else:
                entries = codec.batch_to_records(batch, now_us)
                lo, hi = codec.record_time_range(batch, now_us)
                _check_timestamps_ahead(opts, hi, now_us)
                msg.min_ts = lo if msg.min_ts is None else min(msg.min_ts, lo)
                msg.max_ts = hi if msg.max_ts is None else max(msg.max_ts, hi)
            if lh is None:
                custom = (codec.arrow_ledger_metadata(batch.schema, spark_schema_json, writer_label)
                          if fmt == ARROW else codec.record_ledger_metadata(writer_label))
                alive = pending.begin_task(bk.store, pending_key, opts.single_log())
                lh = bk.create_ledger(password=opts.password, custom_metadata=custom,
                                      **opts.ledger_options())
                pending.register(bk.store, pending_key, lh.ledger_id,
                                 dict(info, partition=partition, attempt=attempt,
                                      host=socket.gethostname(), pid=os.getpid()))
            inflight.append(lh.append_many_async(entries))
            msg.entries += len(entries)
            msg.rows += batch.num_rows
            msg.bytes += sum(len(e) for e in entries)
            while len(inflight) > MAX_BATCHES_IN_FLIGHT:
                inflight.popleft().result()
            stall = fault.get("stallTask") == partition and attempt == 0 \
                and info.get("batch", 0) in (0, -1)
            if fault.get("hangTask") == partition or stall:
                for f in inflight:
                    f.result()
                while True:
                    time.sleep(120)
                    if stall:
                        break
            if fail_task is not None and fail_task == partition and attempt == attempt_to_fail:
                for f in inflight:
                    f.result()
                raise InjectedFault(f"_testFault: task for partition {partition} fails on its "
                                    "first attempt")
        while inflight:
            inflight.popleft().result()
        if lh is not None:
            lh.close()
            msg.ledgers = [lh.ledger_id]
        return msg
    except BaseException:
        if lh is not None:          # best effort: the driver's cleanup catches what this misses
            try:
                lh.close()
            except Exception:  # noqa: BLE001
                pass
            try:
                bk.delete_ledger(lh.ledger_id)
                pending.unregister(bk.store, pending_key, lh.ledger_id)
            except Exception:  # noqa: BLE001
                pass
        raise
    finally:
        pending.end_task(bk.store, pending_key, alive, lh.ledger_id if lh is not None else None)


def _ledger_ids(messages) -> list[int]:
    return [lid for m in messages if m is not None for lid in (getattr(m, "ledgers", None) or [])]


def _ledger_info(messages) -> dict[int, dict]:
    """The list-entry keys the tasks' messages give their ledgers: the record timestamps
    written (``min_ts``/``max_ts``), which let a seek by time skip whole ledgers."""
    return {lid: {"min_ts": m.min_ts, "max_ts": m.max_ts}
            for m in messages if m is not None and getattr(m, "min_ts", None) is not None
            for lid in m.ledgers}


# ---- batch writer -----------------------------------------------------------------------

class BookKeeperBatchWriter(importguard.Guarded, DataSourceArrowWriter):
    """``df.write.format("bookkeeper")``: task ledgers, one atomic append (or overwrite)."""

    def __init__(self, opts, schema, overwrite: bool):
        self.opts = opts
        self.log_name = opts.single_log()
        self.fmt = opts.entry_format
        self.overwrite = overwrite
        self.schema_json = codec.schema_json(schema)
        self.job = f"batch-{uuid.uuid4().hex}"
        # when the job started (before any commit of it), on this machine's elapsed clock:
        # the commit (on this machine) turns it into the store's time (metadata.clock)
        self.started = elapsed()

    def write(self, iterator):
        with conn.profile("write"):
            return write_task(self.opts, self.fmt, self.schema_json, self.job, iterator, {},
                              self.job)

    def commit(self, messages):
        logs = conn.log_store(self.opts)
        ids = _ledger_ids(messages)
        # a writer id the log no longer remembers may start a new key only with sequence 0
        # (metadata.log_segments: a later sequence could retry a commit already applied)
        started = logs.store.clock.at(self.started) if self.opts.writer_sequence == 0 else None
        kw = dict(writer_id=self.opts.writer_id, sequence=self.opts.writer_sequence,
                  info=_ledger_info(messages), writer_started_ms=started)
        try:
            kw["guard"] = pending.begin_commit(logs.store, self.job, ids)
            if kw["guard"] is not None:
                kw["mark"] = pending.commit_mark(self.job)
            if self.overwrite:
                applied = logs.overwrite(self.log_name, ids, **kw)
            else:
                applied = logs.append_ledgers(self.log_name, ids, **kw)
            if not applied:
                log.info("log %s: write %s/%s was already applied; nothing appended",
                         self.log_name, self.opts.writer_id, self.opts.writer_sequence)
            if "failCommitAfterAppend" in faults(self.opts):
                raise InjectedFault("_testFault: the batch commit fails after its append")
        except GuardChangedError:
            raise pending.JobReclaimedError(
                f"write job {self.job} was reclaimed as abandoned while it committed; nothing "
                "was appended. Run the write again") from None
        finally:
            pending.clean(logs, self.job, self.log_name, remove_job=True)

    def abort(self, messages):
        """Delete the job's ledgers that the log does not list. A commit that raised may
        still have been applied (its answer lost): what the log lists stays."""
        logs = conn.log_store(self.opts)
        logs.delete_unreferenced(self.log_name, _ledger_ids(messages))
        pending.clean(logs, self.job, self.log_name, remove_job=True)


# ---- streaming sink ---------------------------------------------------------------------

def _task_query_ids():
    from pyspark import TaskContext
    conn.freeze_worker_heap()
    tc = TaskContext.get()
    if tc is None:
        return None, None
    qid = tc.getLocalProperty("sql.streaming.queryId")
    run = tc.getLocalProperty("spark.jobGroup.id")
    return qid, run


def sink_writer_id(opts, spark_query_id: str | None) -> str:
    if opts.query_id:
        return opts.query_id
    if not spark_query_id:
        raise BadRequestError("the bookkeeper sink cannot tell the streaming query id; set "
                              "option 'queryId'")
    return f"spark-{spark_query_id}"


_sink_lock = threading.Lock()
_sink_stores: dict = {}          # (pid, uri, writer id) -> CheckpointStore


def _sink_store(logs, opts, wid: str, fresh: bool = False):
    from bkspark.log import CheckpointStore
    key = (os.getpid(), opts.metadata_uri, wid)
    with _sink_lock:
        store = _sink_stores.get(key)
        if store is not None and fresh:
            try:
                store.close()
            except Exception:  # noqa: BLE001
                pass
            store = None
        if store is None:
            store = CheckpointStore(logs, f"spark-sink.{wid}", compact_after=64)
            _sink_stores[key] = store
        return store


def _forget_sink_store(opts, wid: str) -> None:
    with _sink_lock:
        _sink_stores.pop((os.getpid(), opts.metadata_uri, wid), None)


class BookKeeperStreamWriter(importguard.Guarded, DataSourceStreamArrowWriter):
    """``writeStream.format("bookkeeper")``: exactly-once micro-batch commits."""

    def __init__(self, opts, schema):
        self.opts = opts
        self.log_name = opts.single_log()
        self.fmt = opts.entry_format
        self.schema_json = codec.schema_json(schema)

    def write(self, iterator):
        qid, run = _task_query_ids()
        wid = sink_writer_id(self.opts, qid)
        from pyspark import TaskContext
        tc = TaskContext.get()
        batch = tc.getLocalProperty("streaming.sql.batchId") if tc else None
        with conn.profile("write"):
            msg = write_task(self.opts, self.fmt, self.schema_json, f"sink-{wid}", iterator,
                             {"batch": int(batch) if batch is not None else -1, "run": run}, wid)
        msg.query_id, msg.run_id = qid, run
        return msg

    def commit(self, messages, batchId):
        with conn.profile("commit"):
            self._commit(messages, batchId)

    def _commit(self, messages, batchId):
        present = [m for m in messages if m is not None]
        ids = _ledger_ids(present)
        if not present:
            return
        qid = next((m.query_id for m in present if m.query_id), None)
        run = next((m.run_id for m in present if m.run_id), None) or "unknown"
        wid = sink_writer_id(self.opts, qid)
        logs = conn.log_store(self.opts)
        fault = faults(self.opts)
        for attempt in range(3):
            store = _sink_store(logs, self.opts, wid, fresh=attempt > 0)
            try:
                self._commit_once(logs, store, wid, run, ids, _ledger_info(present), batchId,
                                  fault, spark_query=qid)
                break
            except LogFencedError:
                # someone opened our store (maybe a later commit process of this same run):
                # reopen and decide again from the recorded owner
                _forget_sink_store(self.opts, wid)
                if attempt == 2:
                    raise
        pending.clean(logs, f"sink-{wid}", self.log_name, keep=(), upto_batch=batchId)

    def _commit_once(self, logs, store, wid, run, ids, info, batch_id, fault, spark_query=None):
        latest = store.latest()
        owner, superseded, committed_for = None, [], None
        if latest is not None:
            payload = latest[1] or {}
            owner, superseded = payload.get("run"), list(payload.get("superseded", []))
            since = payload.get("since", 0)
            committed_for = payload.get("spark_query")
        else:
            since = logs.store.clock.now_ms()   # when this query started committing (kept)
        if run in superseded:
            raise LogFencedError(f"streaming query {wid}: this run ({run}) was superseded by a "
                                 f"newer run ({owner}) of the same query; it may not commit")
        if owner is not None and owner != run:
            superseded = (superseded + [owner])[-32:]
            log.info("sink %s: run %s takes over from run %s", wid, run, owner)
        try:
            done = logs.writer_sequence(self.log_name, wid)     # (the head only)
        except NoSuchLogError:
            done = -1
        if done >= 0 and committed_for and spark_query and committed_for != spark_query:
            # another Spark query (a new or reset checkpoint) under the same queryId: its batch
            # ids restart at 0, so the sink can neither tell which of them the log holds nor
            # where its source started -- committing would skip or repeat rows
            raise BadRequestError(
                f"log {self.log_name!r} holds batches 0..{done} of query {wid!r} committed by "
                f"Spark query {committed_for}, but this is Spark query {spark_query} (its "
                "checkpoint was reset or lost, or another query re-uses the queryId): "
                "committing its batches could skip or repeat rows, so it is refused. Restart "
                "the query from its original checkpointLocation, or use a new 'queryId' (and "
                "choose its startingOffsets) with the new checkpoint")
        if batch_id < done:
            raise BadRequestError(
                f"log {self.log_name!r} already holds batch {done} of query {wid!r}, but Spark "
                f"is committing batch {batch_id}: the query's checkpoint was reset or belongs to "
                "another query; use a new checkpointLocation together with a new 'queryId'")
        store.commit(batch_id, {"run": run, "superseded": superseded, "log": self.log_name,
                                "ledgers": ids, "since": since,
                                "spark_query": spark_query or committed_for})
        if fault.get("failCommitBeforeAppend") == batch_id:
            raise InjectedFault(f"_testFault: sink commit of batch {batch_id} fails before append")
        applied = logs.append_ledgers(self.log_name, ids, writer_id=wid, sequence=batch_id,
                                      epoch=store.epoch, info=info, writer_started_ms=since)
        if not applied:
            log.info("sink %s: batch %d was already in log %s; nothing appended twice",
                     wid, batch_id, self.log_name)
        if fault.get("failCommitAfterAppend") == batch_id:
            raise InjectedFault(f"_testFault: sink commit of batch {batch_id} fails after append")
        if batch_id % 32 == 0 and batch_id > 64:
            store.purge(batch_id - 64)

    def abort(self, messages, batchId):
        logs = conn.log_store(self.opts)
        logs.delete_unreferenced(self.log_name, _ledger_ids(messages))
