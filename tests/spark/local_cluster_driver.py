"""One Spark application on ``local-cluster[2,1,1024]`` (a master, two workers, each executor
its own JVM with its own Python workers) running the connector's scenarios against a real
bookie cluster; writes what it saw as JSON for ``test_spark_local_cluster.py`` to check.

    python tests/spark/local_cluster_driver.py METADATA_URI OUT.json

Scenarios (each on logs of its own): batch record and arrow round trips; a streaming copy;
a batch write and a micro-batch during which the executor JVM running one task is
SIGKILLed (the task stalls after its first acknowledged rows, ``_testFault=stallTask:0``;
its registration names the task's Python process, whose executor JVM is found through
``/proc``); last, the connector registered with an interpreter whose executors (then also
its planning) cannot import bkspark: what error the application sees. A separate process
because one Python process holds one SparkContext, and the rest of the suite shares a
``local[2]`` one.

Which Python Spark starts (``bkspark/spark/README.md``, "Which Python runs the connector"):
the driver sets ``PYSPARK_PYTHON`` (and no ``PYSPARK_DRIVER_PYTHON``) in the environment
the driver's JVM starts with -- the supported way -- to a wrapper that logs every process
Spark starts through it (module, driver or executor side) and runs this Python; a
``python3`` first in ``PATH`` logs any process Spark would start by that bare name.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid

EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"

# A Python that Spark starts: log "<tag> <driver|executor> <pid> <args>", then run this Python.
# HIDE: on executors (or everywhere) bkspark is made unimportable: no site-packages .pth files
# (-S; the packages' directories are passed in PYTHONPATH instead), no PYTHONPATH entry
# holding a bkspark package, and / as the working directory (`python -m` puts it on sys.path).
WRAPPER = """#!/bin/sh
case "$(tr '\\0' ' ' < /proc/$PPID/cmdline 2>/dev/null)" in
  *{executor_class}*) side=executor ;;
  *) side=driver ;;
esac
echo "{tag} $side $$ $*" >> {log}
if [ {hide} = all ] || [ {hide}-$side = executors-executor ]; then
  keep=""
  for p in $(printf '%s' "$PYTHONPATH" | tr ':' ' '); do
    [ -e "$p/bkspark" ] || keep="$keep$p:"
  done
  PYTHONPATH="$keep{site}"; export PYTHONPATH
  cd /
  exec {python} -S "$@"
fi
exec {python} "$@"
"""


def make_python(directory: str, tag: str, log_path: str, hide: str = "none") -> str:
    """An executable ``<directory>/python3`` (see WRAPPER); its path."""
    import site
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "python3")
    with open(path, "w") as f:
        f.write(WRAPPER.format(executor_class=EXECUTOR_CLASS, tag=tag, log=log_path, hide=hide,
                               site=":".join(site.getsitepackages()), python=sys.executable))
    os.chmod(path, 0o755)
    return path


def python_launches(log_path: str) -> list[dict]:
    """The processes the wrappers started: tag, side, pid and the worker module they ran."""
    out = []
    try:
        with open(log_path) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        tag, side, pid, *args = line.split()
        out.append({"tag": tag, "side": side, "pid": int(pid),
                    "module": args[-1] if "-m" in args else " ".join(args)[:80]})
    return out


def executor_jvm_of(pid: int) -> int | None:
    """The executor JVM among ``pid``'s ancestors (a task's Python worker: worker -> daemon ->
    executor)."""
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if EXECUTOR_CLASS.encode() in f.read():
                    return pid
            with open(f"/proc/{pid}/status") as f:
                pid = int(next(line for line in f if line.startswith("PPid:")).split()[1])
        except (OSError, StopIteration, ValueError):
            return None
    return None


def kill_stalled_executor(logs, is_job, timeout: float = 120.0, seen: dict | None = None) -> int:
    """Wait for a task of the write jobs ``is_job(key)`` selects to register a ledger as
    partition 0's first attempt; SIGKILL the executor JVM running it; its pid. ``seen`` gets
    the task's pid and its parent's (the Python daemon that forked it)."""
    from bkspark.spark import pending
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            keys = [k for k in logs.store.children(pending.PENDING_ROOT) if is_job(k)]
        except Exception:  # noqa: BLE001 - no write job yet
            keys = []
        for key in keys:
            try:
                children = logs.store.children(pending.job_path(key))
            except Exception:  # noqa: BLE001 - cleaned up meanwhile
                continue
            for child in filter(str.isdigit, children):
                try:
                    info = json.loads(logs.store.get(f"{pending.job_path(key)}/{child}")[0])
                except Exception:  # noqa: BLE001 - unregistered meanwhile
                    continue
                if info.get("partition") == 0 and info.get("attempt") == 0 and info.get("pid"):
                    jvm = executor_jvm_of(int(info["pid"]))
                    if jvm is not None:
                        if seen is not None:
                            seen.update(task_pid=int(info["pid"]), parent_pid=_ppid(info["pid"]))
                        os.kill(jvm, signal.SIGKILL)
                        return jvm
        time.sleep(0.2)
    raise RuntimeError(f"no stalled task appeared within {timeout}s")


def _ppid(pid) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line for line in f if line.startswith("PPid:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return None


def _jobs(logs) -> list[str]:
    from bkspark.spark import pending
    try:
        return logs.store.children(pending.PENDING_ROOT)
    except Exception:  # noqa: BLE001 - none yet
        return []


def values(spark, uri, log_name) -> list[str]:
    rows = (spark.read.format("bookkeeper").option("metadataServiceUri", uri).load(log_name)
            .selectExpr("CAST(value AS STRING) AS v").collect())
    return [r.v for r in rows]


def main(uri: str, out_path: str) -> None:
    from pyspark.sql import SparkSession

    from bkspark.client import BookKeeper
    from bkspark.log import LogStore

    # The supported way to choose the Python of format("bookkeeper") found without
    # registration: PYSPARK_PYTHON (and no PYSPARK_DRIVER_PYTHON, which would win) in the
    # environment the driver's JVM starts with -- here this process's, before Spark starts.
    pythons = os.path.join(os.path.dirname(os.path.abspath(out_path)), "pythons")
    launches = os.path.join(pythons, "launches.log")
    os.environ["PYSPARK_PYTHON"] = make_python(os.path.join(pythons, "configured"),
                                               "configured", launches)
    os.environ.pop("PYSPARK_DRIVER_PYTHON", None)
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(make_python(
        os.path.join(pythons, "path"), "path", launches)), os.environ.get("PATH", "")])

    t0 = time.monotonic()
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("bkspark-lc")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.executor.memory", "512m")
             .config("spark.task.maxFailures", "4")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    tag = uuid.uuid4().hex[:6]
    result: dict = {"startup_s": round(time.monotonic() - t0, 1)}
    bk = BookKeeper(uri)
    logs = LogStore(bk)

    def wr(df, log_name, **opts):
        w = df.write.format("bookkeeper").option("metadataServiceUri", uri).mode("append")
        for k, v in opts.items():
            w = w.option(k, v)
        w.save(log_name)

    # -- batch, both formats, tasks on both executors --------------------------------------
    name = f"lc-record-{tag}"
    wr(spark.range(0, 1000, 1, 4).selectExpr("CAST(id AS STRING) AS value"), name)
    result["record"] = {"values": sorted(values(spark, uri, name), key=int)}
    daemons = spark.sparkContext.parallelize(range(8), 8).mapPartitions(
        lambda _it: [os.getppid()]).collect()            # one Python daemon per executor JVM
    result["executor_processes"] = len(set(daemons))
    result["record"]["at_s"] = round(time.monotonic() - t0, 1)

    name = f"lc-arrow-{tag}"
    df = spark.range(0, 500, 1, 4).selectExpr("id", "CAST(id * 1.5 AS DOUBLE) AS x",
                                              "CONCAT('k', CAST(id AS STRING)) AS k")
    wr(df, name, entryFormat="arrow")
    back = (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
            .option("entryFormat", "arrow").load(name))
    result["arrow"] = {"schema": back.schema.simpleString(),
                       "rows": sorted(tuple(r) for r in back.collect()) ==
                       sorted(tuple(r) for r in df.collect())}
    result["arrow"]["at_s"] = round(time.monotonic() - t0, 1)

    # -- streaming copy ---------------------------------------------------------------------
    src, dst = f"lc-src-{tag}", f"lc-copy-{tag}"
    with logs.open_writer(src) as w:
        for i in range(300):
            w.append_async(str(i).encode())
    q = (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
         .option("log", src).option("startingOffsets", "earliest")
         .option("maxEntriesPerTrigger", 100).load()
         .writeStream.format("bookkeeper").option("metadataServiceUri", uri).option("log", dst)
         .option("checkpointLocation", os.path.join(os.path.dirname(out_path), "ckpt-copy"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    result["stream"] = {"values": sorted(values(spark, uri, dst), key=int)}
    result["stream"]["at_s"] = round(time.monotonic() - t0, 1)

    # -- an executor JVM killed in the middle of a batch write ------------------------------
    name = f"lc-kill-batch-{tag}"
    killed: dict = {}
    batch_jobs = {k for k in _jobs(logs)}
    t = threading.Thread(target=lambda: killed.update(pid=kill_stalled_executor(
        logs, lambda key: key.startswith("batch-") and key not in batch_jobs, seen=killed)))
    t.start()
    wr(spark.range(0, 2000, 1, 4).selectExpr("CAST(id AS STRING) AS value"), name,
       _testFault="stallTask:0")
    t.join()
    result["kill_batch"] = {"killed": killed.get("pid"), "task_pid": killed.get("task_pid"),
                            "task_parent_pid": killed.get("parent_pid"),
                            "values": sorted(values(spark, uri, name), key=int)}
    result["kill_batch"]["at_s"] = round(time.monotonic() - t0, 1)

    # -- an executor JVM killed in the middle of a micro-batch -----------------------------
    src, dst = f"lc-ksrc-{tag}", f"lc-kdst-{tag}"
    with logs.open_writer(src) as w:
        for i in range(600):
            w.append_async(str(i).encode())
    killed = {}
    sink_jobs = {k for k in _jobs(logs)}
    t = threading.Thread(target=lambda: killed.update(pid=kill_stalled_executor(
        logs, lambda key: key.startswith("sink-") and key not in sink_jobs)))
    t.start()
    q = (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
         .option("log", src).option("startingOffsets", "earliest")
         .option("maxEntriesPerTrigger", 200).load()
         .writeStream.format("bookkeeper").option("metadataServiceUri", uri).option("log", dst)
         .option("_testFault", "stallTask:0")
         .option("checkpointLocation", os.path.join(os.path.dirname(out_path), "ckpt-kill"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    t.join()
    result["kill_stream"] = {"killed": killed.get("pid"),
                             "values": sorted(values(spark, uri, dst), key=int)}
    result["kill_stream"]["at_s"] = round(time.monotonic() - t0, 1)

    # -- a Python without bkspark: on the executors only, then everywhere -------------------
    # bkspark.spark.register() gives the source the SparkContext's pythonExec (what Python
    # UDFs run); registering in spark.newSession() leaves the zero-config one of `spark`.
    for key, hide in (("nobk_executors", "executors"), ("nobk_everywhere", "all")):
        result[key] = read_without_bkspark(spark, uri, f"lc-record-{tag}", make_python(
            os.path.join(pythons, key), key, launches, hide=hide))
        result[key]["at_s"] = round(time.monotonic() - t0, 1)
    result["python"] = {"exec": sys.executable, "configured": os.environ["PYSPARK_PYTHON"],
                        "launches": python_launches(launches)}
    result["total_s"] = round(time.monotonic() - t0, 1)
    bk.close()
    spark.stop()
    with open(out_path, "w") as f:
        json.dump(result, f)


def read_without_bkspark(spark, uri: str, log_name: str, python: str) -> dict:
    """Read ``log_name`` through the connector registered in ``spark.newSession()`` with
    ``python`` as the interpreter Spark starts for it; the error the application sees."""
    from bkspark.spark import register
    other = spark.newSession()
    sc = spark.sparkContext
    saved, sc.pythonExec = sc.pythonExec, python
    try:
        register(other)
    finally:
        sc.pythonExec = saved
    try:
        other.read.format("bookkeeper").option("metadataServiceUri", uri).load(log_name).collect()
        return {"python": python, "error": None}
    except Exception as exc:  # noqa: BLE001 - what the application sees is the point
        return {"python": python, "error": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
