"""Executors without bkspark run the connector from a packed environment (`spark.archives`).

``bkspark spark-env pack`` makes the archive from the wheel ``make wheel`` builds; an
application on ``local-cluster[2,1,1024]`` (executors in JVMs of their own) is started as
bkspark/spark/README.md says -- ``PYSPARK_DRIVER_PYTHON`` the driver's Python (it has
bkspark), ``PYSPARK_PYTHON=./environment/bin/python`` and ``spark.archives=ENV#environment``
-- in an environment without PYTHONPATH, so an executor's Python can import bkspark only
from the archive Spark unpacked for it. It writes and reads a log, copies it with a
streaming query run twice on one checkpoint (rows added between the runs), and reports
where its tasks imported bkspark from.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.timeout(900)]

APP = textwrap.dedent('''
    import json, sys, uuid
    from pyspark.sql import SparkSession
    uri, env, ckpt, out = sys.argv[1:5]
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
             .config("spark.archives", env + "#environment")
             .config("spark.ui.enabled", "false").getOrCreate())
    report = {}

    def where(_):
        import os, sys
        import bkspark
        yield (bkspark.__file__, sys.prefix, os.getpid())

    report["tasks"] = spark.sparkContext.parallelize(range(4), 4).mapPartitions(where).collect()
    src, dst = "packed-" + uuid.uuid4().hex[:8], "packed-copy-" + uuid.uuid4().hex[:8]

    def write(first, n):
        rows = [(b"k%d" % i, b"v%d" % i) for i in range(first, first + n)]
        (spark.createDataFrame(rows, "key binary, value binary").repartition(2).write
         .format("bookkeeper").option("metadataServiceUri", uri).option("log", src)
         .mode("append").save())

    def read(log):
        rows = (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
                .option("log", log).load().select("value").collect())
        return sorted(bytes(r.value).decode() for r in rows)

    from bkspark.testing.sparkapps import copy_available_now
    write(0, 200)
    report["read"] = read(src)
    report["errors"] = [copy_available_now(spark, uri, src, dst, ckpt)]
    write(200, 50)
    report["errors"].append(copy_available_now(spark, uri, src, dst, ckpt))
    report["copied"] = read(dst)
    spark.stop()
    open(out, "w").write(json.dumps(report))
''')


def test_executors_without_bkspark_run_it_from_the_packed_environment(bk_cluster, uri,
                                                                      bkspark_wheel, tmp_path):
    archive = tmp_path / "env.tar.gz"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    packed = subprocess.run([sys.executable, "-m", "bkspark.cli.main", "spark-env", "pack",
                             str(archive), "--wheel", bkspark_wheel], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    assert "spark-submit --archives" in packed.stdout
    (tmp_path / "app.py").write_text(APP)
    env.update(PYSPARK_DRIVER_PYTHON=sys.executable, PYSPARK_PYTHON="./environment/bin/python")
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "app.py", uri, str(archive), str(tmp_path / "ckpt"),
                           str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=840)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    report = json.loads(out.read_text())
    for module, prefix, _pid in report["tasks"]:       # every task: bkspark of the archive
        assert prefix.endswith("/environment"), prefix
        assert module.startswith(prefix + "/lib/python"), (module, prefix)
    assert len({pid for *_, pid in report["tasks"]}) >= 2   # (Python workers of 2 executors)
    assert report["read"] == sorted(f"v{i}" for i in range(200))
    assert report["errors"] == ["None", "None"]
    assert report["copied"] == sorted(f"v{i}" for i in range(250))    # each row once


def test_pack_refuses_what_spark_could_not_use_and_names_the_fix(bkspark_wheel, tmp_path):
    from bkspark import errors
    from bkspark.spark.packenv import pack, wheel_requirements
    with pytest.raises(errors.BadRequestError, match=r"\.tar\.gz, \.tgz or \.zip"):
        pack(str(tmp_path / "env.tar"), bkspark_wheel)
    with pytest.raises(errors.BadRequestError, match="no wheel at .*make wheel"):
        pack(str(tmp_path / "env.tar.gz"), str(tmp_path / "missing.whl"))
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    with pytest.raises(errors.BadRequestError, match="not a bkspark wheel"):
        wheel_requirements(str(tmp_path / "bad.whl"))
    needs = wheel_requirements(bkspark_wheel)
    names = {r.split("<")[0].split(">")[0].split("=")[0].split("[")[0] for r in needs}
    assert "pyspark" not in names and {"grpcio", "pyarrow", "kazoo"} <= names, needs
    assert not any(n in names for n in ("pytest", "atheris", "zstandard"))    # extras' only
    assert "pyspark" in {r.split("<")[0].split(">")[0]
                         for r in wheel_requirements(bkspark_wheel, with_pyspark=True)}
    assert not list(tmp_path.glob("env.tar*"))
