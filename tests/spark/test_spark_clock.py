"""Issue 47, finding 5: a Spark task on a host whose clock is a day behind stamped its records
(rows without a timestamp) with its own time, so `startingTimestamp` skipped its ledger.
The task side of the batch sink runs here in a process under libfaketime
(bkspark.testing.clockskew) -- the sink's own code, without a Spark session -- against the
session's real cluster; the records must carry the metadata store's time."""
from __future__ import annotations

import json
import time

from bkspark.spark.reader import seek_time
from bkspark.testing.clockskew import run_skewed

TASK = """
import json, sys
import pyarrow as pa
from pyspark.sql.types import BinaryType, StructField, StructType
from bkspark.spark.options import parse_options
from bkspark.spark.writer import BookKeeperBatchWriter
uri, name = sys.argv[1], sys.argv[2]
opts = parse_options({"metadataServiceUri": uri, "log": name})
writer = BookKeeperBatchWriter(opts, StructType([StructField("value", BinaryType())]), False)
message = writer.write(iter([pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c"]})]))
writer.commit([message])
print("RESULT " + json.dumps({"min_ts": message.min_ts, "max_ts": message.max_ts}), flush=True)
"""


def test_a_task_a_day_behind_stamps_the_stores_time(uri, logs, log_name):
    done = run_skewed("-1d", TASK, uri, log_name, timeout=180)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{done.stdout}\n{done.stderr[-3000:]}"
    stamps = json.loads(lines[-1][len("RESULT "):])
    now_us = time.time() * 1e6
    assert abs(stamps["max_ts"] - now_us) < 120e6, stamps       # (before: a day ago)
    md, _ = logs.get(log_name)
    start = seek_time(logs, md, int(now_us - 60e6))             # startingTimestamp: 1 min ago
    assert start is not None and start.ledger_id == md.ledgers[0].ledger_id \
        and start.entry_id == 0, start
