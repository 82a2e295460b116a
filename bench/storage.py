#!/usr/bin/env python3
"""Bookie storage throughput with sync on, beside a raw write+fdatasync loop at the same batch size.

For each entry size, N Python threads call Storage.add_entries() with batches of B entries (as the
bookie server does: one batch per gRPC message); every call returns only after its journal records
are fdatasync'ed.  The raw loop appends the same number of bytes per call (B x (entry + journal
record header)) to a preallocated file with one os.pwrite() + os.fdatasync() per batch (both release
the GIL; ~1 us of Python per call).  The "raw double write" loop is the same loop while a second
thread writes the same bytes again to another file in 16 MiB pwrite chunks with one fdatasync per
64 MiB -- what any design that keeps a second copy (entry logs) on the same disk pays at least, with
no CPU work: raw double write / raw is the bound the double write puts on the storage ratio.  All run
in this process, on the same disk, in interleaved rounds (the disk is shared and noisy), and the
medians are compared; the load average is printed with every figure.  The storage figure includes
the background checkpoints that copy the write cache to entry logs on the same disk.

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


def raw_loop(path: str, batch_bytes: int, seconds: float, prealloc: bool,
             double: bool = False) -> tuple[float, int]:
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    buf = os.urandom(batch_bytes)
    if prealloc:
        os.posix_fallocate(fd, 0, 16 << 20)
    n = 0
    pre_end = 16 << 20 if prealloc else 0
    pos = 0
    stop = threading.Event()
    copier = None
    if double:  # the second copy: same bytes, to another file, in big chunks, rare fdatasyncs
        chunk = (buf * ((16 << 20) // batch_bytes + 1))[:16 << 20]

        def copy() -> None:
            cfd = os.open(path + ".copy", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
            done = 0
            while not stop.is_set():
                if n * batch_bytes - done < len(chunk):
                    time.sleep(0.0005)
                    continue
                os.pwrite(cfd, chunk, done)
                done += len(chunk)
                if done % (64 << 20) == 0:
                    os.fdatasync(cfd)
            os.close(cfd)
            os.unlink(path + ".copy")

        copier = threading.Thread(target=copy)
        copier.start()
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
    stop.set()
    if copier is not None:
        copier.join()
    os.close(fd)
    os.unlink(path)
    return dt, n


def storage_run(s: Storage, lid_base: int, entry_size: int, batch: int, threads: int, seconds: float) -> dict:
    body = os.urandom(entry_size)
    key = b"bench-password"
    counts = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)

    def worker(t: int) -> None:
        lid = lid_base + t
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
    n = sum(counts)
    syncs = st1["journal_syncs"] - st0["journal_syncs"]
    return {
        "entries_s": n / dt, "mb_s": n * entry_size / dt / 1e6, "syncs": syncs,
        "group_kib": (st1["journal_bytes"] - st0["journal_bytes"]) / max(1, syncs) / 1024,
        "sync_ms": (st1["journal_sync_ns_sum"] - st0["journal_sync_ns_sum"]) / max(1, syncs) / 1e6,
        "checkpoints": st1["checkpoints"] - st0["checkpoints"],
        "flushes": st1["flushes"] - st0["flushes"],
        "cache_waits": st1["cache_full_waits"] - st0["cache_full_waits"],
    }


def loadavg() -> str:
    try:
        return "load " + " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "load ?"


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="directory on the disk to test (default: a temp dir)")
    ap.add_argument("--seconds", type=float, default=14.0, help="storage seconds per entry size")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved raw/storage rounds per entry size")
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
            cfg = StorageConfig(journal_dir=os.path.join(d, "journal"), ledger_dirs=[os.path.join(d, "ledgers")],
                                write_cache_bytes=args.cache_mb << 20, journal_sync=not args.no_sync,
                                checkpoint_interval_s=10)
            s = Storage(cfg)
            batch_bytes = batch * (size + JOURNAL_RECORD_OVERHEAD)
            # the shared disk is noisy: interleave short rounds of raw and storage, report medians
            runs, raws, raw2s = [], [], []
            per = args.seconds / args.rounds
            load0 = loadavg()
            for r in range(args.rounds):
                dt, n = raw_loop(os.path.join(root, "raw.dat"), batch_bytes, per / 2, True)
                raws.append(n * batch / dt)
                dt, n = raw_loop(os.path.join(root, "raw.dat"), batch_bytes, per / 2, True, double=True)
                raw2s.append(n * batch / dt)
                runs.append(storage_run(s, 1000 * (r + 1), size, batch, args.threads, per))
            s.close()
            shutil.rmtree(d, ignore_errors=True)
            st = {k: median([x[k] for x in runs]) for k in runs[0]}
            raw_e = median(raws)
            raw2_e = median(raw2s)
            print(f"\nentry {size} B, batch {batch} entries/call ({batch_bytes / 1024:.0f} KiB/call), "
                  f"{args.rounds} interleaved rounds, medians ({load0} at start, {loadavg()} at end):")
            print(f"  storage add_entries : {st['entries_s']:>10,.0f} entries/s  {st['mb_s']:8.1f} MB/s   "
                  f"({args.threads} threads; avg group {st['group_kib']:.0f} KiB, avg write+sync {st['sync_ms']:.2f} ms,"
                  f" {st['flushes']} cache flushes + {st['checkpoints']} checkpoints/round, {st['cache_waits']} cache-full waits/round)")
            print(f"  raw write+fdatasync : {raw_e:>10,.0f} entries/s  {raw_e * size / 1e6:8.1f} MB/s   "
                  f"(one os.pwrite of {batch_bytes / 1024:.0f} KiB + os.fdatasync per batch, preallocated file)")
            print(f"  raw double write    : {raw2_e:>10,.0f} entries/s  {raw2_e * size / 1e6:8.1f} MB/s   "
                  f"(the same loop + the same bytes copied to a second file: {raw2_e / raw_e * 100:.0f}% of raw)")
            print(f"  ratio storage/raw   : {st['entries_s'] / raw_e * 100:.0f}%   "
                  f"(storage/raw double write: {st['entries_s'] / raw2_e * 100:.0f}%; per-round storage entries/s: "
                  f"{', '.join(format(x['entries_s'], ',.0f') for x in runs)}; "
                  f"raw: {', '.join(format(x, ',.0f') for x in raws)}; "
                  f"raw double write: {', '.join(format(x, ',.0f') for x in raw2s)})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
