"""Spark connector throughput vs Parquet on local disk, same data, same run.

    python bench/spark.py                 # ~300k rows (~30 MB), about 2 minutes
    python bench/spark.py --full          # 2M rows (~200 MB), the issue's target size
    python bench/spark.py --metadata URI  # against a running cluster instead of a fresh one

The same cached DataFrame (id long, key string, score double, flag boolean, payload binary:
~100 bytes a row) is written and read back through ``format("bookkeeper")``
(``entryFormat=arrow``, E=3 Qw=2 Qa=2, bookies journaling with fdatasync) and through
Parquet on local disk. Reads are materialised with the ``noop`` sink (every column is
produced, nothing collected). MB/s uses the same logical size for both formats: the Arrow
bytes of the data (what the log stores per replica). Prints rows/s, MB/s and the ratio to
Parquet for each direction; the best of ``--repeat`` runs counts.

Targets (issue 7): read >= 0.7x Parquet rows/s, write >= 0.5x Parquet rows/s.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
_pp = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if REPO not in _pp:
    os.environ["PYTHONPATH"] = os.pathsep.join([REPO] + _pp)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--full", action="store_true", help="2,000,000 rows (~200 MB)")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--payload", type=int, default=64, help="bytes of the binary column")
    p.add_argument("--metadata", default=None, help="metadata URI of a running cluster")
    p.add_argument("--master", default="local[2]")
    args = p.parse_args()
    rows = 2_000_000 if args.full else args.rows

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    work = tempfile.mkdtemp(prefix="bkspark-bench-spark-")
    cluster = None
    if args.metadata is None:
        from bkspark.localcluster import LocalCluster
        cluster = LocalCluster(num_bookies=3, data_dir=os.path.join(work, "bookies"))
        cluster.start_all()
        uri = cluster.metadata_uri
    else:
        uri = args.metadata
    spark = (SparkSession.builder.master(args.master).appName("bkspark-bench-spark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(args.partitions))
             .config("spark.driver.memory", "2g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = (spark.range(0, rows, numPartitions=args.partitions)
              .select("id",
                      F.concat(F.lit("key-"), F.lpad(F.col("id").cast("string"), 12, "0")).alias("key"),
                      (F.col("id") * 0.37).alias("score"),
                      (F.col("id") % 3 == 0).alias("flag"),
                      F.expr(f"cast(repeat(substr(md5(cast(id as string)), 1, 16), "
                             f"{max(1, args.payload // 16)}) as binary)").alias("payload"))
              .cache())
        df.count()
        bk_opts = dict(metadataServiceUri=uri, entryFormat="arrow", ensembleSize="3",
                       writeQuorumSize="2", ackQuorumSize="2")
        parquet_dir = os.path.join(work, "parquet")
        log = "bench-spark"

        def bk_write():
            w = df.write.format("bookkeeper").mode("overwrite")
            for k, v in bk_opts.items():
                w = w.option(k, v)
            w.save(log)

        def bk_read():
            r = spark.read.format("bookkeeper")
            for k, v in bk_opts.items():
                r = r.option(k, v)
            r.load(log).write.format("noop").mode("overwrite").save()

        def pq_write():
            df.write.mode("overwrite").parquet(parquet_dir)

        def pq_read():
            spark.read.parquet(parquet_dir).write.format("noop").mode("overwrite").save()

        # warm-up: JVM, Python workers, both code paths (small)
        small = df.limit(1000)
        small.write.format("bookkeeper").mode("overwrite").options(**bk_opts).save("bench-warmup")
        spark.read.format("bookkeeper").options(**bk_opts).load("bench-warmup").count()
        small.write.mode("overwrite").parquet(parquet_dir + "-warmup")
        spark.read.parquet(parquet_dir + "-warmup").count()

        best = {k: float("inf") for k in ("bk_write", "pq_write", "bk_read", "pq_read")}
        for _ in range(args.repeat):
            best["bk_write"] = min(best["bk_write"], timed(bk_write))
            best["pq_write"] = min(best["pq_write"], timed(pq_write))
            best["bk_read"] = min(best["bk_read"], timed(bk_read))
            best["pq_read"] = min(best["pq_read"], timed(pq_read))

        from bkspark.client import BookKeeper
        from bkspark.log import LogStore
        with BookKeeper(uri) as bk:
            md, _ = LogStore(bk).get(log)
            arrow_bytes = sum(e.get("length", 0) for e in md.ledgers)
            n_ledgers, n_entries = len(md.ledgers), sum(e["last_entry_id"] + 1 for e in md.ledgers)
        parquet_bytes = sum(os.path.getsize(os.path.join(d, f))
                            for d, _, fs in os.walk(parquet_dir) for f in fs if f.endswith(".parquet"))
        mb = arrow_bytes / 1e6
        print(f"config: rows={rows:,} partitions={args.partitions} master={args.master} "
              f"payload={args.payload}B; bookkeeper entryFormat=arrow E=3 Qw=2 Qa=2 "
              f"({'fresh 3-bookie local cluster' if cluster else uri}), {n_ledgers} ledgers, "
              f"{n_entries} entries, {mb:.1f} MB Arrow (per replica); parquet {parquet_bytes / 1e6:.1f} MB "
              f"on local disk; best of {args.repeat}")
        for direction in ("write", "read"):
            bk_t, pq_t = best[f"bk_{direction}"], best[f"pq_{direction}"]
            target = 0.5 if direction == "write" else 0.7
            ratio = pq_t / bk_t
            print(f"{direction:>5}: bookkeeper {rows / bk_t:>12,.0f} rows/s {mb / bk_t:7.1f} MB/s "
                  f"({bk_t:.2f}s) | parquet {rows / pq_t:>12,.0f} rows/s {mb / pq_t:7.1f} MB/s "
                  f"({pq_t:.2f}s) | ratio {ratio:.2f}x (target >= {target}x: "
                  f"{'met' if ratio >= target else 'NOT met'})")
    finally:
        spark.stop()
        if cluster is not None:
            cluster.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
