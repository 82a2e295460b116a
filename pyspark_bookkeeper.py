"""Zero-config registration of ``format("bookkeeper")``.

PySpark scans top-level modules named ``pyspark_*`` for a ``DefaultSource`` data source, so
after ``pip install bkspark`` any new SparkSession resolves ``spark.read.format("bookkeeper")``
without calling :func:`bkspark.spark.register`.
"""
from bkspark.spark.datasource import BookKeeperDataSource as DefaultSource

__all__ = ["DefaultSource"]
