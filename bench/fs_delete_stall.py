"""What removing a large file costs a concurrent fdatasync on this filesystem (issue 53, item 3).

A bookie removes entry logs a compaction emptied (up to ``entry_log_max_size``, 1 GiB) and
journal files the checkpoint no longer needs (up to 512 MiB) while its journal syncs adds. A
thread here writes 4 KiB and fdatasyncs in a loop (a journal's pattern) in ``--dir``; meanwhile
a ``--mb`` MiB file, written and synced before, is removed -- by one ``unlink``, or as
bookie_native's ``unlink_gradually`` removes compacted entry logs and (on its reaper thread)
old journals (bookie_native/engine.c: cut 8 MiB off its end at a time, 5 ms apart, then
unlink; the constants are repeated here). Prints, for each way and
``--rounds`` interleaved rounds, the fdatasync's p50/p99/max from the removal's start to 1.5 s
after it, beside the same loop's figures just before (the reference).

    python bench/fs_delete_stall.py [--mb 1024] [--rounds 2] [--dir DIR]
                                    [--step-mb 8] [--pause-ms 5]

2026-12-07 17:39 UTC, this machine (ext4 mounted with ``discard``, /tmp), 1 GiB, 2 rounds
(tests ran beside it): one unlink took 226-239 ms and held fdatasyncs up to 55-61 ms (just
before: at most 2.9-3.8 ms); cut 32 MiB at a time 20 ms apart, 867-911 ms, at most 8.6 and
27.6 ms. An ad hoc run of the same loop ~17:30 UTC, quiet: 48-73 ms against 8.7-10.4 ms.

2026-12-07 22:09 UTC, the same / remounted ``nodiscard`` for the run: one unlink 55-71 ms,
syncs at most 6.5-8.1 ms (with ``discard`` minutes before: 37-39 ms). 22:45 UTC, ``discard``,
five rounds each: 32 MiB cuts 20 ms apart, syncs at most 5.0-14.7 ms (median 5.6); 8 MiB cuts
5 ms apart (the engine's since), 1.7-9.0 ms (median 2.5); 4 MiB cuts 2.5 ms apart, 2.3-5.1 ms,
but a p99 of 0.5 ms against 0.15.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

STEP_BYTES = 8 << 20            # bookie_native/engine.c DELETE_STEP_BYTES
PAUSE_S = 0.005                 # ... DELETE_PAUSE_NS


def big_file(path: str, mb: int) -> None:
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def syncing(path: str, stop: threading.Event, lat: list) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    block = b"x" * 4096
    try:
        while not stop.is_set():
            os.write(fd, block)
            t = time.perf_counter()
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)


def remove(path: str, gradually: bool, step: int = STEP_BYTES, pause: float = PAUSE_S) -> None:
    if gradually:
        fd = os.open(path, os.O_WRONLY)
        try:
            size = os.fstat(fd).st_size
            while size > step:
                size -= step
                os.ftruncate(fd, size)
                time.sleep(pause)
        finally:
            os.close(fd)
    os.unlink(path)


def ms(xs: list, q: float) -> str:
    xs = sorted(xs)
    return f"{xs[min(len(xs) - 1, int(len(xs) * q))] * 1e3:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where (default: a temporary directory)")
    ap.add_argument("--step-mb", type=int, default=STEP_BYTES >> 20,
                    help="the cut of the gradual removal (default: the engine's)")
    ap.add_argument("--pause-ms", type=float, default=PAUSE_S * 1e3,
                    help="the pause between two cuts (default: the engine's)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bkspark-bench-delete-", dir=args.dir) as d:
        st = os.statvfs(d)
        print(f"# bench/fs_delete_stall.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
              f"{d} (block size {st.f_bsize}), a {args.mb} MiB file, {args.rounds} rounds")
        for _ in range(args.rounds):
            for gradually in (False, True):
                target = os.path.join(d, "big")
                big_file(target, args.mb)
                time.sleep(1.0)
                stop, lat = threading.Event(), []
                t = threading.Thread(target=syncing, args=(os.path.join(d, "journal"), stop, lat))
                t.start()
                time.sleep(0.5)
                n0 = len(lat)
                t0 = time.perf_counter()
                remove(target, gradually, args.step_mb << 20, args.pause_ms / 1e3)
                took = time.perf_counter() - t0
                time.sleep(1.5)
                stop.set()
                t.join()
                before, after = lat[:n0], lat[n0:]
                way = (f"cut {args.step_mb} MiB a step ({args.pause_ms:g} ms), unlink" if gradually
                       else "one unlink")
                print(f"{way:<32} took {took * 1e3:7.1f} ms | fdatasync meanwhile: p50 "
                      f"{ms(after, 0.5)} p99 {ms(after, 0.99)} max {max(after) * 1e3:.1f} ms "
                      f"({len(after)}) | before: p50 {ms(before, 0.5)} max "
                      f"{max(before) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
