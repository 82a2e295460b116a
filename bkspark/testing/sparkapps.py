"""Steps that the tests' Spark applications share -- applications run in processes of their
own (a Spark Connect client, a ``local-cluster`` driver), each on the session they built."""
from __future__ import annotations


def copy_available_now(spark, uri: str, src: str, dst: str, checkpoint: str,
                       timeout: float = 300) -> str:
    """Copy log ``src`` to ``dst`` with a streaming query (``availableNow``, from the earliest
    entry, on ``checkpoint``); the query's exception as text ("None": none; a query still
    running after ``timeout`` seconds is stopped and says so)."""
    query = (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
             .option("log", src).option("startingOffsets", "earliest").load()
             .select("key", "value").writeStream.format("bookkeeper")
             .option("metadataServiceUri", uri).option("log", dst)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    if not query.awaitTermination(timeout):
        query.stop()
        return f"still running after {timeout} s"
    return str(query.exception())
