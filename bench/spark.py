"""Spark connector throughput vs Parquet on local disk, same data, same run.

    python bench/spark.py                 # ~300k rows (~30 MB), about 2 minutes
    python bench/spark.py --full          # 2M rows (~200 MB), the issue's target size
    python bench/spark.py --metadata URI  # against a running cluster instead of a fresh one
    python bench/spark.py --bookie-args=--entry-log-page-cache   # flags of the fresh cluster's bookies
    python bench/spark.py --compression none   # arrow entries uncompressed (also lz4, zstd)

The same cached DataFrame (id long, key string, score double, flag boolean, payload binary:
~100 bytes a row) is written and read back through ``format("bookkeeper")``
(``entryFormat=arrow``, E=3 Qw=2 Qa=2, bookies journaling with fdatasync; the connector's
default compression, LZ4, unless ``--compression`` says otherwise) and through Parquet on
local disk (its default compression, snappy). Reads are materialised with the ``noop`` sink
(every column is produced, nothing collected). MB/s uses the same logical size for both
formats: the Arrow bytes of the data, uncompressed. Prints rows/s, MB/s and the ratio to
Parquet for each direction: the median of ``--repeat`` interleaved runs (the ratio of the
medians; each one's best in brackets). A third read, of a Python data source that yields
batches of the log's rows from memory over the same partitions, as large as the log's entries,
which the connector hands to Spark as they are (:func:`floor_source`), gives the ceiling of the read ratio on this
machine: what Spark's Python data source path itself costs next to Parquet's JVM reader. The
same source's Arrow writer, which only counts the batches it is given, gives the write
ratio's ceiling.

The last line: the fixed cost of a query, a 1,000-row read through ``format("bookkeeper")``,
through the floor source and of ``spark.range`` (a Python data source's planning and task
start-up, paid by every read whatever its size).

Targets: read >= 1.0x Parquet rows/s and >= 90% of the floor (issue 53), write >= 0.5x
Parquet rows/s (issue 7).
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

from procstat import machine_cpu_ticks, process_cpu_seconds  # noqa: E402  (bench/ is sys.path[0])


def floor_source():
    """The Python data source path with no storage: a source whose tasks yield template
    Arrow batches (the first entry of the written log, decoded once; distinct copies of it in
    turn, :data:`FLOOR_COPY_BYTES` of them built once per Python worker, so they are not in
    the CPU's cache as one batch yielded again would be) until they have produced as many
    rows as the log holds, over as many partitions as the bookkeeper read plans. The read ratio cannot exceed this source's ratio: it is what Spark's Python
    data source path (Arrow batches from a Python worker to the JVM) costs on this machine,
    measured in the same run."""
    from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                        InputPartition, WriterCommitMessage)

    class Share(InputPartition):
        def __init__(self, rows: int):
            self.rows = rows

    class Reader(DataSourceReader):
        def __init__(self, options):
            self.options = options

        def partitions(self):
            rows, n = int(self.options["rows"]), int(self.options["partitions"])
            return [Share(rows // n + (1 if i < rows % n else 0)) for i in range(n)]

        def read(self, partition):
            templates = _floor_templates(self.options["template"])
            left, turn = partition.rows, 0
            while left > 0:
                template = templates[turn % len(templates)]
                turn += 1
                batch = template if left >= template.num_rows else template.slice(0, left)
                left -= batch.num_rows
                yield batch

    class Counted(WriterCommitMessage):
        def __init__(self, rows: int):
            self.rows = rows

    class Writer(DataSourceArrowWriter):
        def write(self, iterator):
            return Counted(sum(batch.num_rows for batch in iterator))

    class FloorSource(DataSource):
        @classmethod
        def name(cls):
            return "bkspark_bench_floor"

        def schema(self):
            import json

            from pyspark.sql.types import StructType
            return StructType.fromJson(json.loads(self.options["schema"]))

        def reader(self, schema):
            return Reader(self.options)

        def writer(self, schema, overwrite):
            return Writer()

    return FloorSource


_TEMPLATES: dict = {}
#: the floor source's distinct copies of its template, in bytes (more than a CPU cache)
FLOOR_COPY_BYTES = 64 << 20


def _floor_templates(path: str) -> list:
    """The floor source's batches (:func:`floor_source`), built once per Python worker."""
    if path not in _TEMPLATES:
        import pyarrow as pa

        with open(path, "rb") as f:
            first = pa.ipc.open_stream(f.read()).read_next_batch()
        copies = max(1, FLOOR_COPY_BYTES // max(1, first.nbytes))
        _TEMPLATES.clear()
        _TEMPLATES[path] = [pa.concat_batches([first, first.slice(0, 0)])
                            for _ in range(copies)]
    return _TEMPLATES[path]


BUSY: dict = {}
BOOKIE_PIDS: list = []


def timed(fn, key: str = "") -> float:
    """Wall seconds of ``fn()``; records the share of the machine's CPU that was busy and the
    CPU seconds the bookies used meanwhile."""
    b0, t0 = machine_cpu_ticks()
    k0 = process_cpu_seconds(BOOKIE_PIDS)
    t = time.perf_counter()
    fn()
    dt = time.perf_counter() - t
    b1, t1 = machine_cpu_ticks()
    if key and (key not in BUSY or dt < BUSY[key][0]):
        BUSY[key] = (dt, (b1 - b0) / max(1, t1 - t0), process_cpu_seconds(BOOKIE_PIDS) - k0)
    return dt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--full", action="store_true", help="2,000,000 rows (~200 MB)")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5,
                   help="interleaved runs of each read and write; medians count")
    p.add_argument("--payload", type=int, default=64, help="bytes of the binary column")
    p.add_argument("--compression", default=None, choices=("none", "lz4", "zstd"),
                   help="the bookkeeper write's compression option (default: the connector's)")
    p.add_argument("--max-entry-bytes", default=None,
                   help="the bookkeeper write's maxEntryBytes option (default: the connector's)")
    p.add_argument("--metadata", default=None, help="metadata URI of a running cluster")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--bookie-args", default="",
                   help='flags for the fresh cluster\'s bookies, e.g. "--entry-log-page-cache"')
    args = p.parse_args()
    rows = 2_000_000 if args.full else args.rows

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    work = tempfile.mkdtemp(prefix="bkspark-bench-spark-")
    cluster = None
    if args.metadata is None:
        from bkspark.localcluster import LocalCluster
        cluster = LocalCluster(num_bookies=3, data_dir=os.path.join(work, "bookies"),
                               extra_args=args.bookie_args.split())
        cluster.start_all()
        uri = cluster.metadata_uri
        BOOKIE_PIDS.extend(b.proc.pid for b in cluster.bookies)
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
        if args.compression:
            bk_opts["compression"] = args.compression
        if args.max_entry_bytes:
            bk_opts["maxEntryBytes"] = args.max_entry_bytes
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

        def floor_write():
            df.write.format("bkspark_bench_floor").mode("append").save()

        def floor_read():
            (spark.read.format("bkspark_bench_floor").options(**floor_opts).load()
             .write.format("noop").mode("overwrite").save())

        # warm-up: JVM, Python workers, both code paths (small)
        small = df.limit(1000)
        small.write.format("bookkeeper").mode("overwrite").options(**bk_opts).save("bench-warmup")
        spark.read.format("bookkeeper").options(**bk_opts).load("bench-warmup").count()
        small.write.mode("overwrite").parquet(parquet_dir + "-warmup")
        spark.read.parquet(parquet_dir + "-warmup").count()

        times: dict = {k: [] for k in ("bk_write", "pq_write", "floor_write", "bk_read",
                                       "pq_read", "floor_read")}
        floor_opts = None
        spark.dataSource.register(floor_source())
        small.write.format("bkspark_bench_floor").mode("append").save()   # warm-up
        for _ in range(args.repeat):
            times["bk_write"].append(timed(bk_write, "bk_write"))
            times["pq_write"].append(timed(pq_write, "pq_write"))
            times["floor_write"].append(timed(floor_write, "floor_write"))
            if floor_opts is None:
                floor_opts, row_bytes = prepare_floor(spark, uri, log, bk_opts, rows, work)
                floor_read()        # warm-up: the new source's planning and workers
            times["bk_read"].append(timed(bk_read, "bk_read"))
            times["pq_read"].append(timed(pq_read, "pq_read"))
            times["floor_read"].append(timed(floor_read, "floor_read"))
        best = {k: min(v) for k, v in times.items()}
        median = {k: statistics.median(v) for k, v in times.items()}

        from bkspark.client import BookKeeper
        from bkspark.log import LogStore
        with BookKeeper(uri) as bk:
            md, _ = LogStore(bk).get(log)
            stored_bytes = sum(e.sealed_length() for e in md.ledgers)
            n_ledgers, n_entries = len(md.ledgers), sum(e.last_entry_id + 1 for e in md.ledgers)
        parquet_bytes = sum(os.path.getsize(os.path.join(d, f))
                            for d, _, fs in os.walk(parquet_dir) for f in fs if f.endswith(".parquet"))
        mb = row_bytes * rows / 1e6
        print(f"config: rows={rows:,} partitions={args.partitions} master={args.master} "
              f"payload={args.payload}B; bookkeeper entryFormat=arrow E=3 Qw=2 Qa=2 "
              f"compression={args.compression or 'default'} "
              f"maxEntryBytes={args.max_entry_bytes or 'default'} "
              f"({'fresh 3-bookie local cluster' if cluster else uri}"
              f"{' with bookie flags ' + args.bookie_args if cluster and args.bookie_args else ''}), "
              f"{n_ledgers} ledgers, "
              f"{n_entries} entries, {mb:.1f} MB Arrow, {stored_bytes / 1e6:.1f} MB stored (per "
              f"replica); parquet {parquet_bytes / 1e6:.1f} MB "
              f"on local disk; medians of {args.repeat} interleaved runs (best)")
        for direction in ("write", "read"):
            bk_t, pq_t = median[f"bk_{direction}"], median[f"pq_{direction}"]
            target = 0.5 if direction == "write" else 1.0
            ratio = pq_t / bk_t
            print(f"{direction:>5}: bookkeeper {rows / bk_t:>12,.0f} rows/s {mb / bk_t:7.1f} MB/s "
                  f"({bk_t:.2f}s; {best[f'bk_{direction}']:.2f}s) | parquet {rows / pq_t:>12,.0f} "
                  f"rows/s {mb / pq_t:7.1f} MB/s ({pq_t:.2f}s; {best[f'pq_{direction}']:.2f}s) | "
                  f"ratio {ratio:.2f}x ({best[f'pq_{direction}'] / best[f'bk_{direction}']:.2f}x) "
                  f"(target >= {target}x: {'met' if ratio >= target else 'NOT met'})")
        fw_t, fl_t = median["floor_write"], median["floor_read"]
        print("cores busy in the best run (bookies' CPU seconds): " + ", ".join(
            f"{k} {v[1] * 100:.0f}% ({v[2]:.2f}s)" for k, v in BUSY.items()))
        print(f"floor write: python sink, no storage {rows / fw_t:>7,.0f} rows/s "
              f"{mb / fw_t:7.1f} MB/s ({fw_t:.2f}s) | ratio to parquet "
              f"{median['pq_write'] / fw_t:.2f}x: the write ratio's ceiling; bookkeeper write "
              f"reaches {fw_t / median['bk_write'] * 100:.0f}% of it")
        print(f"floor read: python source, no storage {rows / fl_t:>7,.0f} rows/s {mb / fl_t:7.1f} MB/s "
              f"({fl_t:.2f}s, {floor_opts['partitions']} partitions) | ratio to parquet "
              f"{median['pq_read'] / fl_t:.2f}x: the read ratio's ceiling; bookkeeper read reaches "
              f"{fl_t / median['bk_read'] * 100:.0f}% of it (target >= 90%)")
        # the fixed cost of a query: a 1,000-row read of each, best of 5
        tiny = "bench-warmup"                           # (1,000 rows, written above)
        tiny_floor = dict(floor_opts, rows="1000", partitions="1")

        def best_of(fn, n=5):
            out = float("inf")
            for _ in range(n):
                t = time.perf_counter()
                fn()
                out = min(out, time.perf_counter() - t)
            return out
        fixed = {
            "bookkeeper": best_of(lambda: spark.read.format("bookkeeper").options(**bk_opts)
                                  .load(tiny).write.format("noop").mode("overwrite").save()),
            "python floor source": best_of(
                lambda: spark.read.format("bkspark_bench_floor").options(**tiny_floor).load()
                .write.format("noop").mode("overwrite").save()),
            "spark.range": best_of(lambda: spark.range(1000).write.format("noop")
                                   .mode("overwrite").save()),
        }
        print("fixed cost of a query (1,000 rows to noop, best of 5): " + ", ".join(
            f"{k} {v:.3f}s" for k, v in fixed.items()))
    finally:
        spark.stop()
        if cluster is not None:
            cluster.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def prepare_floor(spark, uri, log, bk_opts, rows, work) -> tuple[dict, float]:
    """The floor source's read options (the bookkeeper read's schema, partition count and first
    entry, as an Arrow IPC stream file the tasks read once) and the Arrow bytes of a row."""
    import pyarrow as pa

    from bkspark.client import BookKeeper
    from bkspark.log import LogStore
    from bkspark.spark.codec import MD_ARROW_SCHEMA, decode_arrow

    df = spark.read.format("bookkeeper").options(**bk_opts).load(log)
    with BookKeeper(uri) as bk:
        logs = LogStore(bk)
        md, _ = logs.get(log)
        first = md.ledgers[0].ledger_id
        rh = bk.open_ledger(first, password=b"", recovery=False)
        data = next(iter(rh.read(0, 0))).data
        arrow_schema = pa.ipc.read_schema(pa.py_buffer(rh.metadata.custom_metadata[MD_ARROW_SCHEMA]))
    batch = decode_arrow(data, arrow_schema)
    template = os.path.join(work, "floor-template.arrows")
    with open(template, "wb") as f, pa.ipc.new_stream(f, batch.schema) as w:
        w.write_batch(batch)
    return ({"schema": df.schema.json(), "rows": str(rows),
             "partitions": str(df.rdd.getNumPartitions()), "template": template},
            batch.nbytes / batch.num_rows)


if __name__ == "__main__":
    sys.exit(main())
