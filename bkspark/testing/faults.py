"""Randomized fault runs with an invariant checker (issue 9).

    python -m bkspark.testing.faults --seed 7 --duration 120 --store both --report run.json
    python -m bkspark.testing.faults crash --seed 7 --kills 300 --report crash.json

A **fault run** starts metadata (the embedded SQLite store, or a real ZooKeeper server in
its own chroot), N bookies (``BookieCluster`` with fault injection, small write cache and
frequent checkpoints) and writer *processes*:

* ledger writers create ledgers of random (E, Qw, Qa) and append numbered, checksummed
  records (:func:`make_record`), pipelined;
* log writers append records to a shared log through ``LogStore.open_writer`` (rolling
  ledgers often), re-taking the log when fenced.

Every acknowledgement is appended to the worker's ack file and flushed to the OS before
the worker counts it, so a SIGKILLed worker still leaves every ack it saw.

The **schedule** is a pure function of the seed (:func:`make_schedule`): SIGKILL+restart of
bookies, SIGSTOP/SIGCONT pauses, delays/drops/failures injected with ``set_faults``,
SIGKILL of writer processes (a replacement starts), a second client recovering a writer's
current ledger (or taking over the log) while the first still writes, metadata session
expiry of a writer (SIGUSR1 makes the worker expire its own session with
``metadata.testing.expire_session``), and disk-full bookies (restarted with a tiny
``--disk-usage-threshold`` -> read-only). The runner also snapshots the log metadata.

The **checker** (:class:`Checker`) heals the cluster, then opens every ledger with
recovery and verifies against the ack files:

* ``acked-entry-lost``: an acknowledged entry is past the closed end or unreadable;
* ``fenced-writer-success``: a writer got an ack past the end a recoverer closed at;
* ``bad-record`` / ``ack-mismatch``: an entry fails its record checksum, or is not the
  record that was acknowledged at that id;
* ``out-of-order``: a ledger's records are not in the writer's order; a log's records of
  one writer are not in order;
* ``replica-divergence`` / ``under-replicated``: two replicas of an entry differ, or an
  entry of a closed ledger is held by fewer than Qa bookies of its write set;
* ``reader-divergence``: two clients read different sequences;
* ``end-moved``: a closed ledger's end (recorded by its writer, a recoverer, or the first
  check) differs when re-opened later (after every bookie was SIGKILLed and restarted);
* ``log-*``: a non-empty ledger vanished from a log's list or changed position, more than
  one ledger open, or an acknowledged log position not in the log.

A failing run prints its seed; ``--seed S --duration D`` replays the same schedule.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from bkspark import errors
from bkspark.client import quorum

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PASSWORD = b"faults"
LOG_NAME = "chaos-log"
BOOKIE_ARGS = ["--write-cache-mb", "1", "--checkpoint-interval-s", "0.5",
               "--journal-max-size-mb", "1", "--entry-log-max-size-mb", "2",
               "--gc-interval-s", "2", "--disk-check-interval-s", "0.3"]
CLIENT_CONF = dict(add_timeout=3.0, read_timeout=3.0, speculative_read_timeout=0.5,
                   metadata_retries=40)
LEDGER_CONFIGS = [(3, 2, 2), (3, 3, 2), (3, 3, 3), (4, 3, 2), (3, 2, 1)]

# ---- records ------------------------------------------------------------------------------

_REC = struct.Struct(">4sIQI")     # magic, worker, seq, payload length
_MAGIC = b"BKSR"


def make_record(worker: int, seq: int, size: int) -> bytes:
    """A self-checking record: header, deterministic filler, CRC32 of both."""
    rng = random.Random(worker * 1_000_003 + seq)
    filler = rng.randbytes(size)
    head = _REC.pack(_MAGIC, worker, seq, size)
    return head + filler + struct.pack(">I", zlib.crc32(head + filler))


def parse_record(data: bytes) -> tuple[int, int]:
    """(worker, seq) of a record; ValueError if it is not an intact record."""
    if len(data) < _REC.size + 4:
        raise ValueError(f"record too short ({len(data)} bytes)")
    magic, worker, seq, size = _REC.unpack_from(data, 0)
    if magic != _MAGIC or len(data) != _REC.size + size + 4:
        raise ValueError("bad record header")
    if struct.unpack(">I", data[-4:])[0] != zlib.crc32(data[:-4]):
        raise ValueError(f"record checksum mismatch (worker {worker} seq {seq})")
    return worker, seq


# ---- workers (subprocesses) -------------------------------------------------------------------

class AckFile:
    """Line-oriented, flushed on every line: a SIGKILL loses nothing written."""

    def __init__(self, path: str):
        self._f = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, *fields) -> None:
        line = " ".join(str(f) for f in fields) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()


def _install_expiry_handler(bk, acks: AckFile) -> None:
    def expire():
        from metadata.testing import expire_session
        try:
            expire_session(bk.store, timeout=20)
            acks.write("S", "expired")
        except Exception as exc:  # noqa: BLE001
            acks.write("S", "expiry-failed", type(exc).__name__)

    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=expire, daemon=True).start())


def _log_to(path_or_stream, level=None) -> "logging.Handler":
    """Send bkspark's INFO records (recoveries, ensemble changes, log takeovers) to a file
    or stream of the run directory: what a violation's post-mortem reads."""
    import logging
    handler = (logging.FileHandler(path_or_stream) if isinstance(path_or_stream, str)
               else logging.StreamHandler(path_or_stream))
    handler.setFormatter(logging.Formatter(
        "%(asctime)s.%(msecs)03d %(threadName)s %(name)s %(levelname)s %(message)s", "%H:%M:%S"))
    handler.setLevel(level or logging.INFO)
    root = logging.getLogger("bkspark")
    root.addHandler(handler)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    return handler


def worker_main(args) -> None:
    from bkspark.client import BookKeeper
    _log_to(sys.stderr)
    rng = random.Random(args.seed * 7919 + args.worker_id)
    acks = AckFile(args.acks)
    seq = 0
    with BookKeeper(args.uri, **CLIENT_CONF) as bk:
        _install_expiry_handler(bk, acks)
        acks.write("W", args.mode, os.getpid())
        if args.mode == "ledger":
            while True:
                seq = _ledger_round(bk, rng, acks, args.worker_id, seq)
        else:
            _log_loop(bk, rng, acks, args.worker_id)


def _ledger_round(bk, rng, acks: AckFile, wid: int, seq: int) -> int:
    e, qw, qa = rng.choice(LEDGER_CONFIGS)
    try:
        lh = bk.create_ledger(e, qw, qa, password=PASSWORD,
                              digest=rng.choice(["crc32c", "hmac", "crc32"]))
    except errors.BKError as exc:
        acks.write("N", type(exc).__name__)
        time.sleep(0.3)
        return seq
    lid = lh.ledger_id
    acks.write("L", lid, e, qw, qa)
    target = rng.randint(30, 300)
    window: collections.deque = collections.deque()
    failed = None

    def on_done(f, s=None):
        try:
            eid = f.result()
        except BaseException as exc:  # noqa: BLE001
            acks.write("X", lid, s, type(exc).__name__)
            return
        acks.write("A", lid, eid, s)

    for _ in range(target):
        rec = make_record(wid, seq, rng.randint(8, 1500))
        try:
            fut = lh.append_async(rec)
        except errors.BKError as exc:
            failed = exc
            acks.write("X", lid, seq, type(exc).__name__)
            break
        fut.add_done_callback(lambda f, s=seq: on_done(f, s))
        seq += 1
        window.append(fut)
        while len(window) > 8 or (window and window[0].done()):
            try:
                window.popleft().result()
            except BaseException as exc:  # noqa: BLE001
                failed = exc
                break
        if failed is not None:
            break
        time.sleep(0.002)
    for fut in window:
        try:
            fut.result()
        except BaseException as exc:  # noqa: BLE001
            failed = failed or exc
    try:
        lh.close()
        acks.write("C", lid, lh.last_add_confirmed)
    except BaseException as exc:  # noqa: BLE001
        acks.write("CF", lid, type(exc).__name__)
    return seq


def _log_loop(bk, rng, acks: AckFile, wid: int) -> None:
    from bkspark.log import LogStore
    logs = LogStore(bk, password=PASSWORD, ensemble_size=3, write_quorum=2, ack_quorum=2)
    seq = 0
    while True:
        try:
            writer = logs.open_writer(LOG_NAME, roll_bytes=rng.randint(20_000, 120_000))
        except errors.BKError as exc:
            acks.write("N", type(exc).__name__)
            time.sleep(0.5)
            continue
        acks.write("O", writer.epoch, writer.ledger_id)
        window: collections.deque = collections.deque()
        failed = False

        def on_done(f, s):
            try:
                pos = f.result()
            except BaseException as exc:  # noqa: BLE001
                acks.write("X", -1, s, type(exc).__name__)
                return
            acks.write("P", pos.ledger_id, pos.entry_id, s)

        while not failed:
            rec = make_record(wid, seq, rng.randint(8, 1500))
            try:
                fut = writer.append_async(rec)
            except errors.BKError as exc:
                acks.write("X", -1, seq, type(exc).__name__)
                break
            fut.add_done_callback(lambda f, s=seq: on_done(f, s))
            seq += 1
            window.append(fut)
            while len(window) > 8 or (window and window[0].done()):
                try:
                    window.popleft().result()
                except BaseException:  # noqa: BLE001
                    failed = True
                    break
            time.sleep(0.002)
        for fut in window:
            try:
                fut.result()
            except BaseException:  # noqa: BLE001
                pass
        try:
            writer.close()
        except BaseException:  # noqa: BLE001
            pass
        time.sleep(rng.uniform(0.2, 1.0))


# ---- schedule --------------------------------------------------------------------------------

FAULT_KINDS = ("bookie_kill", "bookie_pause", "inject", "writer_kill", "recover_ledger",
               "log_takeover", "session_expire", "disk_full")


@dataclass(order=True)
class Fault:
    t: float
    kind: str = field(compare=False)
    target: int = field(compare=False)
    duration: float = field(compare=False, default=0.0)
    params: dict = field(compare=False, default_factory=dict)

    def to_json(self):
        return {"t": round(self.t, 3), "kind": self.kind, "target": self.target,
                "duration": round(self.duration, 3), "params": self.params}


def make_schedule(seed: int, duration: float, num_bookies: int, num_workers: int,
                  max_bookies_down: int = 2, kinds=FAULT_KINDS) -> list[Fault]:
    """The run's faults, a pure function of its arguments (replayable from the seed).

    At most ``max_bookies_down`` bookies are disrupted (killed, paused, read-only) at a
    time, so that writers can still make progress; the last 15% of the run is quiet.
    """
    rng = random.Random(seed)
    faults: list[Fault] = []
    busy_until = [0.0] * num_bookies
    t = rng.uniform(1.0, 3.0)
    end = duration * 0.85
    weights = {"bookie_kill": 5, "bookie_pause": 3, "inject": 4, "writer_kill": 2,
               "recover_ledger": 3, "log_takeover": 2, "session_expire": 2, "disk_full": 1}
    names = [k for k in kinds if k in weights]
    first = list(names)             # every kind early in the run, then weighted draws
    rng.shuffle(first)
    while t < end:
        kind = first[0] if first else rng.choices(names, [weights[k] for k in names])[0]
        if kind in ("bookie_kill", "bookie_pause", "disk_full", "inject"):
            free = [i for i in range(num_bookies) if busy_until[i] <= t]
            down = sum(1 for u in busy_until if u > t)
            if not free or (kind != "inject" and down >= max_bookies_down):
                t += rng.uniform(0.2, 1.0)
                continue
            if first:
                first.pop(0)
            target = rng.choice(free)
            if kind == "bookie_kill":
                f = Fault(t, kind, target, rng.uniform(0.2, 3.0))
            elif kind == "bookie_pause":
                f = Fault(t, kind, target, rng.uniform(0.5, 5.0))
            elif kind == "disk_full":
                f = Fault(t, kind, target, rng.uniform(2.0, 6.0))
            else:
                rule = {"op": rng.choice(["add", "read", "read_lac", "any"]),
                        "action": rng.choice(["delay", "drop", "fail"]),
                        "probability": round(rng.uniform(0.05, 0.5), 2)}
                if rule["action"] == "delay":
                    rule["delay_ms"] = rng.randint(20, 2000)
                if rule["action"] == "fail":
                    rule["error"] = rng.choice([errors.EIO, errors.ETOOMANYREQUESTS,
                                                errors.EUNKNOWNLEDGERSTATE])
                f = Fault(t, kind, target, rng.uniform(1.0, 5.0), {"rule": rule})
            if kind != "inject":
                busy_until[target] = t + f.duration + 1.5
            faults.append(f)
        else:
            if first:
                first.pop(0)
            faults.append(Fault(t, kind, rng.randrange(num_workers), 0.0))
        t += rng.expovariate(1 / 1.2)
    return faults


# ---- runner ---------------------------------------------------------------------------------

def wait_serving(cluster, timeout: float = 60.0) -> None:
    """Wait until every bookie answers gRPC (through any reconnect backoff of this process)."""
    from bkspark.proto import bookie_pb2 as pb
    for address in cluster.bookie_ids:
        channel, stub = _bookie_rpc(address)
        try:
            stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=timeout, wait_for_ready=True)
        finally:
            channel.close()


def _bookie_rpc(address: str):
    from bkspark.proto import bookie_pb2_grpc as pb_grpc
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.BookieStub(channel)


class FaultRun:
    """One run: cluster + workers + schedule, then the checker. See the module docstring."""

    def __init__(self, seed: int, duration: float, store: str, workdir: str, *,
                 num_bookies: int = 5, ledger_writers: int = 2, log_writers: int = 1,
                 zookeeper=None, kinds=FAULT_KINDS, verbose: bool = False):
        self.seed, self.duration, self.store_kind = seed, duration, store
        self.workdir = workdir
        self.num_bookies = num_bookies
        self.modes = ["ledger"] * ledger_writers + ["log"] * log_writers
        self.zookeeper = zookeeper
        self.kinds = kinds
        self.verbose = verbose
        self.schedule = make_schedule(seed, duration, num_bookies, len(self.modes), kinds=kinds)
        self.faults_applied: collections.Counter = collections.Counter()
        self.fault_errors: list[str] = []
        self.events = AckFile(os.path.join(workdir, "runner.events"))
        self.workers: dict[int, subprocess.Popen] = {}
        self.slot_worker: list[int] = []
        self._next_worker = 0
        self._bg: list[threading.Thread] = []
        self.log_snapshots: list[list[dict]] = []
        self.paused: set[int] = set()
        self._takeovers = 0
        self._takeover_lock = threading.Lock()
        self.uri = ""

    def say(self, *a):
        if self.verbose:
            print(f"[{time.strftime('%H:%M:%S')} seed={self.seed}]", *a, flush=True)

    # -- workers
    def _spawn(self, slot: int) -> None:
        wid = self._next_worker
        self._next_worker += 1
        cmd = [sys.executable, "-m", "bkspark.testing.faults", "worker", "--uri", self.uri,
               "--mode", self.modes[slot], "--worker-id", str(wid), "--seed", str(self.seed),
               "--acks", os.path.join(self.workdir, f"worker-{wid}.acks")]
        log = open(os.path.join(self.workdir, f"worker-{wid}.log"), "ab")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (_ROOT, env.get("PYTHONPATH")) if x)
        self.workers[wid] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env)
        log.close()
        if slot < len(self.slot_worker):
            self.slot_worker[slot] = wid
        else:
            self.slot_worker.append(wid)

    def _kill_workers(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.workers.values():
            proc.wait()

    def _worker_ready(self, wid: int) -> bool:
        try:
            with open(os.path.join(self.workdir, f"worker-{wid}.acks")) as f:
                return f.readline().startswith("W ")
        except OSError:
            return False

    def _respawn_dead(self) -> None:
        for slot, wid in enumerate(self.slot_worker):
            rc = self.workers[wid].poll()
            if rc is not None:
                self.fault_errors.append(f"worker {wid} died on its own (rc {rc}); respawned")
                self._spawn(slot)

    def _current_ledger(self, wid: int) -> int | None:
        last = None
        try:
            with open(os.path.join(self.workdir, f"worker-{wid}.acks")) as f:
                for line in f:
                    p = line.split()
                    if p and p[0] == "L":
                        last = int(p[1])
        except OSError:
            pass
        return last

    # -- the run
    def run(self) -> dict:
        from bkspark.client import BookKeeper
        from bkspark.testing.cluster import BookieCluster
        from metadata.testing import unique_root
        if self.store_kind == "zk":
            self.uri = self.zookeeper.uri(unique_root("chaos"))
        else:
            self.uri = f"sqlite:///{os.path.join(self.workdir, 'meta.db')}"
        with open(os.path.join(self.workdir, "schedule.json"), "w") as f:
            json.dump([x.to_json() for x in self.schedule], f, indent=0)
        cluster = BookieCluster(self.uri, num_bookies=self.num_bookies,
                                data_dir=os.path.join(self.workdir, "bookies"),
                                extra_args=BOOKIE_ARGS, session_timeout=2.0)
        self.cluster = cluster
        cluster.start_all()
        started = time.monotonic()
        handler = _log_to(os.path.join(self.workdir, "runner.log"))
        try:
            with BookKeeper(self.uri, **CLIENT_CONF) as bk:
                self.bk = bk
                for slot in range(len(self.modes)):
                    self._spawn(slot)
                self._drive(started)
                self._kill_workers()
                for t in self._bg:
                    t.join(60)
                self._heal()
            checker = Checker(self.uri, self.workdir, cluster, self.log_snapshots,
                              say=self.say)
            result = checker.check()
        finally:
            self._kill_workers()
            cluster.stop_all()
            import logging
            logging.getLogger("bkspark").removeHandler(handler)
            handler.close()
        result.update(seed=self.seed, store=self.store_kind, duration=self.duration,
                      faults=dict(self.faults_applied), fault_errors=self.fault_errors[:20],
                      wall_seconds=round(time.monotonic() - started, 1))
        return result

    def _drive(self, started: float) -> None:
        actions = []        # (time, order, fn)
        for i, f in enumerate(self.schedule):
            actions.append((f.t, i, 0, f))
            if f.duration:
                actions.append((f.t + f.duration, i, 1, f))
        actions.sort(key=lambda a: (a[0], a[1], a[2]))
        next_snapshot = 0.0
        for t, _, phase, fault in actions:
            while True:
                now = time.monotonic() - started
                if now >= next_snapshot:
                    self._snapshot_log()
                    self._respawn_dead()
                    next_snapshot = now + 0.5
                if now >= t:
                    break
                time.sleep(min(0.05, t - now))
            try:
                (self._begin if phase == 0 else self._end)(fault)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be applied
                self.fault_errors.append(f"{fault.kind}@{fault.t:.1f}: {type(exc).__name__}: {exc}")
                self.say("fault error", fault.kind, exc)
        while time.monotonic() - started < self.duration:
            self._snapshot_log()
            self._respawn_dead()
            time.sleep(0.5)

    def _snapshot_log(self) -> None:
        from bkspark.log import LogStore
        try:
            md, _ = LogStore(self.bk, password=PASSWORD).get(LOG_NAME)
        except errors.BKError:
            return
        self.log_snapshots.append([dict(e) for e in md.ledgers])

    def _begin(self, f: Fault) -> None:
        c = self.cluster
        self.say("begin", f.kind, f.target, round(f.duration, 2), f.params or "")
        self.events.write("F", f.kind, f.target, json.dumps(f.params, separators=(",", ":")))
        self._apply(f)
        self.faults_applied[f.kind] += 1     # counted once applied without error

    def _apply(self, f: Fault) -> None:
        c = self.cluster
        if f.kind == "bookie_kill":
            c.kill(f.target)
        elif f.kind == "bookie_pause":
            c.pause(f.target, anywhere=True)
            self.paused.add(f.target)
        elif f.kind == "inject":
            if f.target in self.paused or not c.bookies[f.target].alive:
                raise RuntimeError(f"bookie {f.target} is down or paused (schedule drift)")
            c.set_faults(f.target, [f.params["rule"]])
        elif f.kind == "disk_full":
            b = c.bookies[f.target]
            c.kill(f.target)
            b.extra_args = list(c.extra_args) + ["--disk-usage-threshold", "0.0001",
                                                 "--disk-usage-lwm", "0.00005"]
            c.start(f.target)
        elif f.kind == "writer_kill":
            wid = self.slot_worker[f.target]
            self.workers[wid].kill()
            self.workers[wid].wait()
            self._spawn(f.target)
        elif f.kind == "session_expire":
            wid = self.slot_worker[f.target]
            proc = self.workers[wid]
            deadline = time.monotonic() + 20     # SIGUSR1 kills a worker without its handler
            while proc.poll() is None and not self._worker_ready(wid) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is None and self._worker_ready(wid):
                proc.send_signal(signal.SIGUSR1)
        elif f.kind == "recover_ledger":
            ledger_slots = [i for i, m in enumerate(self.modes) if m == "ledger"]
            if not ledger_slots:
                return
            wid = self.slot_worker[ledger_slots[f.target % len(ledger_slots)]]
            lid = self._current_ledger(wid)
            if lid is not None:
                self._background(self._recover, lid)
        elif f.kind == "log_takeover":
            self._background(self._takeover)

    def _end(self, f: Fault) -> None:
        c = self.cluster
        self.say("end", f.kind, f.target)
        if f.kind == "bookie_kill":
            c.start(f.target)
        elif f.kind == "bookie_pause":
            c.resume(f.target)
            self.paused.discard(f.target)
        elif f.kind == "inject":
            if c.bookies[f.target].alive and f.target not in self.paused:
                c.set_faults(f.target, [])
        elif f.kind == "disk_full":
            c.kill(f.target)
            c.bookies[f.target].extra_args = list(c.extra_args)
            c.start(f.target)

    def _background(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._bg.append(t)

    def _recover(self, lid: int) -> None:
        for attempt in range(10):
            try:
                rh = self.bk.open_ledger(lid, password=PASSWORD, recovery=True)
                self.events.write("R", lid, rh.last_add_confirmed)
                rh.close()
                return
            except errors.BKError as exc:
                self.events.write("RF", lid, type(exc).__name__)
                time.sleep(0.5)

    def _takeover(self) -> None:
        """A second log writer takes the log over while the first writes."""
        from bkspark.log import LogStore
        with self._takeover_lock:
            self._takeovers += 1
            wid = 100_000 + self._takeovers
        acks = AckFile(os.path.join(self.workdir, f"worker-{wid}.acks"))
        logs = LogStore(self.bk, password=PASSWORD, ensemble_size=3, write_quorum=2, ack_quorum=2)
        try:
            writer = logs.open_writer(LOG_NAME)
            acks.write("O", writer.epoch, writer.ledger_id)
            for seq in range(20):
                pos = writer.append(make_record(wid, seq, 64))
                acks.write("P", pos.ledger_id, pos.entry_id, seq)
            writer.close()
        except errors.BKError as exc:
            acks.write("X", -1, -1, type(exc).__name__)

    def _heal(self) -> None:
        c = self.cluster
        for i, b in enumerate(c.bookies):
            b.signal(signal.SIGCONT)
            if b.extra_args != c.extra_args:
                c.kill(i)
                b.extra_args = list(c.extra_args)
            if not b.alive:
                c.start(i)
        wait_serving(c)
        c.clear_faults()


# ---- checker ---------------------------------------------------------------------------------

@dataclass
class Acks:
    ledgers: dict = field(default_factory=dict)          # lid -> {"worker", "acked": {eid: seq}}
    closed_by_writer: dict = field(default_factory=dict)  # lid -> last
    recovered: dict = field(default_factory=dict)         # lid -> [last, ...]
    log_acks: list = field(default_factory=list)          # (worker, lid, eid, seq)
    entries_acked: int = 0
    expiries: int = 0


def read_acks(workdir: str) -> Acks:
    acks = Acks()
    for name in sorted(os.listdir(workdir)):
        if not (name.startswith("worker-") and name.endswith(".acks")):
            continue
        wid = int(name[len("worker-"):-len(".acks")])
        with open(os.path.join(workdir, name)) as f:
            for line in f:
                p = line.split()
                if not p or not line.endswith("\n"):
                    continue
                if p[0] == "L":
                    acks.ledgers[int(p[1])] = {"worker": wid, "acked": {},
                                               "quorum": tuple(map(int, p[2:5]))}
                elif p[0] == "A":
                    acks.ledgers[int(p[1])]["acked"][int(p[2])] = int(p[3])
                    acks.entries_acked += 1
                elif p[0] == "C":
                    acks.closed_by_writer[int(p[1])] = int(p[2])
                elif p[0] == "P":
                    acks.log_acks.append((wid, int(p[1]), int(p[2]), int(p[3])))
                    acks.entries_acked += 1
                elif p[0] == "S" and p[1] == "expired":
                    acks.expiries += 1
    events = os.path.join(workdir, "runner.events")
    if os.path.exists(events):
        with open(events) as f:
            for line in f:
                p = line.split()
                if p and p[0] == "R" and line.endswith("\n"):
                    acks.recovered.setdefault(int(p[1]), []).append(int(p[2]))
    return acks


class Checker:
    """Verifies the invariants (module docstring) of one run's ledgers and log."""

    def __init__(self, uri: str, workdir: str, cluster, log_snapshots=(), say=print):
        self.uri, self.workdir, self.cluster = uri, workdir, cluster
        self.log_snapshots = list(log_snapshots)
        self.say = say
        self.violations: list[dict] = []

    def violation(self, kind: str, **details) -> None:
        v = {"invariant": kind, **details}
        if len(self.violations) < 200:
            self.violations.append(v)
        self.say("VIOLATION", v)

    def _open(self, bk, lid: int, attempts: int = 20):
        last_exc = None
        for _ in range(attempts):
            try:
                return bk.open_ledger(lid, password=PASSWORD, recovery=True)
            except (errors.LedgerRecoveryError, errors.BookieUnavailableError) as exc:
                last_exc = exc
                time.sleep(0.5)
        raise last_exc

    def check(self) -> dict:
        from bkspark.client import BookKeeper
        acks = read_acks(self.workdir)
        ends: dict[int, int] = {}
        contents: dict[int, list[bytes]] = {}
        log_ledgers: list[int] = []
        with BookKeeper(self.uri, **CLIENT_CONF) as a, BookKeeper(self.uri, **CLIENT_CONF) as b:
            log_ledgers = self._check_log(a, b, acks, ends, contents)
            for lid in sorted(acks.ledgers):
                self._check_ledger(a, b, lid, acks, ends, contents)
        # a closed ledger's end never moves: SIGKILL every bookie, restart, re-open, compare
        for i in range(len(self.cluster.bookies)):
            self.cluster.kill(i)
        for i in range(len(self.cluster.bookies)):
            self.cluster.start(i, wait=False)
        for i in range(len(self.cluster.bookies)):
            self.cluster.wait_ready(i)
        wait_serving(self.cluster)
        with BookKeeper(self.uri, **CLIENT_CONF) as c:
            for lid, last in sorted(ends.items()):
                try:
                    rh = self._open(c, lid)
                    if rh.last_add_confirmed != last:
                        self.violation("end-moved", ledger=lid, before=last,
                                       after=rh.last_add_confirmed)
                    elif last >= 0:
                        got = _retry(lambda: [e.data for e in rh.read(0, last)])
                        if got != contents[lid]:
                            self.violation("reader-divergence", ledger=lid,
                                           detail="content changed after restarting bookies")
                    rh.close()
                except errors.BKError as exc:
                    self.violation("acked-entry-lost", ledger=lid,
                                   detail=f"re-open after restart failed: {exc!r}")
        return {"violations": self.violations, "entries_acked": acks.entries_acked,
                "ledgers_checked": len(ends), "log_ledgers": len(log_ledgers),
                "session_expiries": acks.expiries, "log_entries_acked": len(acks.log_acks),
                "entries_read": sum(len(v) for v in contents.values())}

    # -- ledgers
    def _check_ledger(self, a, b, lid, acks: Acks, ends, contents) -> None:
        info = acks.ledgers[lid]
        acked: dict = info["acked"]
        try:
            rh = self._open(a, lid)
        except errors.NoSuchLedgerError:
            if acked:
                self.violation("acked-entry-lost", ledger=lid, detail="ledger metadata gone")
            return
        except errors.BKError as exc:
            self.violation("acked-entry-lost", ledger=lid, detail=f"cannot recover: {exc!r}")
            return
        last = rh.last_add_confirmed
        ends[lid] = last
        md = rh.metadata
        for eid, seq in acked.items():
            if eid > last:
                fenced = acks.recovered.get(lid, [])
                kind = "fenced-writer-success" if fenced else "acked-entry-lost"
                self.violation(kind, ledger=lid, entry=eid, closed_end=last,
                               recovered_ends=fenced)
        for who, end in ([("writer-close", acks.closed_by_writer[lid])]
                         if lid in acks.closed_by_writer else []) + \
                [("recoverer", e) for e in acks.recovered.get(lid, [])]:
            if end != last:
                self.violation("end-moved", ledger=lid, recorded_by=who, recorded=end, now=last)
        data = self._read_all(rh, lid, last)
        rh.close()
        if data is None:
            return
        contents[lid] = data
        prev = -1
        for eid, payload in enumerate(data):
            try:
                worker, seq = parse_record(payload)
            except ValueError as exc:
                self.violation("bad-record", ledger=lid, entry=eid, detail=str(exc))
                continue
            if worker != info["worker"]:
                self.violation("bad-record", ledger=lid, entry=eid,
                               detail=f"record of worker {worker} in worker {info['worker']}'s ledger")
            if seq <= prev:
                self.violation("out-of-order", ledger=lid, entry=eid, seq=seq, previous=prev)
            prev = seq
            if eid in acked and acked[eid] != seq:
                self.violation("ack-mismatch", ledger=lid, entry=eid, acked_seq=acked[eid],
                               read_seq=seq)
        # a second client, reading every entry from a different replica than the first
        self._check_replicas(b, lid, md, last, data)

    def _read_all(self, rh, lid, last):
        if last < 0:
            return []
        try:
            return _retry(lambda: [e.data for e in rh.read(0, last)])
        except errors.BKError as exc:
            self.violation("acked-entry-lost", ledger=lid,
                           detail=f"read 0..{last} failed: {exc!r}")
            return None

    def _check_replicas(self, b, lid, md, last, data) -> None:
        from bkspark.client.digest import DigestManager
        from bkspark.proto import bookie_pb2 as pb
        if last < 0:
            return
        dm = DigestManager(lid, md.digest_type, PASSWORD)
        ensembles = _ensembles(md)
        holdings: dict[str, set] = {}
        stubs = {}
        for ens_first, ens in ensembles:
            for bid in ens:
                if bid in holdings:
                    continue
                channel, stub = _bookie_rpc(b._resolve_address(bid))
                stubs[bid] = (channel, stub)
                try:
                    resp = stub.ListEntries(pb.ListEntriesRequest(ledger_id=lid), timeout=10)
                    held = set()
                    if resp.status == errors.EOK:
                        for r in resp.ranges:
                            held.update(range(r.first, r.last + 1))
                    holdings[bid] = held
                except grpc.RpcError as exc:
                    holdings[bid] = set()
                    self.violation("under-replicated", ledger=lid, bookie=bid,
                                   detail=f"ListEntries failed: {exc.code()}")
        qw, qa = md.write_quorum, md.ack_quorum
        reads = []
        for eid in range(last + 1):
            ens = _ensemble_for(ensembles, eid)
            ws = quorum.write_set_bookies(eid, ens, qw)
            holders = [bid for bid in ws if eid in holdings.get(bid, ())]
            if len(holders) < qa:
                self.violation("under-replicated", ledger=lid, entry=eid, holders=holders,
                               write_set=ws, ack_quorum=qa)
            if holders:
                reads.append((eid, holders[-1]))

        def read_one(item):
            eid, bid = item
            resp = stubs[bid][1].Read(pb.ReadRequest(ledger_id=lid, entry_id=eid), timeout=10)
            return eid, bid, resp

        with ThreadPoolExecutor(8) as pool:
            for eid, bid, resp in pool.map(read_one, reads):
                if resp.status != errors.EOK:
                    self.violation("replica-divergence", ledger=lid, entry=eid, bookie=bid,
                                   detail=f"listed entry read gives status {resp.status}")
                    continue
                try:
                    _, _, _, payload = dm.verify(resp.body, eid)
                except errors.BKError as exc:
                    self.violation("replica-divergence", ledger=lid, entry=eid, bookie=bid,
                                   detail=f"digest: {exc}")
                    continue
                if payload != data[eid]:
                    self.violation("reader-divergence", ledger=lid, entry=eid, bookie=bid)
        for channel, _ in stubs.values():
            channel.close()

    # -- log
    def _check_log(self, a, b, acks: Acks, ends=None, contents=None) -> list[int]:
        from bkspark.log import LogStore
        from bkspark.log.store import CLOSED
        logs = LogStore(a, password=PASSWORD)
        if not logs.exists(LOG_NAME):
            if acks.log_acks:
                self.violation("log-acked-lost", detail="log record missing")
            return []
        # snapshots taken during the run: at most one open ledger (the last); every
        # non-empty closed ledger stays, in order
        seen_nonempty: list[int] = []
        for snap in self.log_snapshots:
            ids = [e["ledger_id"] for e in snap]
            opened = [i for i, e in enumerate(snap) if e.get("state") != CLOSED]
            if len(opened) > 1 or (opened and opened[0] != len(snap) - 1):
                self.violation("log-open-ledgers", ledgers=snap)
            present = [lid for lid in seen_nonempty if lid in ids]
            if present != seen_nonempty:
                self.violation("log-ledger-vanished",
                               missing=sorted(set(seen_nonempty) - set(ids)))
            elif [lid for lid in ids if lid in set(seen_nonempty)] != seen_nonempty:
                self.violation("log-order-changed", before=seen_nonempty, now=ids)
            for e in snap:
                if e.get("state") == CLOSED and e.get("last_entry_id", -1) >= 0 \
                        and e["ledger_id"] not in seen_nonempty:
                    seen_nonempty = [lid for lid in ids if lid in set(seen_nonempty)
                                     or lid == e["ledger_id"]]
        # seal the tail as a new owner would, then read it twice
        raw = logs.get(LOG_NAME)[0]
        md = raw.copy(ledgers=[e if e.get("state") == CLOSED else {**e, **logs.closed_ledger_entry(e["ledger_id"])}
                               for e in raw.ledgers])
        self._dump_log_state(a, raw, md)
        ids = [e["ledger_id"] for e in md.ledgers]
        present = [lid for lid in seen_nonempty if lid in ids]
        if present != seen_nonempty:
            self.violation("log-ledger-vanished", missing=sorted(set(seen_nonempty) - set(ids)))
        first = [(r.position.ledger_id, r.position.entry_id, r.data)
                 for r in logs.open_reader(LOG_NAME, "earliest", tail=False)]
        second = [(r.position.ledger_id, r.position.entry_id, r.data)
                  for r in LogStore(b, password=PASSWORD).open_reader(LOG_NAME, "earliest",
                                                                      tail=False)]
        if first != second:
            self.violation("reader-divergence", log=LOG_NAME, first=len(first), second=len(second))
        index = {(lid, eid): data for lid, eid, data in first}
        last_seq: dict[int, int] = {}
        for lid, eid, data in first:
            try:
                worker, seq = parse_record(data)
            except ValueError as exc:
                self.violation("bad-record", log=LOG_NAME, ledger=lid, entry=eid, detail=str(exc))
                continue
            if seq <= last_seq.get(worker, -1):
                self.violation("out-of-order", log=LOG_NAME, ledger=lid, entry=eid,
                               worker=worker, seq=seq, previous=last_seq[worker])
            last_seq[worker] = seq
        for wid, lid, eid, seq in acks.log_acks:
            data = index.get((lid, eid))
            if data is None:
                self.violation("log-acked-lost", ledger=lid, entry=eid, worker=wid, seq=seq,
                               in_list=lid in ids)
                continue
            try:
                if parse_record(data) != (wid, seq):
                    self.violation("ack-mismatch", log=LOG_NAME, ledger=lid, entry=eid,
                                   acked=(wid, seq), read=parse_record(data))
            except ValueError:
                pass
        # the log's ledgers: replicas agree and hold Qa copies; their ends are re-checked
        # after the bookies restart
        per_ledger: dict[int, list[bytes]] = collections.defaultdict(list)
        for lid, eid, data in first:
            per_ledger[lid].append(data)
        for entry in md.ledgers:
            lid = entry["ledger_id"]
            data = per_ledger.get(lid, [])
            if len(data) != entry["last_entry_id"] + 1:
                self.violation("log-acked-lost", ledger=lid, detail=f"read {len(data)} entries, "
                               f"list says end {entry['last_entry_id']}")
                continue
            if ends is not None:
                ends[lid], contents[lid] = entry["last_entry_id"], data
            self._check_replicas(b, lid, a.ledger_metadata(lid), entry["last_entry_id"], data)
        return ids


    def _dump_log_state(self, bk, raw, sealed) -> None:
        """Write the log list (as found and as sealed), every snapshot taken during the run
        and each listed ledger's metadata to ``log-state.json``: a violation's post-mortem."""
        ledgers = {}
        for entry in sealed.ledgers:
            try:
                ledgers[entry["ledger_id"]] = bk.ledger_metadata(entry["ledger_id"]).to_dict()
            except errors.BKError as exc:
                ledgers[entry["ledger_id"]] = repr(exc)
        with open(os.path.join(self.workdir, "log-state.json"), "w") as f:
            json.dump({"found": raw.ledgers, "sealed": sealed.ledgers,
                       "snapshots": self.log_snapshots, "ledger_metadata": ledgers},
                      f, indent=1, default=str)


def _retry(fn, attempts: int = 15, pause: float = 1.0):
    """``fn()``, retried while bookies are transiently unreachable (a client that just saw
    them restart may fail fast for a while); a persistent failure is raised."""
    for i in range(attempts):
        try:
            return fn()
        except errors.BookieUnavailableError:
            if i == attempts - 1:
                raise
            time.sleep(pause)


def _ensembles(md) -> list[tuple[int, list[str]]]:
    """[(first entry id, ensemble)] of a ledger's metadata, in order."""
    for attr in ("ensembles", "segments"):
        segs = getattr(md, attr, None)
        if segs is None:
            continue
        if isinstance(segs, dict):
            return sorted((int(k), list(v)) for k, v in segs.items())
        out = []
        for s in segs:
            if isinstance(s, tuple):
                out.append((int(s[0]), list(s[1])))
            else:
                out.append((int(getattr(s, "first_entry_id")), list(getattr(s, "ensemble"))))
        return sorted(out)
    raise AttributeError("ledger metadata without ensembles")


def _ensemble_for(ensembles, eid: int) -> list[str]:
    chosen = ensembles[0][1]
    for first, ens in ensembles:
        if first <= eid:
            chosen = ens
    return chosen


# ---- sessions of runs, summary, CLI ----------------------------------------------------------

def run_campaign(seed: int, duration: float, store: str = "sqlite", run_seconds: float = 60.0,
                 workdir: str | None = None, keep: bool = False, verbose: bool = False,
                 **run_kwargs) -> dict:
    """Runs of ``run_seconds`` (run i uses seed ``seed + i``) until ``duration`` is spent.

    ``store``: sqlite, zk or both (alternating). Returns the summary (see :func:`summarize`).
    """
    from metadata.testing import ZooKeeperServer
    base = workdir or tempfile.mkdtemp(prefix="bkspark-faults-")
    os.makedirs(base, exist_ok=True)
    stores = ["sqlite", "zk"] if store == "both" else [store]
    zk = None
    if "zk" in stores:
        zk = ZooKeeperServer(tick_time=500, max_session_timeout=60000)
        zk.start()
    runs = []
    started = time.monotonic()
    try:
        i = 0
        while i == 0 or time.monotonic() - started + run_seconds * 0.8 < duration:
            kind = stores[i % len(stores)]
            run_dir = os.path.join(base, f"run-{i:03d}-{kind}")
            os.makedirs(run_dir, exist_ok=True)
            run = FaultRun(seed + i, run_seconds, kind, run_dir, zookeeper=zk, verbose=verbose,
                           **run_kwargs)
            result = run.run()
            runs.append(result)
            print(_run_line(result), flush=True)
            if not result["violations"] and not keep:
                shutil.rmtree(run_dir, ignore_errors=True)
            i += 1
    finally:
        if zk is not None:
            zk.stop()
    summary = summarize(seed, runs)
    summary["workdir"] = base
    if not keep and not summary["violations"]:
        shutil.rmtree(base, ignore_errors=True)
    return summary


def _run_line(r: dict) -> str:
    return (f"run seed={r['seed']} store={r['store']} acked={r['entries_acked']} "
            f"ledgers={r['ledgers_checked']} log_ledgers={r['log_ledgers']} "
            f"faults={sum(r['faults'].values())} fault_errors={len(r['fault_errors'])} "
            f"violations={len(r['violations'])} "
            f"({r['wall_seconds']}s)")


def summarize(seed: int, runs: list[dict]) -> dict:
    faults: collections.Counter = collections.Counter()
    for r in runs:
        faults.update(r["faults"])
    violations = [dict(v, run_seed=r["seed"], store=r["store"]) for r in runs
                  for v in r["violations"]]
    return {"seed": seed, "runs": len(runs), "faults": dict(sorted(faults.items())),
            "faults_total": sum(faults.values()),
            "entries_acked": sum(r["entries_acked"] for r in runs),
            "ledgers_checked": sum(r["ledgers_checked"] for r in runs),
            "session_expiries": sum(r["session_expiries"] for r in runs),
            "violations": violations, "per_run": runs}


def format_summary(s: dict, title: str = "fault runner") -> str:
    lines = [f"{title}: seed={s['seed']} runs={s['runs']} entries_acked={s['entries_acked']} "
             f"ledgers_checked={s.get('ledgers_checked', 0)} violations={len(s['violations'])}",
             "faults: " + (", ".join(f"{k}={v}" for k, v in s["faults"].items()) or "none")]
    for v in s["violations"][:20]:
        lines.append(f"VIOLATION {json.dumps(v, default=str)}")
    bad = [r for r in s.get("per_run", []) if r["violations"]]
    for r in bad:
        lines.append(f"replay: python -m bkspark.testing.faults --seed {r['seed']} --runs 1 "
                     f"--store {r['store']} --run-seconds {r['duration']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        p = argparse.ArgumentParser(prog="bkspark.testing.faults worker")
        p.add_argument("--uri", required=True)
        p.add_argument("--mode", choices=["ledger", "log"], required=True)
        p.add_argument("--worker-id", type=int, required=True)
        p.add_argument("--seed", type=int, required=True)
        p.add_argument("--acks", required=True)
        worker_main(p.parse_args(argv[1:]))
        return 0
    if argv and argv[0] == "crash":
        from bkspark.testing.crash import main as crash_main
        return crash_main(argv[1:])
    if argv and argv[0] == "multihost":
        from bkspark.testing.multihost import main as multihost_main
        return multihost_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bkspark.testing.faults",
                                description="randomized fault runs with an invariant checker "
                                            "(subcommand 'crash': bookie crash campaign)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--duration", type=float, default=120.0, help="total seconds of runs")
    p.add_argument("--run-seconds", type=float, default=60.0, help="length of one run")
    p.add_argument("--runs", type=int, default=None, help="exactly this many runs")
    p.add_argument("--store", choices=["sqlite", "zk", "both"], default="sqlite")
    p.add_argument("--bookies", type=int, default=5)
    p.add_argument("--ledger-writers", type=int, default=2)
    p.add_argument("--log-writers", type=int, default=1)
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true", help="keep run directories")
    p.add_argument("--report", default=None, help="write the JSON summary here")
    p.add_argument("--quiet", action="store_true", help="do not print every fault")
    p.add_argument("--crash-kills", type=int, default=0,
                   help="then run the bookie crash campaign with this many kills")
    a = p.parse_args(argv)
    if a.quiet:     # the runner's own client logs every fenced writer it causes
        import logging
        logging.getLogger("bkspark").setLevel(logging.ERROR)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"fault runner: seed={seed} store={a.store} duration={a.duration}s", flush=True)
    if a.runs is not None:
        summary = _fixed_runs(seed, a)
    else:
        summary = run_campaign(seed, a.duration, a.store, a.run_seconds, a.workdir, a.keep,
                               not a.quiet, num_bookies=a.bookies,
                               ledger_writers=a.ledger_writers, log_writers=a.log_writers)
    text = format_summary(summary)
    if a.crash_kills:
        from bkspark.testing.crash import format_crash, run_crash_campaign
        crash = run_crash_campaign(seed, a.crash_kills, verbose=True)
        summary["crash"] = crash
        summary["violations"] = summary["violations"] + [dict(v, campaign="crash")
                                                         for v in crash["violations"]]
        text += "\n" + format_crash(crash)
    summary["text"] = text
    summary["command"] = " ".join(["python -m bkspark.testing.faults"] + argv)
    print(text, flush=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 1 if summary["violations"] else 0


def _fixed_runs(seed: int, a) -> dict:
    from metadata.testing import ZooKeeperServer
    base = a.workdir or tempfile.mkdtemp(prefix="bkspark-faults-")
    stores = ["sqlite", "zk"] if a.store == "both" else [a.store]
    zk = ZooKeeperServer(tick_time=500).start() if "zk" in stores else None
    runs = []
    try:
        for i in range(a.runs):
            kind = stores[i % len(stores)]
            run_dir = os.path.join(base, f"run-{i:03d}-{kind}")
            os.makedirs(run_dir, exist_ok=True)
            r = FaultRun(seed + i, a.run_seconds, kind, run_dir, zookeeper=zk,
                         verbose=not a.quiet, num_bookies=a.bookies,
                         ledger_writers=a.ledger_writers, log_writers=a.log_writers).run()
            print(_run_line(r), flush=True)
            runs.append(r)
    finally:
        if zk is not None:
            zk.stop()
    s = summarize(seed, runs)
    s["workdir"] = base
    return s


if __name__ == "__main__":
    sys.exit(main())
