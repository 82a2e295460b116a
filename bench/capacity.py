#!/usr/bin/env python3
"""Bookie storage at capacity: memory, index size, reopen time and reads of one large store.

Prints figures, not pass/fail (issue 29, item 6).  Targets the index rework is judged against:
RSS <= the configured caches + 150 MB in both fills; reopen <= 5 s; add throughput >= 0.9x raw
fdatasync; sequential range reads no slower than the baseline; random point reads >= 20k/s from
a warm cache.  The same script measures the engine before and after; run it unchanged.

Phases (``--phases``, comma-separated, in this order):

* ``fill``   -- a child process fills ``<dir>/big`` with ``--entries`` entries of ``--entry-size``
  bytes spread over ``--ledgers`` ledgers (``--threads`` threads, ``add_entries`` calls of
  ``--batch`` entries, each call to one ledger, ledgers taken round-robin), journal fdatasync on,
  every other setting the bookie's defaults (``BookieConfig`` -> ``storage_config``).  It prints
  its own RSS and peak RSS (``/proc/self/status`` VmRSS / VmHWM) ``--samples`` times while
  filling, then after ``checkpoint()`` and after ``close()``.
* ``small``  -- the same in ``<dir>/small`` with ``--small-ledgers`` ledgers of
  ``--small-entries`` entries each (every call covers whole ledgers).
* ``reopen`` -- for each store present: the size on disk of the index (``index/``, RocksDB, and
  ``lastMark``; format 1: ``ledgers.state`` and every ``*.idx``; the ``.idx`` record lists, entry
  logs and journal are printed apart), then a fresh
  child drops the page cache of the store's files (``posix_fadvise(DONTNEED)`` on each file: only
  these files, the machine's cache is left alone), times ``Storage()`` and prints its RSS after
  the open and ``ListEntries`` (``Storage.list_entries``) calls/s over every ledger.
* ``reads``  -- in the reopen child of the big store, right after the open: random point reads
  (``read_entry`` of uniformly random (ledger, entry), ``--read-threads`` threads, at most
  ``--read-keys`` keys or ``--read-seconds``) -- cold; then the same keys again in a new order --
  warm (the first pass is the warm-up).
* ``ranges`` -- sequential range reads: whole ledgers in random order with ``read_range_into``
  in 4 MiB chunks (the bookie's default ``max_bytes_per_message``), one thread, for
  ``--range-seconds``: MB/s and entries/s.
* ``ratio``  -- ``bench/storage.py``'s add ratio (its ``raw_loop`` and ``storage_run``, imported:
  interleaved rounds, medians) on the reopened big store, i.e. with its full index loaded.

The store goes in a new temp dir under ``--dir`` (default ``$TMPDIR`` or ``/tmp``), removed at the
end unless ``--keep``; a kept one, passed as ``--dir``, is measured again without
``fill``/``small`` (and left in place).

    python3 bench/capacity.py                                     # full scale (see below)
    python3 bench/capacity.py --entries 10000000 --small-ledgers 100000
    python3 bench/capacity.py --dir /data/cap --keep --phases fill,small
    python3 bench/capacity.py --dir /data/cap/bks-cap-xxxx --phases reopen,reads,ranges,ratio

Full scale needs ~23 GB of disk and, with today's engine, ~3 GB of RAM; it ran in ~5 minutes.

Baseline, today's engine (in-memory index map loaded at open, 1 KiB key buffer per ledger),
2026-11-24, ``python3 bench/capacity.py`` (defaults: 100,000,000 x 100 B over 1,000 ledgers and
1,000,000 ledgers x 10 entries; 4 fill threads x 1,000 entries/call, journal fdatasync on, bookie
default storage settings: 64 MiB write cache, so the RSS target is 217 MB; 2 vCPUs shared, ext4 on
virtio, load ~2-2.8): big fill RSS 461 MB at 10M entries, 1,585 MB at 50M, 3,018 MB at 100M
(~30 B/entry), 946k entries/s; small fill 1,700 MB at 10M entries in 1M ledgers; index on disk
4,000 MB (big) and 437 MB (small); reopen 12.7 s to 2,498 MB RSS (peak 2,958 MB) and 4.0 s to
1,573 MB; random point reads 25.5k/s cold, 25.2k/s warm (4 threads); ListEntries 6.3k calls/s
(big, 100k entries per ledger) and 920k calls/s (small); sequential range reads 59 MB/s, 592k
entries/s (1 thread, bound by Python per entry); add ratio to raw fdatasync 104% (1 KiB entries,
on the filled store).

With the on-disk index (RocksDB, one record per run of entries; bookie_native/README.md "The
index"), same command, same machine, 2026-11-24 (load 0.4-2.6; caches: 64 MiB write cache + 32 MiB
index cache + 32 MiB of index memtables, RSS target 284 MB): big fill RSS 179 MB at 10M entries,
211 MB at 50M, 238 MB at 100M, 1.37M entries/s; small fill 250 MB at 10M entries in 1M ledgers;
index on disk 20 MB (big) and 27 MB (small), plus the .idx record lists compaction reads (4,000 MB
and 400 MB: unchanged); reopen 0.32 s to 57 MB RSS and 0.60 s to 59 MB (the open's peak, 520 MB,
is the journal replay's read-only map of the last journal file: page cache, not heap); random
point reads 19.2k/s cold, 18.8k/s warm (4 threads); ListEntries 268 calls/s (big: the 100k
entries of a ledger come from ~200 runs, then sorted) and 44k calls/s (small); sequential range
reads 56 MB/s, 560k entries/s; add ratio 81% (4 interleaved rounds; ``bench/storage.py`` alone in
the same hour: 88% against 83% for the engine before).

With run records that store one length for equal-length runs (varints otherwise) and
``ListEntries`` from the runs' bounds, same command, 2026-11-24 (load 1.5-2.4): big fill RSS
152 MB at 10M entries, 195 MB at 50M, 206 MB at 100M, 1.96M entries/s; small fill 255 MB at 10M
entries in 1M ledgers, 0.85M entries/s; index on disk 8.1 MB (big) and 31 MB (small); reopen
0.78 s to 56 MB and 0.56 s to 60 MB; random point reads 25.9k/s cold, 25.4k/s warm (4 threads);
ListEntries 13.4k calls/s (big) and 88k calls/s (small); sequential range reads 76 MB/s, 759k
entries/s; add ratio 87% at load 2.4 (``bench/storage.py`` alone in the same hour: 93%).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from bkspark.bookie.config import BookieConfig  # noqa: E402
from bkspark.bookie.server import storage_config  # noqa: E402
from bkspark.bookie.storage import Storage  # noqa: E402


def _bench_storage():
    spec = importlib.util.spec_from_file_location("bench_storage", os.path.join(HERE, "storage.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench_storage = _bench_storage()
KEY = b"bench-password"
PHASES = ("fill", "small", "reopen", "reads", "ranges", "ratio")


def proc_mem() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes."""
    rss = hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) << 10
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) << 10
    return rss, hwm


def mem_str() -> str:
    rss, hwm = proc_mem()
    return f"RSS {rss / 1e6:8.1f} MB  peak {hwm / 1e6:8.1f} MB"


def store_config(d: str):
    bc = BookieConfig(journal_dir=os.path.join(d, "journal"), ledger_dirs=[os.path.join(d, "ledgers")])
    return storage_config(bc)


def disk_usage(d: str) -> dict:
    """Bytes on disk (allocated blocks) and apparent sizes of the store's files, by kind."""
    kinds = {"index": [0, 0, 0], ".idx record lists": [0, 0, 0], "entry logs": [0, 0, 0], "journal": [0, 0, 0],
             "other": [0, 0, 0]}
    for root, _dirs, files in os.walk(d):
        for name in files:
            st = os.stat(os.path.join(root, name))
            if os.path.basename(root) in ("index", "index.tmp") or name in ("ledgers.state", "lastMark"):
                k = "index"  # (format 1: the *.idx were the index, counted below)
            elif name.endswith(".idx"):
                k = ".idx record lists"
            elif name.endswith(".log"):
                k = "entry logs"
            elif name.endswith(".txn"):
                k = "journal"
            else:
                k = "other"
            kinds[k][0] += st.st_blocks * 512
            kinds[k][1] += st.st_size
            kinds[k][2] += 1
    return kinds


def drop_file_cache(d: str) -> int:
    n = 0
    for root, _dirs, files in os.walk(d):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


# ---------------------------------------------------------------- children

def child_fill(a: dict) -> None:
    d, n_entries, n_ledgers, size = a["dir"], a["entries"], a["ledgers"], a["entry_size"]
    threads, batch, samples = a["threads"], a["batch"], a["samples"]
    print(f"  before open                : {mem_str()}", flush=True)
    s = Storage(store_config(d))
    print(f"  after open (empty)         : {mem_str()}", flush=True)
    body = os.urandom(size)
    per_ledger = n_entries // n_ledgers
    whole = a["whole_ledgers"]          # small fill: each call covers whole ledgers
    # work items: (ledger, first, count); a call covers `batch` entries
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "mark": 0}
    if whole:
        per_call = max(1, batch // per_ledger)
        n_calls = (n_ledgers + per_call - 1) // per_call
    else:
        chunks = (per_ledger + batch - 1) // batch
        n_calls = chunks * n_ledgers
    step = max(1, n_entries // samples)
    t0 = time.perf_counter()
    err = []

    def item(i: int):
        if whole:
            lo = i * per_call
            return [(lid, e, KEY, False, body) for lid in range(lo + 1, min(n_ledgers, lo + per_call) + 1)
                    for e in range(per_ledger)]
        lid, c = i % n_ledgers + 1, i // n_ledgers
        first = c * batch
        return [(lid, e, KEY, False, body) for e in range(first, min(per_ledger, first + batch))]

    def worker() -> None:
        add = s.add_entries
        try:
            while True:
                with lock:
                    i = state["next"]
                    if i >= n_calls:
                        return
                    state["next"] = i + 1
                entries = item(i)
                st = add(entries)
                if st[0] != 0 or st[-1] != 0:
                    raise RuntimeError(f"add failed: {st[:3]}")
                with lock:
                    state["done"] += len(entries)
                    if state["done"] >= state["mark"] + step:
                        state["mark"] = state["done"] - state["done"] % step
                        dt = time.perf_counter() - t0
                        print(f"  {state['done']:>12,} entries  : {mem_str()}   "
                              f"({state['done'] / dt:,.0f} entries/s so far)", flush=True)
        except BaseException as exc:  # noqa: BLE001
            err.append(exc)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if err:
        raise err[0]
    dt = time.perf_counter() - t0
    n = state["done"]
    print(f"  filled {n:,} entries in {dt:.1f} s: {n / dt:,.0f} entries/s, {n * size / dt / 1e6:.1f} MB/s of bodies",
          flush=True)
    t1 = time.perf_counter()
    s.checkpoint()
    print(f"  after checkpoint ({time.perf_counter() - t1:.1f} s) : {mem_str()}", flush=True)
    t1 = time.perf_counter()
    s.close()
    print(f"  after close ({time.perf_counter() - t1:.1f} s)      : {mem_str()}", flush=True)


def _key_space(s: Storage):
    lids = sorted(s.ledgers())
    lasts = [s.last_entry_id(lid) for lid in lids]
    return lids, lasts


def _point_reads(s: Storage, keys: list, threads: int, seconds: float) -> tuple[int, float, int]:
    """Read keys (split over threads) until done or `seconds`; (reads, elapsed, bytes)."""
    counts = [0] * threads
    nbytes = [0] * threads
    deadline = [0.0]
    start = threading.Barrier(threads + 1)
    err = []

    def worker(t: int) -> None:
        rd = s.read_entry
        mine = keys[t::threads]
        start.wait()
        n = b = 0
        try:
            for i, (lid, e) in enumerate(mine):
                b += len(rd(lid, e))
                n += 1
                if i & 255 == 0 and time.perf_counter() > deadline[0]:
                    break
        except BaseException as exc:  # noqa: BLE001
            err.append(exc)
        counts[t], nbytes[t] = n, b

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    t0 = time.perf_counter()
    deadline[0] = t0 + seconds
    start.wait()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    if err:
        raise err[0]
    return sum(counts), dt, sum(nbytes)


def child_open(a: dict) -> None:
    d, phases = a["dir"], a["phases"]
    n = drop_file_cache(d)
    print(f"  page cache of the store's {n} files dropped (posix_fadvise DONTNEED)", flush=True)
    print(f"  before open                : {mem_str()}", flush=True)
    t0 = time.perf_counter()
    s = Storage(store_config(d))
    dt = time.perf_counter() - t0
    print(f"  reopen                     : {dt:.2f} s", flush=True)
    print(f"  after open                 : {mem_str()}", flush=True)
    lids, lasts = _key_space(s)
    total = sum(x + 1 for x in lasts)
    print(f"  store holds {len(lids):,} ledgers, {total:,} entries", flush=True)
    rng = random.Random(29)
    if "reads" in phases and lids:
        keys = []
        for _ in range(a["read_keys"]):
            i = rng.randrange(len(lids))
            keys.append((lids[i], rng.randint(0, lasts[i])))
        n, dt, b = _point_reads(s, keys, a["read_threads"], a["read_seconds"])
        print(f"  random point reads, cold   : {n / dt:>10,.0f} reads/s  ({n:,} reads in {dt:.1f} s, "
              f"{a['read_threads']} threads, {b / n if n else 0:.0f} B each)  {mem_str()}", flush=True)
        warm = keys[:n]
        rng.shuffle(warm)
        n2, dt2, _ = _point_reads(s, warm, a["read_threads"], a["read_seconds"])
        print(f"  random point reads, warm   : {n2 / dt2:>10,.0f} reads/s  ({n2:,} reads in {dt2:.1f} s, "
              f"the same {n:,} keys again, new order)  {mem_str()}", flush=True)
    if "reopen" in phases and lids:
        t0 = time.perf_counter()
        ranges = 0
        for lid in lids:
            ranges += len(s.list_entries(lid))
        dt = time.perf_counter() - t0
        print(f"  ListEntries (list_entries) : {len(lids) / dt:>10,.0f} calls/s, {total / dt:,.0f} entries/s listed "
              f"({len(lids):,} ledgers in {dt:.2f} s, {ranges:,} ranges)  {mem_str()}", flush=True)
    if "ranges" in phases and lids:
        buf = bytearray(4 << 20)
        order = list(range(len(lids)))
        rng.shuffle(order)
        n = b = ledgers = 0
        t0 = time.perf_counter()
        deadline = t0 + a["range_seconds"]
        for i in order:
            lid, last = lids[i], lasts[i]
            nxt = 0
            while nxt <= last:
                chunk = s.read_range_into(lid, nxt, last, 4 << 20, buf)
                if not chunk:
                    chunk = s.read_range(lid, nxt, last, 4 << 20)
                for _e, body in chunk:
                    b += len(body)
                n += len(chunk)
                nxt = chunk[-1][0] + 1
            ledgers += 1
            if time.perf_counter() > deadline:
                break
        dt = time.perf_counter() - t0
        print(f"  sequential range reads     : {b / dt / 1e6:>10,.1f} MB/s, {n / dt:,.0f} entries/s  "
              f"({ledgers:,} whole ledgers, {n:,} entries in {dt:.1f} s, read_range_into 4 MiB chunks, 1 thread)  "
              f"{mem_str()}", flush=True)
    if "ratio" in phases:
        bs = bench_storage
        size, batch = a["ratio_size"], a["ratio_batch"]
        batch_bytes = batch * (size + bs.JOURNAL_RECORD_OVERHEAD)
        per = a["ratio_seconds"] / a["ratio_rounds"]
        raws, runs = [], []
        raw_path = os.path.join(d, "raw.dat")
        load0 = bs.loadavg()
        base = (max(lids) + 1 if lids else 1) + 1_000_000
        for r in range(a["ratio_rounds"]):
            dt, k = bs.raw_loop(raw_path, batch_bytes, per / 2, True)
            raws.append(k * batch / dt)
            runs.append(bs.storage_run(s, base + 1000 * r, size, batch, a["ratio_threads"], per))
        st = bs.median([x["entries_s"] for x in runs])
        raw = bs.median(raws)
        print(f"  add ratio (bench/storage.py raw_loop + storage_run; entry {size} B, batch {batch}, "
              f"{a['ratio_threads']} threads, {a['ratio_rounds']} interleaved rounds, medians; {load0} at start, "
              f"{bs.loadavg()} at end):", flush=True)
        print(f"    storage add_entries      : {st:>10,.0f} entries/s  (per round: "
              f"{', '.join(format(x['entries_s'], ',.0f') for x in runs)})", flush=True)
        print(f"    raw write+fdatasync      : {raw:>10,.0f} entries/s  (per round: "
              f"{', '.join(format(x, ',.0f') for x in raws)})", flush=True)
        print(f"    ratio storage/raw        : {st / raw * 100:.0f}%   {mem_str()}", flush=True)
    t0 = time.perf_counter()
    s.close()
    print(f"  close                      : {time.perf_counter() - t0:.2f} s", flush=True)


# ---------------------------------------------------------------- parent

def run_child(kind: str, a: dict) -> None:
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", kind, json.dumps(a)], check=False)
    if r.returncode != 0:
        raise SystemExit(f"child {kind} failed with exit code {r.returncode}")


def print_disk(d: str) -> None:
    u = disk_usage(d)
    ix = u["index"]
    print(f"  index on disk              : {ix[0] / 1e6:,.1f} MB allocated ({ix[1] / 1e6:,.1f} MB apparent) in "
          f"{ix[2]} files (index/ (RocksDB) + lastMark; format 1: ledgers.state + the .idx files)")
    for k in (".idx record lists", "entry logs", "journal", "other"):
        v = u[k]
        print(f"  {k + ' on disk':<27}: {v[0] / 1e6:,.1f} MB allocated ({v[1] / 1e6:,.1f} MB apparent) in {v[2]} files")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--_child":
        a = json.loads(sys.argv[3])
        {"fill": child_fill, "open": child_open}[sys.argv[2]](a)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100_000_000, help="entries of the big fill")
    ap.add_argument("--ledgers", type=int, default=1000, help="ledgers of the big fill")
    ap.add_argument("--entry-size", type=int, default=100)
    ap.add_argument("--small-ledgers", type=int, default=1_000_000, help="ledgers of the small-ledger fill")
    ap.add_argument("--small-entries", type=int, default=10, help="entries per small ledger")
    ap.add_argument("--threads", type=int, default=4, help="fill threads")
    ap.add_argument("--batch", type=int, default=1000, help="entries per add_entries call in the fills")
    ap.add_argument("--samples", type=int, default=10, help="RSS lines printed during a fill")
    ap.add_argument("--read-threads", type=int, default=4)
    ap.add_argument("--read-keys", type=int, default=200_000, help="random keys of the point-read passes")
    ap.add_argument("--read-seconds", type=float, default=15.0, help="cap of each point-read pass")
    ap.add_argument("--range-seconds", type=float, default=15.0)
    ap.add_argument("--ratio-sizes", default="1024:256", help="entry_size:batch of the add ratio "
                    "(bench/storage.py's first default)")
    ap.add_argument("--ratio-seconds", type=float, default=14.0)
    ap.add_argument("--ratio-rounds", type=int, default=4)
    ap.add_argument("--ratio-threads", type=int, default=4)
    ap.add_argument("--phases", default=",".join(PHASES), help=f"some of {','.join(PHASES)}")
    ap.add_argument("--dir", default=None, help="an existing store (from --keep) or a parent directory for a "
                    "new temp one (default: $TMPDIR or /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the directory")
    args = ap.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    bad = [p for p in phases if p not in PHASES]
    if bad:
        ap.error(f"unknown phase(s) {bad}; choose from {PHASES}")
    if args.dir and (os.path.isdir(os.path.join(args.dir, "big")) or os.path.isdir(os.path.join(args.dir, "small"))):
        root, created = args.dir, False
    else:
        root, created = tempfile.mkdtemp(prefix="bks-cap-", dir=args.dir), True
    rsize, rbatch = map(int, args.ratio_sizes.split(":"))
    cfg = store_config(os.path.join(root, "x"))
    print(f"bkspark capacity benchmark: dir={root} phases={','.join(phases)} cpus={os.cpu_count()} "
          f"{bench_storage.loadavg()}")
    print(f"  big fill: {args.entries:,} entries x {args.entry_size} B over {args.ledgers:,} ledgers; "
          f"small fill: {args.small_ledgers:,} ledgers x {args.small_entries} entries; "
          f"{args.threads} fill threads, {args.batch} entries/call, journal_sync={cfg.journal_sync}")
    caches = (cfg.write_cache_bytes + cfg.index_cache_bytes) >> 20
    memtables = 2 * (cfg.index_memtable_bytes >> 20)  # two RocksDB memtables (bookie_native/kv.c)
    print(f"  configured caches (bookie defaults): write cache {cfg.write_cache_bytes >> 20} MiB "
          f"(two halves; the journal's pending buffer never exceeds it), index cache "
          f"{cfg.index_cache_bytes >> 20} MiB + {memtables} MiB of index memtables, ledger cache "
          f"{cfg.ledger_cache_entries:,} ledgers, range-read buffer 4 MiB per reading "
          f"thread; entry_log_page_cache={cfg.entry_log_page_cache}, checkpoint every "
          f"{cfg.checkpoint_interval_s:g} s -> RSS target <= {caches + memtables} MiB + 150 MB "
          f"= {((caches + memtables) * 1.048576 + 150):.0f} MB")
    big, small = os.path.join(root, "big"), os.path.join(root, "small")
    common = {"threads": args.threads, "batch": args.batch, "samples": args.samples, "entry_size": args.entry_size}
    try:
        if "fill" in phases:
            print(f"\nfill {big}: {args.entries:,} entries over {args.ledgers:,} ledgers (child process)", flush=True)
            run_child("fill", dict(common, dir=big, entries=args.entries, ledgers=args.ledgers, whole_ledgers=False))
        if "small" in phases:
            n = args.small_ledgers * args.small_entries
            print(f"\nsmall fill {small}: {args.small_ledgers:,} ledgers x {args.small_entries} entries "
                  f"(child process)", flush=True)
            run_child("fill", dict(common, dir=small, entries=n, ledgers=args.small_ledgers, whole_ledgers=True))
        opened = [p for p in ("reopen", "reads", "ranges", "ratio") if p in phases]
        for d in (big, small):
            if not opened or not os.path.isdir(d):
                continue
            ph = opened if d == big else [p for p in opened if p == "reopen"]
            if not ph:
                continue
            print(f"\nreopen {d} (fresh child process): {','.join(ph)}", flush=True)
            print_disk(d)
            sys.stdout.flush()
            run_child("open", {"dir": d, "phases": ph, "read_keys": args.read_keys,
                               "read_threads": args.read_threads, "read_seconds": args.read_seconds,
                               "range_seconds": args.range_seconds, "ratio_size": rsize, "ratio_batch": rbatch,
                               "ratio_seconds": args.ratio_seconds, "ratio_rounds": args.ratio_rounds,
                               "ratio_threads": args.ratio_threads})
    finally:
        if args.keep or not created:
            print(f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
