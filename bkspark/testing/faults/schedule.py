"""A fault run's schedule: a pure function of the seed."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from bkspark import errors


FAULT_KINDS = ("bookie_kill", "bookie_pause", "inject", "writer_kill", "recover_ledger",
               "log_takeover", "session_expire", "disk_full")


@dataclass(order=True)
class Fault:
    t: float
    kind: str = field(compare=False)
    target: int = field(compare=False)
    duration: float = field(compare=False, default=0.0)
    params: dict = field(compare=False, default_factory=dict)

    def to_json(self):
        return {"t": round(self.t, 3), "kind": self.kind, "target": self.target,
                "duration": round(self.duration, 3), "params": self.params}


def make_schedule(seed: int, duration: float, num_bookies: int, num_workers: int,
                  max_bookies_down: int = 2, kinds=FAULT_KINDS) -> list[Fault]:
    """The run's faults, a pure function of its arguments (replayable from the seed).

    At most ``max_bookies_down`` bookies are disrupted (killed, paused, read-only) at a
    time, so that writers can still make progress; the last 15% of the run is quiet.
    """
    rng = random.Random(seed)
    faults: list[Fault] = []
    busy_until = [0.0] * num_bookies
    t = rng.uniform(1.0, 3.0)
    end = duration * 0.85
    weights = {"bookie_kill": 5, "bookie_pause": 3, "inject": 4, "writer_kill": 2,
               "recover_ledger": 3, "log_takeover": 2, "session_expire": 2, "disk_full": 1}
    names = [k for k in kinds if k in weights]
    first = list(names)             # every kind early in the run, then weighted draws
    rng.shuffle(first)
    while t < end:
        kind = first[0] if first else rng.choices(names, [weights[k] for k in names])[0]
        if kind in ("bookie_kill", "bookie_pause", "disk_full", "inject"):
            free = [i for i in range(num_bookies) if busy_until[i] <= t]
            down = sum(1 for u in busy_until if u > t)
            if not free or (kind != "inject" and down >= max_bookies_down):
                t += rng.uniform(0.2, 1.0)
                continue
            if first:
                first.pop(0)
            target = rng.choice(free)
            if kind == "bookie_kill":
                f = Fault(t, kind, target, rng.uniform(0.2, 3.0))
            elif kind == "bookie_pause":
                f = Fault(t, kind, target, rng.uniform(0.5, 5.0))
            elif kind == "disk_full":
                f = Fault(t, kind, target, rng.uniform(2.0, 6.0))
            else:
                rule = {"op": rng.choice(["add", "read", "read_lac", "any"]),
                        "action": rng.choice(["delay", "drop", "fail"]),
                        "probability": round(rng.uniform(0.05, 0.5), 2)}
                if rule["action"] == "delay":
                    rule["delay_ms"] = rng.randint(20, 2000)
                if rule["action"] == "fail":
                    rule["error"] = rng.choice([errors.EIO, errors.ETOOMANYREQUESTS,
                                                errors.EUNKNOWNLEDGERSTATE])
                f = Fault(t, kind, target, rng.uniform(1.0, 5.0), {"rule": rule})
            if kind != "inject":
                busy_until[target] = t + f.duration + 1.5
            faults.append(f)
        else:
            if first:
                first.pop(0)
            faults.append(Fault(t, kind, rng.randrange(num_workers), 0.0))
        t += rng.expovariate(1 / 1.2)
    return faults
