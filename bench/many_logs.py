"""Many logs, many small ledgers: what reads and passes cost per ledger and per log (issue 51).

    python bench/many_logs.py                          # 2,000 small ledgers; 300 logs
    python bench/many_logs.py --ledgers 10000 --logs 1000   # the issue's sizes
    python bench/many_logs.py --catalog 100,1000,10000 --stores sqlite,zk --no-spark

Spark batch reads (``spark.read.format("bookkeeper")...count()``, ``local[2]``, record
entries, E=3 Qw=2 Qa=2, 3 local bookies, sqlite metadata), best of ``--repeat``:

* one log of ``--ledgers`` ledgers x 8 records, against the same records in ONE ledger
  (the reference, same run): the ratio is what small ledgers cost (target: within 2x); and
  the same read as one task per core (``minPartitions=2, openCostInBytes=4KiB``; by default
  a range counts 256 KiB more than its bytes, so 10,000 ranges fill 20 packs of 128 MiB, and
  a data source cannot see the cores: it packs for the planner's CPUs, at most 16);
* ``--logs`` logs x 2 ledgers x 3 records, read by one ``logPattern`` (target at 1,000 logs:
  <= 5 s).

The ledgers are written directly (client + LogStore, no Spark), committed to their logs in
batches; the reads start once the bookies are idle again (their write-cache flushes of what
was just written ran under the first reads before: 2026-11-28), and the merge cost (issue 51
item 3), whose deleted ledger the bookies then collect, is measured last. Prints each figure
with the number of input partitions Spark planned.

``--catalog N,...`` then times, for N logs of one closed ledger each (one record), on each of
``--stores`` (sqlite; zk: a local ZooKeeper), the driver-side passes whose cost should follow
what changed, not N:

* creation: logs created per second (a ledger written, closed and listed in a new log);
* retention: a pass over every log (each with a size policy within its bound) -- the first,
  then one with nothing changed;
* ``bkspark shell logs --json`` (in-process);
* a streaming source over all N logs (``logPattern``): a trigger (latestOffset + partitions +
  commit) with nothing new, and one after a single log gained a ledger.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import checkout  # noqa: E402,F401  (this checkout in every Spark Python)
from procstat import wait_idle  # noqa: E402  (bench/ is sys.path[0])
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


def merge_cost(bk, logs, name: str) -> tuple[float, float, int]:
    """What merging log ``name``'s closed ledgers into one would cost (issue 51, item 3):
    ``(seconds to read them, seconds to read them and write their entries into one new
    ledger, entries)`` -- the rewrite a background merge does before its one metadata
    transaction (the new ledger is deleted again; the log is not changed)."""
    ids = [e.ledger_id for e in logs.segments(name)]

    def entries():
        for at in range(0, len(ids), 128):
            for rh in bk.open_ledgers(ids[at:at + 128], logs.password):
                yield from rh.read(0, rh.last_add_confirmed)

    t = time.perf_counter()
    n = sum(1 for _ in entries())
    read_s = time.perf_counter() - t
    t = time.perf_counter()
    lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    pending = []
    for e in entries():
        pending.append(lh.append_async(e.data))
        if len(pending) >= 1000:
            for f in pending:
                f.result()
            pending = []
    for f in pending:
        f.result()
    lh.close()
    merge_s = time.perf_counter() - t
    bk.delete_ledgers([lh.ledger_id])
    return read_s, merge_s, n


def catalog(store: str, n: int, spark_free: bool = True) -> dict:
    """The catalog figures (module docstring) for ``n`` logs on ``store``."""
    import contextlib
    import io

    from bkspark.cli.main import main as cli
    from bkspark.client import BookKeeper
    from bkspark.localcluster import LocalCluster
    from bkspark.log import LogStore
    from bkspark.log.retention import RetentionPolicy
    from bkspark.recovery.retention import RetentionService
    from bkspark.spark.codec import record_spark_schema
    from bkspark.spark.options import parse_options
    from bkspark.spark.stream import BookKeeperStreamReader, ReadAllAvailable

    work = tempfile.mkdtemp(prefix=f"bkspark-bench-catalog-{store}-")
    with contextlib.ExitStack() as stack:
        uri = None
        if store == "zk":
            from metadata.testing import ZooKeeperServer, unique_root
            zk = ZooKeeperServer(tick_time=500, max_session_timeout=60000)
            zk.start()
            stack.callback(zk.stop)
            uri = zk.uri(unique_root())
        cluster = stack.enter_context(LocalCluster(
            metadata_uri=uri, num_bookies=3, data_dir=os.path.join(work, "bookies")))
        uri = cluster.metadata_uri
        bk = stack.enter_context(BookKeeper(uri))
        logs = LogStore(bk)
        names = [f"cat-{i:06d}" for i in range(n)]
        t = time.perf_counter()
        for name in names:
            fill(bk, logs, name, 1, 1)
        out = {"create_per_s": n / (time.perf_counter() - t)}
        for name in names:
            logs.set_retention(name, RetentionPolicy(bytes=1 << 30))
        service = RetentionService(bk, "bench")
        t = time.perf_counter()
        service.run_once()
        out["retention_first"] = time.perf_counter() - t
        t = time.perf_counter()
        service.run_once()
        out["retention_idle"] = time.perf_counter() - t
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            cli(["shell", "logs", "--metadata", uri, "--json"])
        out["shell_logs"] = time.perf_counter() - t
        opts = parse_options({"logPattern": "cat-.*", "startingOffsets": "earliest",
                              "queryId": "bench", "metadataServiceUri": uri})
        source = BookKeeperStreamReader(opts, record_spark_schema())

        def trigger(start):
            t = time.perf_counter()
            end = source.latestOffset(start, ReadAllAvailable())
            source.partitions(start, end)
            source.commit(end)
            return end, time.perf_counter() - t
        end, out["stream_first"] = trigger(source.initialOffset())
        end, out["stream_idle"] = trigger(end)
        fill(bk, logs, names[n // 2], 1, 1)
        end, out["stream_one_changed"] = trigger(end)
        return out


def print_catalog(rows: list) -> None:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# bench/many_logs.py --catalog, {when}, logs of 1 closed ledger x 1 record, "
          "E=3 Qw=2 Qa=2, 3 local bookies, seconds unless said")
    head = ("store", "logs", "create/s", "retention 1st", "retention idle", "shell logs",
            "stream 1st", "stream idle", "stream 1 changed")
    print("".join(f"{h:>17}" for h in head))
    for store, n, f in rows:
        print(f"{store:>17}{n:>17}{f['create_per_s']:>17.0f}{f['retention_first']:>17.2f}"
              f"{f['retention_idle']:>17.2f}{f['shell_logs']:>17.2f}{f['stream_first']:>17.2f}"
              f"{f['stream_idle']:>17.3f}{f['stream_one_changed']:>17.3f}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledgers", type=int, default=2000)
    p.add_argument("--logs", type=int, default=300)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--catalog", default="", help="log counts of the catalog figures, e.g. 100,1000")
    p.add_argument("--stores", default="sqlite", help="sqlite,zk")
    p.add_argument("--no-spark", action="store_true", help="the catalog figures only")
    args = p.parse_args()
    if args.catalog:
        rows = [(store, int(n), catalog(store, int(n)))
                for store in args.stores.split(",") for n in args.catalog.split(",")]
        print_catalog(rows)
    if args.no_spark:
        return 0

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
        print(f"# filled in {time.perf_counter() - t:.0f} s; the bookies idle "
              f"{wait_idle(b.proc.pid for b in cluster.bookies):.0f} s later", flush=True)
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
            per_core = count(log="small-ledgers", minPartitions="2", openCostInBytes="4KiB")
            many = count(logPattern="many-.*")
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            print(f"# bench/many_logs.py, {when}, local[2], record entries, E=3 Qw=2 Qa=2, "
                  f"sqlite metadata, 3 local bookies, best of {args.repeat}")
            print(f"{'read (count)':<40}{'rows':>9}{'partitions':>12}{'seconds':>9}{'ratio':>8}")
            for label, (dt, rows, parts) in [
                    ("one ledger (reference)", one),
                    (f"one log of {args.ledgers} ledgers x 8", small),
                    ("  the same in 2 tasks (see docstring)", per_core),
                    (f"{args.logs} logs x 2 ledgers x 3", many)]:
                print(f"{label:<40}{rows:>9}{parts:>12}{dt:>9.2f}{dt / one[0]:>7.1f}x")
            # last: the bookies collect the merge's deleted ledger afterwards, which must not
            # run under the reads above
            read_s, merge_s, n = merge_cost(bk, logs, "small-ledgers")
            print(f"# merge cost, client only: reading the {args.ledgers} small ledgers' {n} "
                  f"entries {read_s:.2f} s; reading and writing them into one ledger "
                  f"{merge_s:.2f} s", flush=True)
        finally:
            bk.close()
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
