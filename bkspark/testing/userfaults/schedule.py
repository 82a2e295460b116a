"""A user-level fault run's schedule: a pure function of the seed (and the run's length)."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

FAULT_KINDS = (
    "bookie_pause",             # SIGSTOP/SIGCONT of a random bookie
    "bookie_pause_tail",        # SIGSTOP every bookie of the stream source's open ledger
    "bookie_kill",              # SIGKILL, restart later
    "lost_answer_applied",      # a workload's next metadata write applied, its answer lost
    "lost_answer_not_applied",  # ... not applied, the answer lost
    "session_expire",           # a workload's metadata session expires
    "takeover",                 # another writer opens a log a LogWriter writes (fences it)
    "batch_driver_kill",        # SIGKILL of the Spark batch driver (and its workers)
    "stream_driver_kill",       # SIGKILL of the streaming driver; restart from its checkpoint
    "stream_lost_checkpoint",   # ... restart with a new checkpointLocation, same queryId
    "stream_reset_checkpoint",  # a query of its own run twice, the second time on a new
                                #     checkpoint under the same queryId
    "stream_replan_paused",     # ... killed between a batch's offsets and its commit, and
                                #     restarted while every bookie of the source's tail is
                                #     paused (the batch is planned again from its offsets)
    "python_worker_kill",       # SIGKILL of a PySpark worker (the executor side of local[2])
    "truncate",                 # LogStore.truncate of a retained log
    "shell_retention",          # `bkspark shell apply-retention` (a process of its own)
    "clock_skew",               # ... from a host whose wall clock is hours or days off
)
#: wall-clock offsets of a clock_skew fault (libfaketime's syntax)
SKEW_OFFSETS = ("+8d", "+2h", "+90s", "-400d")

#: roles a lost answer / a session expiry can hit
LOST_TARGETS = ("appender-app-0", "appender-app-1", "appender-ow-0", "spark", "spark", "stream")
EXPIRE_TARGETS = ("appender-app-0", "appender-app-1", "appender-ow-0", "tailer", "spark",
                  "stream")
TAKEOVER_LOGS = ("app-0", "app-1", "ow-0")
WEIGHTS = {"bookie_pause": 3, "bookie_pause_tail": 4, "bookie_kill": 3,
           "lost_answer_applied": 5, "lost_answer_not_applied": 2, "session_expire": 2,
           "takeover": 3, "batch_driver_kill": 1, "stream_driver_kill": 0,
           "stream_lost_checkpoint": 0, "stream_replan_paused": 0, "stream_reset_checkpoint": 0,
           "python_worker_kill": 2, "truncate": 3,
           "shell_retention": 1, "clock_skew": 1}
BOOKIE_KINDS = ("bookie_pause", "bookie_pause_tail", "bookie_kill")
#: the streaming query's faults: applied one after the other, in the schedule's order
STREAM_SEQUENCE = ("stream_replan_paused", "stream_driver_kill", "stream_lost_checkpoint")


@dataclass(order=True)
class Fault:
    t: float
    kind: str = field(compare=False)
    target: int = field(compare=False, default=0)
    duration: float = field(compare=False, default=0.0)
    params: dict = field(compare=False, default_factory=dict)

    def to_json(self):
        return {"t": round(self.t, 3), "kind": self.kind, "target": self.target,
                "duration": round(self.duration, 3), "params": self.params}


def make_schedule(seed: int, duration: float, num_bookies: int = 5, warmup: float = 15.0,
                  kinds=FAULT_KINDS) -> list[Fault]:
    """The run's faults (replayable from the seed). Every kind once early (shuffled), then
    weighted draws until 80% of the run; at most two bookies disrupted at a time (a paused
    tail ensemble counts as two); the streaming driver is killed at most every 25 s (its
    restart is a new JVM) and loses its checkpoint once per run."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    busy_until = [0.0] * num_bookies
    t = warmup + rng.uniform(0.0, 2.0)
    end = max(warmup + 5.0, duration * 0.8)
    names = [k for k in kinds if k in WEIGHTS]
    first = [k for k in names]
    rng.shuffle(first)
    # the streaming driver (a new JVM each restart): killed at fixed points -- once early,
    # then its checkpoint lost once in the middle, then every ~60 s in a long run
    fixed: list[Fault] = []
    span = end - warmup
    if "stream_reset_checkpoint" in names:
        fixed.append(Fault(warmup + span * rng.uniform(0.02, 0.1), "stream_reset_checkpoint"))
    if "stream_replan_paused" in names:
        fixed.append(Fault(warmup + span * rng.uniform(0.05, 0.15), "stream_replan_paused"))
    if "stream_driver_kill" in names:
        fixed.append(Fault(warmup + span * rng.uniform(0.25, 0.4), "stream_driver_kill"))
    if "stream_lost_checkpoint" in names:
        fixed.append(Fault(warmup + span * rng.uniform(0.5, 0.62), "stream_lost_checkpoint"))
    if "stream_driver_kill" in names:
        at = warmup + span * 0.62 + 60.0
        while at < end:
            fixed.append(Fault(at + rng.uniform(-10, 10), "stream_driver_kill"))
            at += 60.0
    driver = ("stream_driver_kill", "stream_lost_checkpoint", "stream_replan_paused",
              "stream_reset_checkpoint")
    first = [k for k in first if k not in driver]
    drawable = [k for k in names if WEIGHTS[k] > 0 and k not in driver]
    while t < end and (first or drawable):     # (only driver kinds: nothing to draw)
        kind = first[0] if first else rng.choices(drawable, [WEIGHTS[k] for k in drawable])[0]
        down = sum(1 for u in busy_until if u > t)
        if kind in BOOKIE_KINDS:
            need = 2 if kind == "bookie_pause_tail" else 1
            if down + need > 2:
                t += rng.uniform(0.3, 1.0)
                if first and t > end * 0.9:
                    first.pop(0)
                continue
            if kind == "bookie_pause_tail":
                f = Fault(t, kind, 0, rng.uniform(2.5, 6.0))
                # (the tail's bookies are known only when it is applied: block every bookie)
                busy_until = [max(u, t + f.duration + 1.0) for u in busy_until]
            else:
                free = [i for i in range(num_bookies) if busy_until[i] <= t]
                target = rng.choice(free)
                dur = rng.uniform(1.0, 5.0) if kind == "bookie_pause" else rng.uniform(0.5, 3.0)
                f = Fault(t, kind, target, dur)
                busy_until[target] = t + dur + 1.5
        elif kind in ("lost_answer_applied", "lost_answer_not_applied"):
            target = rng.randrange(len(LOST_TARGETS))
            params = {"role": LOST_TARGETS[target]}
            if kind == "lost_answer_applied":
                params["delay"] = round(rng.uniform(0.0, 1.5), 2)
            f = Fault(t, kind, target, 0.0, params)
        elif kind == "session_expire":
            target = rng.randrange(len(EXPIRE_TARGETS))
            f = Fault(t, kind, target, 0.0, {"role": EXPIRE_TARGETS[target]})
        elif kind == "takeover":
            target = rng.randrange(len(TAKEOVER_LOGS))
            f = Fault(t, kind, target, 0.0, {"log": TAKEOVER_LOGS[target]})
        elif kind == "python_worker_kill":
            f = Fault(t, kind, rng.randrange(2), 0.0, {"driver": rng.choice(["batch", "stream"])})
        elif kind == "clock_skew":
            f = Fault(t, kind, 0, 0.0, {"offset": rng.choice(SKEW_OFFSETS)})
        elif kind == "truncate":
            f = Fault(t, kind, 0, 0.0, {"log": rng.choice(["app-1", "batch-0", "batch-0"])})
        else:
            f = Fault(t, kind)
        if first:
            first.pop(0)
        faults.append(f)
        t += rng.expovariate(1 / 1.6)
    return sorted(faults + fixed)
