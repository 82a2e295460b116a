"""kill -9 a process adding in a loop, many times; every acknowledged add and fence survives.

BKSPARK_CRASH_RUNS sets the number of kills (default 20, about 15-30 s).
"""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from bkspark import errors
from bkspark.bookie.storage import Storage

sys.path.insert(0, os.path.dirname(__file__))
from crash_child import body_for, config  # noqa: E402

CHILD = os.path.join(os.path.dirname(__file__), "crash_child.py")


def run_child(d, run, seed, delay, early_kill=None, child=CHILD):
    """Run `child` (a script of crash_child.py's protocol) on d, SIGKILL it after `delay` s; its lines."""
    p = subprocess.Popen([sys.executable, child, d, str(run), str(seed)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    if early_kill is not None:  # possibly while it is opening / replaying the previous crash
        time.sleep(early_kill)
        p.send_signal(signal.SIGKILL)
        out, err = p.communicate()
        return out.decode().splitlines()
    # wait until it is open (startup replays the previous crash) then let it run a while
    line = p.stdout.readline()
    if line != b"R\n":
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"child failed to start (run {run}): {line!r} {err.decode()[-3000:]}")
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    # read through p.stdout (not communicate(), which reads the raw pipe and would miss lines
    # that readline() above already pulled into the buffer -- e.g. a "d <ledger>" line)
    out = p.stdout.read()
    err = p.stderr.read()
    p.wait()
    assert p.returncode == -signal.SIGKILL, err.decode()[-3000:]
    return (line + out).decode().splitlines()


@pytest.mark.timeout(600)
def test_kill9_loses_nothing_acknowledged(tmp_path):
    runs = int(os.environ.get("BKSPARK_CRASH_RUNS", "20"))
    seed0 = int(os.environ.get("BKSPARK_CRASH_SEED", str(random.randrange(1 << 30))))
    rnd = random.Random(seed0)
    d = str(tmp_path)
    acked: dict[int, set[int]] = {}
    fenced: set[int] = set()
    deleting: set[int] = set()
    total = 0
    for run in range(runs):
        early = rnd.uniform(0.05, 0.4) if run % 4 == 3 else None
        lines = run_child(d, run, rnd.randrange(1 << 30), rnd.uniform(0.02, 0.7), early)
        for ln in lines:
            parts = ln.split()
            if not parts:
                continue
            if parts[0] == "A":
                lid, a, b = map(int, parts[1:])
                acked.setdefault(lid, set()).update(range(a, b + 1))
            elif parts[0] == "F":
                fenced.add(int(parts[1]))
            elif parts[0] in ("d", "D"):
                deleting.add(int(parts[1]))
        # verify (in this process); alternate clean close and close without checkpoint
        try:
            s = Storage(config(d))
        except errors.BKError as ex:
            pytest.fail(f"seed {seed0} run {run}: storage does not reopen after the kill: {ex!r}")
        try:
            for lid, ents in acked.items():
                if lid in deleting:
                    continue
                assert s.has_ledger(lid), f"seed {seed0} run {run}: ledger {lid} lost"
                for e in ents:
                    try:
                        got = s.read_entry(lid, e)
                    except errors.BKError as ex:
                        pytest.fail(f"seed {seed0} run {run}: acked entry {lid}:{e} unreadable: {ex!r}")
                    assert got == body_for(lid, e), f"seed {seed0} run {run}: entry {lid}:{e} wrong bytes"
                    total += 1
            for lid in fenced:
                if lid not in deleting:
                    assert s.is_fenced(lid), f"seed {seed0} run {run}: acked fence of {lid} lost"
                    assert s.add_entries([(lid, 10**6, b"key%d" % lid, False, b"x")]) == [errors.EFENCED]
        finally:
            if run % 2:
                s.close()
            else:
                s._store.close(checkpoint=False)
    assert total > 0
    print(f"crash test: {runs} kills, {sum(len(v) for v in acked.values())} acked entries verified (seed {seed0})")
