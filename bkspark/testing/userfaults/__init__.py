"""Randomized fault runs of the user-level layers (logs, readers, Spark) with a checker.

    python -m bkspark.testing.userfaults --seed 7 --duration 240 --store both --report r.json

The sibling of :mod:`bkspark.testing.faults` (which checks the ledger protocol) one layer up.
A **run** starts metadata (the embedded SQLite store, or a real ZooKeeper server in its own
chroot), five real bookie processes (``BookieCluster``) and workload *processes*
(:mod:`.workloads`, :mod:`.spark_jobs`), each recording every acknowledgement or commit in a
line-flushed ack file before counting it:

* LogWriter appenders on three shared logs (``app-0`` -- the stream's source, ``app-1`` --
  cut by retention and truncation, ``ow-0`` -- overwritten by Spark jobs while written),
  rolling often and re-taking their log when fenced;
* a tailing LogReader from EARLIEST on ``app-0``, and a reader of ``app-1`` moving a cursor;
* a Spark batch driver (a real SparkSession, ``local[2,4]``) looping over write jobs:
  append, append with ``writerId``/``writerSequence`` and its re-run, a failing first task
  attempt, a commit that raises after its append and its re-run, overwrite of ``ow-0`` while
  its LogWriter writes, overwrite of ``batch-0``;
* a Spark streaming query ``app-0`` -> ``stream-out`` (option ``queryId``, a
  ``checkpointLocation``, a short client read timeout);
* the keys workload: 1,100 batch commits with distinct writer ids into ``keys-0``, then
  re-runs of the earliest ``(writerId, 0)`` (in process, and through Spark);
* retention passes every second on ``app-1`` (by age) and ``batch-0`` (by size).

The **schedule** (:func:`make_schedule`) is a pure function of the seed: bookies paused
(also every bookie of the stream source's open ledger, longer than the query's read timeout),
SIGKILLed and restarted; lost metadata answers (applied, held back, or not applied) armed in
the workload's own process through arm files (Spark's Python workers claim them through
``sitehook/sitecustomize.py``, only in a commit of a job without a writer id); another
client truncating ``batch-0`` between a Spark commit that was applied and the loss of its
answer; metadata session expiry (SIGUSR1, or an arm file for Spark workers); log takeovers
by a second writer; SIGKILL of the Spark drivers (and restart from the checkpoint), of the
streaming driver between a batch's offsets and its commit, restarted while every bookie of
the ledger that batch ends in is paused (and the source's writer stopped) until the new
driver planned the batch again; the streaming driver with its checkpoint lost (restart with
a new ``checkpointLocation`` and the same ``queryId``: it must continue exactly or refuse),
a query of its own run twice that way (``lc-out-<k>``), and of PySpark workers (the
executor side of ``local[2]``); truncations (``LogStore.truncate``) and ``bkspark shell
apply-retention``.

The **checker** (:class:`Checker`) heals the cluster, reads every log back through a fresh
client and reports violations by kind (its docstring): ``acked-missing``, ``duplicate``,
``batch-not-exactly-once``, ``stream-skip``, ``stream-repeat``, ``log-names-deleted-ledger``,
``superseded-write-acked``, ``out-of-order``, ``reader-skip``. What retention, truncation and
overwrites legitimately removed is told from their recorded times (each cut removes a prefix
or the whole list). The report: runs, faults applied by kind, lost answers taken, rows
checked, violations by kind, the time to the first violation (of each kind). A failing run
prints its seed; ``--seed S --runs 1 --run-seconds D --store X`` replays its schedule (the
interleavings of processes are not replayed).
"""


def __getattr__(name):          # (cheap to import: Spark's workers import .workloads)
    if name == "Checker":
        from .checker import Checker
        return Checker
    if name == "UserFaultRun":
        from .runner import UserFaultRun
        return UserFaultRun
    if name in ("FAULT_KINDS", "Fault", "make_schedule"):
        from . import schedule
        return getattr(schedule, name)
    if name in ("main", "run_campaign"):
        from . import cli
        return getattr(cli, name)
    raise AttributeError(name)


__all__ = ["Checker", "FAULT_KINDS", "Fault", "UserFaultRun", "main", "make_schedule",
           "run_campaign"]
