"""A bookie's threads, named where the operating system shows them.

Python 3.11 leaves every thread of a process named after the process in ``/proc`` (``top
-H``, ``ps -L``, ``bench/procstat.py``), so a bookie's garbage collection, its connections and
its pools all read as ``python3``. The threads made here carry their Python name to the OS as
well (its first 15 bytes), so a stall can be traced to the thread that used the CPU. The
engine's own C threads name themselves (``bks-ckpt``, ``bks-j*``, ``bks-reap``) and
RocksDB's are ``rocksdb:*``.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from bkspark import _native


def _named(target, name: str):
    def run(*args):
        _native.name_thread(name)
        return target(*args)
    return run


def thread(target, name: str, args: tuple = ()) -> threading.Thread:
    """A daemon thread running ``target(*args)``, named ``name`` in Python and in the OS."""
    return threading.Thread(target=_named(target, name), args=args, name=name, daemon=True)


def pool(workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose workers are named ``name`` in the OS (``name_N`` in Python)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name,
                              initializer=_native.name_thread, initargs=(name,))
