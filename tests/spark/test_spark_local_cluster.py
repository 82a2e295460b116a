"""The connector on ``local-cluster[2,1,1024]``: executors in JVMs of their own (and their own
Python workers), against three real bookies on ZooKeeper, with an executor JVM SIGKILLed in
the middle of a batch write and of a micro-batch: every row lands exactly once. Spark starts
the Python named by ``PYSPARK_PYTHON`` for the connector's planning and tasks, and a Python
without bkspark (on the executors, or on the driver's host too) fails with an error saying
what to install where.

One Spark application runs every scenario (``local_cluster_driver.py``, a process of its own:
the rest of the suite holds this process's ``local[2]`` SparkContext); the tests check what
it reports.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from metadata.testing import unique_root

# the application's own time limit (subprocess.run below), not pytest.ini's 300 s: on a
# loaded 2-core machine the application alone has taken 260 s
pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(900)]
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def report(zookeeper, bk_cluster, tmp_path_factory):
    from bkspark.localcluster import LocalCluster
    d = tmp_path_factory.mktemp("lc")        # bk_cluster: PYTHONPATH for bookies and workers
    with LocalCluster(zookeeper.uri(unique_root()), num_bookies=3,
                      data_dir=str(d / "bookies")) as cluster:
        out = d / "report.json"
        r = subprocess.run([sys.executable, os.path.join(HERE, "local_cluster_driver.py"),
                            cluster.metadata_uri, str(out)], capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
        return json.loads(out.read_text())


def test_executors_are_separate_jvms(report):
    assert report["executor_processes"] == 2


def test_batch_record_and_arrow_round_trips(report):
    assert report["record"]["values"] == [str(i) for i in range(1000)]
    assert report["arrow"]["rows"] and report["arrow"]["schema"] == \
        "struct<id:bigint,x:double,k:string>"


def test_streaming_copy(report):
    assert report["stream"]["values"] == [str(i) for i in range(300)]


def test_executor_killed_during_a_batch_write(report):
    assert report["kill_batch"]["killed"]
    assert report["kill_batch"]["values"] == [str(i) for i in range(2000)]


def test_executor_killed_during_a_micro_batch(report):
    assert report["kill_stream"]["killed"]
    assert report["kill_stream"]["values"] == [str(i) for i in range(600)]


PLANNERS = ("pyspark.sql.worker.lookup_data_sources", "pyspark.sql.worker.create_data_source",
            "pyspark.sql.worker.plan_data_source_read", "pyspark.sql.worker.write_into_data_source",
            "pyspark.sql.worker.commit_data_source_write",
            "pyspark.sql.streaming.python_streaming_source_runner",
            "pyspark.sql.worker.python_streaming_sink_runner")


def test_spark_starts_the_python_named_by_PYSPARK_PYTHON(report):
    launches = report["python"]["launches"]
    assert not [p for p in launches if p["tag"] == "path"], \
        "Spark started the bare python3 of PATH"
    started = {(p["side"], p["module"]) for p in launches if p["tag"] == "configured"}
    for module in PLANNERS:                     # planning the connector: the driver's host
        assert ("driver", module) in started, (module, sorted(started))
    assert ("executor", "pyspark.worker") in started, sorted(started)
    # the connector's write task that was SIGKILLed ran in a worker forked by a daemon that
    # Spark started through PYSPARK_PYTHON on its executor
    daemons = {p["pid"] for p in launches if p["tag"] == "configured" and p["side"] == "executor"}
    assert report["kill_batch"]["task_parent_pid"] in daemons


def _says_what_to_install_where(msg: str, report) -> None:
    assert msg, "the job did not fail"
    for text in ("bkspark cannot be imported by the Python that Spark started for "
                 'format("bookkeeper") on host ' + socket.gethostname() + ": "
                 + report["python"]["exec"],
                 "ModuleNotFoundError: No module named 'bkspark'",
                 ("Install bkspark into that Python on this host and on every host that runs "
                  "Spark executors (pip install bkspark; --py-files cannot carry it"),
                 "$PYSPARK_DRIVER_PYTHON, else $PYSPARK_PYTHON, else python3",
                 ("After bkspark.spark.register(spark) Spark starts the Python that it starts "
                  "for Python UDFs")):
        assert text in msg, (text, msg[-3000:])


def test_executors_without_bkspark_say_what_to_install_where(report):
    _says_what_to_install_where(report["nobk_executors"]["error"], report)
    started = {(p["side"], p["module"]) for p in report["python"]["launches"]
               if p["tag"] == "nobk_executors"}
    assert ("driver", "pyspark.sql.worker.plan_data_source_read") in started  # planned fine
    assert ("executor", "pyspark.worker") in started                          # tasks failed


def test_planning_without_bkspark_says_what_to_install_where(report):
    _says_what_to_install_where(report["nobk_everywhere"]["error"], report)
    assert not [p for p in report["python"]["launches"]
                if p["tag"] == "nobk_everywhere" and p["side"] == "executor"]
