"""Streaming pipeline log -> transform -> log, exactly once.

    python examples/spark_streaming_pipeline.py [--metadata URI] [--follow]

A producer appends JSON events to log ``demo-clicks`` through a log writer; the query reads
them (``startingOffsets=earliest``, at most ``maxEntriesPerTrigger`` entries per
micro-batch), keeps the clicks of paying users and writes them to ``demo-paid-clicks``.

Exactly once: every micro-batch's tasks write ledgers of their own, and the sink's commit
appends them with (query id, batch id) as idempotency key, so a batch re-run after a crash
adds nothing twice; a second running instance of the query fences the first. Spark's
``checkpointLocation`` stays a directory; the sink's ownership record lives in a BookKeeper
checkpoint store. The source's cursor (named by ``queryId``) shows the query's lag.
"""
import json
import os
import tempfile

import spark_common  # noqa: F401


def produce(uri: str, log: str, n: int, start: int = 0) -> None:
    from bkspark.client import BookKeeper
    from bkspark.log import LogStore
    with BookKeeper(uri) as bk:
        logs = LogStore(bk)
        with logs.open_writer(log) as writer:
            for i in range(start, start + n):
                writer.append(json.dumps({"click": i, "user": f"u{i % 5}",
                                          "paying": i % 5 in (0, 3)}).encode())


def run(spark, uri: str, src: str = "demo-clicks", dst: str = "demo-paid-clicks",
        checkpoint: str | None = None, follow: bool = False) -> list:
    from pyspark.sql import functions as F
    checkpoint = checkpoint or os.path.join(tempfile.mkdtemp(prefix="bkspark-ckpt-"), "pipeline")
    events = (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
              .option("log", src).option("startingOffsets", "earliest")
              .option("maxEntriesPerTrigger", 25).option("queryId", "paid-clicks").load())
    schema = "click long, user string, paying boolean"
    paid = (events.select(F.from_json(F.col("value").cast("string"), schema).alias("e"), "timestamp")
            .where("e.paying")
            .select(F.col("e.user").alias("key"),
                    F.to_json(F.struct("e.click", "e.user")).alias("value"), "timestamp"))
    writer = (paid.writeStream.format("bookkeeper").option("metadataServiceUri", uri)
              .option("log", dst).option("checkpointLocation", checkpoint))
    query = (writer.trigger(processingTime="1 second") if follow
             else writer.trigger(availableNow=True)).start()
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    print(f"[stream] {len(batches)} micro-batches, entries per batch: "
          f"{[p['numInputRows'] for p in batches]}")
    out = (spark.read.format("bookkeeper").option("metadataServiceUri", uri).load(dst)
           .select(F.col("value").cast("string").alias("value")).collect())
    print(f"[stream] {dst!r} holds {len(out)} paid clicks, e.g. {[r.value for r in out[:3]]}")
    return out


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--follow", action="store_true", help="keep running (processingTime trigger)")
    args, _ = p.parse_known_args()
    uri = spark_common.metadata_uri()
    produce(uri, "demo-clicks", 100)
    spark = spark_common.spark_session("bkspark-streaming-pipeline")
    run(spark, uri, follow=args.follow)
    spark.stop()
