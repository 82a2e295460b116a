"""Routed writes (rows to the log their ``topic`` column names) vs a write to one log, same run.

    python bench/spark_routing.py                       # 200k records, 1 / 5 / 50 logs
    python bench/spark_routing.py --rows 1000000 --logs 1,5,50,200

The same cached DataFrame of records (``topic``, ``key`` ~16 B, ``value`` ~100 B) is appended
through ``format("bookkeeper")`` (entryFormat=record, E=3 Qw=2 Qa=2, ``local[2]``, 2
partitions) once to one log named by option ``log`` (the reference) and once routed to N logs
by its ``topic`` column, for each N of ``--logs``. Prints, for each: rows/s (best of
``--repeat``), the ratio to the one-log write, the ledgers the job created (2 tasks x N logs)
and the seconds of the write. Then the commit alone, with the Spark job out of the picture:
N closed one-entry ledgers listed in N new logs by one ``LogStore.append_to_logs`` (one
transaction), and, for reference, by N ``append_ledgers`` calls (one transaction each: what
a commit that is not atomic across logs would cost). What it shows: what routing costs per
row (grouping rows, one ledger per log per task) and per log (the commit transaction grows
with N).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import checkout  # noqa: E402,F401  (this checkout in every Spark Python)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def commit_seconds(bk, logs, n: int) -> tuple[float, float]:
    """Seconds to list n closed ledgers in n new logs: in one transaction, then one by one."""
    def ledgers(tag):
        out = {}
        for i in range(n):
            lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
            lh.append(b"x")
            lh.close()
            out[f"commit-{tag}-{n}-{i}"] = [lh.ledger_id]
        return out
    together = ledgers("together")
    t = time.perf_counter()
    logs.append_to_logs(together, writer_id="bench", sequence=0)
    one = time.perf_counter() - t
    apart = ledgers("apart")
    t = time.perf_counter()
    for name, ids in apart.items():
        logs.append_ledgers(name, ids, writer_id="bench", sequence=0)
    return one, time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--logs", default="1,5,50", help="comma list of routed log counts")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--partitions", type=int, default=2)
    args = p.parse_args()
    counts = [int(n) for n in args.logs.split(",")]

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from bkspark.client import BookKeeper
    from bkspark.localcluster import LocalCluster
    from bkspark.log import LogStore

    work = tempfile.mkdtemp(prefix="bkspark-bench-routing-")
    with LocalCluster(num_bookies=3, data_dir=os.path.join(work, "bookies")) as cluster:
        uri = cluster.metadata_uri
        spark = (SparkSession.builder.master(f"local[{args.partitions}]")
                 .appName("bkspark-bench-routing").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        bk = BookKeeper(uri)
        logs = LogStore(bk)
        try:
            base = (spark.range(0, args.rows, numPartitions=args.partitions)
                    .select(F.col("id"),
                            F.lpad(F.col("id").cast("string"), 16, "0").alias("key"),
                            F.expr("repeat(md5(cast(id as string)), 3)").alias("value"))
                    .cache())
            base.count()
            opts = dict(metadataServiceUri=uri, ensembleSize="3", writeQuorumSize="2",
                        ackQuorumSize="2", maxLogsPerWrite="1000")
            run = [0]

            def write(n_logs: int | None) -> tuple[float, int]:
                """Seconds of one append; the ledgers it created."""
                run[0] += 1
                prefix = f"route-{n_logs}-{run[0]}"
                if n_logs is None:
                    df = base.select("key", "value")
                else:
                    df = base.select(F.concat(F.lit(prefix + "-"),
                                              (F.col("id") % n_logs).cast("string"))
                                     .alias("topic"), "key", "value")
                w = df.write.format("bookkeeper").mode("append")
                for k, v in opts.items():
                    w = w.option(k, v)
                before = set(bk.list_ledgers())
                t = time.perf_counter()
                if n_logs is None:
                    w.save(prefix)
                else:
                    w.save()
                dt = time.perf_counter() - t
                return dt, len(set(bk.list_ledgers()) - before)

            write(None)                                     # warm-up: JVM, workers
            write(5)
            results = {}
            for n in [None] + counts:
                best = min((write(n) for _ in range(args.repeat)), key=lambda r: r[0])
                results[n] = best
            commits = {n: commit_seconds(bk, logs, n) for n in counts}
            ref = args.rows / results[None][0]
            when = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
            print(f"# bench/spark_routing.py, {when}, "
                  f"{args.rows:,} records (~120 B), local[{args.partitions}], E=3 Qw=2 Qa=2, "
                  f"sqlite metadata, 3 local bookies, best of {args.repeat}")
            print(f"{'write':<22}{'rows/s':>12}{'ratio':>8}{'ledgers':>9}{'seconds':>9}")
            for n, (dt, ledgers) in results.items():
                label = "one log (reference)" if n is None else f"routed to {n} logs"
                print(f"{label:<22}{args.rows / dt:>12,.0f}{args.rows / dt / ref:>7.2f}x"
                      f"{ledgers:>9}{dt:>9.2f}")
            print(f"{'commit of':<22}{'one transaction':>16}{'one per log':>13}")
            for n, (together, apart) in commits.items():
                print(f"{f'{n} logs':<22}{together * 1000:>13.1f} ms{apart * 1000:>10.1f} ms")
        finally:
            bk.close()
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
