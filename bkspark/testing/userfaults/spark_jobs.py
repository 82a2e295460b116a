"""The Spark drivers of a user-level fault run: one SparkSession (``local[2,4]``) per process.

* :func:`batch_main` -- a loop of write jobs through ``df.write.format("bookkeeper")``
  (append, append with ``writerId``/``writerSequence`` and its re-run, a task that fails its
  first attempt, a commit that raises after its append and its re-run, overwrite of a log a
  LogWriter is writing, overwrite of the batch log, and the re-run of an early writer key of
  the keys log through Spark). Each job writes rows with unique values ``j:<job>:<n>`` and
  records ``J job start log kind rows t`` then ``J job committed|failed t``; re-runs write
  the same rows under ``rerun-start`` / ``rerun-committed`` / ``rerun-failed``.
* :func:`stream_main` -- ``readStream`` of the stream's source log (tail ledger open, a
  short client read timeout) into ``writeStream`` to the sink log, option ``queryId`` and a
  ``checkpointLocation``; each row keeps its source position in its key
  (``<ledger>:<entry>``). Every completed micro-batch is recorded
  ``P run batch rows end t durations`` from the query's progress; the query's end ``Q run failed|...`` (``Q run restart`` when
  Spark could not start its Python worker in time and the query starts again in the same
  driver).
"""
from __future__ import annotations

import json
import os
import random
import sys
import time

from .workloads import (BATCH_LOG, KEYS_LOG, OVERWRITE_LOG, STREAM_SINK, STREAM_SOURCE,
                        AckFile, now)

QUERY_ID = "uf-query"
#: starts of the streaming query in one driver (:func:`_spark_start_failure`)
START_ATTEMPTS = 10
#: job kinds of the batch driver and their weights
JOB_KINDS = {"append": 4, "append-id": 3, "fail-task": 2, "commit-raise": 2,
             "overwrite-live": 3, "overwrite-batch": 1, "append-ow": 1, "keys-rerun": 1}


def session(app: str):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    s = (SparkSession.builder.master("local[2,4]").appName(app)
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.default.parallelism", "2")
         .config("spark.driver.memory", "768m")
         .config("spark.sql.streaming.stopTimeout", "5s")
         # (C1 only, serial GC: a JVM that starts and runs on a busy 2-core machine)
         .config("spark.driver.extraJavaOptions",
                 "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1")
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    # registered here, not found by Spark's scan for pyspark_* modules: that scan runs once,
    # in a Python worker, and a worker killed by the run's faults then fails every job of the
    # driver with "bookkeeper.DefaultSource" not found (the scan is tested elsewhere)
    from bkspark.spark import register
    register(s)
    return s


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    for marker in ("BadRequestError", "LogFencedError", "InjectedFault", "OutcomeUnknownError",
                   "JobReclaimedError", "BKError", "NoSuchLedgerError"):
        if marker in text:
            return marker
    return type(exc).__name__


def batch_main(a) -> None:
    spark = session("uf-batch")
    acks = AckFile(a.acks)
    rng = random.Random(f"{a.seed}/{a.run_id}")
    acks.write("W", "batch", os.getpid(), a.run_id, now())
    kinds, weights = list(JOB_KINDS), list(JOB_KINDS.values())
    keys_done = os.path.join(os.path.dirname(a.acks), "keys.done")
    keys_rerun = 5 + (hash(a.run_id) % 3)
    n = 0

    def write(job, log, rows, parts, mode="append", opts=None, event="", fault=None):
        df = spark.range(0, rows, 1, parts).selectExpr(
            f"concat('j:{job}:', cast(id as string)) as value")
        w = df.write.format("bookkeeper").option("metadataServiceUri", a.uri) \
            .option("log", log).mode(mode)
        for k, v in (opts or {}).items():
            w = w.option(k, str(v))
        if fault:
            w = w.option("_testFault", fault)
        acks.write("J", job, f"{event}start", log, kind, rows, now())
        try:
            w.save()
        except Exception as exc:  # noqa: BLE001 - a failed job is recorded, not fatal
            acks.write("J", job, f"{event}failed", now(), _short(exc))
            print(f"job {job} {event}failed: {str(exc)[:3000]}", file=sys.stderr, flush=True)
            return False
        acks.write("J", job, f"{event}committed", now())
        return True

    while True:
        job = f"{a.run_id}.{n}"
        n += 1
        kind = rng.choices(kinds, weights)[0]
        rows, parts = rng.randint(10, 120), rng.randint(1, 3)
        if kind == "append":
            write(job, BATCH_LOG, rows, parts)
        elif kind == "append-id":
            ids = {"writerId": f"bw-{job}", "writerSequence": 0}
            write(job, BATCH_LOG, rows, parts, opts=ids)
            if rng.random() < 0.6:      # the same job again: must append nothing
                write(job, BATCH_LOG, rows, parts, opts=ids, event="rerun-")
        elif kind == "fail-task":
            write(job, BATCH_LOG, rows, max(parts, 2), fault="failTask:0")
        elif kind == "commit-raise":
            ids = {"writerId": f"bw-{job}", "writerSequence": 0}
            write(job, BATCH_LOG, rows, parts, opts=ids, fault="failCommitAfterAppend:0")
            write(job, BATCH_LOG, rows, parts, opts=ids, event="rerun-")
        elif kind == "overwrite-live":
            write(job, OVERWRITE_LOG, rows, parts, mode="overwrite")
        elif kind == "overwrite-batch":
            write(job, BATCH_LOG, rows, parts, mode="overwrite")
        elif kind == "append-ow":
            write(job, OVERWRITE_LOG, rows, parts)
        elif kind == "keys-rerun" and os.path.exists(keys_done):
            # an early writer key of the keys log, re-run through Spark (its rows are the
            # keys workload's: one row j:kw-<i>:0)
            kjob = f"kw-{keys_rerun}"
            df = spark.createDataFrame([(f"j:{kjob}:0",)], "value string")
            acks.write("J", kjob, "rerun-start", KEYS_LOG, "keys-rerun", 1, now())
            try:
                df.write.format("bookkeeper").option("metadataServiceUri", a.uri) \
                    .option("log", KEYS_LOG).option("writerId", kjob) \
                    .option("writerSequence", "0").mode("append").save()
                acks.write("J", kjob, "rerun-committed", now())
            except Exception as exc:  # noqa: BLE001
                acks.write("J", kjob, "rerun-failed", now(), _short(exc))
            keys_rerun += 1
        time.sleep(rng.uniform(0.1, 0.6))


def _progress_fields(p) -> tuple:
    get = (lambda k: p[k]) if isinstance(p, dict) else (lambda k: getattr(p, k))
    try:
        batch, rows = get("batchId"), get("numInputRows")
        sources = get("sources")
        src = sources[0] if sources else None
        end = (src["endOffset"] if isinstance(src, dict) else src.endOffset) if src else None
    except (KeyError, AttributeError, TypeError):
        return None
    if isinstance(end, str):
        try:
            end = json.loads(end)
        except ValueError:
            pass
    try:
        took = dict(get("durationMs"))     # (where a slow micro-batch spent its time)
    except (KeyError, AttributeError, TypeError, ValueError):
        took = {}
    return batch, rows, end, took


def stream_main(a) -> None:
    spark = session("uf-stream")
    acks = AckFile(a.acks)
    acks.write("W", "stream", os.getpid(), a.run_id, now())
    query_id, sink = a.query_id or QUERY_ID, a.sink or STREAM_SINK
    src = (spark.readStream.format("bookkeeper").option("metadataServiceUri", a.uri)
           .option("log", STREAM_SOURCE).option("startingOffsets", "earliest")
           .option("queryId", query_id)
           .option("client.readTimeout", "1.0").option("client.speculativeReadTimeout", "0.3")
           .load())
    out = src.selectExpr("value", "cast(concat(cast(ledger_id as string), ':', "
                                  "cast(entry_id as string)) as binary) as key")
    for attempt in range(START_ATTEMPTS):
        acks.write("Q", a.run_id, "start", a.mode, a.checkpoint, now())
        q = _start_query(out, a, sink, query_id, acks)
        exc = _follow(q, a, acks)
        if exc is None or not _spark_start_failure(exc) or attempt == START_ATTEMPTS - 1:
            break
        acks.write("Q", a.run_id, "restart", now(), "PythonWorkerStart")
        print(f"query restarted in this driver: {str(exc)[:300]}", file=sys.stderr, flush=True)
    # (the sink's refusal of another Spark query: the checker and runner tell it)
    refused = exc is not None and "original checkpointLocation" in str(exc)
    acks.write("Q", a.run_id, "refused" if refused else "failed" if exc else "stopped",
               now(), _short(exc) if exc else "-",
               (str(exc).replace("\n", " ")[:300] if exc else ""))
    sys.exit(3)


def _start_query(out, a, sink: str, query_id: str, acks):
    try:
        w = (out.writeStream.format("bookkeeper").option("metadataServiceUri", a.uri)
             .option("log", sink).option("queryId", query_id)
             .option("checkpointLocation", a.checkpoint))
        w = w.trigger(availableNow=True) if a.available_now else \
            w.trigger(processingTime="500 milliseconds")
        return w.start()
    except Exception as exc:  # noqa: BLE001
        acks.write("Q", a.run_id, "failed", now(), _short(exc))
        print(f"query failed to start: {str(exc)[:3000]}", file=sys.stderr, flush=True)
        sys.exit(3)


def _follow(q, a, acks):
    """Record the query's completed micro-batches (``P``) until it ends; its exception (None:
    it stopped)."""
    seen = -1
    while True:
        active = q.isActive         # (before the progress: a batch that ends the query counts)
        for p in q.recentProgress:
            f = _progress_fields(p)
            if f is None or f[0] <= seen:
                continue
            seen = f[0]
            acks.write("P", a.run_id, f[0], f[1], json.dumps(f[2], separators=(",", ":")), now(),
                       json.dumps(f[3], separators=(",", ":")))
        if not active:
            exc = q.exception()
            if exc:
                print(f"query failed: {str(exc)[:3000]}", file=sys.stderr, flush=True)
            return exc
        time.sleep(0.2)


def _spark_start_failure(exc) -> bool:
    """Whether the query ended because Spark could not start a Python worker in time (its
    wait for a new worker to connect back is a fixed 10 s; on two busy cores the streaming
    source's runner can miss it). Not a fault of the connector: the driver starts the query
    again from its checkpoint, as a user's supervisor would, instead of a new JVM."""
    return "Python worker failed to connect back" in str(exc)
