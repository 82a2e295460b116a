"""Per-process clients: one BookKeeper client (and LogStore) per metadata URI, client
settings (the ``client.*`` options) and process.

Spark runs the connector's code in Python workers that are reused across tasks; building a
client (metadata session, gRPC channels, threads) per task would dominate small tasks, so
clients are cached per process id (a forked worker never reuses its parent's client) and
live until the process exits.
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import threading

_lock = threading.Lock()
_clients: dict = {}


def _key(uri: str, settings: dict | None) -> tuple:
    return (os.getpid(), uri, tuple(sorted((settings or {}).items())))


def bookkeeper(uri: str, settings: dict | None = None):
    """This process's client of ``uri`` with ``settings`` (ClientConfig fields: the
    ``client_settings`` of the options)."""
    from bkspark.client import BookKeeper
    key = _key(uri, settings)
    with _lock:
        bk = _clients.get(key)
        if bk is None or getattr(bk, "_closed", False):
            bk = BookKeeper(uri, **(settings or {}))
            _clients[key] = bk
        return bk


def log_store(opts):
    """A LogStore over the cached client with the replication settings of ``opts``."""
    from bkspark.log import LogStore
    return LogStore(bookkeeper(opts.metadata_uri, opts.client_settings), password=opts.password,
                    **opts.ledger_options())


def drop(uri: str, settings: dict | None = None) -> None:
    """Close and forget this process's client for ``uri`` and ``settings`` (after a fatal
    client error)."""
    with _lock:
        bk = _clients.pop(_key(uri, settings), None)
    if bk is not None:
        try:
            bk.close()
        except Exception:  # noqa: BLE001
            pass


@atexit.register
def _close_all() -> None:
    pid = os.getpid()
    for (p, *_), bk in list(_clients.items()):
        if p == pid:
            try:
                bk.close()
            except Exception:  # noqa: BLE001
                pass


# ---- the worker's heap ----------------------------------------------------------------------

_worker_pid = None      # this process is a PySpark worker (os.getpid() when it was checked)


def freeze_worker_heap() -> None:
    """At the start of a task in a PySpark worker: move every object alive now out of the
    cyclic collector's reach (``gc.freeze``, an O(1) list move).

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker, and a
    forked worker's first full collection writes to every page it inherited. With pyarrow,
    pandas, gRPC and this package loaded (~100k objects) that cost 30-140 ms of CPU per
    task, a third of a read task's Python time on a 2-core machine. What is alive when a task
    starts (the previous task's garbage was just collected by the daemon) is the process's
    long-lived state: modules, the cached client. Frozen objects are still freed by
    reference counting. Other processes (the driver: the user's application) are left alone.
    """
    global _worker_pid
    pid = os.getpid()
    if _worker_pid != pid:
        import sys
        main = getattr(sys.modules.get("__main__"), "__spec__", None)
        if main is None or not main.name.startswith("pyspark."):
            return
        _worker_pid = pid
    import gc
    gc.freeze()


# ---- opt-in profiling of Spark tasks ---------------------------------------------------------

PROFILE_ENV = "BKSPARK_SPARK_PROFILE"     # a directory: each task dumps <kind>-<pid>-<n>.prof


def _dump(prof, kind: str, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    prof.dump_stats(os.path.join(out, f"{kind}-{os.getpid()}-{next(_profile_seq)}.prof"))


@contextlib.contextmanager
def profile(kind: str):
    """The block (a write task, a sink's commit), profiled with cProfile into
    ``$BKSPARK_SPARK_PROFILE`` when that variable is set."""
    out = os.environ.get(PROFILE_ENV)
    if not out:
        yield
        return
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        _dump(prof, kind, out)


def profiled(kind: str, gen):
    """``gen`` (an iterator of a task), profiled with cProfile into ``$BKSPARK_SPARK_PROFILE``
    when that variable is set (Spark's Python workers inherit the driver's environment); the
    time between its items (the consumer's) does not count."""
    out = os.environ.get(PROFILE_ENV)
    if not out:
        yield from gen
        return
    import cProfile
    prof = cProfile.Profile()
    it = iter(gen)
    try:
        while True:
            prof.enable()
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                prof.disable()
            yield item
    finally:
        _dump(prof, kind, out)


_profile_seq = itertools.count()
