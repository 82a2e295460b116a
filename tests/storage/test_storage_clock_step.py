"""The storage engine's timed waits measure elapsed time, not the wall clock (issue 47): after the
wall clock steps back (an NTP step, a VM restored from a snapshot) its timed background work goes
on at its pace instead of stalling for the size of the step.

A child process (clock_step_child.py) runs a store with a checkpoint every 0.25 s under a wall
clock the test steps back by an hour (bkspark.testing.clockskew, with ``wall_clock_waits``: a wait
on a CLOCK_REALTIME condition variable ends when the wall clock reads its deadline, as on a host).
Nothing but its timer wakes the checkpoint thread there (single small adds, no explicit
checkpoint), so with deadlines taken from the wall clock the wait it was in when the clock
stepped lasted an hour and no checkpoint followed the step.
"""
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from bkspark.testing.clockskew import libfaketime, skewed_env, step
from metadata.testing import skip_or_fail

CHILD = os.path.join(os.path.dirname(__file__), "clock_step_child.py")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STEP = "-1h"
STEPPED_S = 3600


class Child:
    def __init__(self, d: str, env: dict):
        self.p = subprocess.Popen([sys.executable, CHILD, d], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line.split())
        self.lines.put(None)

    def until(self, ok, timeout: float, why: str):
        """The first line (split) for which ok(line) holds, within timeout seconds."""
        end = time.monotonic() + timeout
        last = None
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                line = ()
            if line == ():
                pytest.fail(f"{why} (last line of the child: {last})", pytrace=False)
            if line is None:
                pytest.fail(f"the child ended: {self.p.wait()} {self.p.stderr.read()[-2000:]}",
                            pytrace=False)
            last = line
            if ok(line):
                return line

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()


def stat(line):
    """(wall s, checkpoints, last log mark) of a STAT line, else None"""
    if line[0] != "STAT":
        return None
    return float(line[2]), int(line[3]), (int(line[4]), int(line[5]))


@pytest.mark.timeout(60)
def test_timed_waits_go_on_after_the_wall_clock_steps_back(tmp_path):
    if libfaketime() is None:
        skip_or_fail("libfaketime is not installed (apt-get install faketime)")
    clock = str(tmp_path / "clock")
    env = skewed_env("+0", step_file=clock, wall_clock_waits=True)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    child = Child(str(tmp_path / "store"), env)
    try:
        # running: the periodic checkpoints advance the last log mark
        first = stat(child.until(lambda ln: stat(ln) is not None, 30, "the store never started"))
        child.until(lambda ln: stat(ln) is not None and stat(ln)[1] >= first[1] + 3, 10,
                    "no periodic checkpoints before the step")
        step(clock, STEP)
        wall, ckpts, mark = stat(child.until(
            lambda ln: stat(ln) is not None and stat(ln)[0] < first[0] - STEPPED_S / 2, 10,
            "the child's wall clock never stepped back"))
        # a checkpoint waits at most 0.25 s for its turn: several within 5 s, each moving the mark
        child.until(lambda ln: stat(ln) is not None and stat(ln)[1] >= ckpts + 3 and stat(ln)[2] > mark, 5,
                    f"no checkpoint for 5 s after the wall clock stepped back {STEP} "
                    f"(checkpoints stayed at {ckpts}, the last log mark at {mark}; "
                    f"the interval is 0.25 s)")
    finally:
        child.close()
