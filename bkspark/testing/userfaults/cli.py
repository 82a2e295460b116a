"""Sessions of user-level fault runs, their report and ``python -m bkspark.testing.userfaults``."""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys


def run_campaign(seed: int, duration: float, store: str = "sqlite", run_seconds: float = 90.0,
                 workdir: str | None = None, keep: bool = False, verbose: bool = False,
                 runs: int | None = None, **run_kwargs) -> dict:
    """Runs of ``run_seconds`` (run i uses seed ``seed + i``) until ``duration`` is spent (or
    exactly ``runs``); ``store``: sqlite, zk or both (alternating)."""
    from bkspark.testing.faults.cli import run_sessions

    from .runner import UserFaultRun

    def make_run(run_seed, kind, run_dir, zk):
        return UserFaultRun(run_seed, run_seconds, kind, run_dir, zookeeper=zk,
                            verbose=verbose, **run_kwargs)
    return run_sessions(make_run, seed, duration, store, run_seconds, workdir, keep, run_line,
                        summarize, runs=runs, prefix="bkspark-userfaults-")


def run_line(r: dict) -> str:
    return (f"run seed={r['seed']} store={r['store']} rows={r['rows_checked_total']} "
            f"faults={sum(r['faults'].values())} violations="
            f"{sum(r['violations_by_kind'].values())} "
            f"{json.dumps(r['violations_by_kind'])} ({r['wall_seconds']}s)")


def summarize(seed: int, runs: list[dict]) -> dict:
    faults: collections.Counter = collections.Counter()
    by_kind: collections.Counter = collections.Counter()
    rows: collections.Counter = collections.Counter()
    hits: collections.Counter = collections.Counter()
    first = None
    for r in runs:
        faults.update(r["faults"])
        by_kind.update(r["violations_by_kind"])
        rows.update(r["rows_checked"])
        hits.update(r.get("lost_answers_hit", {}))
        if r["time_to_first_violation"] is not None:
            t = r["campaign_offset_s"] + r["time_to_first_violation"]
            first = t if first is None else min(first, t)
    violations = [dict(v, seed=r["seed"], store=r["store"]) for r in runs
                  for v in r["violations"]]
    first_by_kind = {}
    for r in runs:
        for v in r["violations"]:
            t = round(r["campaign_offset_s"] + v["t"], 1)
            if v["kind"] not in first_by_kind or t < first_by_kind[v["kind"]]["t"]:
                first_by_kind[v["kind"]] = {"t": t, "seed": r["seed"], "store": r["store"]}
    return {"seed": seed, "runs": len(runs), "faults": dict(sorted(faults.items())),
            "faults_total": sum(faults.values()), "lost_answers_hit": dict(hits),
            "rows_checked": dict(rows), "rows_checked_total": sum(rows.values()),
            "violations_by_kind": dict(by_kind),
            "time_to_first_violation_s": None if first is None else round(first, 1),
            "first_violation_by_kind": first_by_kind,
            "violations": violations, "per_run": runs}


def format_summary(s: dict) -> str:
    lines = [f"user-level fault campaign: seed={s['seed']} runs={s['runs']} "
             f"rows_checked={s['rows_checked_total']} "
             f"violations={sum(s['violations_by_kind'].values())} "
             f"time_to_first={s['time_to_first_violation_s']}s",
             "faults: " + (", ".join(f"{k}={v}" for k, v in s["faults"].items()) or "none"),
             "lost answers / expiries taken: " + json.dumps(s["lost_answers_hit"]),
             "rows checked: " + json.dumps(s["rows_checked"]),
             "violations by kind: " + json.dumps(s["violations_by_kind"]),
             "first violation of each kind: " + json.dumps(s["first_violation_by_kind"])]
    for v in s["violations"][:30]:
        lines.append(f"VIOLATION {json.dumps(v, default=str)[:500]}")
    for r in s.get("per_run", []):
        if r["violations"]:
            kinds = f" --kinds {','.join(r['kinds'])}" if r.get("kinds") else ""
            lines.append(f"replay: python -m bkspark.testing.userfaults --seed {r['seed']} "
                         f"--runs 1 --store {r['store']} --run-seconds {r['duration']}{kinds}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        from .workloads import worker_main
        return worker_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bkspark.testing.userfaults",
                                description="randomized fault runs of logs, readers, Spark "
                                            "batch and streaming jobs, with a checker")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--duration", type=float, default=120.0, help="total seconds of runs")
    p.add_argument("--run-seconds", type=float, default=None,
                   help="length of one run (default: the duration, at most 300)")
    p.add_argument("--runs", type=int, default=None, help="exactly this many runs")
    p.add_argument("--store", choices=["sqlite", "zk", "both"], default="sqlite")
    p.add_argument("--keys", type=int, default=None,
                   help="writer ids the keys workload commits (default 1100)")
    p.add_argument("--kinds", default=None,
                   help="comma-separated fault kinds of the schedule (default: every kind)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true", help="keep run directories")
    p.add_argument("--report", default=None, help="write the JSON report here")
    p.add_argument("--quiet", action="store_true", help="do not print every fault")
    a = p.parse_args(argv)
    import logging
    logging.getLogger("bkspark").setLevel(logging.ERROR)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    run_seconds = a.run_seconds or min(a.duration, 300.0)
    if a.store == "both" and a.runs is None and a.run_seconds is None:
        run_seconds = min(a.duration / 2, 300.0)
    print(f"user-level fault campaign: seed={seed} store={a.store} duration={a.duration}s "
          f"run_seconds={run_seconds}", flush=True)
    kw = {} if a.keys is None else {"keys_count": a.keys}
    if a.kinds:
        from .schedule import FAULT_KINDS
        kinds = tuple(k.strip() for k in a.kinds.split(",") if k.strip())
        unknown = sorted(set(kinds) - set(FAULT_KINDS))
        if unknown:
            p.error(f"unknown fault kinds {unknown}: choose from {', '.join(FAULT_KINDS)}")
        if not kinds:
            p.error("--kinds names no fault kind: give at least one, or leave it out")
        kw["kinds"] = kinds
    summary = run_campaign(seed, a.duration, a.store, run_seconds, a.workdir, a.keep,
                           not a.quiet, runs=a.runs, **kw)
    summary["text"] = format_summary(summary)
    summary["command"] = " ".join(["python -m bkspark.testing.userfaults"] + argv)
    print(summary["text"], flush=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 1 if summary["violations"] else 0
