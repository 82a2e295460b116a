"""format("bookkeeper") through Spark Connect (`pip install bkspark[connect]`;
bkspark/spark/README.md, "Spark Connect").

A client of ``SparkSession.builder.remote("local[2]")`` -- PySpark's Connect server in a JVM
of its own, its Python workers started by that server -- on the session's real cluster. It
runs in a process of its own (one JVM per process: the suite's classic session would be
another); its server listens on Spark Connect's port, 15002, which must be free. What it
must do, each step printing one JSON line:

* batch write and read with the source found by the server's discovery (no ``register``);
* the same after a client-side ``bkspark.spark.register(spark)`` (sent to the server);
* a streaming copy (source and sink, ``availableNow``), run again on the same checkpoint
  after more rows arrived: every row in the copy once;
* a bad option's error reaching the client readable: the option named, the fix said.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from metadata.testing import skip_or_fail

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow,
              pytest.mark.timeout(700)]       # (the client's own limit: 600 s)

CLIENT = textwrap.dedent('''
    import json, sys, uuid
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    uri, ckpt = sys.argv[1], sys.argv[2]
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    assert isinstance(spark, ConnectSession), type(spark)

    def say(**what):
        print(json.dumps(what), flush=True)

    def write(log, rows):
        df = spark.createDataFrame(rows, "key binary, value binary")
        (df.write.format("bookkeeper").option("metadataServiceUri", uri).option("log", log)
           .mode("append").save())

    def read(log):
        rows = (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
                .option("log", log).load().select("key", "value").collect())
        return sorted([bytes(r.key).decode(), bytes(r.value).decode()] for r in rows)

    src, dst = "connect-src-" + uuid.uuid4().hex[:8], "connect-dst-" + uuid.uuid4().hex[:8]
    write(src, [(b"k%d" % i, b"v%d" % i) for i in range(50)])
    say(step="discovered", rows=read(src))

    from bkspark.spark import register
    register(spark)
    write(src, [(b"k%d" % i, b"v%d" % i) for i in range(50, 60)])
    say(step="registered", rows=read(src))

    from bkspark.testing.sparkapps import copy_available_now
    first = copy_available_now(spark, uri, src, dst, ckpt)
    write(src, [(b"k%d" % i, b"v%d" % i) for i in range(60, 75)])
    second = copy_available_now(spark, uri, src, dst, ckpt)
    say(step="streamed", errors=[first, second], rows=read(dst))

    try:
        (spark.read.format("bookkeeper").option("metadataServiceUri", uri).option("lgo", src)
         .load().collect())
        say(step="bad option", error=None)
    except Exception as exc:
        say(step="bad option", error=str(exc))
    spark.stop()
''')


def test_format_bookkeeper_through_spark_connect(bk_cluster, uri, tmp_path):
    try:
        import google.rpc  # noqa: F401
        import grpc_status  # noqa: F401
        import zstandard  # noqa: F401
    except ImportError as exc:
        skip_or_fail(f"Spark Connect's client needs bkspark[connect] (make install): {exc}")
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    done = subprocess.run([sys.executable, str(script), uri, str(tmp_path / "ckpt")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    steps = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            steps[doc["step"]] = doc
    assert done.returncode == 0 and len(steps) == 4, done.stdout[-3000:] + done.stderr[-5000:]
    expect = lambda n: sorted([f"k{i}", f"v{i}"] for i in range(n))  # noqa: E731
    assert steps["discovered"]["rows"] == expect(50)
    assert steps["registered"]["rows"] == expect(60)
    assert steps["streamed"]["errors"] == ["None", "None"]
    assert steps["streamed"]["rows"] == expect(75)            # each row once, in two runs
    error = steps["bad option"]["error"]
    assert error and "unknown option 'lgo'" in error and "did you mean 'log'" in error, error
