#!/usr/bin/env python3
"""A log under a streaming-like commit load for a long time: does any cost climb with age?

Prints figures, not pass/fail (issue 30, item 5). A real ZooKeeper and 3 real bookies are
started in a temp dir; ``--writers`` threads each commit, in a loop, 1-4 new closed ledgers
of a few small entries to one log with ``LogStore.append_ledgers`` under an idempotency key
(writer id, sequence) -- what each micro-batch of a streaming query does. The log is created
with a retention policy keeping ``--keep-minutes`` (``RetentionPolicy(ms=...)``), applied by
the retention service where a deployment runs it: a ``bkspark autorecovery`` process of its own
(:mod:`bkspark.recovery.retention`, a pass every ``--retention-every`` seconds: the expired
ledgers leave the list in one transaction and are deleted), so the log's length, the bookies'
data and ZooKeeper's data should stop growing once it starts cutting. The default keeps one
minute, so that retention cuts through most of the first 10% too: the first and the last 10%
then compare the same steady state at different ages.

Printed per 10% of the commits: commit latency p50/p99 (the ``append_ledgers`` call: closed
ledgers' metadata reads, one metadata transaction), the log head record's size, the log's
metadata records (segments + ledger-index records), the bookies' RSS (sum) and disk use,
ZooKeeper's data directory size, the ledgers retention has cut so far, and the load average.
Targets (issue 30): commit p99 of the last 10% within 1.2x of the first 10%; head size
constant; bookie disk and RAM flat once retention cuts.

    python3 bench/endurance.py                          # 200,000 commits (hours on 2 vCPUs)
    python3 bench/endurance.py --commits 20000 --keep-minutes 0.5
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bkspark.client import BookKeeper  # noqa: E402
from bkspark.log import LogStore  # noqa: E402
from bkspark.log.retention import RetentionPolicy  # noqa: E402
from bkspark.localcluster import LocalCluster  # noqa: E402
from metadata import log_segments  # noqa: E402
from metadata.layout import log_path  # noqa: E402
from metadata.testing import ZooKeeperServer, unique_root  # noqa: E402


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def du(path: str) -> int:
    out = subprocess.run(["du", "-sb", path], capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout else 0


#: bookie flags that let a run of minutes reach its steady state of disk and memory use (see
#: --bookie-args): small journal files, entry logs, index memtables (whose write-ahead log RocksDB
#: holds to four of them) and index block cache, which the defaults size for months of data
STEADY_STATE_BOOKIE_ARGS = ("--journal-max-size-mb 16 --journal-max-backups 1 "
                            "--entry-log-max-size-mb 8 --gc-interval-s 10 "
                            "--index-memtable-mb 1 --index-cache-mb 8")


def add_cluster_arguments(ap: argparse.ArgumentParser) -> None:
    """``--dir`` and ``--bookie-args``: where the scratch cluster lives and its bookies' flags."""
    ap.add_argument("--dir", default=None, help="parent of the temp dir (default $TMPDIR or /tmp)")
    ap.add_argument("--bookie-args", default=STEADY_STATE_BOOKIE_ARGS,
                    help="flags of the bookies (default: %(default)r). A bookie's disk use is "
                         "bounded by its journal (--journal-max-size-mb x (1 + "
                         "--journal-max-backups), 512 MiB x 6 by default) and its entry logs "
                         "(the data retention keeps, plus the current log: an entry log is "
                         "compacted only once rolled, at --entry-log-max-size-mb, 1 GiB by "
                         "default) and its index's write-ahead log (4 x --index-memtable-mb); "
                         "small files reach that bound within a run of minutes, the "
                         "defaults only after tens of GB. '' runs the bookies' defaults")


def scratch_zookeeper(prefix: str, parent: str | None):
    """A temp dir (under ``parent``) and a fresh ZooKeeper with a root of its own:
    ``(dir, server, metadata URI)``; the caller stops the server and removes the dir."""
    root = tempfile.mkdtemp(prefix=f"bks-{prefix}-", dir=parent)
    zk = ZooKeeperServer()
    zk.start()
    return root, zk, zk.uri(unique_root(prefix))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


@contextlib.contextmanager
def retention_process(uri: str, interval: float):
    """The retention service as a deployment runs it: a ``bkspark autorecovery`` process of its
    own (retention only: no auditor, no worker), not threads sharing the writers' interpreter.
    It logs its cuts to this process's stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "bkspark.cli.main", "autorecovery",
                             "--metadata", uri, "--no-auditor", "--no-worker",
                             "--retention-interval", str(interval)])
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


class Run:
    def __init__(self, args, logs: LogStore, bk: BookKeeper):
        self.args, self.logs, self.bk = args, logs, bk
        self.lock = threading.Lock()
        self.done = 0
        self.latencies: list[float] = []            # of the current tenth
        self.errors: list[str] = []
        self.stop = threading.Event()

    def writer(self, w: int) -> None:
        rng = random.Random(w)
        started = int(time.time() * 1000)
        seq = 0
        while not self.stop.is_set():
            with self.lock:
                if self.done >= self.args.commits:
                    return
            ids = []
            for _ in range(rng.randint(1, 4)):
                lh = self.bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"")
                for i in range(rng.randint(2, 5)):
                    lh.append(b"w%d-s%d-e%d-" % (w, seq, i) + b"x" * self.args.entry_size)
                lh.close()
                ids.append(lh.ledger_id)
            t0 = time.perf_counter()
            try:
                self.logs.append_ledgers(self.args.log, ids, writer_id=f"writer-{w}", sequence=seq,
                                         writer_started_ms=started)
            except Exception as exc:  # noqa: BLE001 - reported at the end
                self.errors.append(f"writer {w} seq {seq}: {type(exc).__name__}: {exc}")
                self.stop.set()
                return
            dt = time.perf_counter() - t0
            with self.lock:
                self.done += 1
                self.latencies.append(dt)
            seq += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=200_000)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--entry-size", type=int, default=64)
    ap.add_argument("--keep-minutes", type=float, default=1.0)
    ap.add_argument("--retention-every", type=float, default=10.0)
    ap.add_argument("--log", default="endurance")
    add_cluster_arguments(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="  %(asctime)s %(name)s: %(message)s")
    root, zk, uri = scratch_zookeeper("endurance", args.dir)
    print(f"bkspark endurance: {args.commits:,} commits of 1-4 ledgers x 2-5 entries of "
          f"{args.entry_size} B, {args.writers} writers (idempotency keys), retention keeps "
          f"{args.keep_minutes:g} min (cut every {args.retention_every:g} s); ZooKeeper "
          f"{zk.address}, 3 bookies {args.bookie_args or '(default flags)'}, E=3 Qw=2 Qa=2; "
          f"cpus={os.cpu_count()}", flush=True)
    try:
        with LocalCluster(uri, 3, os.path.join(root, "bookies"),
                          extra_args=args.bookie_args.split()) as cluster, \
                retention_process(uri, args.retention_every), BookKeeper(uri) as bk:
            logs = LogStore(bk)
            logs.create(args.log, retention=RetentionPolicy(ms=int(args.keep_minutes * 60_000)))
            run = Run(args, logs, bk)
            threads = [threading.Thread(target=run.writer, args=(w,), daemon=True) for w in range(args.writers)]
            for t in threads:
                t.start()
            t_start = time.monotonic()
            print(f"{'done':>8} {'elapsed':>8} {'p50 ms':>8} {'p99 ms':>8} {'head B':>7} "
                  f"{'records':>8} {'ledgers':>8} {'bookie RSS MB':>13} {'bookie disk MB':>14} "
                  f"{'zk data MB':>10} {'cut':>7}  load", flush=True)
            step = max(1, args.commits // 10)
            mark = step
            while any(t.is_alive() for t in threads):
                time.sleep(0.5)
                with run.lock:
                    done = run.done
                if done < mark and any(t.is_alive() for t in threads):
                    continue
                with run.lock:
                    lat, run.latencies = run.latencies, []
                mark += step
                head, _ = bk.store.get(log_path(args.log))
                records = len(bk.store.children(log_segments.segments_path(args.log))) + \
                    len(bk.store.children(log_segments.ledgers_index_path(args.log)))
                first, nxt = logs.bounds(args.log)
                rss = sum(rss_bytes(b.proc.pid) for b in cluster.bookies if b.alive)
                disk = sum(du(b.dir) for b in cluster.bookies)
                print(f"{done:>8,} {time.monotonic() - t_start:>7.0f}s {pct(lat, .5) * 1e3:>8.1f} "
                      f"{pct(lat, .99) * 1e3:>8.1f} {len(head):>7} {records:>8,} {nxt - first:>8,} "
                      f"{rss / 1e6:>13.0f} {disk / 1e6:>14.0f} {du(zk.dir) / 1e6:>10.1f} "
                      f"{first:>7,}  "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
            run.stop.set()
            if run.errors:
                print("errors:", *run.errors[:10], sep="\n  ")
    finally:
        zk.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
