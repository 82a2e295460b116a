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
from bkspark.spark import codec, conn, importguard, pending, routing
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
    log_of: dict = field(default_factory=dict)    # ledger id -> its log (routed writes)
    # ledger id -> list-entry keys: {"min_ts", "max_ts"}, the record timestamps written
    # (microseconds; record format), which let a seek by time skip whole ledgers
    ledger_info: dict = field(default_factory=dict)


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


class _TaskLedger:
    """One log's ledger in a task: created at the log's first rows."""

    def __init__(self, log_name: str | None):
        self.log_name = log_name
        self.handle = None
        self.min_ts = self.max_ts = None


def write_task(opts, fmt: str, spark_schema_json: str, pending_key: str, iterator,
               info: dict, writer_label: str) -> BKCommitMessage:
    """Write the task's batches into one new ledger per log (the option's one log, or each
    log the routing column names: :mod:`bkspark.spark.routing`); close them; describe them."""
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
    target = opts.write_target()
    bk = conn.bookkeeper(opts.metadata_uri, opts.client_settings)
    ledgers: dict[str | None, _TaskLedger] = {}
    inflight: deque = deque()           # the task's adds in flight, over all its ledgers

    def wait(keep: int = 0) -> None:
        while len(inflight) > keep:
            inflight.popleft().result()
    alive = None
    msg = BKCommitMessage(partition=partition, attempt=attempt)
    now_us = bk.store.clock.now_ms() * 1000     # records without a timestamp: the store's time

    def ledger_for(log_name: str | None, schema) -> _TaskLedger:
        nonlocal alive
        out = ledgers.get(log_name)
        if out is not None:
            return out
        routing.check_log_count(len(ledgers) + 1, opts.max_logs_per_write,
                                f"task {partition} of the write")
        out = _TaskLedger(log_name)
        custom = (codec.arrow_ledger_metadata(schema, spark_schema_json, writer_label)
                  if fmt == ARROW else codec.record_ledger_metadata(writer_label))
        if alive is None:
            alive = pending.begin_task(bk.store, pending_key, target)
        out.handle = bk.create_ledger(password=opts.password, custom_metadata=custom,
                                      **opts.ledger_options())
        ledgers[log_name] = out
        pending.register(bk.store, pending_key, out.handle.ledger_id,
                         dict(info, partition=partition, attempt=attempt,
                              host=socket.gethostname(), pid=os.getpid(),
                              log=log_name or target))
        return out

    column = None
    try:
        for batch in iterator:
            if batch.num_rows == 0:
                continue
            if target is None:
                column = column or routing.routing_column(batch.schema.names)
                parts = routing.split(batch, column, opts.max_logs_per_write)
            else:
                parts = [(target, batch)]
            for log_name, rows in parts:
                task_ledger = ledger_for(log_name if target is None else None, rows.schema)
                if fmt == ARROW:
                    entries = [memoryview(codec.encode_arrow(b, opts.compression))
                               for b in codec.split_batch(rows, opts.max_entry_bytes)]
                else:
                    entries = codec.batch_to_records(rows, now_us)
                    lo, hi = codec.record_time_range(rows, now_us)
                    _check_timestamps_ahead(opts, hi, now_us)
                    tl = task_ledger
                    tl.min_ts = lo if tl.min_ts is None else min(tl.min_ts, lo)
                    tl.max_ts = hi if tl.max_ts is None else max(tl.max_ts, hi)
                inflight.append(task_ledger.handle.append_many_async(entries))
                msg.entries += len(entries)
                msg.rows += rows.num_rows
                msg.bytes += sum(len(e) for e in entries)
                wait(keep=MAX_BATCHES_IN_FLIGHT)
            stall = fault.get("stallTask") == partition and attempt == 0 \
                and info.get("batch", 0) in (0, -1)
            if fault.get("hangTask") == partition or stall:
                wait()
                while True:
                    time.sleep(120)
                    if stall:
                        break
            if fail_task is not None and fail_task == partition and attempt == attempt_to_fail:
                wait()
                raise InjectedFault(f"_testFault: task for partition {partition} fails on its "
                                    "first attempt")
        wait()
        for task_ledger in ledgers.values():
            task_ledger.handle.close()
            lid = task_ledger.handle.ledger_id
            msg.ledgers.append(lid)
            if task_ledger.log_name is not None:
                msg.log_of[lid] = task_ledger.log_name
            if task_ledger.min_ts is not None:
                msg.ledger_info[lid] = {"min_ts": task_ledger.min_ts,
                                        "max_ts": task_ledger.max_ts}
        return msg
    except BaseException:
        for task_ledger in ledgers.values():    # best effort: the driver's cleanup catches
            lh = task_ledger.handle             # what this misses
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
        pending.end_task(bk.store, pending_key, alive,
                         [t.handle.ledger_id for t in ledgers.values()])


def _ledger_ids(messages) -> list[int]:
    return [lid for m in messages if m is not None for lid in (getattr(m, "ledgers", None) or [])]


def _ledger_info(messages) -> dict[int, dict]:
    """The list-entry keys the tasks' messages give their ledgers (timestamps written)."""
    return {lid: keys for m in messages if m is not None
            for lid, keys in (getattr(m, "ledger_info", None) or {}).items()}


def _ledgers_by_log(messages, opts) -> dict[str, list[int]]:
    """The messages' ledgers grouped by the log each goes to (the option's one log, or the
    log a routed task wrote it for), logs in first-seen order; BadRequestError beyond option
    maxLogsPerWrite."""
    target = opts.write_target()
    out: dict[str, list[int]] = {}
    for m in messages:
        if m is None:
            continue
        for lid in m.ledgers or []:
            out.setdefault(target or m.log_of[lid], []).append(lid)
    routing.check_log_count(len(out), opts.max_logs_per_write, "the write")
    return out


# ---- batch writer -----------------------------------------------------------------------

class BookKeeperBatchWriter(importguard.Guarded, DataSourceArrowWriter):
    """``df.write.format("bookkeeper")``: task ledgers, one atomic append (or overwrite) --
    to the option's log, or to every log the rows name (:mod:`bkspark.spark.routing`)."""

    def __init__(self, opts, schema, overwrite: bool):
        self.opts = opts
        self.log_name = opts.write_target()         # None: routed by a column
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
            by_log = _ledgers_by_log(messages, self.opts)
            if self.log_name is None:
                for name in by_log:
                    prepare_log(logs, self.opts, name)
            kw["guard"] = pending.begin_commit(logs.store, self.job, ids)
            if kw["guard"] is not None:
                kw["mark"] = pending.commit_mark(self.job)
            if self.overwrite:
                applied = logs.overwrite(self.log_name, ids, **kw)
            elif self.log_name is not None:
                applied = not _routed_before(logs, self.opts) and logs.append_to_logs(
                    {self.log_name: by_log.get(self.log_name, [])}, **kw)
            elif by_log:
                key = self.opts.writer_id
                applied = logs.append_to_logs(by_log, key_log=key and routing.key_log(key), **kw)
            else:
                applied = True          # a routed job without rows: no log to change
            if not applied:
                log.info("logs %s: write %s/%s was already applied; nothing appended",
                         ", ".join(by_log), self.opts.writer_id, self.opts.writer_sequence)
            if "failCommitAfterAppend" in faults(self.opts):
                raise InjectedFault("_testFault: the batch commit fails after its append")
        except GuardChangedError:
            raise pending.JobReclaimedError(
                f"write job {self.job} was reclaimed as abandoned while it committed; nothing "
                "was appended. Run the write again") from None
        finally:
            pending.clean(logs, self.job, self.log_name or pending.ROUTED, remove_job=True)

    def abort(self, messages):
        """Delete the job's ledgers that the log does not list. A commit that raised may
        still have been applied (its answer lost): what the log lists stays."""
        logs = conn.log_store(self.opts)
        _delete_unlisted(logs, messages, self.opts)
        pending.clean(logs, self.job, self.log_name or pending.ROUTED, remove_job=True)


def _routed_before(logs, opts) -> bool:
    """Whether the write's idempotency key was committed already by a write of the same
    writer id that routed by a column (its key log holds it: :func:`routing.key_log`) --
    the same job run again with option 'log' added must not append twice."""
    if opts.writer_id is None:
        return False
    try:
        return logs.writer_sequence(routing.key_log(opts.writer_id),
                                    opts.writer_id) >= opts.writer_sequence
    except NoSuchLogError:
        return False


def _described(target: str | None) -> str:
    return ("the logs its rows' 'topic' column names" if target == pending.ROUTED
            else f"log {target!r}")


def _delete_unlisted(logs, messages, opts) -> None:
    """Delete the messages' ledgers that their log does not list (proven, log by log)."""
    target = opts.write_target()
    by_log: dict[str, list[int]] = {}
    for m in messages:
        for lid in (getattr(m, "ledgers", None) or []) if m is not None else []:
            by_log.setdefault(target or m.log_of[lid], []).append(lid)
    for name, ids in by_log.items():
        logs.delete_unreferenced(name, ids)


def prepare_log(logs, opts, name: str, *, overwrite: bool = False) -> None:
    """The checks and set-up of a log a write appends to (at planning for the option's log,
    at commit for each routed one): its retention policy (options retentionTime/-Size: the
    policy of a log this write creates -- created now, with it; a log that exists must have
    that policy already) and its password (one log, one password: a reader opens every ledger
    of a log with the password it is given; an overwrite replaces them all). BadRequestError
    names the fix."""
    policy = opts.retention
    if policy is not None:
        logs.create(name, retention=policy)
        current = logs.retention(name)
        if current != policy:
            raise BadRequestError(
                f"log {name!r} exists with retention "
                f"'{current.describe() if current else 'keep everything'}', not "
                f"'{policy.describe()}' as the retention options say: they apply when a write "
                f"creates the log. Change an existing log's policy with `bkspark shell "
                f"set-retention {name} ...`, or leave the options out")
    if opts.offload is not None:
        logs.create(name)
        current = logs.offload_policy(name)
        if current is None:
            logs.set_offload(name, opts.offload)
        elif current != opts.offload:
            raise BadRequestError(
                f"log {name!r} offloads {current.describe()}, not {opts.offload.describe()} as "
                f"the offload options say: change its policy with `bkspark shell set-offload "
                f"{name} ...`, or leave the options out")
    if overwrite:
        return
    try:
        last = logs.last_listed(name)
    except NoSuchLogError:
        return
    if last is not None and logs.bk.ledger_metadata(last.ledger_id).keys.derive(
            opts.password) is None:
        raise BadRequestError(
            f"log {name!r} holds ledgers written with another password than option "
            "'password' gives: pass the log's password (every ledger of a log must have "
            "the same one, or no read could read it all), or write to another log")


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
        self.log_name = opts.write_target()         # None: routed by a column
        self.fmt = opts.entry_format
        self.schema_json = codec.schema_json(schema)
        self._prepared: set[str] = set()            # routed logs checked (prepare_log)

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
        if not present:
            return
        by_log = _ledgers_by_log(present, self.opts)
        qid = next((m.query_id for m in present if m.query_id), None)
        run = next((m.run_id for m in present if m.run_id), None) or "unknown"
        wid = sink_writer_id(self.opts, qid)
        logs = conn.log_store(self.opts)
        if self.log_name is None:
            for name in by_log:
                if name not in self._prepared:
                    prepare_log(logs, self.opts, name)
                    self._prepared.add(name)
                    if len(self._prepared) > 4 * self.opts.max_logs_per_write:
                        self._prepared.clear()          # (a bound; checking again is harmless)
        fault = faults(self.opts)
        for attempt in range(3):
            store = _sink_store(logs, self.opts, wid, fresh=attempt > 0)
            try:
                self._commit_once(logs, store, wid, run, by_log, _ledger_info(present),
                                  batchId, fault, spark_query=qid)
                break
            except LogFencedError:
                # someone opened our store (maybe a later commit process of this same run):
                # reopen and decide again from the recorded owner
                _forget_sink_store(self.opts, wid)
                if attempt == 2:
                    raise
        pending.clean(logs, f"sink-{wid}", self.log_name or pending.ROUTED, keep=(),
                      upto_batch=batchId)

    def _commit_once(self, logs, store, wid, run, by_log, info, batch_id, fault,
                     spark_query=None):
        latest = store.latest()
        owner, superseded, committed_for = None, [], None
        if latest is not None:
            payload = latest[1] or {}
            owner, superseded = payload.get("run"), list(payload.get("superseded", []))
            since = payload.get("since", 0)
            committed_for = payload.get("spark_query")
        else:
            since = logs.store.clock.now_ms()   # when this query started committing (kept)
        target = self.log_name or pending.ROUTED
        if latest is not None and (latest[1] or {}).get("log", target) != target:
            raise BadRequestError(
                f"streaming query {wid!r} committed its batches to "
                f"{_described((latest[1] or {}).get('log'))}, but this run writes to "
                f"{_described(target)}: a query keeps where its sink writes (its batches' "
                "idempotency keys live there). Restore the sink's options, or start a new "
                "query (a new 'queryId' and checkpointLocation)")
        if run in superseded:
            raise LogFencedError(f"streaming query {wid}: this run ({run}) was superseded by a "
                                 f"newer run ({owner}) of the same query; it may not commit")
        if owner is not None and owner != run:
            superseded = (superseded + [owner])[-32:]
            log.info("sink %s: run %s takes over from run %s", wid, run, owner)
        keeper = self.log_name or routing.key_log(wid)      # (routing.key_log: why)
        try:
            done = logs.writer_sequence(keeper, wid)            # (the head only)
        except NoSuchLogError:
            done = -1
        where = self.log_name or f"{', '.join(by_log)} (routed; keys in {keeper})"
        if done >= 0 and committed_for and spark_query and committed_for != spark_query:
            # another Spark query (a new or reset checkpoint) under the same queryId: its batch
            # ids restart at 0, so the sink can neither tell which of them the log holds nor
            # where its source started -- committing would skip or repeat rows
            raise BadRequestError(
                f"log {where!r} holds batches 0..{done} of query {wid!r} committed by "
                f"Spark query {committed_for}, but this is Spark query {spark_query} (its "
                "checkpoint was reset or lost, or another query re-uses the queryId): "
                "committing its batches could skip or repeat rows, so it is refused. Restart "
                "the query from its original checkpointLocation, or use a new 'queryId' (and "
                "choose its startingOffsets) with the new checkpoint")
        if batch_id < done:
            raise BadRequestError(
                f"log {where!r} already holds batch {done} of query {wid!r}, but Spark "
                f"is committing batch {batch_id}: the query's checkpoint was reset or belongs to "
                "another query; use a new checkpointLocation together with a new 'queryId'")
        store.commit(batch_id, {"run": run, "superseded": superseded,
                                "log": self.log_name or pending.ROUTED,
                                "ledgers": [lid for ids in by_log.values() for lid in ids],
                                "since": since,
                                "spark_query": spark_query or committed_for})
        if fault.get("failCommitBeforeAppend") == batch_id:
            raise InjectedFault(f"_testFault: sink commit of batch {batch_id} fails before append")
        routed = self.log_name is None
        applied = logs.append_to_logs(by_log if routed else {self.log_name: by_log.get(
                                          self.log_name, [])},
                                      writer_id=wid, sequence=batch_id, epoch=store.epoch,
                                      info=info, writer_started_ms=since,
                                      key_log=keeper if routed else None)
        if not applied:
            log.info("sink %s: batch %d was already in log %s; nothing appended twice",
                     wid, batch_id, where)
        if fault.get("failCommitAfterAppend") == batch_id:
            raise InjectedFault(f"_testFault: sink commit of batch {batch_id} fails after append")
        if batch_id % 32 == 0 and batch_id > 64:
            store.purge(batch_id - 64)

    def abort(self, messages, batchId):
        _delete_unlisted(conn.log_store(self.opts), messages, self.opts)
