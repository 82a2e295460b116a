"""Foreground adds while the bookies collect and compact deleted ledgers (issue 53, item 3).

A retention cut deletes ledgers; each bookie then garbage-collects them (its index entries)
and compacts the entry logs they leave mostly dead (copying the live records out, at
``compaction_rate_mb_per_s``). This bench measures what that does to the adds of a writer
that keeps going, against the same writer with the bookies idle, in one run:

1. the peak add rate at ``--size`` (``--peak-seconds``), then a paced run at ``--fraction``
   of it with the bookies idle: the reference;
2. ``--garbage-mb`` of ``--garbage-size`` entries written into three ledgers at once (their entries interleave in every
   entry log), the bookies left to flush it, then two of the three deleted: every entry log
   is two-thirds dead, below the compaction threshold (0.5 by default);
3. the same paced run once they are idle, before the delete: a second reference, on the
   machine as the garbage left it (its page cache, the index's own compactions);
4. at once after the delete, the same paced run, ``--gc-seconds`` long, while the bookies collect and compact
   (garbage collection every ``--gc-interval`` s) -- the line says how many bytes they
   compacted meanwhile (counted when a pass ends), how long their re-pointing held flushes
   off, and how long adds waited for a full write cache;
5. the same paced run once they are idle again (the machine may have changed: a third
   reference).

Every paced run deletes its ledger when it ends (gigabytes of entry logs); each phase starts
only once the bookies have collected the one before it, so no phase pays for removing another
phase's files (until 2026-12-07 the collecting phase and the last one did: the last one's
reference removed ~18 GB of the collecting phase's logs).

Each paced line prints the client's p50/p99/p99.9, the bookie side of the latency (time to
store an add message durably, from their /metrics), the bookies' CPU, and the p99 ratio to
the first reference; the collecting line also its ratio to the second (target: <= 2x). Under
it: the bookies' CPU by thread (``bookie-gc`` collects and compacts, ``bookie-data-con``
serves adds, ``bks-ckpt`` flushes, ``rocksdb:*`` is the index's own work), their block I/O
and the disk's busy time and discards (bench/procstat.py ``Activity``), and where the late
adds' time went, stage by stage (``--trace``, the client's add trace).

    python bench/gc_stall.py [--size 65536] [--garbage-mb 768] [--seconds 10]
                             [--compaction-rate 16] [--bookies 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client import (BookKeeper, BookieCluster, freeze_startup_heap,  # noqa: E402
                    measured, percentile, report, run, settle, slow_summary, storage_histogram,
                    storage_counter, storage_summary, trace_summary)
from procstat import Activity, wait_idle  # noqa: E402


def garbage(bk, ensemble: int, qw: int, qa: int, mb: int, size: int) -> list:
    """``mb`` MiB of ``size``-byte entries in three ledgers written together (their entries
    interleave in the entry logs); returns their ids, closed."""
    payload = os.urandom(size)
    per_call = max(1, (256 << 10) // size)
    handles = [bk.create_ledger(ensemble, qw, qa, digest="crc32c", password=b"bench")
               for _ in range(3)]
    pending = []
    for _ in range((mb << 20) // size // 3 // per_call):
        for lh in handles:
            pending.append(lh.append_many_async([payload] * per_call))
        if len(pending) > 24:
            pending.pop(0).result(120)
    for f in pending:
        f.result(120)
    for lh in handles:
        lh.close()
    return [lh.ledger_id for lh in handles]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64 << 10, help="bytes per entry of the writer")
    ap.add_argument("--fraction", type=float, default=0.5, help="pace, as a fraction of peak")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each paced run")
    ap.add_argument("--peak-seconds", type=float, default=3.0)
    ap.add_argument("--gc-seconds", type=float, default=30.0,
                    help="length of the paced run while the bookies collect and compact (long "
                         "enough for their passes to finish in it)")
    ap.add_argument("--garbage-mb", type=int, default=768)
    ap.add_argument("--garbage-size", type=int, default=1024,
                    help="bytes per entry of the deleted ledgers (small entries: many index "
                         "records for the collection to drop)")
    ap.add_argument("--gc-interval", type=float, default=3.0)
    ap.add_argument("--compaction-rate", type=float, default=None,
                    help="the bookies' compaction_rate_mb_per_s (default: theirs, 16; 0: unlimited)")
    ap.add_argument("--bookies", type=int, default=3, choices=(1, 3))
    ap.add_argument("--trace", type=int, default=16, metavar="N",
                    help="stamp 1 add in N at each stage of its way and print where the late "
                         "ones' time went (0: off)")
    args = ap.parse_args()
    e, qw, qa = (3, 2, 2) if args.bookies == 3 else (1, 1, 1)
    extra = ["--gc-interval-s", str(args.gc_interval)]
    if args.compaction_rate is not None:
        extra += ["--compaction-rate-mb-per-s", str(args.compaction_rate)]
    with tempfile.TemporaryDirectory(prefix="bkspark-bench-gc-") as d, \
            BookieCluster(f"sqlite://{d}/meta.db", num_bookies=args.bookies, data_dir=d,
                          fault_injection=False, extra_args=extra) as c, \
            BookKeeper(c.metadata_uri, max_outstanding_bytes=8 << 20, add_timeout=30) as bk:
        freeze_startup_heap()
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        rate_mb = "default (16)" if args.compaction_rate is None else f"{args.compaction_rate:g}"
        print(f"# bench/gc_stall.py, {when}: {args.bookies} bookies on loopback, E={e} Qw={qw} "
              f"Qa={qa}, {args.size} B entries, sqlite metadata, journal sync on, "
              f"{os.cpu_count()} CPUs, gc every {args.gc_interval:g} s, compaction rate "
              f"{rate_mb} MB/s, garbage {args.garbage_mb} MiB of {args.garbage_size} B entries "
              "(2/3 deleted)", flush=True)
        batch = max(1, (256 << 10) // args.size)
        settle(c)
        n, el, lat, _, cpu = measured(
            bk, c, lambda: run(bk, e, qw, qa, args.size, args.peak_seconds, batch))
        peak = report("peak", args.size, n, el, lat, cpu)
        rate = peak * args.fraction

        def paced(label: str, reference: float | None, seconds: float | None = None) -> float:
            h0 = storage_histogram(c)
            compacted0 = storage_counter(c, "compacted_bytes")
            waits0 = storage_counter(c, "cache_full_waits")
            timers0 = {t: storage_counter(c, f"t_{t}_ns") for t in ("cache_wait", "c_repoint")}
            activity = Activity((b.proc.pid for b in c.bookies), d)
            tracer = bk.trace_adds(args.trace) if args.trace else None
            n, el, lat, slow, cpu = measured(
                bk, c, lambda: run(bk, e, qw, qa, args.size, seconds or args.seconds, 1, rate=rate))
            bk.stop_tracing_adds()
            report(label, args.size, n, el, lat, cpu)
            print(activity.summary(), flush=True)
            print(storage_summary(h0, storage_histogram(c)), flush=True)
            print(slow_summary(n, el, slow), flush=True)
            if tracer is not None:
                print(trace_summary(tracer, run.ledger_id), flush=True)
            p99 = percentile(lat, 0.99)
            compacted = storage_counter(c, "compacted_bytes") - compacted0
            waits = storage_counter(c, "cache_full_waits") - waits0
            timers = {t: (storage_counter(c, f"t_{t}_ns") - v) / 1e9 for t, v in timers0.items()}
            print(f"    compacted meanwhile: {compacted / 1e6:.0f} MB (re-pointing, which holds off "
                  f"flushes: {timers['c_repoint']:.2f} s); adds that waited for a full write cache: "
                  f"{waits:.0f}, {timers['cache_wait']:.2f} s"
                  + ("" if reference is None else f"; p99 {p99 / reference:.2f}x the reference"),
                  flush=True)
            return p99

        settle(c)
        reference = paced(f"paced at {args.fraction:g} x peak, idle", None)
        settle(c)
        t = time.perf_counter()
        ids = garbage(bk, e, qw, qa, args.garbage_mb, args.garbage_size)
        print(f"    (garbage written in {time.perf_counter() - t:.0f} s)", flush=True)
        wait_idle(b.proc.pid for b in c.bookies)     # their flushes of it done
        before = paced("  ... after the garbage, before the delete", reference)
        # the paced run's own ledger (deleted after it) collected first: its gigabytes of
        # entry logs, removed under the next phase, would be measured as this delete's cost
        settle(c, keep=len(ids) * e)
        bk.delete_ledgers(ids[:2])
        t = time.perf_counter()
        during = paced("  ... while they collect + compact", reference, args.gc_seconds)
        print(f"    p99 {during / before:.2f}x the reference taken after the garbage, before the "
              "delete (target <= 2x)", flush=True)
        settle(c, limit=600, keep=len(ids[2:]) * e)    # (its compaction done, too)
        print(f"    (bookies idle again {time.perf_counter() - t:.0f} s after the delete)")
        paced("  ... idle again", reference)
        bk.delete_ledgers(ids[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
