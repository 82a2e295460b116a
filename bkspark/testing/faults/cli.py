"""Sessions of fault runs, their summary and ``python -m bkspark.testing.faults``."""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import sys
import tempfile
import time

from .runner import FaultRun
from .workloads import worker_main


def run_sessions(make_run, seed: int, duration: float, store: str, run_seconds: float,
                 workdir: str | None, keep: bool, line, summarize, runs: int | None = None,
                 prefix: str = "bkspark-faults-") -> dict:
    """The loop of a campaign, shared by the fault runner and the user-level campaign: runs of
    ``run_seconds`` (run i uses seed ``seed + i``; ``make_run(seed, kind, run_dir, zk)`` makes
    one, ``.run()`` runs it) until ``duration`` is spent, or exactly ``runs``; ``store``:
    sqlite, zk or both (alternating, one ZooKeeper server for them all). A run without
    violations leaves no directory unless ``keep``, nor the campaign without any. Returns
    ``summarize(seed, results)`` with the campaign directory (``workdir``)."""
    from metadata.testing import ZooKeeperServer
    base = workdir or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(base, exist_ok=True)
    stores = ["sqlite", "zk"] if store == "both" else [store]
    zk = None
    if "zk" in stores:
        zk = ZooKeeperServer(tick_time=500, max_session_timeout=60000)
        zk.start()
    results = []
    started = time.monotonic()
    try:
        i = 0
        while (i < runs) if runs is not None else \
                (i == 0 or time.monotonic() - started + run_seconds * 0.8 < duration):
            kind = stores[i % len(stores)]
            run_dir = os.path.join(base, f"run-{i:03d}-{kind}")
            os.makedirs(run_dir, exist_ok=True)
            offset = time.monotonic() - started
            result = make_run(seed + i, kind, run_dir, zk).run()
            result["campaign_offset_s"] = round(offset, 1)
            result["workdir"] = run_dir
            results.append(result)
            print(line(result), flush=True)
            if not result["violations"] and not keep:
                shutil.rmtree(run_dir, ignore_errors=True)
            i += 1
    finally:
        if zk is not None:
            zk.stop()
    summary = summarize(seed, results)
    summary["workdir"] = base
    if not keep and not summary["violations"]:
        shutil.rmtree(base, ignore_errors=True)
    return summary


def run_campaign(seed: int, duration: float, store: str = "sqlite", run_seconds: float = 60.0,
                 workdir: str | None = None, keep: bool = False, verbose: bool = False,
                 **run_kwargs) -> dict:
    """Runs of ``run_seconds`` (run i uses seed ``seed + i``) until ``duration`` is spent.

    ``store``: sqlite, zk or both (alternating). Returns the summary (see :func:`summarize`).
    """
    def make_run(run_seed, kind, run_dir, zk):
        return FaultRun(run_seed, run_seconds, kind, run_dir, zookeeper=zk, verbose=verbose,
                        **run_kwargs)
    return run_sessions(make_run, seed, duration, store, run_seconds, workdir, keep, run_line,
                        summarize)


def run_line(r: dict) -> str:
    return (f"run seed={r['seed']} store={r['store']} acked={r['entries_acked']} "
            f"ledgers={r['ledgers_checked']} log_ledgers={r['log_ledgers']} "
            f"faults={sum(r['faults'].values())} fault_errors={len(r['fault_errors'])} "
            f"violations={len(r['violations'])} "
            f"({r['wall_seconds']}s)")


def summarize(seed: int, runs: list[dict]) -> dict:
    faults: collections.Counter = collections.Counter()
    for r in runs:
        faults.update(r["faults"])
    violations = [dict(v, run_seed=r["seed"], store=r["store"]) for r in runs
                  for v in r["violations"]]
    return {"seed": seed, "runs": len(runs), "faults": dict(sorted(faults.items())),
            "faults_total": sum(faults.values()),
            "entries_acked": sum(r["entries_acked"] for r in runs),
            "ledgers_checked": sum(r["ledgers_checked"] for r in runs),
            "session_expiries": sum(r["session_expiries"] for r in runs),
            "violations": violations, "per_run": runs}


def format_summary(s: dict, title: str = "fault runner") -> str:
    lines = [f"{title}: seed={s['seed']} runs={s['runs']} entries_acked={s['entries_acked']} "
             f"ledgers_checked={s.get('ledgers_checked', 0)} violations={len(s['violations'])}",
             "faults: " + (", ".join(f"{k}={v}" for k, v in s["faults"].items()) or "none")]
    for v in s["violations"][:20]:
        lines.append(f"VIOLATION {json.dumps(v, default=str)}")
    bad = [r for r in s.get("per_run", []) if r["violations"]]
    for r in bad:
        lines.append(f"replay: python -m bkspark.testing.faults --seed {r['seed']} --runs 1 "
                     f"--store {r['store']} --run-seconds {r['duration']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        p = argparse.ArgumentParser(prog="bkspark.testing.faults worker")
        p.add_argument("--uri", required=True)
        p.add_argument("--mode", choices=["ledger", "log"], required=True)
        p.add_argument("--worker-id", type=int, required=True)
        p.add_argument("--seed", type=int, required=True)
        p.add_argument("--acks", required=True)
        worker_main(p.parse_args(argv[1:]))
        return 0
    if argv and argv[0] == "crash":
        from bkspark.testing.crash import main as crash_main
        return crash_main(argv[1:])
    if argv and argv[0] == "multihost":
        from bkspark.testing.multihost import main as multihost_main
        return multihost_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bkspark.testing.faults",
                                description="randomized fault runs with an invariant checker "
                                            "(subcommand 'crash': bookie crash campaign)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--duration", type=float, default=120.0, help="total seconds of runs")
    p.add_argument("--run-seconds", type=float, default=60.0, help="length of one run")
    p.add_argument("--runs", type=int, default=None, help="exactly this many runs")
    p.add_argument("--store", choices=["sqlite", "zk", "both"], default="sqlite")
    p.add_argument("--bookies", type=int, default=5)
    p.add_argument("--ledger-writers", type=int, default=2)
    p.add_argument("--log-writers", type=int, default=1)
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true", help="keep run directories")
    p.add_argument("--report", default=None, help="write the JSON summary here")
    p.add_argument("--quiet", action="store_true", help="do not print every fault")
    p.add_argument("--crash-kills", type=int, default=0,
                   help="then run the bookie crash campaign with this many kills")
    a = p.parse_args(argv)
    if a.quiet:     # the runner's own client logs every fenced writer it causes
        import logging
        logging.getLogger("bkspark").setLevel(logging.ERROR)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"fault runner: seed={seed} store={a.store} duration={a.duration}s", flush=True)
    if a.runs is not None:
        summary = _fixed_runs(seed, a)
    else:
        summary = run_campaign(seed, a.duration, a.store, a.run_seconds, a.workdir, a.keep,
                               not a.quiet, num_bookies=a.bookies,
                               ledger_writers=a.ledger_writers, log_writers=a.log_writers)
    text = format_summary(summary)
    if a.crash_kills:
        from bkspark.testing.crash import format_crash, run_crash_campaign
        crash = run_crash_campaign(seed, a.crash_kills, verbose=True)
        summary["crash"] = crash
        summary["violations"] = summary["violations"] + [dict(v, campaign="crash")
                                                         for v in crash["violations"]]
        text += "\n" + format_crash(crash)
    summary["text"] = text
    summary["command"] = " ".join(["python -m bkspark.testing.faults"] + argv)
    print(text, flush=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 1 if summary["violations"] else 0


def _fixed_runs(seed: int, a) -> dict:
    from metadata.testing import ZooKeeperServer
    base = a.workdir or tempfile.mkdtemp(prefix="bkspark-faults-")
    stores = ["sqlite", "zk"] if a.store == "both" else [a.store]
    zk = ZooKeeperServer(tick_time=500).start() if "zk" in stores else None
    runs = []
    try:
        for i in range(a.runs):
            kind = stores[i % len(stores)]
            run_dir = os.path.join(base, f"run-{i:03d}-{kind}")
            os.makedirs(run_dir, exist_ok=True)
            r = FaultRun(seed + i, a.run_seconds, kind, run_dir, zookeeper=zk,
                         verbose=not a.quiet, num_bookies=a.bookies,
                         ledger_writers=a.ledger_writers, log_writers=a.log_writers).run()
            print(run_line(r), flush=True)
            runs.append(r)
    finally:
        if zk is not None:
            zk.stop()
    s = summarize(seed, runs)
    s["workdir"] = base
    return s
