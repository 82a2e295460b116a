"""Fixtures of the Spark connector tests: ONE bookie cluster and ONE SparkSession per session.

Spark tests are slow to start (JVM, Python workers), so everything here is session-scoped:
``bk_cluster`` (3 real bookies on an embedded SQLite store, named by ``BKSPARK_METADATA_URI``
before Spark starts, so the connector's default ``metadataServiceUri`` is found the way the
local cluster's banner tells users to; finding the running local cluster without the
variable is tested by ``tests/test_readme.py``), ``spark`` (``local[2,3]``:
two cores, a failed task is retried up to 3 times; UI off; 2 shuffle partitions; Python filter
pushdown on) and ``logs`` (a LogStore on the cluster). Tests use unique log names.

The session never calls ``bkspark.spark.register``: ``format("bookkeeper")`` must resolve
through the zero-config ``pyspark_bookkeeper`` module.
"""
from __future__ import annotations

import os
import sys
import uuid

import pytest

from metadata.testing import skip_or_fail

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _java_available() -> bool:
    import shutil
    return bool(os.environ.get("JAVA_HOME") or shutil.which("java"))


@pytest.fixture(scope="session")
def bk_cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("bkspark-home")
    os.environ["BKSPARK_HOME"] = str(home)          # workers inherit it (set before Spark starts)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if REPO not in paths:                           # bookies and Spark workers import bkspark
        os.environ["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in paths if p])
    from bkspark.localcluster import LocalCluster
    with LocalCluster(num_bookies=3, data_dir=str(tmp_path_factory.mktemp("bookies"))) as cluster:
        os.environ["BKSPARK_METADATA_URI"] = cluster.metadata_uri   # inherited by Spark's JVM
        yield cluster
        os.environ.pop("BKSPARK_METADATA_URI", None)


@pytest.fixture(scope="session")
def uri(bk_cluster) -> str:
    return bk_cluster.metadata_uri


@pytest.fixture(scope="session")
def spark(bk_cluster):
    if not _java_available():
        skip_or_fail("no Java: Spark tests need a JVM")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2,3]").appName("bkspark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def logs(bk_cluster):
    from bkspark.client import BookKeeper
    from bkspark.log import LogStore
    with BookKeeper(bk_cluster.metadata_uri) as bk:
        yield LogStore(bk)


@pytest.fixture
def log_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
