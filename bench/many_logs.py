"""Many logs, many small ledgers: what reads cost per ledger and per log (issue 51).

    python bench/many_logs.py                          # 2,000 small ledgers; 300 logs
    python bench/many_logs.py --ledgers 10000 --logs 1000   # the issue's sizes

Spark batch reads (``spark.read.format("bookkeeper")...count()``, ``local[2]``, record
entries, E=3 Qw=2 Qa=2, 3 local bookies, sqlite metadata), best of ``--repeat``:

* one log of ``--ledgers`` ledgers x 8 records, against the same records in ONE ledger
  (the reference, same run): the ratio is what small ledgers cost (target: within 2x);
* ``--logs`` logs x 2 ledgers x 3 records, read by one ``logPattern`` (target at 1,000 logs:
  <= 5 s).

The ledgers are written directly (client + LogStore, no Spark), committed to their logs in
batches. Prints each figure with the number of input partitions Spark planned.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import checkout  # noqa: E402,F401  (this checkout in every Spark Python)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

COMMIT_BATCH = 400


def fill(bk, logs, name: str, ledgers: int, rows: int) -> None:
    """``ledgers`` closed ledgers of ``rows`` records each, listed in log ``name``."""
    from bkspark.spark.codec import encode_record
    ids = []
    for i in range(ledgers):
        lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        for f in [lh.append_async(encode_record(f"{name}:{i}:{j}".encode()))
                  for j in range(rows)]:
            f.result()
        lh.close()
        ids.append(lh.ledger_id)
        if len(ids) == COMMIT_BATCH:
            logs.append_ledgers(name, ids)
            ids = []
    if ids:
        logs.append_ledgers(name, ids)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledgers", type=int, default=2000)
    p.add_argument("--logs", type=int, default=300)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()

    from pyspark.sql import SparkSession

    from bkspark.client import BookKeeper
    from bkspark.localcluster import LocalCluster
    from bkspark.log import LogStore

    work = tempfile.mkdtemp(prefix="bkspark-bench-many-")
    with LocalCluster(num_bookies=3, data_dir=os.path.join(work, "bookies")) as cluster:
        uri = cluster.metadata_uri
        bk = BookKeeper(uri)
        logs = LogStore(bk)
        t = time.perf_counter()
        fill(bk, logs, "small-ledgers", args.ledgers, 8)
        fill(bk, logs, "one-ledger", 1, 8 * args.ledgers)
        for i in range(args.logs):
            fill(bk, logs, f"many-{i:05d}", 2, 3)
        print(f"# filled in {time.perf_counter() - t:.0f} s", flush=True)
        spark = (SparkSession.builder.master("local[2]").appName("bkspark-bench-many-logs")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            def count(**opts) -> tuple[float, int, int]:
                best, rows, parts = None, 0, 0
                for _ in range(args.repeat):
                    r = spark.read.format("bookkeeper").option("metadataServiceUri", uri)
                    for k, v in opts.items():
                        r = r.option(k, v)
                    df = r.load()
                    t = time.perf_counter()
                    rows = df.count()
                    dt = time.perf_counter() - t
                    parts = df.rdd.getNumPartitions()
                    best = dt if best is None else min(best, dt)
                return best, rows, parts

            count(log="one-ledger")                                      # warm-up
            one = count(log="one-ledger")
            small = count(log="small-ledgers")
            many = count(logPattern="many-.*")
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            print(f"# bench/many_logs.py, {when}, local[2], record entries, E=3 Qw=2 Qa=2, "
                  f"sqlite metadata, 3 local bookies, best of {args.repeat}")
            print(f"{'read (count)':<40}{'rows':>9}{'partitions':>12}{'seconds':>9}{'ratio':>8}")
            for label, (dt, rows, parts) in [
                    ("one ledger (reference)", one),
                    (f"one log of {args.ledgers} ledgers x 8", small),
                    (f"{args.logs} logs x 2 ledgers x 3", many)]:
                print(f"{label:<40}{rows:>9}{parts:>12}{dt:>9.2f}{dt / one[0]:>7.1f}x")
        finally:
            bk.close()
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
