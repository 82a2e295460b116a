"""Multi-host campaign: ZooKeeper, bookies and clients on hosts of their own, real network faults.

    python -m bkspark.testing.faults multihost --seed 7 --duration 120 --report mh.json

A **deployment** (:class:`Deployment`) puts a three-server ZooKeeper ensemble, N bookies and
two client hosts in network namespaces (:mod:`bkspark.testing.netns`), each with its own
address: bookies listen on ``0.0.0.0`` and advertise their host's address; clients dial
``zk://<zk1>:2181,<zk2>:2181,<zk3>:2181/bk``.

Client **workers** (processes on the client hosts, ``python -m bkspark.testing.multihost
worker``) write to shared logs:

* ``stream``: a :class:`~bkspark.log.LogWriter` appends numbered payloads to log ``stream``,
  rolling every few entries. When fenced it re-takes the log a moment later, so the two
  client hosts keep taking the log from each other. An append that fails with any other
  error is not retried with the same payload (its fate is in doubt): the next payload goes
  through the same writer, which must settle what happened from the metadata.
* ``commit``: closed ledgers appended to log ``commits`` with ``append_ledgers`` and an
  idempotency key ``(worker, sequence)``; a commit whose outcome is unknown is retried with
  the same key (and a new ledger, as a re-run Spark job would) until it settles.

Every outcome is a line in the worker's event file, written and flushed before the worker
goes on (``ack``, ``fenced``, ``error``, ``commit``), with the wall-clock time.

The **schedule** is a pure function of the seed. It starts with the seeds' split-brain
scenario across hosts (a writer's host is cut from ZooKeeper and every bookie for longer than
the add timeout plus the session timeout, the other host takes the log over, the cut heals:
the old writer must report ``LogFencedError``), then draws faults: symmetric cuts between a
client and ZooKeeper (every server, or one: the client reconnects to another) or a bookie,
ZooKeeper's answers to a client dropped (requests applied, answers lost), a ZooKeeper server
cut from its peers (it falls behind; its clients move to the others), one-way drops and
random loss between clients and bookies, a bookie cut from everything, and SIGKILL of
bookies.

The **checker** reads both logs back from the observer (never cut off) and counts
violations: ``acked-missing`` (an acknowledged payload is not in the log), ``duplicate`` (a
payload appears twice), ``out-of-order`` (one worker's payloads not in its order),
``listed-ledger-deleted`` (the log names a ledger that does not exist: unreadable log),
``commit-missing`` / ``commit-twice`` (a commit reported applied is absent, or any key is
applied twice), ``commit-key-missing`` (the log's idempotency key of a committer is below a
sequence it was told is committed), ``stale-error-after-heal`` (a writer cut off while another took over did not
report LogFencedError within the settle time after the heal). It also reports the time from
each heal to the cut-off client's first acknowledged append.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

STREAM_LOG = "stream"
COMMIT_LOG = "commits"
ZK_PORT = 2181
SESSION_TIMEOUT = 4.0           # the workers' ZooKeeper session
ADD_TIMEOUT = 2.0               # the workers' add timeout
SETTLE_AFTER_HEAL = 30.0        # a cut-off writer must know it was fenced within this
PASSWORD = b"multihost"


# ---- workers (run on the client hosts) ------------------------------------------------------

class _Events:
    def __init__(self, path: str):
        self.f = open(path, "a", buffering=1)

    def write(self, kind: str, **fields) -> None:
        self.f.write(json.dumps({"t": time.time(), "kind": kind, **fields}) + "\n")
        self.f.flush()


def _client(uri: str, add_timeout: float = ADD_TIMEOUT):
    from bkspark.client import BookKeeper
    from metadata import open_store
    store = open_store(uri, session_timeout=SESSION_TIMEOUT, connect_timeout=30)
    return BookKeeper(store=store, add_timeout=add_timeout, read_timeout=5.0)


def worker_main(args) -> None:
    from bkspark import errors
    from bkspark.log import LogStore
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    events = _Events(args.events)
    bk = _client(args.uri, args.add_timeout)
    logs = LogStore(bk, password=PASSWORD, ensemble_size=3, write_quorum=2, ack_quorum=2)
    events.write("start", worker=args.worker)
    if args.mode == "stream":
        _stream(logs, args.log or STREAM_LOG, args.worker, events, stop, errors)
    else:
        _commits(logs, bk, args.log or COMMIT_LOG, args.worker, events, stop, errors)
    events.write("done")
    os._exit(0)         # do not wait for a client stuck on a cut-off host


def _stream(logs, name, worker, events, stop, errors) -> None:
    writer, n = None, 0
    while not stop["now"]:
        if writer is None:
            try:
                writer = logs.open_writer(name, roll_bytes=400)
                events.write("owner", ledger=writer.ledger_id, epoch=writer.epoch)
            except errors.BKError as exc:
                events.write("error", op="open", error=type(exc).__name__, msg=str(exc)[:200])
                time.sleep(0.5)
                continue
        payload = f"{worker}:{n}"
        n += 1
        try:
            position = writer.append(payload.encode())
            events.write("ack", payload=payload, ledger=position.ledger_id,
                         entry=position.entry_id)
            time.sleep(0.02)
        except errors.LogFencedError as exc:
            events.write("fenced", payload=payload, msg=str(exc)[:200])
            writer = None
            time.sleep(1.0)         # let the other host write for a while
        except errors.BKError as exc:
            events.write("error", op="append", payload=payload, error=type(exc).__name__,
                         msg=str(exc)[:200])
            time.sleep(0.2)


def _commits(logs, bk, name, worker, events, stop, errors) -> None:
    sequence = 0
    while not stop["now"]:
        try:
            lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2,
                                  password=PASSWORD)
            lh.append_many([f"{worker}:{sequence}:{i}".encode() for i in range(3)])
            lh.close()
            applied = logs.append_ledgers(name, [lh.ledger_id], writer_id=worker,
                                          sequence=sequence)
            events.write("commit", sequence=sequence, ledger=lh.ledger_id, applied=applied)
            sequence += 1
            time.sleep(0.05)
        except errors.BKError as exc:       # retried with the same key and a new ledger
            events.write("error", op="commit", sequence=sequence, error=type(exc).__name__,
                         msg=str(exc)[:200])
            time.sleep(0.3)


# ---- the deployment ---------------------------------------------------------------------------

class Deployment:
    """A ZooKeeper ensemble (``zk_servers`` hosts), ``num_bookies`` bookies and client hosts
    ``c0``, ``c1`` on a test network."""

    def __init__(self, workdir: str, num_bookies: int = 5, zk_servers: int = 3):
        from bkspark.localcluster import LocalCluster
        from bkspark.testing.netns import Network
        from metadata.testing import ZooKeeperEnsemble
        self.workdir = workdir
        self.net = Network()
        try:
            self.zk_hosts = [self.net.add_host(f"zk{i}") for i in range(zk_servers)]
            self.bookie_hosts = [self.net.add_host(f"b{i}") for i in range(num_bookies)]
            self.clients = [self.net.add_host("c0"), self.net.add_host("c1")]
            self.zk = ZooKeeperEnsemble(hosts=[(h.address, self.net.launcher(h))
                                               for h in self.zk_hosts])
            self.zk.start()
            self.uri = self.zk.uri("/bk")
            hosts = self.bookie_hosts
            self.cluster = LocalCluster(
                self.uri, num_bookies, os.path.join(workdir, "bookies"),
                ["--metadata-session-timeout-s", "4"],
                placement=lambda i: (hosts[i].address, self.net.launcher(hosts[i])),
                listen_all=True, start_timeout=120)
            self.cluster.start_all()
            self._check_registrations()
        except BaseException:
            self.close()
            raise

    def _check_registrations(self) -> None:
        """Bookies listening on 0.0.0.0 must register the address of their own host."""
        from metadata import open_store, registry
        with open_store(self.uri) as store:
            registered = set(registry.list_bookies(store))
        expected = {b.bookie_id for b in self.cluster.bookies}
        if registered != expected:
            raise RuntimeError(f"bookies on 0.0.0.0 registered as {sorted(registered)}, "
                               f"expected their hosts' addresses {sorted(expected)}")

    def start_worker(self, host, mode: str, worker: str, *extra: str) -> tuple:
        """Start a worker process on ``host``; ``(process, events path)``. Its output goes to
        ``worker-<worker>.log`` in the work directory."""
        path = os.path.join(self.workdir, f"events-{worker}.jsonl")
        with open(os.path.join(self.workdir, f"worker-{worker}.log"), "ab") as log:
            proc = self.net.popen(host, [sys.executable, "-m", "bkspark.testing.multihost",
                                         "worker", "--uri", self.uri, "--mode", mode,
                                         "--worker", worker, "--events", path, *extra],
                                  stdout=log, stderr=subprocess.STDOUT)
        return proc, path

    def close(self) -> None:
        cluster = getattr(self, "cluster", None)
        if cluster is not None:
            cluster.stop_all()
        zk = getattr(self, "zk", None)
        if zk is not None:
            zk.stop()
        self.net.close()


# ---- faults -----------------------------------------------------------------------------------

KINDS = ("zk_cut", "zk_answers_lost", "zk_follower_behind", "bookie_cut", "bookie_one_way",
         "bookie_lossy", "bookie_isolated", "bookie_kill")


@dataclass
class Heal:
    """A cut-off period of a client host, for the after-heal checks."""
    client: str
    start: float
    end: float
    takeover: bool = False      # the other client took the stream log over meanwhile


@dataclass
class CampaignResult:
    seed: int
    duration: float
    faults: dict = field(default_factory=lambda: collections.Counter())
    heals: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def run_campaign(seed: int, duration: float, workdir: str | None = None,
                 num_bookies: int = 5, verbose: bool = True) -> CampaignResult:
    """One deployment, the scripted split-brain scenario, then random faults for
    ``duration`` seconds; then the checker. Returns the result (violations included)."""
    rng = random.Random(seed)
    workdir = workdir or tempfile.mkdtemp(prefix="bkspark-multihost-")
    result = CampaignResult(seed, duration)
    say = (lambda *a: print("multihost:", *a, flush=True)) if verbose else (lambda *a: None)
    dep = Deployment(workdir, num_bookies)
    procs = []
    try:
        c0, c1 = dep.clients
        streams = {"s0": dep.start_worker(c0, "stream", "s0"),
                   "s1": dep.start_worker(c1, "stream", "s1")}
        commits = {"k0": dep.start_worker(c0, "commit", "k0"),
                   "k1": dep.start_worker(c1, "commit", "k1")}
        procs = [p for p, _ in list(streams.values()) + list(commits.values())]
        time.sleep(5.0)
        _split_brain(dep, streams, result, say)
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            _random_fault(dep, rng, result, say)
            time.sleep(rng.uniform(0.5, 2.0))
        dep.net.heal()
        for i in range(len(dep.cluster.bookies)):
            dep.cluster.start(i)
        time.sleep(SETTLE_AFTER_HEAL / 3)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except Exception:  # noqa: BLE001 - a worker stuck on a dead client
                proc.kill()
        events = {w: _read_events(path) for w, (_, path) in {**streams, **commits}.items()}
        check(dep, events, result)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        dep.close()
    say(format_result(result))
    return result


def _split_brain(dep, streams, result, say) -> None:
    """The seeds' split-brain scenario across hosts: s0's host is cut from ZooKeeper and
    every bookie; s1 takes the stream log over; the cut heals after add timeout + session."""
    c0 = dep.clients[0]
    deadline = time.monotonic() + 30
    while _last_owner(streams) != "s0" and time.monotonic() < deadline:
        time.sleep(0.05)            # cut s0 while it owns the log
    owner_before = _last_owner(streams)
    start = time.time()
    say("split-brain: cutting c0 from ZooKeeper and every bookie")
    for z in dep.zk_hosts:
        dep.net.cut(c0, z)
    for b in dep.bookie_hosts:
        dep.net.cut(c0, b)
    time.sleep(ADD_TIMEOUT + SESSION_TIMEOUT + 4.0)
    end = time.time()
    dep.net.heal(c0)
    takeover = owner_before == "s0" and _took_over_between(streams["s1"][1], start, end)
    result.faults["split_brain"] += 1
    result.heals.append(Heal("s0", start, end, takeover=takeover))
    say(f"split-brain: healed after {end - start:.1f}s (s1 owned the log meanwhile: {takeover})")
    time.sleep(3.0)


def _last_owner(streams) -> str | None:
    """The stream worker that opened the log last, if it has not been fenced since."""
    best = None
    for w, (_, path) in streams.items():
        for e in _read_events(path):
            if e["kind"] in ("owner", "fenced") and (best is None or e["t"] > best[0]):
                best = (e["t"], w, e["kind"])
    return best[1] if best and best[2] == "owner" else None


def _took_over_between(path, start, end) -> bool:
    return any(e["kind"] == "owner" and start <= e["t"] <= end for e in _read_events(path))


def _random_fault(dep, rng, result, say) -> None:
    kind = rng.choice(KINDS)
    ci = rng.randrange(2)
    client = dep.clients[ci]
    bi = rng.randrange(len(dep.bookie_hosts))
    bookie = dep.bookie_hosts[bi]
    zi = rng.randrange(len(dep.zk_hosts))
    zk = dep.zk_hosts[zi]
    seconds = rng.uniform(1.0, 2 * (ADD_TIMEOUT + SESSION_TIMEOUT))
    start = time.time()
    if kind == "zk_cut":                # from every server, or from one (the client moves
        for z in (dep.zk_hosts if rng.random() < 0.5 else [zk]):   # to another, maybe lagging)
            dep.net.cut(client, z)
    elif kind == "zk_answers_lost":
        seconds = rng.uniform(1.0, 4.0)
        for z in dep.zk_hosts:
            dep.net.drop(z, client, sport=ZK_PORT)
    elif kind == "zk_follower_behind":  # a server cut from its peers falls behind, and its
        others = [z for z in dep.zk_hosts if z != zk]                   # clients move on
        for z in others:
            dep.net.cut(zk, z)
    elif kind == "bookie_cut":
        dep.net.cut(client, bookie)
    elif kind == "bookie_one_way":
        if rng.random() < 0.5:
            dep.net.drop(client, bookie)
        else:
            dep.net.drop(bookie, client)
    elif kind == "bookie_lossy":
        dep.net.lossy(client, bookie, rng.randrange(10, 40))
        dep.net.lossy(bookie, client, rng.randrange(10, 40))
    elif kind == "bookie_isolated":
        for h in [*dep.zk_hosts, *dep.clients, *[b for b in dep.bookie_hosts if b != bookie]]:
            dep.net.cut(bookie, h)
    elif kind == "bookie_kill":
        dep.cluster.kill(bi)
    say(f"{kind} client=c{ci} bookie=b{bi} zk=zk{zi} for {seconds:.1f}s")
    time.sleep(seconds)
    if kind == "bookie_kill":
        dep.cluster.start(bi)
    else:
        dep.net.heal()
    if kind in ("zk_cut", "zk_answers_lost", "bookie_cut"):
        result.heals.append(Heal(f"s{ci}", start, time.time()))
    result.faults[kind] += 1


# ---- checker ----------------------------------------------------------------------------------

def _read_events(path: str) -> list[dict]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass        # a line cut by SIGKILL
    except FileNotFoundError:
        pass
    return out


def check(dep, events: dict, result: CampaignResult) -> None:
    """Read both logs back from the observer and compare with every worker's events."""
    from bkspark import errors
    from bkspark.client import BookKeeper
    from bkspark.log import EARLIEST, LogStore
    v = result.violations
    with BookKeeper(dep.uri) as bk:
        logs = LogStore(bk, password=PASSWORD)
        if logs.exists(STREAM_LOG):         # recover the last writer's ledger: an acked entry
            logs.open_writer(STREAM_LOG).close()    # of an open ledger is read after recovery
        stream = _read_log(logs, STREAM_LOG, EARLIEST, v, errors)
        commit_records = _read_log(logs, COMMIT_LOG, EARLIEST, v, errors)
        for name in (STREAM_LOG, COMMIT_LOG):
            if logs.exists(name):
                for lid in logs.get(name)[0].ledger_ids():
                    try:
                        bk.ledger_metadata(lid)
                    except errors.NoSuchLedgerError:
                        v.append({"kind": "listed-ledger-deleted", "log": name, "ledger": lid})
        committed = logs.get(COMMIT_LOG)[0].writers if logs.exists(COMMIT_LOG) else {}

    # stream: every ack present once, per-worker order, no duplicate payloads
    seen = collections.Counter(stream)
    for payload, count in seen.items():
        if count > 1:
            v.append({"kind": "duplicate", "log": STREAM_LOG, "payload": payload,
                      "count": count})
    order = {p: i for i, p in enumerate(stream)}
    acked = 0
    for worker in ("s0", "s1"):
        last = -1
        for e in events.get(worker, []):
            if e["kind"] != "ack":
                continue
            acked += 1
            if e["payload"] not in order:
                v.append({"kind": "acked-missing", "log": STREAM_LOG, "payload": e["payload"]})
                continue
            if order[e["payload"]] < last:
                v.append({"kind": "out-of-order", "log": STREAM_LOG, "payload": e["payload"]})
            last = order[e["payload"]]

    # commits: reported applied -> present once; no key applied twice
    per_key = collections.Counter()
    for record in commit_records:
        worker, sequence, i = record.rsplit(":", 2)
        if i == "0":
            per_key[(worker, int(sequence))] += 1
    commits_acked = 0
    for worker in ("k0", "k1"):
        reported = [e["sequence"] for e in events.get(worker, []) if e["kind"] == "commit"]
        commits_acked += len(reported)
        for sequence in reported:
            if per_key[(worker, sequence)] == 0:
                v.append({"kind": "commit-missing", "worker": worker, "sequence": sequence})
        if reported and committed.get(worker, -1) < max(reported):
            v.append({"kind": "commit-key-missing", "worker": worker,
                      "recorded": committed.get(worker), "reported": max(reported)})
    for key, count in per_key.items():
        if count > 1:
            v.append({"kind": "commit-twice", "worker": key[0], "sequence": key[1]})

    # cut-off writers learn they were fenced; time to the first ack after each heal
    firsts = []
    for heal in result.heals:
        later = [e for e in events.get(heal.client, []) if e["t"] > heal.end]
        acks = [e["t"] for e in later if e["kind"] == "ack"]
        if acks:
            firsts.append(min(acks) - heal.end)
        if heal.takeover:
            # from the cut on, the writer must learn it lost the log ("fenced", or a new
            # writer of its own: it was fenced just before the cut) before it acknowledges
            # anything after the heal, and within the settle time
            since_cut = [e for e in events.get(heal.client, []) if e["t"] >= heal.start]
            settled = next((e for e in since_cut if e["kind"] in ("fenced", "owner")), None)
            first_ack = next((e for e in since_cut if e["kind"] == "ack" and e["t"] > heal.end),
                             None)
            if settled is None or settled["t"] - heal.end > SETTLE_AFTER_HEAL or (
                    first_ack is not None and first_ack["t"] < settled["t"]):
                v.append({"kind": "stale-error-after-heal", "worker": heal.client,
                          "after": [(e["kind"], e.get("error")) for e in since_cut[:5]]})
    errors_by_kind = collections.Counter(
        e.get("error") for evs in events.values() for e in evs if e["kind"] == "error")
    result.stats = {
        "entries_acked": acked, "log_appends_acked": commits_acked,
        "stream_records": len(stream), "commit_records": len(commit_records),
        "fenced": sum(1 for evs in events.values() for e in evs if e["kind"] == "fenced"),
        "errors": dict(errors_by_kind),
        "first_ack_after_heal_s": _percentiles(firsts),
    }


def _read_log(logs, name, start, violations, errors) -> list[str]:
    if not logs.exists(name):
        return []
    try:
        with logs.open_reader(name, start, tail=False) as reader:
            return [r.data.decode() for r in reader]
    except errors.BKError as exc:
        violations.append({"kind": "log-unreadable", "log": name, "error": repr(exc)})
        return []


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    values = sorted(values)
    pick = lambda q: round(values[min(len(values) - 1, int(q * len(values)))], 2)  # noqa: E731
    return {"n": len(values), "p50": pick(0.5), "max": round(values[-1], 2)}


def format_result(r: CampaignResult) -> str:
    faults = ", ".join(f"{k} {n}" for k, n in sorted(r.faults.items()))
    lines = [f"multihost campaign seed={r.seed} duration={r.duration:g}s",
             f"  faults: {faults}",
             f"  entries acked: {r.stats.get('entries_acked')}, log appends acked: "
             f"{r.stats.get('log_appends_acked')}, fenced: {r.stats.get('fenced')}",
             f"  first ack after a heal (s): {r.stats.get('first_ack_after_heal_s')}",
             f"  errors seen by workers: {r.stats.get('errors')}",
             f"  violations: {len(r.violations)}"]
    lines += [f"    {json.dumps(x)}" for x in r.violations[:20]]
    if r.violations:
        lines.append(f"  replay: python -m bkspark.testing.faults multihost --seed {r.seed} "
                     f"--duration {r.duration:g}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        p = argparse.ArgumentParser(prog="bkspark.testing.multihost worker")
        p.add_argument("--uri", required=True)
        p.add_argument("--mode", choices=["stream", "commit"], required=True)
        p.add_argument("--worker", required=True)
        p.add_argument("--events", required=True)
        p.add_argument("--log", default=None, help="default: stream / commits")
        p.add_argument("--add-timeout", type=float, default=ADD_TIMEOUT)
        worker_main(p.parse_args(argv[1:]))
        return 0
    p = argparse.ArgumentParser(prog="python -m bkspark.testing.faults multihost",
                                description="multi-host campaign over network namespaces")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--duration", type=float, default=120.0, help="seconds of random faults")
    p.add_argument("--bookies", type=int, default=5)
    p.add_argument("--workdir", default=None)
    p.add_argument("--report", default=None, help="write the JSON result here")
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    r = run_campaign(seed, a.duration, a.workdir, a.bookies)
    if a.report:
        with open(a.report, "w") as f:
            json.dump({"seed": r.seed, "duration": r.duration, "faults": dict(r.faults),
                       "stats": r.stats, "violations": r.violations,
                       "text": format_result(r)}, f, indent=1)
    return 1 if r.violations else 0


if __name__ == "__main__":
    sys.exit(main())
