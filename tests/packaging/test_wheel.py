"""`make wheel` gives a wheel that runs a bookie and a Spark job where no RocksDB is installed.

The wheel is built as README says (``make wheel``), installed into a fresh virtual
environment (its other dependencies -- PySpark, grpcio... -- from this Python's site packages:
the wheel brings bkspark and its C libraries, nothing else), and run from a directory
outside the repository, without PYTHONPATH, in a mount namespace where the system's
librocksdb is hidden (bind-mounted over with /dev/null): a local cluster of 3 bookies starts,
a Spark job writes and reads a log through ``format("bookkeeper")``, and the cluster stops.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from metadata.testing import skip_or_fail

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sysconfig_paths() -> list[str]:
    import sysconfig
    return [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow,
              pytest.mark.timeout(1200)]      # (its steps' own limits add up to ~1,000 s)
SYSTEM_ROCKSDB = sorted(glob.glob("/usr/lib/*/librocksdb.so*") + glob.glob("/usr/lib/librocksdb.so*"))

JOB = textwrap.dedent('''
    import sys
    from pyspark.sql import SparkSession
    uri = sys.argv[1]
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    rows = [(b"k%d" % i, b"v%d" % i) for i in range(100)]
    df = spark.createDataFrame(rows, "key binary, value binary")
    (df.write.format("bookkeeper").option("metadataServiceUri", uri).option("log", "from-wheel")
       .mode("append").save())
    back = (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
            .option("log", "from-wheel").load().select("key", "value").collect())
    print("ROWS", sorted((bytes(r.key), bytes(r.value)) for r in back) == sorted(rows), len(back))
    spark.stop()
''')


def _hidden(command: str) -> list[str]:
    """``command`` (shell) in a mount namespace where the system's librocksdb is /dev/null
    (``exec``: a timeout's kill reaches the command itself)."""
    hide = "".join(f"mount --bind /dev/null {lib} && " for lib in SYSTEM_ROCKSDB)
    return ["unshare", "--mount", "sh", "-c", hide + "exec " + command]


def test_the_wheel_is_manylinux_and_bundles_rocksdb(bkspark_wheel):
    wheel = bkspark_wheel
    assert "manylinux" in os.path.basename(wheel), wheel
    names = zipfile.ZipFile(wheel).namelist()
    libs = [n for n in names if n.startswith("bkspark.libs/")]
    assert any("librocksdb" in n for n in libs), libs
    assert any(n.startswith("bkspark/_native") and n.endswith(".so") for n in names)
    assert not any(n.startswith("tests/") for n in names)
    tracked = set(subprocess.run(["git", "ls-files", "bkspark", "metadata", "*.py"], cwd=REPO,
                                 capture_output=True, text=True, check=True).stdout.split())
    stale = [n for n in names if n.endswith(".py") and not n.startswith("bkspark-")
             and n not in tracked]
    assert not stale, f"the wheel holds files the checkout does not: {stale}"


def test_the_wheel_runs_a_bookie_and_a_spark_job_with_no_rocksdb_installed(bkspark_wheel,
                                                                           tmp_path):
    if os.geteuid() != 0:
        skip_or_fail("the wheel test hides the system's librocksdb in a mount namespace: "
                     "it needs root")
    assert SYSTEM_ROCKSDB, "this test hides the system's librocksdb: none found"
    wheel = bkspark_wheel
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("BKSPARK_")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                    wheel], check=True, timeout=300, capture_output=True, env=env)
    # the other dependencies (PySpark, grpcio, ...) from this Python's site packages, named
    # by one path: their .pth files -- this checkout's editable install among them -- are
    # not read, so the checkout stays out of the environment's sys.path
    (site,) = {p for p in sysconfig_paths() if p.endswith("site-packages")}
    venv_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True,
                               env=env).stdout.strip()
    with open(os.path.join(venv_site, "system-dependencies.pth"), "w") as f:
        f.write(site + "\n")
    work = tmp_path / "work"
    work.mkdir()
    env.update(HOME=str(tmp_path / "home"), BKSPARK_HOME=str(tmp_path / "bkspark-home"),
               PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python,
               PATH=f"{venv / 'bin'}:{env['PATH']}")

    def run(command: str, timeout: float = 300) -> str:
        done = subprocess.run(_hidden(command), cwd=work, env=env, capture_output=True,
                              text=True, timeout=timeout)
        assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    # the control: in the namespace, the system's librocksdb cannot be loaded ...
    control = subprocess.run(_hidden(f"{sys.executable} -c \"import ctypes; "
                                     f"ctypes.CDLL('{SYSTEM_ROCKSDB[-1]}')\""),
                             capture_output=True, text=True, timeout=60)
    assert control.returncode != 0, "the system's librocksdb was not hidden"
    # ... and the wheel's bkspark loads the RocksDB it bundles, from the environment
    where = run(f"{python} -c \"import sys, bkspark._native, bkspark, metadata, "
                "pyspark_bookkeeper as z; print(bkspark.__file__, metadata.__file__, z.__file__); "
                "print([l.split()[-1] for l in open('/proc/self/maps') if 'rocksdb' in l][0]); "
                f"print({REPO!r} in sys.path)\"")
    *modules, rocksdb, checkout_on_path = where.split()
    assert all(m.startswith(str(venv)) for m in modules), where
    assert "/bkspark.libs/librocksdb" in rocksdb and checkout_on_path == "False", where
    data = work / "cluster"
    try:
        run(f"bkspark localcluster --data-dir {data} --background", timeout=180)
        (work / "job.py").write_text(JOB)
        out = run(f"{python} job.py sqlite://{data}/metadata.db", timeout=420)
        assert "ROWS True 100" in out, out
    finally:                    # (not asserted: a failed start's own error is the one shown)
        subprocess.run(_hidden(f"bkspark localcluster --stop --data-dir {data}"), cwd=work,
                       env=env, capture_output=True, timeout=120)
