"""Processes whose wall clock is wrong, for tests of issue 47 ("one clock").

A process is skewed with libfaketime (Debian ``faketime``): ``LD_PRELOAD`` of its library
and ``FAKETIME`` set to an offset such as ``"+8d"`` or ``"-400d"``. The process's
``time.time()`` (and SQLite's ``'now'``, and ``CLOCK_REALTIME`` in C) is off by that much;
the kernel's own stamps (file times) and other processes are not. ``CLOCK_MONOTONIC`` is
left alone (``DONT_FAKE_MONOTONIC=1``): a host's wrong wall clock does not change how fast
its elapsed time runs. With ``FAKETIME_TIMESTAMP_FILE`` (:func:`skewed_env`'s ``step_file``)
the offset is read from a file on every call, so a test can step the clock of a running
process (an NTP step) by rewriting it (:func:`step`).

Timed waits: libfaketime turns the absolute deadline of a ``pthread_cond_timedwait`` on a
``CLOCK_REALTIME`` condition variable into a timeout relative to the call, so a step of the clock
never moves a wait as the kernel's clock does on a host (a step back by an hour makes such a wait
an hour longer there). ``skewed_env(..., wall_clock_waits=True)`` preloads a small shim (built
with ``cc`` on first use) before libfaketime that gives those waits the host's behaviour: a wait
ends when the process's wall clock reads its deadline, however the clock was stepped meanwhile.
Waits on ``CLOCK_MONOTONIC`` condition variables are left alone either way (see
``FAKETIME_FORCE_MONOTONIC_FIX`` in :func:`skewed_env`).

libfaketime 0.9.10 (Debian 12) fails ``time.sleep`` with ``EINVAL`` (its ``clock_nanosleep``
on the unfaked monotonic clock); :func:`skewed_env` puts a ``sitecustomize`` first on the
child's ``PYTHONPATH`` whose ``time.sleep`` waits in ``select`` instead, so the code under test
sleeps as it would on the skewed host.
"""
from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile

_CANDIDATES = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
               "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
               "/usr/lib/faketime/libfaketime.so.1")


def libfaketime() -> str | None:
    """The path of libfaketime's (single-threaded clock) library, or None if not installed."""
    for path in _CANDIDATES + tuple(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")):
        if os.path.exists(path):
            return path
    return None


def skewed_env(offset: str, base: dict | None = None, step_file: str | None = None,
               wall_clock_waits: bool = False) -> dict:
    """The environment of a process whose wall clock is ``offset`` off (libfaketime's
    syntax: ``"+8d"``, ``"-1h"``, ``"+660s"``). ``step_file``: the offset is read from
    that file (written now with ``offset``) on every clock call instead.
    ``wall_clock_waits``: timed waits on ``CLOCK_REALTIME`` condition variables last until
    the wall clock reads their deadline, as on a host whose clock is stepped (module doc).

    :raises RuntimeError: libfaketime is not installed (``apt-get install faketime``;
        ``make install`` does), or the shim of ``wall_clock_waits`` cannot be built.
    """
    lib = libfaketime()
    if lib is None:
        raise RuntimeError("libfaketime is not installed: apt-get install faketime "
                           "(make install and .ci/run install it)")
    env = dict(os.environ if base is None else base)
    libs = (wall_clock_waits_lib(), lib) if wall_clock_waits else (lib,)
    env["LD_PRELOAD"] = " ".join(p for p in (*libs, env.get("LD_PRELOAD", "")) if p)
    env["DONT_FAKE_MONOTONIC"] = "1"
    # with glibc >= 2.30 libfaketime 0.9.10 otherwise rebases the deadline of a wait on a
    # CLOCK_MONOTONIC condition variable on a faked monotonic time although monotonic time is
    # not faked: such waits returned at once (the storage engine's threads spun a core)
    env["FAKETIME_FORCE_MONOTONIC_FIX"] = "0"
    env["PYTHONPATH"] = os.pathsep.join([_sleep_site()] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if step_file is not None:
        step(step_file, offset)
        env["FAKETIME_TIMESTAMP_FILE"] = step_file
        env["FAKETIME_NO_CACHE"] = "1"
        env.pop("FAKETIME", None)
    else:
        env["FAKETIME"] = offset
    return env


_SLEEP_SITE = '''"""bkspark.testing.clockskew: time.sleep through select (module docstring)."""
import select
import time


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        select.select([], [], [], left)


time.sleep = _sleep
'''


def _sleep_site() -> str:
    """A directory holding the ``sitecustomize`` of skewed Python children (written once)."""
    tag = hashlib.sha256(_SLEEP_SITE.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"bkspark-clockskew-site-{tag}")
    if not os.path.exists(os.path.join(path, "sitecustomize.py")):
        os.makedirs(path, exist_ok=True)
        tmp = os.path.join(path, f"sitecustomize.py.{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(_SLEEP_SITE)
        os.replace(tmp, os.path.join(path, "sitecustomize.py"))
    return path


_WALL_CLOCK_WAITS_C = r"""
/* LD_PRELOAD'ed before libfaketime (bkspark.testing.clockskew): a timed wait on a CLOCK_REALTIME
 * condition variable lasts until the process's (faked) wall clock reads its deadline, as the
 * kernel's does when a host's clock is stepped; libfaketime alone makes the deadline relative to
 * the call.  Waits on CLOCK_MONOTONIC condition variables go to glibc as they are. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SLICE_NS 20000000LL /* how often a wall-clock wait looks at the wall clock */
#define MAXMONO 4096

typedef int (*init_fn)(pthread_cond_t *, const pthread_condattr_t *);
typedef int (*destroy_fn)(pthread_cond_t *);
typedef int (*wait_fn)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static const void *mono[MAXMONO]; /* the CLOCK_MONOTONIC condition variables */
static int nmono;

static void *sym(void *h, const char *name)
{
    void *p = dlvsym(h, name, "GLIBC_2.3.2");
    if (!p) {
        fprintf(stderr, "clockskew wall-clock waits: no %s\n", name);
        abort();
    }
    return p;
}

static void *next_sym(void **cache, const char *name) /* the next definition: libfaketime's */
{
    void *p = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (!p) {
        p = sym(RTLD_NEXT, name);
        __atomic_store_n(cache, p, __ATOMIC_RELEASE);
    }
    return p;
}

static wait_fn glibc_wait(void) /* glibc's own, past libfaketime's */
{
    static void *f;
    void *p = __atomic_load_n(&f, __ATOMIC_ACQUIRE);
    if (!p) {
        void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
        p = sym(libc ? libc : RTLD_NEXT, "pthread_cond_timedwait");
        __atomic_store_n(&f, p, __ATOMIC_RELEASE);
    }
    return (wait_fn)p;
}

static int find(const void *cv) /* reg_mu held */
{
    for (int i = 0; i < nmono; i++)
        if (mono[i] == cv)
            return i;
    return -1;
}

static void set_mono(const void *cv, int on)
{
    pthread_mutex_lock(&reg_mu);
    int i = find(cv);
    if (on && i < 0) {
        if (nmono == MAXMONO) {
            fprintf(stderr, "clockskew wall-clock waits: over %d monotonic conds\n", MAXMONO);
            abort();
        }
        mono[nmono++] = cv;
    } else if (!on && i >= 0) {
        mono[i] = mono[--nmono];
    }
    pthread_mutex_unlock(&reg_mu);
}

static int is_mono(const void *cv)
{
    pthread_mutex_lock(&reg_mu);
    int r = find(cv) >= 0;
    pthread_mutex_unlock(&reg_mu);
    return r;
}

int pthread_cond_init(pthread_cond_t *cv, const pthread_condattr_t *a)
{
    static void *next;
    clockid_t clk = CLOCK_REALTIME;
    if (a)
        pthread_condattr_getclock(a, &clk);
    int rc = ((init_fn)next_sym(&next, "pthread_cond_init"))(cv, a);
    if (rc == 0)
        set_mono(cv, clk == CLOCK_MONOTONIC);
    return rc;
}

int pthread_cond_destroy(pthread_cond_t *cv)
{
    static void *next;
    set_mono(cv, 0);
    return ((destroy_fn)next_sym(&next, "pthread_cond_destroy"))(cv);
}

int pthread_cond_timedwait(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *abstime)
{
    wait_fn wait = glibc_wait();
    if (is_mono(cv) || abstime->tv_nsec < 0 || abstime->tv_nsec >= 1000000000L)
        return wait(cv, mu, abstime);
    for (;;) {
        struct timespec wall, real;
        clock_gettime(CLOCK_REALTIME, &wall); /* libfaketime's: the process's wall clock */
        long long left = (long long)(abstime->tv_sec - wall.tv_sec) * 1000000000LL +
                         (abstime->tv_nsec - wall.tv_nsec);
        if (left <= 0)
            return ETIMEDOUT;
        if (left > SLICE_NS)
            left = SLICE_NS;
        syscall(SYS_clock_gettime, CLOCK_REALTIME, &real); /* the kernel's, which glibc waits on */
        real.tv_nsec += (long)left;
        if (real.tv_nsec >= 1000000000L) {
            real.tv_sec++;
            real.tv_nsec -= 1000000000L;
        }
        int rc = wait(cv, mu, &real);
        if (rc != ETIMEDOUT)
            return rc;
    }
}
"""


def wall_clock_waits_lib() -> str:
    """The path of the shim of ``skewed_env(..., wall_clock_waits=True)``, built with ``cc``
    into the temporary directory on first use (one per version of its source)."""
    tag = hashlib.sha256(_WALL_CLOCK_WAITS_C.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"bkspark-wallwaits-{tag}.so")
    if os.path.exists(path):
        return path
    src = path[:-3] + f".{os.getpid()}.c"
    tmp = path + f".{os.getpid()}.tmp"
    try:
        with open(src, "w") as f:
            f.write(_WALL_CLOCK_WAITS_C)
        p = subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-o", tmp, src, "-ldl"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"cannot build the wall-clock waits shim: {p.stderr.strip()}")
        os.replace(tmp, path)
    finally:
        for f in (src, tmp):
            if os.path.exists(f):
                os.unlink(f)
    return path


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
