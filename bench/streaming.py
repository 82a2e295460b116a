#!/usr/bin/env python3
"""A Spark streaming query writing one log for thousands of micro-batches: does a batch get
slower as the log ages?

Prints figures, not pass/fail (issue 30, item 5). A real ZooKeeper and 3 real bookies are
started in a temp dir (the local cluster runs the retention service, a pass every
``--retention-every`` seconds). A structured streaming query reads Spark's
``rate-micro-batch`` source (``--rows-per-batch`` rows a batch over 8 partitions: unlike
``rate``, whose offsets move once a second, it feeds every trigger) and writes
``format("bookkeeper")`` to one log
with ``Trigger.ProcessingTime("200 milliseconds")``: every micro-batch's 8 tasks each write a
ledger of their own and the sink commits the batch's ledgers to the log in one metadata
transaction keyed by (query, batch) -- so the log gains 8 ledgers a batch. The log is created
by the query with ``retentionTime`` = ``--keep-minutes`` (0: keep everything).

Printed per 10% of ``--batches``: micro-batch duration (Spark's ``triggerExecution``) mean,
p50 and p99, the rows written, the ledgers committed so far and those still listed, the log head record's size,
the bookies' RSS (sum) and disk use, the driver JVM's and this process's RSS. At the end:
the mean and median duration of the last 500 batches over the first 500 (target: <= 1.2x;
the first batch, which starts the Python workers, counts in the first 500), and the
exactly-once check: after the query stops, no row of the log may appear twice and every
micro-batch from the oldest the log still holds to the newest must be there whole
(:func:`check_exactly_once`).

    python3 bench/streaming.py                        # 5,000 micro-batches (over an hour)
    python3 bench/streaming.py --batches 600 --keep-minutes 0

Before it, the reference measured in the same run (``--reference-batches`` micro-batches
each, 0: none): the same source and trigger into Spark's own ``noop`` sink (what Spark's
micro-batch costs on this machine) and into a Python data source sink that writes nothing
(what PySpark's Python sink adds: a Python worker per task, the commit in a Python process);
the bookkeeper sink's micro-batch is quoted as a ratio to them.

Ctrl-C (or SIGTERM) stops the query early; the summary and the check still run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import threading
import time

import checkout  # noqa: E402,F401  (this checkout in every Spark Python)

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.pop("PYSPARK_DRIVER_PYTHON", None)

from endurance import (add_cluster_arguments, du, pct, rss_bytes,  # noqa: E402
                       scratch_zookeeper)

from bkspark.client import BookKeeper  # noqa: E402
from bkspark.localcluster import LocalCluster  # noqa: E402
from bkspark.log import LogStore  # noqa: E402
from metadata.layout import log_path  # noqa: E402

PARTITIONS = 8


def spark_session(master: str):
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(master).appName("bkspark-streaming-endurance")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(PARTITIONS))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def progress_listener(batches: list, lock: threading.Lock, active: list):
    """A listener appending ``(batch id, triggerExecution ms, input rows, durationMs)`` per
    micro-batch (``durationMs``: Spark's split of the batch -- ``addBatch`` is the tasks and
    the sink's commit, the rest is the source's offsets, planning and the checkpoint) -- of
    the query named ``active[0]`` only (a stopped query's late events do not count)."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            p = event.progress
            with lock:
                if p.name != active[0]:
                    return
                batches.append((p.batchId, p.durationMs.get("triggerExecution", 0),
                                p.numInputRows, dict(p.durationMs)))

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass
    return Progress()


def null_sink_source():
    """A Python data source whose streaming sink consumes its rows and stores nothing: the
    reference for what PySpark's Python sink costs per micro-batch."""
    from pyspark.sql.datasource import (DataSource, DataSourceStreamArrowWriter,
                                        WriterCommitMessage)

    class NullWriter(DataSourceStreamArrowWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId):
            pass

        def abort(self, messages, batchId):
            pass

    class NullSink(DataSource):
        @classmethod
        def name(cls):
            return "bench-null-sink"

        def streamWriter(self, schema, overwrite):
            return NullWriter()
    return NullSink


def reference_durations(rows, root: str, fmt: str, batches: int, batch_lists: list,
                        lock: threading.Lock, active: list) -> list[float]:
    """Micro-batch durations of ``rows`` into sink ``fmt`` for ``batches`` micro-batches
    (same trigger as the measured query)."""
    with lock:
        batch_lists.clear()
        active[0] = f"reference-{fmt}"
    query = (rows.writeStream.format(fmt).queryName(active[0])
             .option("checkpointLocation", os.path.join(root, f"checkpoint-{fmt}"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        while True:
            time.sleep(0.5)
            if query.exception() is not None:
                raise RuntimeError(f"reference query ({fmt}) failed: {query.exception()}")
            with lock:
                if len(batch_lists) >= batches:
                    return [d for _, d, _, _ in batch_lists[:batches]]
    finally:
        query.stop()
        with lock:
            batch_lists.clear()


def driver_jvm_pid(spark) -> int:
    try:
        name = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getName()
        return int(name.split("@")[0])
    except Exception:  # noqa: BLE001 - a figure only
        return 0


def check_exactly_once(spark, uri: str, log: str, rows_per_batch: int) -> str:
    """The log's rows against the source's numbering: ``rate-micro-batch`` gives batch ``b``
    the values ``b*R .. (b+1)*R-1``. No value may appear twice, and every batch from the
    oldest one the log still holds to the newest must be there whole -- except the oldest,
    which retention may have cut into (it removes whole ledgers from the log's start; a read
    racing a cut skips what it removed: failOnDataLoss=false)."""
    from pyspark.sql import functions as F
    values = (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
              .option("failOnDataLoss", "false").load(log)
              .select(F.col("value").cast("string").cast("long").alias("v")))
    got = values.groupBy((F.col("v") / rows_per_batch).cast("long").alias("b")) \
        .agg(F.count("v"), F.countDistinct("v")).collect()        # one read: one plan
    per_batch = {b: n for b, n, _ in got}
    n, distinct = sum(per_batch.values()), sum(d for _, _, d in got)
    if not per_batch:
        return "FAILED: the log is empty"
    lo, hi = min(per_batch), max(per_batch)
    broken = [b for b in range(lo + 1, hi + 1) if per_batch.get(b) != rows_per_batch]
    ok = n == distinct and not broken
    return (f"{'OK' if ok else 'FAILED'}: {n:,} rows, {distinct:,} distinct, batches {lo}..{hi} "
            f"(the oldest with {per_batch[lo]} of {rows_per_batch} rows)"
            + ("" if not broken else f"; batches missing rows or duplicated: {broken[:10]}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=5000)
    ap.add_argument("--rows-per-batch", type=int, default=80)
    ap.add_argument("--keep-minutes", type=float, default=5.0,
                    help="the log's retentionTime (0: keep everything)")
    ap.add_argument("--retention-every", type=float, default=10.0)
    ap.add_argument("--reference-batches", type=int, default=300,
                    help="micro-batches into each reference sink before the run (0: none)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--log", default="stream-endurance")
    add_cluster_arguments(ap)
    args = ap.parse_args()
    window = min(500, max(1, args.batches // 10))
    root, zk, uri = scratch_zookeeper("streaming", args.dir)
    print(f"bkspark streaming endurance: {args.batches:,} micro-batches, rate-micro-batch source "
          f"{args.rows_per_batch} rows a batch over {PARTITIONS} partitions -> format('bookkeeper') "
          f"log {args.log!r}, Trigger.ProcessingTime('200 milliseconds'), {args.master}; "
          f"retentionTime {args.keep_minutes:g} min (service pass every "
          f"{args.retention_every:g} s); ZooKeeper {zk.address}, 3 bookies "
          f"{args.bookie_args or '(default flags)'}; "
          f"cpus={os.cpu_count()}", flush=True)
    try:
        with LocalCluster(uri, 3, os.path.join(root, "bookies"),
                          retention_interval=args.retention_every,
                          extra_args=args.bookie_args.split()) as cluster, \
                BookKeeper(uri) as bk:
            logs = LogStore(bk)
            spark = spark_session(args.master)
            jvm = driver_jvm_pid(spark)
            batches: list = []
            lock = threading.Lock()
            active = [""]               # the query whose progress counts
            spark.streams.addListener(progress_listener(batches, lock, active))
            from pyspark.sql import functions as F
            rows = (spark.readStream.format("rate-micro-batch")
                    .option("rowsPerBatch", args.rows_per_batch)
                    .option("numPartitions", PARTITIONS).load()
                    .select(F.col("value").cast("string").alias("value"), "timestamp"))
            references = {}
            if args.reference_batches > 0:
                spark.dataSource.register(null_sink_source())
                for fmt in ("noop", "bench-null-sink"):
                    got = reference_durations(rows, root, fmt, args.reference_batches,
                                              batches, lock, active)
                    # the first micro-batches start the Python workers: the steady ones count
                    steady = got[len(got) // 5:]
                    references[fmt] = statistics.fmean(steady)
                    print(f"reference: {args.reference_batches} micro-batches into "
                          f"format({fmt!r}): mean {references[fmt]:.0f} ms, median "
                          f"{pct(steady, .5):.0f} ms (the last {len(steady)})", flush=True)
            with lock:
                active[0] = "bookkeeper"
            writer = (rows.writeStream.format("bookkeeper").queryName("bookkeeper")
                      .option("metadataServiceUri", uri).option("log", args.log)
                      .option("checkpointLocation", os.path.join(root, "checkpoint")))
            if args.keep_minutes > 0:
                writer = writer.option("retentionTime", f"{int(args.keep_minutes * 60_000)}")
            query = writer.trigger(processingTime="200 milliseconds").start()
            print(f"{'batches':>8} {'elapsed':>8} {'mean ms':>8} {'p50 ms':>7} {'p99 ms':>7} "
                  f"{'rows':>6} {'committed':>9} {'listed':>7} {'head B':>7} "
                  f"{'bookie RSS MB':>13} {'bookie disk MB':>14} {'JVM RSS MB':>10} "
                  f"{'py RSS MB':>9}  load", flush=True)
            t0 = time.monotonic()
            step = max(1, args.batches // 10)
            mark = step
            durations: list[float] = []
            # Ctrl-C / SIGTERM: stop, then sum up. The handler only appends to a list: a
            # second signal arriving while the first handler runs must not wait for a lock
            # the same thread holds (an Event's would deadlock the main thread)
            interrupted: list[int] = []
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda signum, _frame: interrupted.append(signum))
            while True:
                time.sleep(0.5)
                if interrupted:
                    print(f"stopped early, after {len(durations):,} micro-batches", flush=True)
                    break
                if query.exception() is not None:
                    print(f"query failed: {query.exception()}")
                    break
                with lock:
                    durations = [d for _, d, _, _ in batches]
                    rows_in = sum(r for _, _, r, _ in batches)
                if len(durations) < mark:
                    continue
                tenth = durations[mark - step:mark]
                first, nxt = logs.bounds(args.log)
                head, _ = bk.store.get(log_path(args.log))
                print(f"{mark:>8,} {time.monotonic() - t0:>7.0f}s "
                      f"{statistics.fmean(tenth):>8.0f} {pct(tenth, .5):>7.0f} "
                      f"{pct(tenth, .99):>7.0f} {rows_in:>6,} {nxt:>9,} {nxt - first:>7,} "
                      f"{len(head):>7} "
                      f"{sum(rss_bytes(b.proc.pid) for b in cluster.bookies) / 1e6:>13.0f} "
                      f"{sum(du(b.dir) for b in cluster.bookies) / 1e6:>14.0f} "
                      f"{rss_bytes(jvm) / 1e6:>10.0f} {rss_bytes(os.getpid()) / 1e6:>9.0f}  "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
                mark += step
                if len(durations) >= args.batches:
                    break
            query.stop()
            if len(durations) >= 2 * window:
                head_mean = statistics.fmean(durations[:window])
                tail_mean = statistics.fmean(durations[-window:])
                head_p50, tail_p50 = pct(durations[:window], .5), pct(durations[-window:], .5)
                print(f"micro-batch duration, last {window} over first {window}: mean "
                      f"{tail_mean:.0f} / {head_mean:.0f} ms = {tail_mean / head_mean:.2f}x, "
                      f"median {tail_p50:.0f} / {head_p50:.0f} ms = {tail_p50 / head_p50:.2f}x "
                      f"(target <= 1.2x); ledgers committed to the log: "
                      f"{logs.bounds(args.log)[1]:,}")
                for fmt, ref in references.items():
                    print(f"the last {window} micro-batches over format({fmt!r})'s: "
                          f"{tail_mean:.0f} / {ref:.0f} ms = {tail_mean / ref:.2f}x")
            with lock:
                phases = [split for _, _, _, split in batches]
            if phases:
                names = sorted({k for split in phases for k in split},
                               key=lambda k: -statistics.fmean(s.get(k, 0) for s in phases))
                print("where a micro-batch's time goes (mean ms over the run, Spark's durationMs): "
                      + ", ".join(f"{k} {statistics.fmean(s.get(k, 0) for s in phases):.0f}"
                                  for k in names), flush=True)
            logs.set_retention(args.log, None)     # the log holds still while it is checked
            print("exactly once:", check_exactly_once(spark, uri, args.log, args.rows_per_batch),
                  flush=True)
            spark.stop()
    finally:
        zk.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
