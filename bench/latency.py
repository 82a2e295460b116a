"""Append-to-visible latency: from a writer's append call until a tailing reader in another
client (another process) may read the entry -- its long poll returned a LAC at or past it.

Starts bookies on loopback as ``bench/client.py`` does (a BookieCluster on a temporary SQLite
store, journal sync on; its helpers are reused), then for each producer and each writer
configuration writes one ledger (E=3 Qw=2 Qa=2, ``--size``-byte entries) while a reader
process tails it with ``ReadHandle.read_lac_long_poll`` and stamps the moment each LAC came
back (``time.monotonic``, the same clock in both processes). Producers:

* trickle: one ``append`` (waits for the acknowledgement), ``--trickle-pause``, repeat: a
  lone entry the next add would confirm only a pause later;
* lone: the same with ``--lone-pause`` longer than ``explicit_lac_interval`` plus the
  client's 0.5-s tick: only an explicit LAC ever confirms the entry;
* steady: ``append_async`` of one entry at a time, paced at ``--steady-rate`` entries/s: the
  next entries carry the LAC (nothing extra should be sent).

Writer configurations, alternated within each producer (``--repeat`` pairs): *new* --
``explicit_lac_delay`` (``--delay``, the client's default unless given), an explicit LAC sent
that long after the add stream went idle; *old* -- ``explicit_lac_delay=0``: only the
periodic path, once idle for ``explicit_lac_interval`` (1 s), checked every 0.5 s, as before
the delayed send existed. Each line prints p50/p99/max, the entries, the writer's WriteLac
rounds (each goes to the E bookies) per entry, and the bookies' CPU seconds. The latency
counts from the append call (submit), so it includes the add's own acknowledgement. The
machine is shared: compare lines of one run only.

    python bench/latency.py [--trickle-samples 100] [--trickle-pause 0.2] [--lone-samples 10]
                            [--lone-pause 1.6] [--steady-rate 500] [--steady-seconds 10]
                            [--size 1024] [--delay S] [--repeat 1] [--read-entries]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time

# bench/client.py (bench/ is sys.path[0]); importing it also puts the repository on sys.path
from client import bookie_cpu_seconds, bookie_metrics, percentile, settle

from bkspark.client import BookKeeper
from bkspark.client.api import ClientConfig
from bkspark.heap import freeze_startup_heap
from bkspark.testing.cluster import BookieCluster

PASSWORD = b"bench"
POLL_S = 0.2            # the reader's long poll; it polls again at once when one returns


def tail(uri: str, ledger_id: int, read_entries: bool, conn) -> None:
    """The reader process: long-poll the ledger's LAC until the writer says which entry is
    its last and the LAC reached it; send back ``[(first, last, t)]``: entries first..last
    became visible at monotonic time t."""
    with BookKeeper(uri, read_timeout=10) as bk:
        freeze_startup_heap()
        rh = bk.open_ledger(ledger_id, password=PASSWORD, recovery=False)
        seen = rh.last_add_confirmed
        conn.send(seen)
        stamps, final = [], None
        while final is None or seen < final:
            lac = rh.read_lac_long_poll(seen, POLL_S)
            t = time.monotonic()
            if lac > seen:
                stamps.append((seen + 1, lac, t))
                if read_entries:
                    for _ in rh.read(seen + 1, lac):
                        pass
                seen = lac
            while conn.poll():
                final = conn.recv()
        conn.send(stamps)


def write_lac_requests(cluster) -> int:
    """WriteLac requests the bookies answered so far (``bookie_write_lac_requests``)."""
    return int(sum(s.value for families in bookie_metrics(cluster) for f in families
                   if f.name == "bookie_write_lac_requests" for s in f.samples
                   if s.name.endswith("_total")))


def produce(lh, payload: bytes, kind: str, args) -> dict[int, float]:
    """Write with the ``kind`` producer; return {entry id: submit time}."""
    submitted: dict[int, float] = {}
    if kind in ("trickle", "lone"):
        samples, pause = ((args.trickle_samples, args.trickle_pause) if kind == "trickle"
                          else (args.lone_samples, args.lone_pause))
        for _ in range(samples):
            t = time.monotonic()
            submitted[lh.append(payload)] = t
            time.sleep(pause)
        return submitted
    n, t0 = 0, time.monotonic()
    futures = []
    while True:
        due = t0 + n / args.steady_rate
        if due - t0 >= args.steady_seconds:
            break
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        futures.append((time.monotonic(), lh.append_async(payload)))
        n += 1
    for t, f in futures:
        submitted[f.result(60)] = t
    return submitted


def measure(cluster, kind: str, delay: float, args) -> str:
    """One run: a fresh writer client and ledger, a reader process; the report line."""
    ctx = multiprocessing.get_context("spawn")
    payload = os.urandom(args.size)
    with BookKeeper(cluster.metadata_uri, explicit_lac_delay=delay) as bk:
        lh = bk.create_ledger(3, 2, 2, digest="crc32c", password=PASSWORD)
        parent, child = ctx.Pipe()
        reader = ctx.Process(target=tail, args=(cluster.metadata_uri, lh.ledger_id,
                                                args.read_entries, child), daemon=True)
        reader.start()
        parent.recv()           # the reader has opened the ledger
        requests0, cpu0 = write_lac_requests(cluster), bookie_cpu_seconds(cluster)
        submitted = produce(lh, payload, kind, args)
        parent.send(max(submitted))
        stamps = parent.recv()
        reader.join(30)
        rounds = lh.explicit_lac_rounds
        lh.close()
        bk.delete_ledger(lh.ledger_id)
    requests = write_lac_requests(cluster) - requests0
    cpu = bookie_cpu_seconds(cluster) - cpu0
    lat = []
    for first, last, t in stamps:
        for e in range(first, last + 1):
            if e in submitted:
                lat.append((t - submitted[e]) * 1000.0)
    lat.sort()
    n = len(submitted)
    label = "new" if delay else "old"
    how = (f"explicit_lac_delay={delay * 1000:g} ms" if delay
           else f"explicit_lac_delay=0, interval {ClientConfig.explicit_lac_interval:g} s")
    return (f"{kind:<8} {label} ({how}) [load {os.getloadavg()[0]:.1f}]".ljust(68)
            + f"p50 {percentile(lat, 0.50):8.1f} ms  p99 {percentile(lat, 0.99):8.1f} ms  "
            f"max {lat[-1] if lat else float('nan'):8.1f} ms  ({len(lat)} of {n} entries; "
            f"WriteLac rounds {rounds} = {rounds / n:.3f}/entry, {requests} requests at the "
            f"bookies; bookies {cpu:.2f} CPU-s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trickle-samples", type=int, default=100)
    ap.add_argument("--trickle-pause", type=float, default=0.2)
    ap.add_argument("--lone-samples", type=int, default=10)
    ap.add_argument("--lone-pause", type=float, default=1.6)
    ap.add_argument("--steady-rate", type=float, default=500.0, help="entries/s")
    ap.add_argument("--steady-seconds", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--delay", type=float, default=ClientConfig.explicit_lac_delay,
                    help="explicit_lac_delay of the new configuration (seconds)")
    ap.add_argument("--repeat", type=int, default=1, help="new/old pairs per producer")
    ap.add_argument("--producers", default="trickle,lone,steady")
    ap.add_argument("--read-entries", action="store_true",
                    help="the reader also reads every entry it sees (a consumer's load)")
    args = ap.parse_args()
    if not args.delay:
        ap.error("--delay must be > 0 (the old configuration is the delay at 0)")
    with tempfile.TemporaryDirectory(prefix="bkspark-latency-") as d:
        print(f"load average before the run: {os.getloadavg()[0]:.1f}")
        print(f"bench/latency.py: 3 bookies on loopback (sqlite metadata, journal sync on), "
              f"{os.cpu_count()} CPUs; ledger E=3 Qw=2 Qa=2, crc32c, {args.size}-B entries; "
              f"reader in another process, long polls of {POLL_S:g} s"
              f"{', reading every entry' if args.read_entries else ''}; trickle: "
              f"{args.trickle_samples} x (append, {args.trickle_pause:g} s pause); lone: "
              f"{args.lone_samples} x (append, {args.lone_pause:g} s pause); steady: "
              f"{args.steady_rate:g} entries/s for {args.steady_seconds:g} s; "
              f"new = explicit_lac_delay {args.delay * 1000:g} ms, old = 0; {args.repeat} "
              "new/old pair(s) per producer, alternated", flush=True)
        with BookieCluster(f"sqlite://{d}/meta.db", num_bookies=3, data_dir=d,
                           fault_injection=False, extra_args=["--gc-interval-s", "3"]) as c:
            freeze_startup_heap()
            for kind in [k for k in args.producers.split(",") if k]:
                for i in range(args.repeat):
                    order = (args.delay, 0.0) if i % 2 == 0 else (0.0, args.delay)
                    for delay in order:
                        settle(c)
                        print(measure(c, kind, delay, args), flush=True)


if __name__ == "__main__":
    main()
