"""Zero-config registration of ``format("bookkeeper")``.

PySpark scans top-level modules named ``pyspark_*`` for a ``DefaultSource`` data source, so
after ``pip install bkspark`` any new SparkSession resolves ``spark.read.format("bookkeeper")``
without calling :func:`bkspark.spark.register`. The scan runs in the Python that Spark's
driver JVM starts for data sources (``bkspark/spark/README.md``, "Which Python runs the
connector"); if bkspark is there but does not import (a missing dependency, a C extension
built for another Python), the error says which Python on which host and what to do.
"""
try:
    from bkspark.spark.datasource import BookKeeperDataSource as DefaultSource
except ImportError as exc:
    try:
        from bkspark.spark.importguard import missing_message
    except ImportError:
        raise exc from None
    raise ImportError(missing_message(exc), name=exc.name) from exc

__all__ = ["DefaultSource"]
