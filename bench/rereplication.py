#!/usr/bin/env python3
"""Re-replication throughput after a bookie loss (MB/s of entry bodies copied).

A local cluster of real bookie processes (journal sync on) is filled with closed ledgers at
E=3 Qw=2 Qa=2; one bookie is SIGKILLed and its data is re-replicated:

* ``manual``: ``recover_bookie`` (what ``bkspark shell recover <bookie>`` runs) in this process;
* ``auto``: an in-process AutoRecovery (auditor + worker, lostBookieRecoveryDelay 0) from the
  moment the dead bookie's registration vanished until no record is left and no ledger
  references the dead bookie (includes the auditor's scan and the worker's lock handling).

Each copied entry is read (digest-checked) from a surviving replica and written with
RECOVERY_ADD to the replacement bookie, whose journal fsyncs it. The figure counts entry
bodies (payload + 36 bytes of header/digest) divided by wall time.

    python3 bench/rereplication.py                       # default run, < 60 s
    python3 bench/rereplication.py --mode both --ledgers 16 --entries 4000 --entry-size 4096
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bkspark.client import BookKeeper  # noqa: E402
from bkspark.recovery.manual import recover_bookie  # noqa: E402
from bkspark.recovery.service import AutoRecovery, AutoRecoveryConfig  # noqa: E402
from bkspark.recovery.urm import UnderReplicationManager  # noqa: E402
from bkspark.testing.cluster import BookieCluster  # noqa: E402
from metadata import ledgers as ledger_store  # noqa: E402
from metadata import registry  # noqa: E402


def fill(bk, ledgers: int, entries: int, size: int) -> int:
    payload = os.urandom(size)
    handles = [bk.create_ledger(3, 2, 2, password=b"bench") for _ in range(ledgers)]
    futs = []
    for i in range(entries):
        for lh in handles:
            futs.append(lh.append_async(payload))
        if len(futs) > 4000:
            for f in futs:
                f.result()
            futs = []
    for f in futs:
        f.result()
    for lh in handles:
        lh.close()
    return ledgers * entries * size


def kill_one(cluster, bk) -> str:
    victim = cluster.bookie_ids[0]
    cluster.kill(0)
    deadline = time.monotonic() + 60
    while victim in registry.list_bookies(bk.store):
        if time.monotonic() > deadline:
            raise SystemExit("dead bookie never unregistered")
        time.sleep(0.05)
    return victim


def run_manual(bk, victim) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    s = recover_bookie(bk, victim)
    dt = time.perf_counter() - t0
    if s.failed:
        raise SystemExit(f"recovery failed: {s.failed}")
    return s.bytes, s.entries, dt


def run_auto(uri, bk, victim) -> tuple[int, int, float]:
    urm = UnderReplicationManager(bk.store)
    urm.set_lost_bookie_recovery_delay(0)
    ar = AutoRecovery(uri, AutoRecoveryConfig(lost_bookie_recovery_delay=0, audit_interval=1,
                                              open_ledger_grace=1, retry_backoff=0.5, worker_threads=4,
                                              session_timeout=5))
    t0 = time.perf_counter()
    ar.start()
    try:
        while True:
            if not urm.list() and ar.auditor is not None and ar.auditor.published and \
                    not any(victim in ledger_store.read_ledger(bk.store, lid)[0].all_bookies()
                            for lid in ledger_store.list_ledgers(bk.store)):
                break
            if time.perf_counter() - t0 > 600:
                raise SystemExit("autorecovery did not finish in 600 s")
            time.sleep(0.05)
        dt = time.perf_counter() - t0
        return ar.worker.stats.bytes, ar.worker.stats.entries, dt
    finally:
        ar.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["manual", "auto", "both"], default="both")
    ap.add_argument("--ledgers", type=int, default=8)
    ap.add_argument("--entries", type=int, default=1500, help="entries per ledger")
    ap.add_argument("--entry-size", type=int, default=4096)
    ap.add_argument("--bookies", type=int, default=4)
    ap.add_argument("--dir", default=None, help="data directory (default: a temp dir)")
    ap.add_argument("--metadata", default=None, help="metadata URI (default: embedded sqlite)")
    args = ap.parse_args()
    modes = ["manual", "auto"] if args.mode == "both" else [args.mode]
    print(f"config: bookies={args.bookies} E=3 Qw=2 Qa=2 ledgers={args.ledgers} "
          f"entries/ledger={args.entries} entry_size={args.entry_size}B journal_sync=on "
          f"cpus={os.cpu_count()} metadata={args.metadata or 'sqlite (embedded)'}", flush=True)
    for mode in modes:
        base = args.dir or tempfile.mkdtemp(prefix="bkspark-rerepl-")
        data = os.path.join(base, mode)
        shutil.rmtree(data, ignore_errors=True)
        uri = args.metadata or f"sqlite://{data}/meta.db"
        try:
            with BookieCluster(uri, num_bookies=args.bookies, data_dir=data,
                               fault_injection=False, session_timeout=3.0) as cluster, \
                    BookKeeper(uri, add_timeout=30, read_timeout=30) as bk:
                t0 = time.perf_counter()
                written = fill(bk, args.ledgers, args.entries, args.entry_size)
                wdt = time.perf_counter() - t0
                victim = kill_one(cluster, bk)
                if mode == "manual":
                    nbytes, entries, dt = run_manual(bk, victim)
                else:
                    nbytes, entries, dt = run_auto(uri, bk, victim)
                print(f"[{mode}] wrote {written / 1e6:.1f} MB payload in {wdt:.1f}s; lost bookie "
                      f"{victim}; re-replicated {entries} entries, {nbytes / 1e6:.1f} MB in "
                      f"{dt:.2f}s => {nbytes / 1e6 / dt:.1f} MB/s "
                      f"({entries / dt:.0f} entries/s)", flush=True)
        finally:
            if not args.dir:
                shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
