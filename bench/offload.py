"""Offload: how fast closed ledgers become Parquet, and how fast Spark reads them back (issue 52).

One run, on a fresh 3-bookie local cluster (E=3 Qw=2 Qa=2) and Spark ``local[2]``:

1. Spark writes ``--rows`` rows (Arrow entries) to a log: the write's MB/s is the reference
   the offload's is printed beside;
2. one offload pass (:func:`bkspark.recovery.offload.run`, in this process, as the service
   runs it) turns every closed ledger into Parquet: MB/s of entries;
3. the same rows read by ``format("bookkeeper")`` from the offloaded tier, from the bookie
   tier (``readOffloaded=false``) and by ``spark.read.parquet`` of the offloaded directory,
   interleaved ``--repeat`` times (best of each); each read ends in Spark's ``noop`` sink.

Targets (issue 52): the offloaded tier through ``format("bookkeeper")`` >= 0.9x plain Parquet
and >= 2x the bookie tier. The bookies keep their copy in this version (deleting it after
``keep_on_bookies`` is not built): the last line prints what the files take beside what the
bookies hold (entries x Qw replicas), the disk a deletion would free.

    python bench/offload.py              # 300,000 rows
    python bench/offload.py --full       # 2,000,000 rows
    python bench/offload.py --format record    # a row an entry (key, value)
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import checkout  # noqa: E402,F401  (this checkout in every Spark Python)

os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--full", action="store_true", help="2,000,000 rows")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--payload", type=int, default=64, help="bytes of the binary column")
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
    from bkspark.recovery.offload import run

    work = tempfile.mkdtemp(prefix="bkspark-bench-offload-")
    where = os.path.join(work, "history")
    log = "bench-offload"
    with LocalCluster(num_bookies=3, data_dir=os.path.join(work, "bookies")) as cluster:
        uri = cluster.metadata_uri
        spark = (SparkSession.builder.master("local[2]").appName("bkspark-bench-offload")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        bk = BookKeeper(uri)
        try:
            df = (spark.range(0, rows, numPartitions=2)
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
                     "spark.read.parquet": pq_read}
            for fn in reads.values():           # warm-up: JVM, Python workers, both paths
                fn()
            best = {k: float("inf") for k in reads}
            for _ in range(args.repeat):
                for k, fn in reads.items():
                    t = time.perf_counter()
                    fn()
                    best[k] = min(best[k], time.perf_counter() - t)
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            mb = stored / 1e6
            print(f"# bench/offload.py, {when}: {rows:,} rows ({args.payload} B payload), "
                  f"{args.format} entries, {len(entries)} ledgers, {mb:.1f} MB of entries; "
                  f"3 local bookies "
                  f"E=3 Qw=2 Qa=2, sqlite metadata; local[2]; reads best of {args.repeat}, "
                  "interleaved")
            print(f"write (Spark, format bookkeeper)   {mb / write_s:8.1f} MB/s ({write_s:.2f} s)")
            print(f"offload (one pass, this process)   {mb / offload_s:8.1f} MB/s "
                  f"({offload_s:.2f} s, {len(files)} files, {parquet_bytes / 1e6:.1f} MB "
                  f"Parquet) = {write_s / offload_s:.2f}x the write's rate")
            pq_t = best["spark.read.parquet"]
            for k in reads:
                print(f"read: {k:<28} {rows / best[k]:>12,.0f} rows/s ({best[k]:.2f} s) "
                      f"= {pq_t / best[k]:.2f}x plain Parquet, "
                      f"{best['bookie tier'] / best[k]:.2f}x the bookie tier")
            ratio_pq = pq_t / best["offloaded tier"]
            ratio_bk = best["bookie tier"] / best["offloaded tier"]
            print(f"targets: offloaded tier >= 0.9x plain Parquet: {ratio_pq:.2f}x "
                  f"({'met' if ratio_pq >= 0.9 else 'NOT met'}); >= 2x the bookie tier: "
                  f"{ratio_bk:.2f}x ({'met' if ratio_bk >= 2 else 'NOT met'})")
            print(f"disk: the bookies hold {stored * 2 / 1e6:.1f} MB of entries (x2 replicas, "
                  f"journal aside); the Parquet files {parquet_bytes / 1e6:.1f} MB -- what "
                  "deleting the bookies' copy would free (not built yet)")
        finally:
            bk.close()
            spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
