"""PySpark connector: ``format("bookkeeper")`` for batch and streaming, exactly once.

    spark.read.format("bookkeeper").load("events")                    # record format
    df.write.format("bookkeeper").option("entryFormat", "arrow").mode("append").save("table")
    spark.readStream.format("bookkeeper").option("log", "in").load()
    q = df.writeStream.format("bookkeeper").option("log", "out") \\
          .option("checkpointLocation", "/ckpt/q1").start()

After ``pip install`` the format is found without registration (the top-level module
``pyspark_bookkeeper`` exposes ``DefaultSource``); :func:`register` registers it explicitly.
Options: :mod:`bkspark.spark.options`. Entry encodings: :mod:`bkspark.spark.codec`.
Exactly-once writes: :mod:`bkspark.spark.writer`. Streaming source: :mod:`bkspark.spark.stream`.
"""
from __future__ import annotations

__all__ = ["BookKeeperDataSource", "register", "FORMAT_NAME"]

FORMAT_NAME = "bookkeeper"


def __getattr__(name):          # keep `import bkspark.spark` cheap (no pyspark import)
    if name == "BookKeeperDataSource":
        from bkspark.spark.datasource import BookKeeperDataSource
        return BookKeeperDataSource
    raise AttributeError(name)


def register(spark) -> None:
    """Register ``format("bookkeeper")`` in ``spark`` (a SparkSession)."""
    from bkspark.spark.datasource import BookKeeperDataSource
    spark.dataSource.register(BookKeeperDataSource)
