"""The disk-fault campaign (issue 46): the storage engine under injected I/O errors, with a
checker. ``python -m bkspark.testing.diskfaults --seed S --runs N [--report r.json]``.

Runs one after another on a set of directories (two journals, two ledger directories; a new
set every :data:`RUNS_PER_DIRECTORY` runs); each
is a :mod:`worker <bkspark.testing.diskfaults.worker>` process that opens the storage (replaying
the previous run's end), arms the fault rules its seed gives -- EIO or ENOSPC on open, write,
``sync_file_range``, fdatasync/fsync, rename, fallocate or read, short writes, a failed writeback
losing the file's unsynced bytes -- and adds, fences, sets explicit LACs, deletes, checkpoints
and compacts, printing what was acknowledged. It ends by a power loss (every byte not yet
fdatasync'ed dropped), a kill -9 at a random moment, or a clean close. Run ``i`` uses seed
``seed * 1000 + i``.

After each run the checker (this process, no faults) opens the storage and reports:

* ``refused-start`` -- the storage does not open (the faults were transient: a correct engine
  starts; the campaign then goes on in fresh directories);
* ``acked-entry-lost`` / ``acked-entry-wrong`` -- an acknowledged entry of a ledger never
  deleted is unreadable, missing or not byte-identical;
* ``deleted-ledger-returned`` -- a ledger whose delete was acknowledged exists;
* ``fence-lost`` -- an acknowledged fence is gone; ``lac-lost`` -- the explicit LAC is older than
  the last one acknowledged;
* ``hung`` -- a run did not finish within its time; and whatever a worker reported while
  running (``V`` lines: a read that answered wrong bytes or "no such entry").

Limit: the ledger index (RocksDB) does its own I/O, outside the fault layer: its files take no
injected fault and a power loss keeps what it wrote unsynced, so a checkpoint that moved the
mark without syncing the index would go unseen here (``tests/storage/test_storage_index.py``'s
crash points and the real-device test ``test_a_failed_index_write_is_sticky_and_says_full``
cover the index's ordering and failures).

Replay one run: ``python -m bkspark.testing.diskfaults --seed S --runs 1 --first RUN``; the same
directory state needs the runs before it (``--runs RUN+1``).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from bkspark import errors

from .worker import body_for, config, schedule

RUN_TIMEOUT_S = 90.0
#: runs on one set of directories before the next set starts (the checker re-reads everything
#: acknowledged on a set after each of its runs: the cost of a run stays bounded)
RUNS_PER_DIRECTORY = 25


class Acked:
    """What the workers had acknowledged, over the runs on one set of directories."""

    def __init__(self) -> None:
        self.entries: dict[int, set[int]] = collections.defaultdict(set)
        self.fenced: set[int] = set()
        self.lac: dict[int, int] = {}
        self.deleting: set[int] = set()
        self.deleted: set[int] = set()

    def take(self, line: str) -> None:
        p = line.split()
        if p[0] == "A":
            lid, a, b = map(int, p[1:4])
            self.entries[lid].update(range(a, b + 1))
        elif p[0] == "F":
            self.fenced.add(int(p[1]))
        elif p[0] == "X":
            lid, n = int(p[1]), int(p[2])
            self.lac[lid] = max(n, self.lac.get(lid, 0))
        elif p[0] == "d":
            self.deleting.add(int(p[1]))
        elif p[0] == "D":
            self.deleted.add(int(p[1]))


def check(d: str, acked: Acked, violation, rnd: random.Random) -> int:
    """Open the storage on ``d`` and check everything acknowledged; the entries checked, or -1
    when it does not open."""
    from bkspark.bookie.storage import Storage
    try:
        s = Storage(config(d))
    except errors.BKError as exc:
        violation("refused-start", error=str(exc)[:400])
        return -1
    checked = 0
    try:
        for lid, ents in sorted(acked.entries.items()):
            if lid in acked.deleting:
                continue
            for e in sorted(ents):
                checked += 1
                try:
                    got = s.read_entry(lid, e)
                except errors.BKError as exc:
                    violation("acked-entry-lost", ledger=lid, entry=e, error=repr(exc)[:200])
                    continue
                if got != body_for(lid, e):
                    violation("acked-entry-wrong", ledger=lid, entry=e)
        for lid in sorted(acked.deleted):
            if s.has_ledger(lid):
                violation("deleted-ledger-returned", ledger=lid)
        for lid in sorted(acked.fenced - acked.deleting):
            if not s.is_fenced(lid):
                violation("fence-lost", ledger=lid)
        for lid, n in sorted(acked.lac.items()):
            if lid in acked.deleting:
                continue
            got = s.explicit_lac(lid)
            have = int(got.split(b":")[2]) if got else 0
            if have < n:
                violation("lac-lost", ledger=lid, acked=n, stored=have)
    finally:
        if rnd.random() < 0.5:
            s.close()
        else:
            s._store.close(checkpoint=False)
    return checked


def run_one(d: str, seed: int, index: int, pythonpath: str | None) -> tuple[list[str], str, bool, int]:
    """Run worker ``seed`` on ``d``: (its lines, its stderr tail, whether it hung, its exit
    status)."""
    plan = schedule(seed)
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.Popen([sys.executable, "-m", "bkspark.testing.diskfaults", "worker", d,
                          str(seed), str(index)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env)
    kill_at = None
    if plan["end"] == "kill":
        kill_at = time.monotonic() + random.Random(seed ^ 0xC0FFEE).uniform(0.2, 3.0)
    hung = [False]

    def killer():
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while p.poll() is None:
            now = time.monotonic()
            if kill_at is not None and now >= kill_at:
                p.send_signal(signal.SIGKILL)
                return
            if now >= deadline:
                hung[0] = True
                p.send_signal(signal.SIGKILL)
                return
            time.sleep(0.02)
    t = threading.Thread(target=killer, daemon=True)
    t.start()
    lines = [ln.decode(errors="replace").rstrip("\n") for ln in p.stdout]
    err = p.stderr.read().decode(errors="replace")
    p.wait()
    t.join()
    return lines, err[-2000:], hung[0], p.returncode


def run_campaign(seed: int, runs: int, workdir: str | None = None, keep: bool = False,
                 first: int = 0, pythonpath: str | None = None, verbose: bool = False,
                 max_seconds: float | None = None) -> dict:
    base = workdir or tempfile.mkdtemp(prefix="bkspark-diskfaults-")
    t0 = time.monotonic()
    faults: collections.Counter = collections.Counter()
    endings: collections.Counter = collections.Counter()
    violations: list[dict] = []
    rnd = random.Random(seed)
    session = 0
    d = os.path.join(base, f"s{session}")
    acked = Acked()
    checked_total = 0
    done = 0
    for i in range(first, first + runs):
        if max_seconds is not None and time.monotonic() - t0 > max_seconds:
            break
        run_seed = seed * 1000 + i
        plan = schedule(run_seed)
        lines, err, hung, status = run_one(d, run_seed, i, pythonpath)
        done += 1
        endings[plan["end"]] += 1

        def violation(kind, **details):
            v = {"kind": kind, "run": i, "seed": run_seed, "t": round(time.monotonic() - t0, 1),
                 **details}
            violations.append(v)
            if verbose:
                print(f"VIOLATION {json.dumps(v)}", flush=True)
        if hung:
            violation("hung", stderr=err[-500:])
        opened = False
        for ln in lines:
            if not ln:
                continue
            if ln == "O":
                opened = True
            elif ln[0] == "I":
                _, op, _where, errno_, mode = ln.split()
                faults[f"{op}:{'short' if mode == 'short' else errno_}"] += 1
            elif ln[0] == "V":
                violation(ln.split()[1], detail=ln)
            elif ln[0] == "E":
                endings["open-failed-under-faults"] += 1
            else:
                acked.take(ln)
        if not opened and status not in (-signal.SIGKILL, 3):
            violation("worker-failed", status=status, stderr=err[-800:])
        n = check(d, acked, violation, rnd)
        if verbose:
            print(f"run {i} seed={run_seed} end={plan['end']} rules={len(plan['rules'])} "
                  f"acks={sum(1 for ln in lines if ln[:1] in 'AFXD')} checked={max(n, 0)}",
                  flush=True)
        if n >= 0:
            checked_total += n
        if n < 0 or (i - first + 1) % RUNS_PER_DIRECTORY == 0:
            # (a directory that does not open is kept for a look; the others go)
            if n >= 0 and not violations and not keep:
                shutil.rmtree(d, ignore_errors=True)
            session += 1
            d = os.path.join(base, f"s{session}")
            acked = Acked()
    by_kind = collections.Counter(v["kind"] for v in violations)
    report = {"seed": seed, "runs": done, "first": first, "faults": dict(sorted(faults.items())),
              "faults_total": sum(faults.values()), "endings": dict(endings),
              "entries_checked": checked_total, "violations_by_kind": dict(by_kind),
              "time_to_first_violation_s": violations[0]["t"] if violations else None,
              "violations": violations, "wall_seconds": round(time.monotonic() - t0, 1),
              "workdir": base if keep or violations else None}
    if not keep and not violations:
        shutil.rmtree(base, ignore_errors=True)
    return report


def format_report(r: dict) -> str:
    lines = [f"disk-fault campaign: seed={r['seed']} runs={r['runs']} "
             f"entries_checked={r['entries_checked']} violations={len(r['violations'])} "
             f"time_to_first={r['time_to_first_violation_s']}s ({r['wall_seconds']}s)",
             "faults: " + (", ".join(f"{k}={v}" for k, v in r["faults"].items()) or "none"),
             "endings: " + json.dumps(r["endings"]),
             "violations by kind: " + json.dumps(r["violations_by_kind"])]
    for v in r["violations"][:20]:
        lines.append(f"VIOLATION {json.dumps(v)[:600]}")
    if r["violations"]:
        v = r["violations"][0]
        lines.append(f"replay: python -m bkspark.testing.diskfaults --seed {r['seed']} "
                     f"--runs {v['run'] + 1}   (directories kept: {r['workdir']})")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        from .worker import main as worker_main
        return worker_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bkspark.testing.diskfaults",
                                description="the storage engine under injected I/O errors, "
                                            "power losses and kills, with a checker")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--first", type=int, default=0, help="index of the first run")
    p.add_argument("--max-seconds", type=float, default=None, help="stop starting runs after this")
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--report", default=None)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 20)
    print(f"disk-fault campaign: seed={seed} runs={a.runs}", flush=True)
    r = run_campaign(seed, a.runs, a.workdir, a.keep, a.first, verbose=not a.quiet,
                     max_seconds=a.max_seconds)
    r["text"] = format_report(r)
    r["command"] = " ".join(["python -m bkspark.testing.diskfaults"] + argv)
    print(r["text"], flush=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(r, f, indent=1, default=str)
    return 1 if r["violations"] else 0
