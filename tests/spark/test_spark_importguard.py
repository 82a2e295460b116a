"""Every connector object that Spark pickles to a Python worker unpickles, in a Python that
cannot import bkspark, into an ImportError that says which Python on which host lacks it and
what to do (``bkspark/spark/importguard.py``); where bkspark imports, it unpickles unchanged.
No SparkSession: ``test_spark_local_cluster.py`` shows the same error reaching the driver.
"""
from __future__ import annotations

import os
import site
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GUIDANCE = ("bkspark cannot be imported by the Python that Spark started for "
            'format("bookkeeper") on host ' + socket.gethostname() + ": ")


def _objects() -> dict:
    from pyspark.sql.types import BinaryType, StructField, StructType

    from bkspark.spark import codec
    from bkspark.spark.datasource import BookKeeperDataSource
    from bkspark.spark.reader import BookKeeperBatchReader, BookKeeperFilteringReader
    from bkspark.spark.stream import BookKeeperStreamReader
    from bkspark.spark.writer import BookKeeperBatchWriter, BookKeeperStreamWriter
    ds = BookKeeperDataSource({"path": "events", "metadataServiceUri": "sqlite:///nowhere.db"})
    rows = codec.record_spark_schema()
    values = StructType([StructField("value", BinaryType())])
    return {
        "data source class": BookKeeperDataSource,      # what planning processes unpickle
        "data source": ds,
        "batch reader": BookKeeperBatchReader(ds.opts, rows),
        "filtering reader": BookKeeperFilteringReader(ds.opts, rows),
        "stream reader": BookKeeperStreamReader(ds.opts, rows),
        "batch writer": BookKeeperBatchWriter(ds.opts, values, False),
        "stream writer": BookKeeperStreamWriter(ds.opts, values),
    }


def test_connector_objects_unpickle_unchanged_where_bkspark_imports():
    from pyspark.serializers import CloudPickleSerializer
    ser = CloudPickleSerializer()
    for what, obj in _objects().items():
        back = ser.loads(ser.dumps(obj))
        if isinstance(obj, type):
            assert back is obj, what
        else:
            assert type(back) is type(obj), what
            assert back.__dict__.keys() == obj.__dict__.keys(), what
            assert back.opts == obj.opts, what


def test_a_python_without_bkspark_says_what_to_install_where(tmp_path):
    """Unpickle each object, and a task command that holds a reader and the data source (the
    shape PySpark sends), in ``python -S`` with only site-packages' directories on its path:
    PySpark and pyarrow import, bkspark does not."""
    from pyspark.serializers import CloudPickleSerializer
    ser = CloudPickleSerializer()
    objs = _objects()
    reader, ds = objs["batch reader"], objs["data source"]

    def data_source_read_func(iterator):
        return reader.read(iterator), ds

    objs["read command"] = (data_source_read_func, reader.schema)
    for what, obj in objs.items():
        (tmp_path / f"{what}.pickle").write_bytes(ser.dumps(obj))
    code = ("import glob, sys\n"
            "from pyspark.serializers import CloudPickleSerializer\n"
            "for path in sorted(glob.glob(sys.argv[1] + '/*.pickle')):\n"
            "    try:\n"
            "        CloudPickleSerializer().loads(open(path, 'rb').read())\n"
            "        print(path, 'LOADED')\n"
            "    except Exception as exc:\n"
            "        print(path, type(exc).__name__, str(exc).replace('\\n', ' '))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(site.getsitepackages()))
    r = subprocess.run([sys.executable, "-S", "-c", code, str(tmp_path)], capture_output=True,
                       text=True, env=env, cwd=str(tmp_path), timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == len(objs), r.stdout
    for line in lines:
        assert " ImportError " + GUIDANCE + sys.executable + ", Python " in line, line
        assert "(ModuleNotFoundError: No module named 'bkspark')" in line, line
        assert "pip install bkspark" in line and "$PYSPARK_PYTHON" in line, line
        assert "bkspark spark-env pack" in line and "spark.archives=" in line, line


def test_zero_config_module_names_the_python_when_bkspark_does_not_import():
    """``pyspark_bookkeeper`` runs in the Python Spark's driver JVM starts to look data
    sources up; a dependency of the connector that does not import is reported with it."""
    code = ("import sys\n"
            "sys.modules['bkspark.spark.codec'] = None   # as if a dependency did not import\n"
            "import pyspark_bookkeeper\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=REPO), cwd=REPO, timeout=120,
                       check=False)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: " + GUIDANCE + sys.executable), r.stderr[-3000:]
    assert "import of bkspark.spark.codec halted" in last
