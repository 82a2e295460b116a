"""Client add throughput and latency, in the spirit of BookKeeper's BenchThroughputLatency.

Starts bookies on loopback (a BookieCluster on a temporary SQLite store, journal sync on),
then for each configuration appends entries as fast as back-pressure allows for
``--seconds`` and prints acknowledged entries/s, MB/s and the p50/p99 add latency
(submit -> acknowledgement of the append call carrying it). At peak, latency is mostly
queueing behind the outstanding-bytes bound. A second, paced run at half the measured peak
rate (``--paced-seconds``, 10 s by default: a 3-s window's p99 hung on whether one disk stall
fell into it) gives the latency the issue's target refers to: once a millisecond it makes one
``append_many_async`` call with the entries due by then (a producer batching per millisecond,
like Kafka's ``linger.ms=1``; latency counts from that call);
every run starts once the bookies are idle again (the run before deleted its ledger, and
the bookies' flushes and garbage collection are done: :func:`settle`).
Configurations: E=3 Qw=2 Qa=2 on 3 bookies with 1 KiB and 64 KiB entries, and the
single-bookie E=Qw=Qa=1 figure. Once started, the process freezes its start-up heap
(:func:`bkspark.heap.freeze_startup_heap`, as docs/tour.md advises latency-sensitive applications):
a full GC pass over it stopped every thread for 10-20 ms once or twice a run.

The disk reference, measured at the start and the end of the run with the bookies idle: three
threads each appending 56 KiB + fdatasync 800 times a second in the bench's directory (about
what each bookie's journal does at half peak with 1 KiB entries): the p99 of a bare journal sync
on this disk at this moment, the bound under every add's latency. The disk is shared with other
tenants; its p99 moved from 1.3 to 6.5 ms within an hour on 2026-11-22. Every client byte costs
four disk bytes here (two replicas, each journaled and then written to an entry log): 64 KiB
"half peak" from a 4-s peak (which the disk's write-back cache inflates) is more than the disk
sustains for long, and a long paced run shows it.

Every line also prints the CPU per entry (client, bookies) and the add-stream messages per
second with the entries they carried: at peak the queues are deep and one message carries
hundreds of entries; a paced run sends small messages, and per-message costs (Python gRPC,
both ends) then dominate -- a steady rate costs several times the CPU per entry of the peak
rate, so "half the peak" is not half the capacity. ``--call-size`` adds an unpaced run with
the paced run's entries per call (the per-call cost alone). The load average is printed
before each line: the machine is shared, compare figures of one run only.

Under each paced line, the bookie side of its latency: the bookies' own histogram of the time
to store an add message durably (``bookie_add_batch_seconds``, scraped from their /metrics
before and after the run). At half peak on 2 vCPUs it stayed at p99 <= 2-5 ms while the
end-to-end p99 was 6-25 ms (2026-11-23): most of the tail is the client process (its ack
threads waiting for a CPU and the GIL) and waiting for the entries' stream to be answered.
Then where the entries over 10 ms lie in time: a few 100-ms windows with most of their entries
late are stalls (one bookie's slow sync holds every later entry: acknowledgements go in entry
order), many windows with a few late entries each is queueing for a CPU. Then where their time
went (``--trace N``, default 16: one entry in N traced stage by stage,
:mod:`bkspark.client.add_trace`): per stage the p50 and p99 of the on-time and of the late
entries, which stage was the longest of each late entry, and the collector passes that
overlapped late entries. The bookie's part is split where its data port stamps a traced
message: read, stored durably (one host, one monotonic clock).

The bookies authenticate clients as a local cluster does by default (tokens,
:mod:`bkspark.auth`). ``--auth-compare N`` measures instead what that costs: two clusters, one
with authentication and one without, N alternating pairs of peak runs per entry size (the
order flips each pair), and the median ratio of their throughput (issue 48's target: >= 0.9x).

    python bench/client.py [--seconds 5] [--sizes 1024,65536] [--no-single] [--no-paced]
                           [--call-size] [--sweep 0.1,0.2,0.3,0.4] [--auth-compare 3]
"""
from __future__ import annotations

import argparse
import array
import collections
import os
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
# the bookies are subprocesses: they run this checkout's code too, not an installed copy
# (an editable install of another checkout would otherwise be measured on the bookie side)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)

from bkspark.client import BookKeeper  # noqa: E402
from bkspark.heap import freeze_startup_heap  # noqa: E402
from bkspark.testing.cluster import BookieCluster  # noqa: E402
from procstat import discards_settled, process_cpu_seconds, wait_idle  # noqa: E402  (bench/ is sys.path[0])


def percentile(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[k]


def bookie_cpu_seconds(cluster) -> float:
    """User+system CPU seconds used so far by the cluster's bookie processes."""
    return process_cpu_seconds(b.proc.pid for b in cluster.bookies if b.proc is not None)


def pin(pids, cpus: set) -> None:
    """Run every thread of processes ``pids`` on ``cpus`` only (threads they start later
    inherit it)."""
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except (ProcessLookupError, FileNotFoundError):
                pass


def bookie_metrics(cluster):
    """Every running bookie's /metrics, parsed (prometheus_client metric families), one list
    each."""
    from prometheus_client.parser import text_string_to_metric_families
    out = []
    for b in cluster.bookies:
        if not b.alive:
            continue
        creds = cluster.credentials("client")
        _, raw, _ = creds.http_request(creds.url(b.address, b.http_port, "/metrics"), timeout=5)
        out.append(list(text_string_to_metric_families(raw.decode())))
    return out


def storage_histogram(cluster) -> dict[float, float]:
    """The bookies' ``bookie_add_batch_seconds`` histogram (bucket upper bound in seconds ->
    add messages so far, cumulative), summed over the bookies' /metrics: how long the bookie
    side took to store an add message durably (validation, journal group commit)."""
    buckets: dict[float, float] = {}
    for families in bookie_metrics(cluster):
        for family in families:
            if family.name == "bookie_add_batch_seconds":
                for sample in family.samples:
                    if sample.name.endswith("_bucket"):
                        le = float(sample.labels["le"])
                        buckets[le] = buckets.get(le, 0.0) + sample.value
    return buckets


def storage_counter(cluster, name: str) -> float:
    """``bookie_storage_<name>`` summed over the bookies."""
    return sum(sample.value for families in bookie_metrics(cluster) for family in families
               if family.name == f"bookie_storage_{name}" for sample in family.samples)


def stored_ledgers(cluster) -> int:
    """Ledgers the bookies still store (``bookie_storage_ledgers``): 0 once their garbage
    collection removed every deleted one."""
    return int(sum(sample.value for families in bookie_metrics(cluster) for family in families
                   if family.name == "bookie_storage_ledgers" for sample in family.samples))


def storage_summary(before: dict, after: dict) -> str:
    """One line on the bookie side of a run's add latency (histogram deltas): the rest of the
    end-to-end figure is the client, the network stack and waiting for a CPU."""
    d = {le: after[le] - before.get(le, 0.0) for le in after}
    total = d.get(float("inf"), 0.0)
    if not total:
        return "    bookie side: no add messages"
    p99 = next(le for le in sorted(d) if d[le] >= 0.99 * total)

    def over(le):
        return (total - d.get(le, total)) / total * 100
    return (f"    bookie side (an add message stored durably, {total:,.0f} messages): p99 <= "
            f"{p99 * 1e3:g} ms (histogram bucket); over 5 ms {over(0.005):.2f}%, "
            f"over 10 ms {over(0.01):.3f}%")


def settle(cluster, limit: float = 30.0, keep: int = 0) -> float:
    """Wait until the bookies are idle again (the previous run's ledger garbage-collected, its
    write-cache flushes and checkpoint done: under 0.05 cores for 0.5 s), so a run measures its
    own steady state rather than the backlog of the run before it -- deleting gigabytes of
    entry logs under a run stalled journal syncs for over a second; return the seconds
    waited. ``keep``: the ledgers the bookies still hold then, summed over them (a ledger of
    ensemble E counts E). No compaction may be copying (its victims are removed after the copy,
    at a rate that leaves the CPU idle), and the removal of files a step at a time must be over
    too: the disk has sent no discard for 0.5 s (:func:`procstat.discards_settled`). Says so
    when ``limit`` passes first."""
    quiet = discards_settled(cluster.bookies[0].dir)
    waited = wait_idle((b.proc.pid for b in cluster.bookies if b.proc is not None), limit,
                       also=lambda: quiet() and stored_ledgers(cluster) <= keep
                       and storage_counter(cluster, "compaction_copying_bytes") == 0)
    if waited >= limit:
        print(f"    (the bookies did not settle within {limit:g} s: the next run starts anyway)",
              flush=True)
    return waited


SLOW_MS = 10.0          # the p99 target
WINDOW_S = 0.1


def run(bk, ensemble, qw, qa, size, seconds, batch, rate=None, outstanding=None,
        timeline=None, event=None):
    """Append for `seconds`; return (entries, elapsed, latencies_ms, slow): ``slow`` counts the
    entries over ``SLOW_MS`` by the ``WINDOW_S`` window they were submitted in. ``timeline``
    (a list): filled with ``(seconds after the start it was submitted, ms)`` of every entry;
    ``event``: ``(seconds, fn)``, ``fn()`` run on a thread that many seconds after the start."""
    lh = bk.create_ledger(ensemble, qw, qa, digest="crc32c", password=b"bench")
    run.ledger_id = lh.ledger_id
    payload = os.urandom(size)
    lat = array.array("d")      # untracked by the cyclic GC (a list of floats is traversed)
    slow: collections.Counter = collections.Counter()
    lock = threading.Lock()
    perf = time.perf_counter
    # warm up the streams
    lh.append_many([payload] * 16)
    n = 0
    t0 = perf()
    if event is not None:
        threading.Timer(event[0], event[1]).start()
    tick = t0
    deadline = t0 + seconds
    last_fut = None
    while True:
        now = perf()
        if now >= deadline:
            break
        k = batch
        if rate is not None:
            # paced: once a millisecond, one call with the entries due by then
            tick += 0.001
            if tick > now:
                time.sleep(tick - now)
                now = perf()
            k = int((now - t0) * rate) - n
            if k <= 0:
                continue
        submit = perf()
        fut = lh.append_many_async([payload] * k)

        def done(f, submit=submit, k=k):
            ms = (perf() - submit) * 1000.0
            with lock:
                lat.extend([ms] * k)
                if timeline is not None:
                    timeline.append((submit - t0, ms, k))
                if ms > SLOW_MS:
                    slow[int((submit - t0) / WINDOW_S)] += k
        fut.add_done_callback(done)
        last_fut = fut
        n += k
    if last_fut is not None:
        last_fut.result(120)
    elapsed = perf() - t0
    lh.close()
    # a full bench writes ~40 GB (journals and entry logs of both replicas): delete each run's
    # ledger, or the bookies' disk crosses disk_usage_threshold and they turn read-only
    bk.delete_ledger(lh.ledger_id)
    # an array again: a list of the peak run's ~400k floats, alive during the paced run, made
    # every full collection there walk it (2-6 ms with every thread stopped, in the measurement)
    return n, elapsed, array.array("d", sorted(lat)), slow


def disk_reference(directory: str, writers: int = 3, rate: float = 800.0, size: int = 56 << 10,
                   seconds: float = 5.0) -> str:
    """Bare journal-like syncs (see the module docstring); return the summary line."""
    lat: list[float] = []
    lock = threading.Lock()
    buf = os.urandom(size)

    def writer(i):
        path = os.path.join(directory, f"disk-reference-{i}")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        mine = []
        try:
            t0 = time.perf_counter()
            for n in range(int(rate * seconds)):
                delay = t0 + n / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                a = time.perf_counter()
                os.write(fd, buf)
                os.fdatasync(fd)
                mine.append((time.perf_counter() - a) * 1000.0)
        finally:
            os.close(fd)
            os.unlink(path)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat.sort()
    return (f"disk reference ({writers} writers x {rate:.0f}/s x {size >> 10} KiB write+fdatasync, "
            f"{seconds:.0f} s): p50 {percentile(lat, 0.5):.2f} ms  p99 {percentile(lat, 0.99):.2f} ms  "
            f"max {lat[-1]:.1f} ms  syncs over 10 ms: {sum(x > 10 for x in lat)} of {len(lat)}")


def stream_counters(bk):
    """(request messages, AddBatch elements, ack messages) of the client's add streams."""
    clients = bk.ctx.pool.clients()
    return tuple(sum(getattr(c, k, 0) for c in clients)
                 for k in ("add_messages", "add_elements", "ack_messages"))


def measured(bk, cluster, fn):
    """Run ``fn()`` -> (n, elapsed, lat, slow); return it with (client cpu, bookie cpu,
    counters)."""
    c0, b0, m0 = time.process_time(), bookie_cpu_seconds(cluster), stream_counters(bk)
    n, el, lat, slow = fn()
    m1 = stream_counters(bk)
    cpu = (time.process_time() - c0, bookie_cpu_seconds(cluster) - b0,
           tuple(b - a for a, b in zip(m0, m1)))
    return n, el, lat, slow, cpu


def slow_summary(n: int, elapsed: float, slow) -> str:
    """Where the entries over SLOW_MS lie in time: a few windows with most of their entries
    late are stalls (a disk flush, the host); many windows with a few each is a broad tail
    (queueing for a CPU)."""
    total = sum(slow.values())
    if not total:
        return f"    entries over {SLOW_MS:g} ms: none"
    windows = int(elapsed / WINDOW_S) + 1
    per_window = n / elapsed * WINDOW_S
    worst = sorted(slow.values(), reverse=True)
    top = sum(worst[:3])
    return (f"    entries over {SLOW_MS:g} ms: {total:,} ({total / n * 100:.2f}%), submitted in "
            f"{len(slow)} of {windows} {WINDOW_S * 1000:.0f}-ms windows; the worst three hold "
            f"{top / total * 100:.0f}% of them ({', '.join(f'{k / per_window * 100:.0f}%' for k in worst[:3])} "
            f"of their windows' entries late)")


#: (label, from stamp, to stamp) of the stages an add's time is split into (add_trace)
TRACE_STAGES = (
    ("queued (back-pressure, lock)", "call", "admitted"),
    ("framed (digest)", "admitted", "framed"),
    ("held until sent (self-clocking)", "framed", "sent_first"),
    ("to the bookie (TCP, its read)", "sent_first", "bookie_received"),
    ("in the bookie (stored durably)", "bookie_received", "bookie_stored"),
    ("back (answer, TCP, ack thread)", "bookie_stored", "acked_quorum"),
    ("ack thread (CPU, GIL, lock)", "acked_quorum", "handled"),
    ("in entry order (earlier entries)", "handled", "completed"),
    ("callback (appender's thread)", "completed", "callback"),
)


def trace_summary(tracer, ledger_id: int) -> str:
    """Where the time of the traced entries of ``ledger_id`` went, stage by stage
    (:data:`TRACE_STAGES`), for those over ``SLOW_MS`` beside the others; which stage was the
    longest of each late one; and the collector's passes that overlap late entries."""
    traces = [t for t in tracer.done if t.ledger_id == ledger_id]
    if not traces:
        return "    add trace: no entry traced"
    late = [t for t in traces if (t.callback - t.call) / 1e6 > SLOW_MS]
    ontime = [t for t in traces if (t.callback - t.call) / 1e6 <= SLOW_MS]

    def stats(group, a, b):
        vals = sorted(max(0, getattr(t, b) - getattr(t, a)) / 1e6 for t in group
                      if getattr(t, a) is not None and getattr(t, b) is not None)
        return (f"{percentile(vals, 0.5):7.2f} {percentile(vals, 0.99):8.2f}" if vals
                else f"{'-':>7} {'-':>8}")
    def took(t, stage):
        a, b = getattr(t, stage[1]), getattr(t, stage[2])
        return -1 if a is None or b is None else b - a
    longest = collections.Counter(max(TRACE_STAGES, key=lambda s: took(t, s))[0] for t in late)
    lines = [f"    add trace (1 entry in {tracer.every}): {len(traces):,} traced, {len(late):,} "
             f"over {SLOW_MS:g} ms; ms per stage (p50 p99), on time | late; the stage that "
             "took longest in each late entry"]
    for label, a, b in TRACE_STAGES:
        lines.append(f"      {label:<34} {stats(ontime, a, b)} | {stats(late, a, b)}   "
                     f"{longest.get(label, 0) / len(late) * 100 if late else 0:4.0f}%")
    spans = [(t.call, t.callback) for t in late]
    hit = [p for p in tracer.gc_pauses if any(s <= p[1] and p[0] <= e for s, e in spans)]
    if late:
        by_gen = collections.Counter(p[2] for p in hit)
        lines.append(f"      collector passes overlapping late entries: {len(hit)} "
                     f"({', '.join(f'gen {g}: {n}' for g, n in sorted(by_gen.items())) or 'none'}"
                     f"), {sum(e - s for s, e, _ in hit) / 1e6:.1f} ms in all")
    return "\n".join(lines)


def report(label, size, n, elapsed, lat, cpu=None):
    rate = n / elapsed
    extra = ""
    if cpu is not None:
        client_cpu, bookie_cpu = cpu[:2]
        extra = (f"  cpu/entry: client {client_cpu / n * 1e6:.0f} us, "
                 f"bookies {bookie_cpu / n * 1e6:.0f} us")
        if len(cpu) > 2 and cpu[2][0]:
            msgs, elems, acks = cpu[2]
            extra += (f"; msgs/s: {msgs / elapsed:.0f} requests ({elems / msgs:.0f} entries "
                      f"each), {acks / elapsed:.0f} acks")
    label = f"{label} [load {os.getloadavg()[0]:.1f}]"
    print(f"{label:<38} {size:>7} B  {rate:>10,.0f} entries/s  {rate * size / 1e6:>8.1f} MB/s  "
          f"p50 {percentile(lat, 0.50):7.2f} ms  p99 {percentile(lat, 0.99):7.2f} ms  "
          f"p99.9 {percentile(lat, 0.999):6.1f} ms  "
          f"({n} entries in {elapsed:.1f} s){extra}", flush=True)
    return rate


def window_summary(timeline, lo: float, hi: float) -> str:
    """p50 / p99 / p99.9 and the share over ``SLOW_MS`` of the entries submitted between
    ``lo`` and ``hi`` seconds after the start (``timeline`` of :func:`run`)."""
    lat = sorted(ms for at, ms, k in timeline if lo <= at < hi for _ in range(k))
    if not lat:
        return "no entries"
    late = sum(1 for ms in lat if ms > SLOW_MS)
    return (f"p50 {percentile(lat, 0.5):6.2f} ms  p99 {percentile(lat, 0.99):7.2f} ms  "
            f"p99.9 {percentile(lat, 0.999):7.1f} ms  over {SLOW_MS:g} ms "
            f"{late / len(lat) * 100:5.2f}% ({len(lat):,} entries)")


def fault_phases(args, d: str) -> None:
    """Issue 53, item 5: the paced run's tail while a re-replication runs at the autorecovery's
    default rate, and in the minute after a bookie of the writer's ensemble is killed.

    Four bookies (E=3 Qw=2 Qa=2 writers; one spare for the ensemble change). The reference:
    paced at half peak with nothing else running. Kill: the paced writer's ledger loses one
    of its bookies (SIGKILL) ``--kill-after`` seconds in; its entries before the kill, in its
    second (the ensemble change) and in the minute after are summarised apart; the bookie is
    started again. Re-replication: a ledger of ``--rereplicate-mb`` (64 KiB entries, E=3
    Qw=3) loses a bookie of its ensemble (stopped), and ``bkspark shell recover`` -- its own
    process, as an autorecovery worker is -- copies its fragments to the spare at the
    daemon's default rate (``DEFAULT_DAEMON_MB_PER_S``) while the paced writer runs on the
    three others."""
    import subprocess
    from bkspark.recovery.throttle import DEFAULT_DAEMON_MB_PER_S
    from metadata import registry
    size = int(args.sizes.split(",")[0])
    with BookieCluster(f"sqlite://{d}/faults.db", num_bookies=4, data_dir=os.path.join(d, "f"),
                       fault_injection=False, extra_args=["--gc-interval-s", "3"]) as c, \
            BookKeeper(c.metadata_uri, max_outstanding_bytes=args.max_outstanding_mb << 20,
                       add_timeout=5) as bk:
        freeze_startup_heap()
        print(f"faults: 4 bookies, E=3 Qw=2 Qa=2 writers of {size} B entries, paced at half "
              f"peak for {args.paced_seconds:.0f} s a phase", flush=True)
        settle(c)
        n, el, lat, _, cpu = measured(bk, c, lambda: run(bk, 3, 2, 2, size, args.seconds, 64))
        peak = report("peak", size, n, el, lat, cpu)
        settle(c)
        n, el, lat, slow, cpu = measured(
            bk, c, lambda: run(bk, 3, 2, 2, size, args.paced_seconds, 1, rate=peak / 2))
        report("  reference: paced, nothing else", size, n, el, lat, cpu)
        reference = percentile(lat, 0.99)
        # a bookie of the writer's ensemble killed
        timeline: list = []
        killed = {}

        def kill():
            ensemble = bk.ledger_metadata(run.ledger_id).last_ensemble()
            i = next(i for i, b in enumerate(c.bookies) if b.bookie_id == ensemble[0])
            killed["at"] = time.monotonic()
            c.kill(i)
            killed["bookie"] = ensemble[0]
        seconds = args.kill_after + 60.0
        t_start = time.monotonic()
        n, el, lat, slow, cpu = measured(
            bk, c, lambda: run(bk, 3, 2, 2, size, seconds, 1, rate=peak / 2,
                               timeline=timeline, event=(args.kill_after, kill)))
        at = killed["at"] - t_start
        report(f"  a bookie killed at {at:.0f} s", size, n, el, lat, cpu)
        print(f"    before the kill:     {window_summary(timeline, 0, at)}")
        print(f"    its second:          {window_summary(timeline, at, at + 1)}")
        print(f"    the minute after it: {window_summary(timeline, at + 1, at + 61)} "
              f"(reference p99 {reference:.2f} ms)", flush=True)
        c.start(next(i for i, b in enumerate(c.bookies) if b.bookie_id == killed["bookie"]))
        c.wait_registered(bk.store)
        settle(c)

        # re-replication at the daemon's default rate, in its own process
        big = bk.create_ledger(3, 3, 2, digest="crc32c", password=b"bench")
        chunk = os.urandom(64 << 10)
        for _ in range(0, args.rereplicate_mb << 20, 64 << 20):
            big.append_many([chunk] * 1024)
        big.close()
        victim = bk.ledger_metadata(big.ledger_id).last_ensemble()[0]
        v = next(i for i, b in enumerate(c.bookies) if b.bookie_id == victim)
        c.stop(v)
        while victim in registry.list_bookies(bk.store):
            time.sleep(0.2)
        wait_idle((b.proc.pid for b in c.bookies if b.alive), 30.0)   # (the big one stays)
        t0 = time.monotonic()
        recover = subprocess.Popen(
            [sys.executable, "-m", "bkspark.cli.main", "shell", "recover", victim,
             "--rate", str(DEFAULT_DAEMON_MB_PER_S), "--metadata", c.metadata_uri, "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        n, el, lat, slow, cpu = measured(
            bk, c, lambda: run(bk, 3, 2, 2, size, args.paced_seconds, 1, rate=peak / 2))
        running = recover.poll() is None
        report(f"  while re-replicating ({DEFAULT_DAEMON_MB_PER_S:g} MB/s)", size, n, el, lat,
               cpu)
        out, err = recover.communicate(timeout=600)
        took = time.monotonic() - t0
        print(f"    re-replication of {args.rereplicate_mb} MiB: {took:.1f} s "
              f"({args.rereplicate_mb * 1.048576 / took:.0f} MB/s; "
              f"{'still running at the end of the paced run' if running else 'done before the paced run ended: a longer ledger covers it'}); "
              f"exit {recover.returncode}; p99 {percentile(lat, 0.99) / reference:.2f}x the "
              f"reference", flush=True)
        if recover.returncode:
            print(f"    recover failed: {err[-500:]}")
        c.start(v)
        c.wait_registered(bk.store)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--sizes", default="1024,65536")
    ap.add_argument("--batch-bytes", type=int, default=256 << 10,
                    help="bytes per append_many call (latency is per call's entries)")
    ap.add_argument("--max-outstanding-mb", type=int, default=8)
    ap.add_argument("--linger", type=float, default=None,
                    help="ClientConfig.add_linger in seconds (default: the client's default)")
    ap.add_argument("--no-single", action="store_true", help="skip the E=Qw=Qa=1 figure")
    ap.add_argument("--no-paced", action="store_true", help="skip the half-peak paced run")
    ap.add_argument("--paced-seconds", type=float, default=10.0,
                    help="length of each paced run (half peak, --sweep): a p99 needs enough entries that one "
                         "host-level disk stall (see the disk reference line) is not 1%% of them")
    ap.add_argument("--trace", type=int, default=16, metavar="N",
                    help="trace 1 entry in N of each paced run stage by stage "
                         "(bkspark.client.add_trace; 0: off) and print where the time went")
    ap.add_argument("--pin", action="store_true",
                    help="the client on CPU 0, the bookies on CPU 1 (taskset): whether the "
                         "tail is the two processes' threads waiting for a shared CPU")
    ap.add_argument("--faults", action="store_true",
                    help="instead of the runs above: the paced tail while a re-replication "
                         "runs and in the minute after a bookie is killed (4 bookies)")
    ap.add_argument("--rereplicate-mb", type=int, default=1024,
                    help="--faults: MiB of the ledger re-replicated under the paced run")
    ap.add_argument("--kill-after", type=float, default=5.0,
                    help="--faults: seconds into the paced run the bookie is killed")
    ap.add_argument("--call-size", action="store_true",
                    help="also run unpaced with the paced run's entries per call")
    ap.add_argument("--sweep", default="",
                    help="also pace at these fractions of the peak, e.g. 0.1,0.2,0.3 "
                         "(the latency/throughput curve: where the steady-rate capacity is)")
    ap.add_argument("--auth-compare", type=int, default=0, metavar="PAIRS",
                    help="compare peak throughput with and without authentication "
                         "(PAIRS alternating runs per size) instead of the runs above")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.auth_compare:
        compare_auth(args, sizes)
        return
    if args.faults:
        with tempfile.TemporaryDirectory(prefix="bkspark-bench-faults-") as d:
            print(disk_reference(d), flush=True)
            fault_phases(args, d)
        return
    with tempfile.TemporaryDirectory(prefix="bkspark-bench-") as d:
        print(f"load average before the run: {os.getloadavg()[0]:.1f}")
        print(f"bench/client.py: 3 bookies on loopback (sqlite metadata, journal sync on), "
              f"{os.cpu_count()} CPUs; {args.seconds:.0f} s per run; digest crc32c; "
              f"max outstanding {args.max_outstanding_mb} MiB; "
              f"append_many batches of ~{args.batch_bytes >> 10} KiB; start-up heap frozen "
              f"(bkspark.heap.freeze_startup_heap); each run's ledger deleted after it "
              f"(bookie gc every 3 s)", flush=True)
        print(disk_reference(d), flush=True)
        with BookieCluster(f"sqlite://{d}/meta.db", num_bookies=3, data_dir=d,
                           fault_injection=False, extra_args=["--gc-interval-s", "3"]) as c, \
                BookKeeper(c.metadata_uri, max_outstanding_bytes=args.max_outstanding_mb << 20,
                           add_timeout=30,
                           **({} if args.linger is None else {"add_linger": args.linger})) as bk:
            freeze_startup_heap()   # as a latency-sensitive application would (docs/tour.md)
            if args.pin:
                pin([os.getpid()], {0})
                pin([b.proc.pid for b in c.bookies], {1})
                print("pinned: this client's threads on CPU 0, the bookies' on CPU 1",
                      flush=True)
            configs = [("E=3 Qw=2 Qa=2 (3 bookies)", 3, 2, 2)]
            if not args.no_single:
                configs.append(("E=1 Qw=1 Qa=1 (1 bookie)", 1, 1, 1))
            for label, e, qw, qa in configs:
                for size in sizes:
                    batch = max(1, args.batch_bytes // size)
                    settle(c)
                    n, el, lat, _, cpu = measured(
                        bk, c, lambda: run(bk, e, qw, qa, size, args.seconds, batch))
                    peak = report(label, size, n, el, lat, cpu)
                    paced = ([] if args.no_paced else [("  paced at half peak", 0.5)]) + [
                        (f"  paced at {float(f):.2f} x peak", float(f))
                        for f in args.sweep.split(",") if f]
                    for paced_label, frac in paced:
                        settle(c)
                        h0 = storage_histogram(c)
                        tracer = bk.trace_adds(args.trace) if args.trace else None
                        n, el, lat, slow, cpu = measured(
                            bk, c, lambda: run(bk, e, qw, qa, size, args.paced_seconds, 1,
                                               rate=peak * frac))
                        bk.stop_tracing_adds()
                        report(paced_label, size, n, el, lat, cpu)
                        print(storage_summary(h0, storage_histogram(c)), flush=True)
                        print(slow_summary(n, el, slow), flush=True)
                        if tracer is not None:
                            print(trace_summary(tracer, run.ledger_id), flush=True)
                    if args.call_size:
                        k = max(1, round(peak / 2 / 1000))
                        settle(c)
                        n, el, lat, _, cpu = measured(
                            bk, c, lambda: run(bk, e, qw, qa, size, min(args.seconds, 3.0), k))
                        report(f"  unpaced, {k} per call", size, n, el, lat, cpu)
            settle(c)
            print(disk_reference(d), flush=True)


def compare_auth(args, sizes) -> None:
    """Peak E=3 Qw=2 Qa=2 throughput with authentication (tokens) against without, in the
    same run: ``args.auth_compare`` alternating pairs per size, and the median ratio."""
    import statistics
    with tempfile.TemporaryDirectory(prefix="bkspark-bench-") as d:
        print(f"load average before the run: {os.getloadavg()[0]:.1f}")
        print(f"bench/client.py --auth-compare {args.auth_compare}: two clusters of 3 bookies "
              f"on loopback (sqlite metadata, journal sync on), one authenticating clients "
              f"(tokens), one not; E=3 Qw=2 Qa=2, {args.seconds:.0f} s per run, "
              f"{os.cpu_count()} CPUs", flush=True)
        clusters = {}
        try:
            for mode, auth in (("auth on", True), ("auth off", False)):
                c = BookieCluster(f"sqlite://{d}/{mode[5:]}/meta.db", num_bookies=3,
                                  data_dir=os.path.join(d, mode[5:]), fault_injection=False,
                                  extra_args=["--gc-interval-s", "3"], auth=auth)
                c.start_all()
                clusters[mode] = (c, BookKeeper(c.metadata_uri, add_timeout=30,
                                                max_outstanding_bytes=args.max_outstanding_mb << 20))
            freeze_startup_heap()
            for size in sizes:
                batch = max(1, args.batch_bytes // size)
                rates: dict[str, list[float]] = {m: [] for m in clusters}
                for pair in range(args.auth_compare):
                    order = list(clusters) if pair % 2 == 0 else list(reversed(clusters))
                    for mode in order:
                        c, bk = clusters[mode]
                        settle(c)
                        n, el, lat, _, cpu = measured(
                            bk, c, lambda: run(bk, 3, 2, 2, size, args.seconds, batch))
                        rates[mode].append(n / el)
                        report(f"{mode:8s} pair {pair + 1}", size, n, el, lat, cpu)
                on, off = (statistics.median(rates[m]) for m in ("auth on", "auth off"))
                print(f"  {size} B entries: median {on:.0f}/s with authentication, {off:.0f}/s "
                      f"without: {on / off:.2f}x", flush=True)
        finally:
            for c, bk in clusters.values():
                bk.close()
                c.stop_all()


if __name__ == "__main__":
    main()
