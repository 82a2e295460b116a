#!/usr/bin/env python3
"""Bookie storage throughput with sync on, beside a raw write+fdatasync loop at the same batch size.

For each entry size, N Python threads call Storage.add_entries() with batches of B entries (as the
bookie server does: one batch per gRPC message); every call returns only after its journal records
are fdatasync'ed.  The raw loop appends the same number of bytes per call (B x (entry + journal
record header)) to a preallocated file with one write() + fdatasync() per batch, in C (via the
storage engine's own primitives is not possible from Python, so it uses os.write/os.fdatasync, which
release the GIL and cost ~1 us of Python per call).  Both run in this process, on the same disk.

    python3 bench/storage.py                  # default run, < 60 s
    python3 bench/storage.py --seconds 10 --threads 4 --dir /path/on/disk
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bkspark.bookie.storage import Storage, StorageConfig  # noqa: E402

JOURNAL_RECORD_OVERHEAD = 12 + 16  # record header + ledger id + entry id


def raw_loop(path: str, batch_bytes: int, seconds: float, prealloc: bool) -> tuple[float, int]:
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    buf = os.urandom(batch_bytes)
    if prealloc:
        os.posix_fallocate(fd, 0, 16 << 20)
    n = 0
    pre_end = 16 << 20 if prealloc else 0
    pos = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        if prealloc and pos + batch_bytes > pre_end:
            os.posix_fallocate(fd, pre_end, 16 << 20)
            pre_end += 16 << 20
        os.pwrite(fd, buf, pos)
        pos += batch_bytes
        os.fdatasync(fd)
        n += 1
    dt = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    return dt, n


def storage_run(d: str, entry_size: int, batch: int, threads: int, seconds: float, sync: bool,
                cache: int) -> dict:
    cfg = StorageConfig(journal_dir=os.path.join(d, "journal"), ledger_dirs=[os.path.join(d, "ledgers")],
                        write_cache_bytes=cache, journal_sync=sync, checkpoint_interval_s=10)
    s = Storage(cfg)
    body = os.urandom(entry_size)
    key = b"bench-password"
    counts = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)

    def worker(t: int) -> None:
        lid = 1000 + t
        nxt = 0
        add = s.add_entries
        start.wait()
        while not stop.is_set():
            st = add([(lid, nxt + i, key, False, body) for i in range(batch)])
            if st[0] != 0:
                raise RuntimeError(f"add failed: {st[:3]}")
            nxt += batch
        counts[t] = nxt

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    st0 = s.stats()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    st1 = s.stats()
    s.close()
    n = sum(counts)
    syncs = st1["journal_syncs"] - st0["journal_syncs"]
    return {
        "entries_s": n / dt, "mb_s": n * entry_size / dt / 1e6, "syncs": syncs,
        "avg_group_kib": (st1["journal_bytes"] - st0["journal_bytes"]) / max(1, syncs) / 1024,
        "avg_sync_ms": (st1["journal_sync_ns_sum"] - st0["journal_sync_ns_sum"]) / max(1, syncs) / 1e6,
        "checkpoints": st1["checkpoints"] - st0["checkpoints"], "cache_waits": st1["cache_full_waits"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="directory on the disk to test (default: a temp dir)")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per measurement")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--cache-mb", type=int, default=64)
    ap.add_argument("--sizes", default="1024:256,65536:8", help="entry_size:batch pairs")
    ap.add_argument("--no-sync", action="store_true", help="benchmark-only: journal without fdatasync")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bks-bench-", dir=args.dir)
    print(f"bkspark storage benchmark: dir={root} threads={args.threads} seconds={args.seconds} "
          f"write_cache={args.cache_mb}MiB journal_sync={not args.no_sync} group_wait=2ms threshold=512KiB "
          f"cpus={os.cpu_count()}")
    try:
        for spec in args.sizes.split(","):
            size, batch = map(int, spec.split(":"))
            d = os.path.join(root, f"s{size}")
            r = storage_run(d, size, batch, args.threads, args.seconds, not args.no_sync, args.cache_mb << 20)
            shutil.rmtree(d, ignore_errors=True)
            batch_bytes = batch * (size + JOURNAL_RECORD_OVERHEAD)
            raw = {}
            for pre in (False, True):
                dt, n = raw_loop(os.path.join(root, "raw.dat"), batch_bytes, args.seconds / 2, pre)
                raw[pre] = (n * batch / dt, n * batch_bytes / dt / 1e6, n / dt)
            best = max(raw.values(), key=lambda x: x[0])
            print(f"\nentry {size} B, batch {batch} entries ({batch_bytes / 1024:.0f} KiB/call):")
            print(f"  storage add_entries : {r['entries_s']:>10,.0f} entries/s  {r['mb_s']:8.1f} MB/s   "
                  f"({r['syncs']} syncs, avg group {r['avg_group_kib']:.0f} KiB, avg sync {r['avg_sync_ms']:.2f} ms, "
                  f"{r['checkpoints']} checkpoints, {r['cache_waits']} cache-full waits)")
            for pre in (False, True):
                e, mb, calls = raw[pre]
                print(f"  raw write+fdatasync : {e:>10,.0f} entries/s  {mb:8.1f} MB/s   "
                      f"({calls:,.0f} syncs/s, {'preallocated' if pre else 'appending'} file, 1 thread)")
            print(f"  ratio storage/raw   : {r['entries_s'] / best[0] * 100:.0f}% (vs the faster raw loop)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
