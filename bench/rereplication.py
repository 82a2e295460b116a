#!/usr/bin/env python3
"""Re-replication throughput after a bookie loss, beside the same cluster's write throughput,
and the foreground's add latency while a repair runs, unthrottled and throttled.

For each entry size (``--sizes``) and mode, a fresh local cluster of real bookie processes
(journal sync on) is filled with ``--gb`` GB of payload in closed ledgers at E=3 Qw=2 Qa=2
(``--ledgers`` ledgers written together: the *write* figure, MB/s of payload); one bookie is
SIGKILLed and its data re-replicated, unthrottled:

* ``manual``: ``recover_bookie`` (what ``bkspark shell recover <bookie>`` runs) in this
  process, 4 ledgers at once;
* ``auto``: an in-process AutoRecovery (auditor + worker with 4 threads,
  lostBookieRecoveryDelay 0, ``--rate 0``) from the moment the dead bookie's registration
  vanished until no record is left and no ledger references the dead bookie (includes the
  auditor's scan and the workers' locks).

Each copied entry is read (digest-checked) from a surviving replica with ranged reads and
written with RECOVERY_ADD to the replacement bookie, whose journal fsyncs it. The copy figure
counts entry bodies (payload + 36 bytes of header/digest) over wall time; its ratio to the
write figure of the same size and run is what to compare across machines (target: >= 0.5x,
and >= 100 MB/s at 64 KiB entries).

Then (``--latency-size``, one cluster per line) a foreground writer in another process
appends ``--latency-entry`` -byte entries one at a time to a new ledger and records each
add's latency: before the loss (no repair), during an unthrottled manual recovery, and
during one throttled to ``--throttle`` MB/s; printed: p50/p99/max of the adds made while
the repair ran, and the repair's rate.

    python3 bench/rereplication.py                                 # 4 KiB and 64 KiB, 1 GB each
    python3 bench/rereplication.py --sizes 16384 --gb 0.2 --modes manual --no-latency
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bkspark.client import BookKeeper  # noqa: E402
from bkspark.recovery.manual import recover_bookie  # noqa: E402
from bkspark.recovery.service import AutoRecovery, AutoRecoveryConfig  # noqa: E402
from bkspark.recovery.throttle import Throttle  # noqa: E402
from bkspark.recovery.urm import UnderReplicationManager  # noqa: E402
from bkspark.testing.cluster import BookieCluster  # noqa: E402
from metadata import ledgers as ledger_store  # noqa: E402
from metadata import registry  # noqa: E402


def fill(bk, ledgers: int, entries: int, size: int) -> tuple[int, float]:
    """Write ``ledgers`` ledgers of ``entries`` entries together; (payload bytes, seconds)."""
    payload = os.urandom(size)
    handles = [bk.create_ledger(3, 2, 2, password=b"bench") for _ in range(ledgers)]
    window = max(64, (64 << 20) // size)         # ~64 MB in flight
    t0 = time.perf_counter()
    futs = []
    for _ in range(entries):
        for lh in handles:
            futs.append(lh.append_async(payload))
        if len(futs) > window:
            for f in futs:
                f.result()
            futs = []
    for f in futs:
        f.result()
    for lh in handles:
        lh.close()
    return ledgers * entries * size, time.perf_counter() - t0


def kill_one(cluster, bk) -> str:
    victim = cluster.bookie_ids[0]
    cluster.kill(0)
    deadline = time.monotonic() + 60
    while victim in registry.list_bookies(bk.store):
        if time.monotonic() > deadline:
            raise SystemExit("dead bookie never unregistered")
        time.sleep(0.05)
    return victim


def run_manual(bk, victim, throttle=None) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    s = recover_bookie(bk, victim, throttle=throttle)
    dt = time.perf_counter() - t0
    if s.failed:
        raise SystemExit(f"recovery failed: {s.failed}")
    return s.bytes, s.entries, dt


def run_auto(uri, bk, victim) -> tuple[int, int, float]:
    urm = UnderReplicationManager(bk.store)
    urm.set_lost_bookie_recovery_delay(0)
    ar = AutoRecovery(uri, AutoRecoveryConfig(lost_bookie_recovery_delay=0, audit_interval=1,
                                              open_ledger_grace=1, retry_backoff=0.5,
                                              worker_threads=4, session_timeout=5,
                                              replication_rate_mb_per_s=0))
    t0 = time.perf_counter()
    ar.start()
    try:
        while True:
            if not urm.list() and ar.auditor is not None and ar.auditor.published and \
                    not any(victim in ledger_store.read_ledger(bk.store, lid)[0].all_bookies()
                            for lid in ledger_store.list_ledgers(bk.store)):
                break
            if time.perf_counter() - t0 > 1200:
                raise SystemExit("autorecovery did not finish in 1200 s")
            time.sleep(0.05)
        dt = time.perf_counter() - t0
        return ar.worker.stats.bytes, ar.worker.stats.entries, dt
    finally:
        ar.stop()


def foreground(uri: str, size: int, stop, conn) -> None:
    """Another process: append ``size``-byte entries one at a time until ``stop``; sends
    ``[(monotonic time, latency s)]``."""
    payload = os.urandom(size)
    out = []
    with BookKeeper(uri, add_timeout=30) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"fg")
        conn.send("ready")
        while not stop.is_set():
            t = time.monotonic()
            lh.append(payload)
            out.append((t, time.monotonic() - t))
        lh.close()
    conn.send(out)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def fresh_cluster(base: str, name: str, bookies: int, metadata: str | None):
    data = os.path.join(base, name)
    shutil.rmtree(data, ignore_errors=True)
    uri = metadata or f"sqlite://{data}/meta.db"
    return uri, BookieCluster(uri, num_bookies=bookies, data_dir=data, fault_injection=False,
                              session_timeout=3.0)


def latency_line(base, args, label: str, throttle_mb: float | None) -> None:
    """One cluster: fill, then the foreground's adds while (a) nothing, or (b) a manual
    recovery at ``throttle_mb`` MB/s (0: unthrottled) runs."""
    uri, cluster = fresh_cluster(base, f"latency-{label}", args.bookies, args.metadata)
    ctx = multiprocessing.get_context("spawn")
    with cluster, BookKeeper(uri, add_timeout=30, read_timeout=30) as bk:
        entries = max(1, int(args.gb * 1e9 / (args.ledgers * args.latency_size)))
        fill(bk, args.ledgers, entries, args.latency_size)
        stop = ctx.Event()
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=foreground, args=(uri, args.latency_entry, stop, theirs))
        proc.start()
        mine.recv()
        time.sleep(1.0)
        if throttle_mb is None:
            t0 = time.monotonic()
            time.sleep(args.baseline_seconds)
            t1, rate = time.monotonic(), ""
        else:
            victim = kill_one(cluster, bk)
            t0 = time.monotonic()
            nbytes, _, dt = run_manual(bk, victim, Throttle(throttle_mb or None))
            t1 = time.monotonic()
            rate = f"; repair {nbytes / 1e6:.0f} MB at {nbytes / 1e6 / dt:.1f} MB/s"
        stop.set()
        samples = mine.recv()
        proc.join(30)
    during = [lat * 1e3 for t, lat in samples if t0 <= t <= t1]
    print(f"  foreground adds {label:<24} n={len(during):>6} p50 {pct(during, .5):6.2f} ms  "
          f"p99 {pct(during, .99):7.2f} ms  max {max(during, default=float('nan')):7.1f} ms"
          f"{rate}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="manual,auto", help="manual, auto or both (comma list)")
    ap.add_argument("--sizes", default="4096,65536", help="entry sizes in bytes (comma list)")
    ap.add_argument("--gb", type=float, default=1.0, help="payload written per run, GB")
    ap.add_argument("--ledgers", type=int, default=8)
    ap.add_argument("--bookies", type=int, default=4)
    ap.add_argument("--latency-size", type=int, default=65536,
                    help="entry size of the ledgers repaired in the latency lines")
    ap.add_argument("--latency-entry", type=int, default=1024,
                    help="entry size of the foreground writer's adds")
    ap.add_argument("--throttle", type=float, default=20.0,
                    help="MB/s of the throttled repair in the latency lines")
    ap.add_argument("--baseline-seconds", type=float, default=10.0)
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--dir", default=None, help="data directory (default: a temp dir)")
    ap.add_argument("--metadata", default=None, help="metadata URI (default: embedded sqlite)")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    print(f"config: bookies={args.bookies} E=3 Qw=2 Qa=2 ledgers={args.ledgers} "
          f"{args.gb:g} GB payload per run, entry sizes {sizes}; journal_sync=on "
          f"cpus={os.cpu_count()} metadata={args.metadata or 'sqlite (embedded)'}", flush=True)
    base = args.dir or tempfile.mkdtemp(prefix="bkspark-rerepl-")
    try:
        for size in sizes:
            entries = max(1, int(args.gb * 1e9 / (args.ledgers * size)))
            for mode in modes:
                uri, cluster = fresh_cluster(base, f"{mode}-{size}", args.bookies, args.metadata)
                with cluster, BookKeeper(uri, add_timeout=30, read_timeout=30) as bk:
                    written, wdt = fill(bk, args.ledgers, entries, size)
                    victim = kill_one(cluster, bk)
                    if mode == "manual":
                        nbytes, copied, dt = run_manual(bk, victim)
                    else:
                        nbytes, copied, dt = run_auto(uri, bk, victim)
                write_rate, copy_rate = written / 1e6 / wdt, nbytes / 1e6 / dt
                print(f"{size:>6} B entries  write {written / 1e6:7.1f} MB in {wdt:6.1f}s = "
                      f"{write_rate:6.1f} MB/s | {mode:<6} re-replicated {copied:>7} entries "
                      f"{nbytes / 1e6:7.1f} MB in {dt:6.2f}s = {copy_rate:6.1f} MB/s "
                      f"({copied / dt:,.0f} entries/s) = {copy_rate / write_rate:.2f}x write",
                      flush=True)
        if not args.no_latency:
            print(f"foreground: {args.latency_entry} B adds one at a time (another process), "
                  f"ledgers repaired of {args.latency_size} B entries", flush=True)
            latency_line(base, args, "no repair", None)
            latency_line(base, args, "repair unthrottled", 0.0)
            latency_line(base, args, f"repair at {args.throttle:g} MB/s", args.throttle)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
