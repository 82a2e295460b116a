"""The connector on ``local-cluster[2,1,1024]``: executors in JVMs of their own (and their own
Python workers), against three real bookies on ZooKeeper, with an executor JVM SIGKILLed in
the middle of a batch write and of a micro-batch: every row lands exactly once.

One Spark application runs every scenario (``local_cluster_driver.py``, a process of its own:
the rest of the suite holds this process's ``local[2]`` SparkContext); the tests check what
it reports.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from metadata.testing import unique_root

pytestmark = [pytest.mark.spark, pytest.mark.integration]
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
