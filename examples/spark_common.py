"""Shared setup of the Spark examples: a small local SparkSession that finds bkspark.

Run from a source checkout without ``pip install``, the examples put the repository root on
``sys.path`` and ``PYTHONPATH`` (Spark's Python workers import ``bkspark`` and the
zero-config ``pyspark_bookkeeper`` module from there).
"""
from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if REPO not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([REPO] + _paths)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def spark_session(app: str = "bkspark-example"):
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local[2]")).appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def metadata_uri(argv=None) -> str:
    """``--metadata URI``, else $BKSPARK_METADATA_URI, else the running local cluster."""
    import argparse

    from bkspark.cluster_registry import default_metadata_uri
    p = argparse.ArgumentParser()
    p.add_argument("--metadata")
    args, _ = p.parse_known_args(argv)
    uri = default_metadata_uri(args.metadata)
    if not uri:
        sys.exit("no metadata URI: start `bkspark localcluster` or pass --metadata URI")
    return uri
