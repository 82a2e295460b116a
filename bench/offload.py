"""Offload: how fast closed ledgers become Parquet, and how fast Spark reads them back (issue 52).

One run, on a fresh 3-bookie local cluster (E=3 Qw=2 Qa=2) and Spark ``local[2]``:

1. Spark writes ``--rows`` rows (Arrow entries) to a log: the write's MB/s is the reference
   the offload's is printed beside;
2. one offload pass (:func:`bkspark.recovery.offload.run`, in this process, as the service
   runs it) turns every closed ledger into Parquet: MB/s of entries;
3. the same rows read by ``format("bookkeeper")`` from the offloaded tier, from the bookie
   tier (``readOffloaded=false``) and by ``spark.read.parquet`` of the offloaded directory
   (and the offloaded tier planned a task a ledger, ``minPartitions``: the plan before
   packing followed the planner's CPUs -- every Python task's fixed cost paid per ledger),
   interleaved ``--repeat`` times (best and median of each; the targets use the median;
   the CPU seconds each read costs the Spark JVM, its Python workers and the bookies, on
   average); each read ends in Spark's ``noop`` sink.

4. the bookies' copy dropped (``keep_on_bookies_ms=0``, :func:`bkspark.recovery.offload.
   drop_copies`; every ledger but the last), each bookie's garbage collection run: the
   bookies' entry-log disk before and after (once it stops shrinking, up to ``--settle`` s),
   and the offloaded tier read again, its files now the only copy.

Targets (issue 52): the offloaded tier through ``format("bookkeeper")`` >= 0.9x plain Parquet
and >= 2x the bookie tier.

    python bench/offload.py              # 300,000 rows
    python bench/offload.py --full       # 2,000,000 rows
    python bench/offload.py --format record    # a row an entry (key, value)
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import checkout  # noqa: E402,F401  (this checkout in every Spark Python)

from procstat import process_cpu_seconds  # noqa: E402  (bench/ is sys.path[0])

os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _spark_pids() -> dict[str, list[int]]:
    """This machine's Spark JVM and Python worker processes (by command line)."""
    out: dict[str, list[int]] = {"JVM": [], "Python workers": []}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"java" in cmd and b"spark" in cmd:
            out["JVM"].append(int(pid))
        elif b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd:
            out["Python workers"].append(int(pid))
    return out


def _entry_log_bytes(cluster) -> int:
    """Bytes of the bookies' files outside their journals (entry logs, index)."""
    total = 0
    for b in cluster.bookies:
        for root, dirs, files in os.walk(b.dir):
            if "journal" in os.path.basename(root):
                dirs[:] = []
                continue
            total += sum(os.path.getsize(os.path.join(root, f)) for f in files
                         if not f.startswith("bookie."))
    return total


def _settled(measure, limit_s: float, quiet_s: float = 10.0) -> tuple[int, float]:
    """``measure()`` once it has not shrunk for ``quiet_s`` (or after ``limit_s``), and the
    seconds waited."""
    start = last_change = time.monotonic()
    value = measure()
    while time.monotonic() - start < limit_s and time.monotonic() - last_change < quiet_s:
        time.sleep(1.0)
        now = measure()
        if now < value:
            value, last_change = now, time.monotonic()
    return value, time.monotonic() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--full", action="store_true", help="2,000,000 rows")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--payload", type=int, default=64, help="bytes of the binary column")
    p.add_argument("--ledgers", type=int, default=8,
                   help="ledgers the write makes (its partitions; all but the last dropped)")
    p.add_argument("--entry-log-mb", type=int, default=16,
                   help="the bookies' entry_log_max_size_mb: the grain at which the disk of "
                        "dropped ledgers is freed (an entry log still written is not collected)")
    p.add_argument("--settle", type=float, default=120.0,
                   help="seconds to wait for the bookies' disk to stop shrinking after the drop")
    p.add_argument("--format", default="arrow", choices=("arrow", "record"),
                   help="entryFormat of the log (record: key and value columns, a row an entry)")
    args = p.parse_args()
    rows = 2_000_000 if args.full else args.rows

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from bkspark.client import BookKeeper
    from bkspark.localcluster import LocalCluster
    from bkspark.log import LogStore
    from bkspark.log.offload import Location, OffloadPolicy
    from bkspark.recovery.offload import drop_copies, run
    from bkspark.testing.cluster import bookie_http

    work = tempfile.mkdtemp(prefix="bkspark-bench-offload-")
    where = os.path.join(work, "history")
    log = "bench-offload"
    with LocalCluster(num_bookies=3, data_dir=os.path.join(work, "bookies"),
                      extra_args=["--entry-log-max-size-mb", str(args.entry_log_mb)]) as cluster:
        uri = cluster.metadata_uri
        spark = (SparkSession.builder.master("local[2]").appName("bkspark-bench-offload")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        bk = BookKeeper(uri)
        try:
            df = (spark.range(0, rows, numPartitions=args.ledgers)
                  .select(*(["id"] if args.format == "arrow" else []),
                          F.concat(F.lit("key-"), F.lpad(F.col("id").cast("string"), 12, "0"))
                          .alias("key"),
                          *([(F.col("id") * 0.37).alias("score")] if args.format == "arrow"
                            else []),
                          F.expr(f"cast(repeat(substr(md5(cast(id as string)), 1, 16), "
                                 f"{max(1, args.payload // 16)}) as binary)")
                          .alias("payload" if args.format == "arrow" else "value"))
                  .withColumn("key", F.col("key").cast("binary" if args.format == "record"
                                                       else "string"))
                  .cache())
            df.count()
            opts = dict(metadataServiceUri=uri, entryFormat=args.format, ensembleSize="3",
                        writeQuorumSize="2", ackQuorumSize="2")
            # warm-up: JVM, Python workers, the write path
            df.limit(1000).write.format("bookkeeper").options(**opts).mode("append").save(
                log + "-warmup")
            t = time.perf_counter()
            df.write.format("bookkeeper").options(**opts).mode("append").save(log)
            write_s = time.perf_counter() - t
            logs = LogStore(bk)
            entries = logs.segments(log)
            stored = sum(e.sealed_length() for e in entries)

            logs.set_offload(log, OffloadPolicy(where, after_ms=1))
            time.sleep(0.01)
            t = time.perf_counter()
            done = run(logs, log, max_ledgers=len(entries))
            offload_s = time.perf_counter() - t
            assert len(done) == len(entries), "not every ledger was offloaded"
            files = [f for r in done.values() for f in r["files"]]
            parquet_bytes = sum(f["bytes"] for f in files)
            directory = Location(where).log_dir(log)

            def bk_read(**extra):
                def go():
                    (spark.read.format("bookkeeper").options(**opts, **extra).load(log)
                     .write.format("noop").mode("overwrite").save())
                return go

            def pq_read():
                spark.read.parquet(directory).write.format("noop").mode("overwrite").save()

            reads = {"offloaded tier": bk_read(), "bookie tier": bk_read(readOffloaded="false"),
                     "spark.read.parquet": pq_read,
                     # the plan before packing followed the task slots: a task a ledger
                     "offloaded, a task a ledger": bk_read(minPartitions=str(len(entries)))}
            for fn in reads.values():           # warm-up: JVM, Python workers, both paths
                fn()
            times = {k: [] for k in reads}
            bookie_pids = [b.proc.pid for b in cluster.bookies]
            cpu = {k: {g: 0.0 for g in ("JVM", "Python workers", "bookies")}
                   for k in reads}                          # CPU seconds a read, on average
            for _ in range(args.repeat):
                for k, fn in reads.items():
                    groups = dict(_spark_pids(), bookies=bookie_pids)   # (workers come, go)
                    before = {g: process_cpu_seconds(p) for g, p in groups.items()}
                    t = time.perf_counter()
                    fn()
                    times[k].append(time.perf_counter() - t)
                    for g, p in groups.items():
                        cpu[k][g] += (process_cpu_seconds(p) - before[g]) / args.repeat
            best = {k: min(v) for k, v in times.items()}
            median = {k: statistics.median(v) for k, v in times.items()}
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            mb = stored / 1e6
            print(f"# bench/offload.py, {when}: {rows:,} rows ({args.payload} B payload), "
                  f"{args.format} entries, {len(entries)} ledgers, {mb:.1f} MB of entries; "
                  f"3 local bookies (entry logs of {args.entry_log_mb} MiB) "
                  f"E=3 Qw=2 Qa=2, sqlite metadata; local[2]; reads interleaved {args.repeat} "
                  "times: median (best)")
            print(f"write (Spark, format bookkeeper)   {mb / write_s:8.1f} MB/s ({write_s:.2f} s)")
            print(f"offload (one pass, this process)   {mb / offload_s:8.1f} MB/s "
                  f"({offload_s:.2f} s, {len(files)} files, {parquet_bytes / 1e6:.1f} MB "
                  f"Parquet) = {write_s / offload_s:.2f}x the write's rate")
            pq_t, pq_best = median["spark.read.parquet"], best["spark.read.parquet"]
            for k in reads:
                print(f"read: {k:<28} {rows / median[k]:>12,.0f} rows/s ({median[k]:.2f} s; "
                      f"best {best[k]:.2f} s) = {pq_t / median[k]:.2f}x plain Parquet "
                      f"(best {pq_best / best[k]:.2f}x), "
                      f"{median['bookie tier'] / median[k]:.2f}x the bookie tier")
            print("CPU seconds a read (" + "; ".join(
                f"{k}: " + ", ".join(f"{g} {v:.2f}" for g, v in cpu[k].items())
                for k in reads) + ")")
            ratio_pq = pq_t / median["offloaded tier"]
            ratio_bk = median["bookie tier"] / median["offloaded tier"]
            print(f"targets: offloaded tier >= 0.9x plain Parquet: {ratio_pq:.2f}x "
                  f"({'met' if ratio_pq >= 0.9 else 'NOT met'}); >= 2x the bookie tier: "
                  f"{ratio_bk:.2f}x ({'met' if ratio_bk >= 2 else 'NOT met'})")
            # 4. the bookies' copy dropped: the disk it frees, the files the only copy
            disk_before = _entry_log_bytes(cluster)
            logs.set_offload(log, OffloadPolicy(where, after_ms=1, keep_on_bookies_ms=0))
            dropped = drop_copies(logs, log)
            for b in cluster.bookies:
                status, _ = bookie_http(b, "/api/v1/bookie/gc", "POST", {}, timeout=120)
                assert status == 200, status
            disk_after, waited = _settled(lambda: _entry_log_bytes(cluster), args.settle)
            again, pq_again = [], []
            for _ in range(args.repeat):
                for k in ("offloaded tier", "spark.read.parquet"):
                    t = time.perf_counter()
                    reads[k]()
                    if k == "offloaded tier":
                        again.append(time.perf_counter() - t)
                    else:
                        pq_again.append(time.perf_counter() - t)
            print(f"disk: entries {stored * 2 / 1e6:.1f} MB on the bookies (x2 replicas), "
                  f"Parquet files {parquet_bytes / 1e6:.1f} MB; the bookies' copy of "
                  f"{len(dropped)} of {len(entries)} ledgers dropped: their entry logs "
                  f"{disk_before / 1e6:.1f} MB -> {disk_after / 1e6:.1f} MB "
                  f"({(disk_before - disk_after) / 1e6:.1f} MB freed, {waited:.0f} s after "
                  "their GC)")
            again, pq_again = statistics.median(again), statistics.median(pq_again)
            print(f"read: {'offloaded tier, only copy':<28} {rows / again:>12,.0f} rows/s "
                  f"({again:.2f} s) = {pq_again / again:.2f}x plain Parquet (interleaved "
                  "again, medians)")
        finally:
            bk.close()
            spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
