#!/usr/bin/env python3
"""The auditor's entries check over many ledgers (issue 51): how long ``check_all_ledgers``
takes with its rate limit off.

    python3 bench/auditor.py                    # 2,000 ledgers
    python3 bench/auditor.py --ledgers 20000    # the issue's size

A local cluster (3 bookies, sqlite metadata) is filled with ``--ledgers`` closed ledgers of
``--entries`` small entries each (E=3 Qw=2 Qa=2, written many ledgers at a time), then timed,
best of ``--repeat``, in the same run:

* ``batched``: :meth:`Auditor.check_all_ledgers` as it is (metadata read in pipelined
  batches, many ledgers' ``ListEntries`` in flight), ``entries_check_rate=0``;
* ``one at a time``: the REFERENCE, the check as it was before batching -- each ledger's
  metadata read alone, then its members asked one after another, answer awaited before the
  next request -- kept only in this bench (:func:`reference_check`) to measure against.

Both judge the answers with the same ``missing_entries``; the cluster is healthy, so both must
find nothing (checked). The figure the default rate limit implies (ledgers / rate) is printed
beside them: it, not the check's own speed, bounds a daemon's check by default. Each row also
shows the CPU seconds the auditor (this process) and the bookies spent, and how busy the
machine was (its other work included): on a small machine the check is bound by the CPU
every ListEntries request costs the client and the bookie, not by waiting.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time

import checkout  # noqa: F401  (this checkout first on sys.path)
from procstat import machine_cpu_ticks, process_cpu_seconds  # noqa: E402  (bench/ is sys.path[0])

#: ledgers created (and written, and closed) together while filling
FILL_BATCH = 200


def fill(bk, ledgers: int, entries: int) -> None:
    """``ledgers`` closed ledgers of ``entries`` 100-byte entries each."""
    body = b"x" * 100
    left = ledgers
    while left:
        n = min(FILL_BATCH, left)
        handles = [f.result() for f in [bk.create_ledger_async(3, 2, 2, password=b"bench")
                                        for _ in range(n)]]
        for f in [lh.append_async(body) for lh in handles for _ in range(entries)]:
            f.result()
        for f in [lh.close_async() for lh in handles]:
            f.result()
        left -= n


def reference_check(auditor) -> int:
    """REFERENCE ONLY (the entries check before batching, for comparison; not product code):
    one metadata read per ledger, then each member's ListEntries awaited before the next.
    Returns the ledgers found lacking entries (nothing is published)."""
    from bkspark.errors import BKError
    from bkspark.recovery.replicator import live_bookies
    from metadata import ledgers as ledger_store
    replicator = auditor.replicator
    _, alive = live_bookies(auditor.store)
    lacking = 0
    for lid in ledger_store.list_ledgers(auditor.store):
        try:
            md, _ = ledger_store.read_ledger(auditor.store, lid)
        except BKError:
            continue
        answers = {}
        for bookie in replicator.members_to_list(md, alive):
            answer = replicator.request_listings(lid, [bookie])[bookie]
            try:
                answer.result()           # one request at a time, as before
            except BKError:
                pass                      # judged (unknown) by missing_entries
            answers[bookie] = answer
        if replicator.missing_entries(md, alive, answers=answers):
            lacking += 1
    return lacking


class Timing:
    """One timed run: wall seconds, CPU seconds of this process (the auditor) and of the
    bookies, and how busy the whole machine was (other work included)."""

    def __init__(self, run, bookie_pids):
        cpu0, bookies0, (busy0, all0) = (process_cpu_seconds([os.getpid()]),
                                         process_cpu_seconds(bookie_pids), machine_cpu_ticks())
        t = time.perf_counter()
        self.result = run()
        self.seconds = time.perf_counter() - t
        busy1, all1 = machine_cpu_ticks()
        self.auditor_cpu = process_cpu_seconds([os.getpid()]) - cpu0
        self.bookies_cpu = process_cpu_seconds(bookie_pids) - bookies0
        self.machine_busy = (busy1 - busy0) / max(1, all1 - all0)


def best_of(repeat: int, run, bookie_pids) -> Timing:
    return min((Timing(run, bookie_pids) for _ in range(repeat)), key=lambda t: t.seconds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledgers", type=int, default=2000)
    p.add_argument("--entries", type=int, default=4, help="entries per ledger (default 4)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--no-reference", action="store_true",
                   help="skip the one-at-a-time reference (it is the slow one)")
    args = p.parse_args()

    from bkspark.client import BookKeeper
    from bkspark.localcluster import LocalCluster
    from bkspark.recovery.auditor import (DEFAULT_ENTRIES_CHECK_RATE, LISTINGS_IN_FLIGHT,
                                          METADATA_BATCH, Auditor, AuditorConfig)
    from bkspark.recovery.urm import UnderReplicationManager

    work = tempfile.mkdtemp(prefix="bkspark-bench-auditor-")
    try:
        with LocalCluster(num_bookies=3, data_dir=os.path.join(work, "bookies")) as cluster, \
                BookKeeper(cluster.metadata_uri) as bk:
            t = time.perf_counter()
            fill(bk, args.ledgers, args.entries)
            print(f"# filled {args.ledgers} ledgers in {time.perf_counter() - t:.0f} s",
                  flush=True)
            bookie_pids = [b.proc.pid for b in cluster.bookies]
            auditor = Auditor(bk, AuditorConfig(entries_check_rate=0), "bench-auditor")
            batched = best_of(args.repeat, auditor.check_all_ledgers, bookie_pids)
            assert batched.result == 0 and UnderReplicationManager(bk.store).list() == [], \
                "a healthy cluster's check published ledgers"
            reference = None
            if not args.no_reference:
                reference = best_of(args.repeat, lambda: reference_check(auditor), bookie_pids)
                assert reference.result == 0, "the reference found ledgers lacking entries"
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"# bench/auditor.py, {when}, {os.cpu_count()} CPUs, Python "
              f"{platform.python_version()}, 3 local bookies, sqlite metadata, "
              f"{args.ledgers} closed ledgers x {args.entries} entries, E=3 Qw=2 Qa=2, "
              f"best of {args.repeat}")
        print(f"# batched: metadata {METADATA_BATCH} ledgers a round, {LISTINGS_IN_FLIGHT} "
              "ListEntries in flight, entries_check_rate=0 (unlimited)")
        print(f"{'entries check':<36}{'seconds':>9}{'ledgers/s':>11}{'auditor CPU s':>15}"
              f"{'bookies CPU s':>15}{'machine busy':>14}")
        rows = [("batched (check_all_ledgers)", batched)]
        if reference is not None:
            rows.append(("one at a time (reference, before)", reference))
        for label, t in rows:
            print(f"{label:<36}{t.seconds:>9.2f}{args.ledgers / t.seconds:>11.0f}"
                  f"{t.auditor_cpu:>15.1f}{t.bookies_cpu:>15.1f}{t.machine_busy:>13.0%}")
        if reference is not None:
            print(f"# speed-up {reference.seconds / batched.seconds:.1f}x")
        print(f"# at the default rate limit ({DEFAULT_ENTRIES_CHECK_RATE:g} ledgers/s) a check "
              f"takes at least {args.ledgers / DEFAULT_ENTRIES_CHECK_RATE:.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
