"""Tail a log to the console as entries arrive (the open ledger is read without fencing).

    python examples/spark_tail_console.py LOG [--metadata URI] [--seconds N]

Like ``kafka-console-consumer``: starts at the end of the log (``startingOffsets=latest``)
and prints every new entry; the writer keeps writing undisturbed. Stop with Ctrl-C.
"""
import argparse

import spark_common  # noqa: F401


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("--seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--from-start", action="store_true", help="startingOffsets=earliest")
    args, _ = p.parse_known_args()
    uri = spark_common.metadata_uri()
    spark = spark_common.spark_session("bkspark-tail")
    from pyspark.sql import functions as F
    entries = (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
               .option("log", args.log)
               .option("startingOffsets", "earliest" if args.from_start else "latest")
               .option("queryId", "console-tail").load())
    query = (entries.select("ledger_id", "entry_id", "timestamp",
                            F.col("key").cast("string").alias("key"),
                            F.col("value").cast("string").alias("value"))
             .writeStream.format("console").option("truncate", "false")
             .trigger(processingTime="1 second").start())
    try:
        query.awaitTermination(args.seconds)
    except KeyboardInterrupt:
        pass
    finally:
        query.stop()
        spark.stop()


if __name__ == "__main__":
    main()
