"""An analytics table stored as Arrow record batches in a log (entryFormat=arrow).

    python examples/spark_arrow_table.py [--metadata URI]

Each entry holds an Arrow IPC record batch of many rows; the table's schema lives in the
ledgers' custom metadata, so a read returns exactly the written schema (nested types, nulls,
decimals) without the caller naming it. Reads and writes move Arrow batches end to end; each
entry's buffers are LZ4-compressed (option ``compression``: ``lz4``, ``zstd`` or ``none``),
and readers need no option to decode them.
"""
import spark_common  # noqa: F401


def run(spark, uri: str, log: str = "demo-sales") -> list:
    from pyspark.sql import functions as F
    sales = (spark.range(0, 20_000, numPartitions=2)
             .select(F.col("id").alias("order_id"),
                     F.element_at(F.array(*[F.lit(s) for s in ("north", "south", "east", "west")]),
                                  (F.col("id") % 4 + 1).cast("int")).alias("region"),
                     (F.col("id") % 97 * 1.25).cast("decimal(12,2)").alias("amount"),
                     F.when(F.col("id") % 10 == 0, None).otherwise(F.col("id") % 7).alias("discount"),
                     F.struct((F.col("id") % 3).alias("channel"),
                              F.array(F.lit("tag"), F.col("id").cast("string")).alias("tags")).alias("meta")))
    (sales.write.format("bookkeeper").option("metadataServiceUri", uri)
          .option("entryFormat", "arrow").mode("overwrite").save(log))
    table = (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
             .option("entryFormat", "arrow").load(log))
    print(f"[arrow] table {log!r} schema: {table.schema.simpleString()}")
    summary = (table.groupBy("region")
               .agg(F.count("*").alias("orders"), F.sum("amount").alias("revenue"),
                    F.avg("discount").alias("avg_discount"))
               .orderBy("region").collect())
    for r in summary:
        print(f"   {r.region:<6} orders={r.orders:>5} revenue={r.revenue:>10} "
              f"avg_discount={r.avg_discount:.2f}")
    return summary


if __name__ == "__main__":
    uri = spark_common.metadata_uri()
    spark = spark_common.spark_session("bkspark-arrow-table")
    run(spark, uri)
    spark.stop()
