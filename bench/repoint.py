"""What a compaction pass's re-point costs a copied entry (issue 53, item 3), storage alone.

Three ledgers of ``--entries`` 200-byte entries each are written interleaved, 500 at a time
(a write cache of 256 KiB: each flush holds 500 of each), into entry logs of 8 MiB; two of
the ledgers are deleted, and compaction passes run unthrottled until one copies nothing.
Prints the entries the passes copied, their time, and how long their re-points held the
checkpoint mutex (``t_c_repoint_ns``: flushes wait meanwhile), per copied entry -- beside the
same storage's flush re-point timer (``t_f_repoint_ns``, the flushes of the same run) as the
reference.

    python bench/repoint.py [--entries 300000]

2026-12-07 17:40 UTC, this machine (2 vCPUs), the default 300,000: 299,500 entries copied in
two passes; the re-point held flushes off 61.6 ms, 0.21 us a copied entry, looking them up
sorted with one iterator a ledger (kv_get_locs); before, a point lookup each: 1,525 ms, 5.09
us a copied entry, and the passes took 3.26 s instead of 1.74 s.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import checkout  # noqa: F401  (this checkout)

from bkspark.bookie.storage import Storage, StorageConfig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=300_000, help="entries a ledger")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bkspark-bench-repoint-") as d:
        s = Storage(StorageConfig(journal_dir=os.path.join(d, "j"),
                                  ledger_dirs=[os.path.join(d, "l0")],
                                  compaction_threshold=0.5,
                                  compaction_max_bytes_per_pass=1 << 30,
                                  compaction_rate_bytes_per_s=0, entry_log_max_size=8 << 20,
                                  write_cache_bytes=256 << 10))
        try:
            body = b"x" * 200
            for at in range(0, args.entries, 500):
                for lid in (1, 2, 3):
                    s.add_entries([(lid, e, b"k", False, body)
                                   for e in range(at, min(args.entries, at + 500))])
            s.checkpoint()
            s.delete_ledger(1)
            s.delete_ledger(2)
            s.checkpoint()
            t0 = time.perf_counter()
            copied = passes = 0
            while True:                     # (passes until one finds nothing to copy)
                st = s.compact()
                passes += 1
                copied += st["entries_copied"]
                if not st["entries_copied"] or passes >= 100:
                    break
            took = time.perf_counter() - t0
            timers = s.stats()
        finally:
            s.close()
    n = max(1, copied)
    print(f"# bench/repoint.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
          f"{os.cpu_count()} CPUs, 3 ledgers x {args.entries:,} entries of 200 B, 2 deleted, "
          "entry logs of 8 MiB, unthrottled passes until one copies nothing")
    print(f"{passes} passes copied {copied:,} entries in {took:.2f} s; the re-point held flushes "
          f"off {timers['t_c_repoint_ns'] / 1e6:.1f} ms = {timers['t_c_repoint_ns'] / n / 1e3:.2f} "
          f"us a copied entry (reference: the flushes' re-point took "
          f"{timers['t_f_repoint_ns'] / 1e6:.1f} ms in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
