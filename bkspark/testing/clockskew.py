"""Processes whose wall clock is wrong, for tests of issue 47 ("one clock").

A process is skewed with libfaketime (Debian ``faketime``): ``LD_PRELOAD`` of its library
and ``FAKETIME`` set to an offset such as ``"+8d"`` or ``"-400d"``. The process's
``time.time()`` (and SQLite's ``'now'``, and ``CLOCK_REALTIME`` in C) is off by that much;
the kernel's own stamps (file times) and other processes are not. ``CLOCK_MONOTONIC`` is
left alone (``DONT_FAKE_MONOTONIC=1``): a host's wrong wall clock does not change how fast
its elapsed time runs. With ``FAKETIME_TIMESTAMP_FILE`` (:func:`skewed_env`'s ``step_file``)
the offset is read from a file on every call, so a test can step the clock of a running
process (an NTP step) by rewriting it (:func:`step`).
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys

_CANDIDATES = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
               "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
               "/usr/lib/faketime/libfaketime.so.1")


def libfaketime() -> str | None:
    """The path of libfaketime's (single-threaded clock) library, or None if not installed."""
    for path in _CANDIDATES + tuple(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")):
        if os.path.exists(path):
            return path
    return None


def skewed_env(offset: str, base: dict | None = None, step_file: str | None = None) -> dict:
    """The environment of a process whose wall clock is ``offset`` off (libfaketime's
    syntax: ``"+8d"``, ``"-1h"``, ``"+660s"``). ``step_file``: the offset is read from
    that file (written now with ``offset``) on every clock call instead.

    :raises RuntimeError: libfaketime is not installed (``apt-get install faketime``;
        ``make install`` does).
    """
    lib = libfaketime()
    if lib is None:
        raise RuntimeError("libfaketime is not installed: apt-get install faketime "
                           "(make install and .ci/run install it)")
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = " ".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    env["DONT_FAKE_MONOTONIC"] = "1"
    if step_file is not None:
        step(step_file, offset)
        env["FAKETIME_TIMESTAMP_FILE"] = step_file
        env["FAKETIME_NO_CACHE"] = "1"
        env.pop("FAKETIME", None)
    else:
        env["FAKETIME"] = offset
    return env


def step(step_file: str, offset: str) -> None:
    """Set the offset of the processes started with ``skewed_env(..., step_file=...)``."""
    tmp = step_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(offset + "\n")
    os.replace(tmp, step_file)


def run_skewed(offset: str, code: str, *args: str, timeout: float = 120.0,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -c code args...`` with its wall clock ``offset`` off; the repository
    stays importable. Returns the completed process (stdout and stderr as text)."""
    from bkspark.testing.faults.common import REPO_ROOT
    e = skewed_env(offset, env)
    e["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + [p for p in e.get("PYTHONPATH", "")
                                                     .split(os.pathsep) if p])
    return subprocess.run([sys.executable, "-c", code, *args], env=e, capture_output=True,
                          text=True, timeout=timeout)
