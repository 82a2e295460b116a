#!/usr/bin/env python3
"""One bookie over loopback: streaming adds with sync on, beside the storage-only figure.

A real bookie process (``python -m bkspark.bookie``) on a temp dir; one client process
(this one) keeps ``--inflight`` AddBatch messages of ``--batch`` entries in flight on one
``AddStream`` and measures acknowledged entries/s, MB/s and per-entry add latency (send of
its batch -> its ack). In the same run, the storage engine alone (``bench/storage.py``'s
``storage_run``: threads calling ``Storage.add_entries`` with the same batch size) gives
the reference; the ratio is printed. Targets (issue 4): >= 80k entries/s at 1 KiB, >= 200 MB/s
at 64 KiB; bookie RSS under its write cache + 150 MB.

    python3 bench/bookie.py                 # ~1 minute
    python3 bench/bookie.py --seconds 10 --sizes 1024,65536
"""
from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)


from bkspark.bookie.storage import Storage, StorageConfig  # noqa: E402
from bkspark.localcluster import LocalCluster  # noqa: E402
from bkspark.proto import bookie_pb2 as pb  # noqa: E402
from bkspark.proto import bookie_pb2_grpc as pb_grpc  # noqa: E402
from storage import storage_run  # noqa: E402  (bench/storage.py)

KEY = b"\x01" * 20


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def bookie_run(address: str, ledger_id: int, size: int, batch: int, inflight: int, seconds: float,
               credentials) -> dict:
    payload = os.urandom(size)
    slots = threading.Semaphore(inflight)
    sent_at: dict[int, float] = {}
    latencies: list[float] = []
    acked = [0]
    stop = threading.Event()

    def batches():
        entry = 0
        while not stop.is_set():
            if not slots.acquire(timeout=0.5):
                continue
            adds = [pb.AddRequest(ledger_id=ledger_id, entry_id=entry + i, master_key=KEY,
                                  body=struct.pack(">qqqq", ledger_id, entry + i, entry + i - 1, size) + payload)
                    for i in range(batch)]
            sent_at[entry] = time.perf_counter()
            entry += batch
            yield pb.AddBatch(adds=adds)

    channel = credentials.channel(address, options=[("grpc.max_send_message_length", 256 << 20),
                                                    ("grpc.max_receive_message_length", 256 << 20)])
    stub = pb_grpc.BookieStub(channel)
    t0 = time.perf_counter()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    for reply in stub.AddStream(batches()):
        now = time.perf_counter()
        ok = sum(1 for r in reply.responses if r.status == 0)
        if ok != len(reply.responses):
            raise SystemExit(f"adds failed: {[r.status for r in reply.responses][:5]}")
        first = min(r.entry_id for r in reply.responses)
        start = sent_at.pop(first - first % batch, None)
        if start is not None:
            latencies.append(now - start)
        acked[0] += ok
        slots.release()
    dt = time.perf_counter() - t0
    channel.close()
    return {"entries_s": acked[0] / dt, "mb_s": acked[0] * size / dt / 1e6,
            "p50_ms": percentile(latencies, 50) * 1e3, "p99_ms": percentile(latencies, 99) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--sizes", default="1024,65536")
    ap.add_argument("--inflight", type=int, default=8, help="AddBatch messages in flight")
    ap.add_argument("--cache-mb", type=int, default=64)
    ap.add_argument("--dir", default=None, help="where bookie and storage reference keep their data")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="bkspark-bench-bookie-", dir=args.dir)
    print(f"config: 1 bookie over loopback, journal sync ON, write cache {args.cache_mb} MiB, "
          f"{args.inflight} batches in flight on one AddStream, {args.seconds:.0f} s per figure, dir {base}")
    results = []
    try:
        with LocalCluster(None, 1, os.path.join(base, "cluster"),
                          ["--write-cache-mb", str(args.cache_mb),
                           "--no-check-new-ledgers"]) as cluster:     # (ledgers by number)
            bookie = cluster.bookies[0]
            for n, size in enumerate(int(s) for s in args.sizes.split(",")):
                batch = max(1, min(256, (512 << 10) // size))
                got = bookie_run(bookie.bookie_id, 100 + n, size, batch, args.inflight, args.seconds,
                                 cluster.credentials("client"))
                got["rss_mb"] = rss_mb(bookie.proc.pid)
                results.append((size, batch, got))
        storage_dir = os.path.join(base, "storage")
        s = Storage(StorageConfig(journal_dir=os.path.join(storage_dir, "journal"),
                                  ledger_dirs=[os.path.join(storage_dir, "ledgers")],
                                  write_cache_bytes=args.cache_mb << 20))
        try:
            print(f"{'entry':>8} {'batch':>6} {'bookie e/s':>11} {'MB/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
                  f"{'storage e/s':>12} {'ratio':>6} {'bookie RSS MB':>14}")
            for n, (size, batch, got) in enumerate(results):
                ref = storage_run(s, 1000 + n * 100, size, batch, args.inflight, args.seconds)
                print(f"{size:>8} {batch:>6} {got['entries_s']:>11,.0f} {got['mb_s']:>8.1f} "
                      f"{got['p50_ms']:>7.2f} {got['p99_ms']:>7.2f} {ref['entries_s']:>12,.0f} "
                      f"{got['entries_s'] / ref['entries_s']:>6.2f} {got['rss_mb']:>14.0f}")
        finally:
            s.close()
        print(f"reference: storage engine alone (bench/storage.py storage_run, {args.inflight} threads, "
              "same batch size, same disk, same run). targets: 1 KiB >= 80k e/s, 64 KiB >= 200 MB/s, "
              f"RSS <= cache + 150 = {args.cache_mb + 150} MB")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
