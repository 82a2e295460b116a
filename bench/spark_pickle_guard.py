"""What the import guard (``bkspark/spark/importguard.py``) costs a Spark task.

    python bench/spark_pickle_guard.py            # 7 rounds of 500 loads per command

PySpark sends every read or write task a pickled command: its function holding the
connector's reader (or writer) and, for reads, the data source. The worker unpickles it once
per task. With the guard the connector's objects pickle as a call to ``importguard.load``,
whose code travels with them. This prints, for a read and a write command as PySpark builds
them (``plan_data_source_read.py`` / ``write_into_data_source.py``), the pickled size and
the time of ``CloudPickleSerializer.loads`` (median of the rounds, microseconds per load)
with the guard and with it switched off in this process (plain ``__newobj__`` pickles and
by-name classes: the pickles of the connector before the guard). No Spark, no cluster.
"""
from __future__ import annotations

import copyreg
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def commands():
    from pyspark.sql.types import BinaryType, StructField, StructType

    from bkspark.spark import codec
    from bkspark.spark.datasource import BookKeeperDataSource
    from bkspark.spark.reader import BookKeeperBatchReader
    from bkspark.spark.writer import BookKeeperBatchWriter
    ds = BookKeeperDataSource({"path": "events", "metadataServiceUri": "sqlite:///nowhere.db"})
    schema = codec.record_spark_schema()
    reader = BookKeeperBatchReader(ds.opts, schema)
    writer = BookKeeperBatchWriter(ds.opts, StructType([StructField("value", BinaryType())]),
                                   False)

    def data_source_read_func(iterator):
        return reader.read(iterator), ds

    def data_source_write_func(iterator):
        return writer.write(iterator)

    return {"read": (data_source_read_func, schema), "write": (data_source_write_func, None)}


def measure(rounds: int = 7, loads: int = 500) -> dict:
    from pyspark.serializers import CloudPickleSerializer
    ser = CloudPickleSerializer()
    out = {}
    for name, command in commands().items():
        blob = ser.dumps(command)
        ser.loads(blob)
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(loads):
                ser.loads(blob)
            times.append((time.perf_counter() - t) / loads * 1e6)
        out[name] = (len(blob), statistics.median(times))
    return out


def guard_off() -> None:
    from bkspark.spark import importguard
    from bkspark.spark.datasource import BookKeeperDataSource
    importguard.Guarded.__reduce__ = lambda self: (copyreg.__newobj__, (type(self),),
                                                   self.__dict__)
    copyreg.dispatch_table.pop(type(BookKeeperDataSource))


def main() -> None:
    import platform

    import pyspark
    print(f"PySpark {pyspark.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs")
    on = measure()
    guard_off()
    off = measure()
    for name in on:
        print(f"{name} command: {off[name][0]} -> {on[name][0]} bytes, "
              f"loads {off[name][1]:.0f} -> {on[name][1]:.0f} us (guard off -> on)")


if __name__ == "__main__":
    main()
