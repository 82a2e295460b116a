"""`make demo`: a local cluster on the embedded metadata store, the Spark examples, then stop.

Starts 3 bookies on an embedded SQLite store (published, so the connector finds it without a
metadataServiceUri), runs the batch round trip, the Arrow analytics table and the streaming
pipeline (log -> transform -> log, exactly once; run twice on one checkpoint, the second
run picks up only the new events), prints what was written and read, and stops the cluster.
The cluster dashboard (``bkspark dashboard``) runs beside it; its URL is printed.
"""
import json
import os
import sys
import tempfile
import time
import urllib.request

import spark_common  # noqa: F401  (sys.path / PYTHONPATH / PYSPARK_PYTHON)


def main() -> int:
    from bkspark.cli.dashboard_cmd import start as start_dashboard
    from bkspark.cli.dashboard_cmd import stop_dashboard
    from bkspark.localcluster import LocalCluster
    import spark_arrow_table
    import spark_batch_roundtrip
    import spark_streaming_pipeline

    data_dir = tempfile.mkdtemp(prefix="bkspark-demo-")
    t0 = time.time()
    print(f"== starting a local cluster (3 bookies, embedded metadata) in {data_dir}")
    with LocalCluster(num_bookies=3, data_dir=data_dir, publish=True) as cluster:
        uri = cluster.metadata_uri
        print(f"   metadata service: {uri}; bookies: {', '.join(cluster.bookie_ids)}")
        dash = start_dashboard(uri, port=0, slow_interval=1.0)
        print(f"   dashboard (live while the demo runs): {dash.url}")
        spark = spark_common.spark_session("bkspark-demo")
        try:
            print("== batch: records")
            spark_batch_roundtrip.run(spark, uri)
            print("== batch: arrow table")
            spark_arrow_table.run(spark, uri)
            print("== streaming: log -> transform -> log (exactly once)")
            spark_streaming_pipeline.produce(uri, "demo-clicks", 100)
            ckpt = os.path.join(data_dir, "checkpoints", "paid-clicks")
            first = spark_streaming_pipeline.run(spark, uri, checkpoint=ckpt)
            print("== more events arrive; the same query resumes from its checkpoint")
            spark_streaming_pipeline.produce(uri, "demo-clicks", 50, start=100)
            second = spark_streaming_pipeline.run(spark, uri, checkpoint=ckpt)
            values = [r.value for r in second]
            dupes = len(values) - len(set(values))
            print(f"   {len(first)} then {len(second)} paid clicks in the output log, "
                  f"{dupes} duplicates")
            from bkspark.client import BookKeeper
            from bkspark.log import LogStore
            with BookKeeper(uri) as bk:
                logs = LogStore(bk)
                for name in logs.list_logs():
                    if name.startswith("__"):
                        continue
                    counts = logs.entry_counts(name)
                    print(f"   log {name:<18} {len(counts)} ledgers, "
                          f"{sum(n for _, n in counts)} entries")
                for cursor, (pos, lag) in logs.cursor_lags("demo-clicks").items():
                    print(f"   cursor {cursor!r} on demo-clicks at {tuple(pos)}, lag {lag} "
                          "(a micro-batch's offsets are committed when the next is planned)")
            time.sleep(1.5)                 # (its next sample of the logs)
            overview = json.load(urllib.request.urlopen(dash.url + "api/overview", timeout=10))
            seen = ", ".join(f"{d['log']} ({d.get('entries', '?')} entries)" for d in overview["logs"])
            print(f"   the dashboard ({dash.url}) saw {overview['bookie_states']['writable']} "
                  f"writable bookies and the logs {seen or '(none yet)'}")
        finally:
            spark.stop()
            stop_dashboard(dash)
        print("== stopping the cluster")
    print(f"== demo done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
