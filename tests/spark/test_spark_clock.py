"""Issue 47, finding 5: a Spark task on a host whose clock is a day behind stamped its records
(rows without a timestamp) with its own time, so `startingTimestamp` skipped its ledger.
The task side of the batch sink runs here in a process under libfaketime
(bkspark.testing.clockskew) -- the sink's own code, without a Spark session -- against the
session's real cluster, and the driver's commit in this one (a true clock); the records must
carry the metadata store's time."""
from __future__ import annotations

import base64
import pickle
import time

from bkspark.spark.reader import seek_time
from bkspark.testing.clockskew import run_skewed

TASK = """
import base64, pickle, sys
import pyarrow as pa
from pyspark.sql.types import BinaryType, StructField, StructType
from bkspark.spark.options import parse_options
from bkspark.spark.writer import BookKeeperBatchWriter
uri, name = sys.argv[1], sys.argv[2]
writer = BookKeeperBatchWriter(parse_options({"metadataServiceUri": uri, "log": name}),
                               StructType([StructField("value", BinaryType())]), False)
message = writer.write(iter([pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c"]})]))
print("RESULT " + base64.b64encode(pickle.dumps((writer.job, message))).decode(), flush=True)
"""


def _writer(uri, log_name, job=None):
    from pyspark.sql.types import BinaryType, StructField, StructType
    from bkspark.spark.options import parse_options
    from bkspark.spark.writer import BookKeeperBatchWriter
    writer = BookKeeperBatchWriter(parse_options({"metadataServiceUri": uri, "log": log_name}),
                                   StructType([StructField("value", BinaryType())]), False)
    if job is not None:
        writer.job = job
    return writer


def test_a_task_a_day_behind_stamps_the_stores_time(uri, logs, log_name):
    done = run_skewed("-1d", TASK, uri, log_name, timeout=180)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{done.stdout}\n{done.stderr[-3000:]}"
    job, message = pickle.loads(base64.b64decode(lines[-1][len("RESULT "):]))
    now_us = time.time() * 1e6
    (keys,) = message.ledger_info.values()
    assert abs(keys["max_ts"] - now_us) < 120e6, message        # (before: a day ago)
    _writer(uri, log_name, job).commit([message])               # (the driver: a true clock)
    md, _ = logs.get(log_name)
    start = seek_time(logs, md, int(now_us - 60e6))             # startingTimestamp: 1 min ago
    assert start is not None and start.ledger_id == md.ledgers[0].ledger_id \
        and start.entry_id == 0, start
