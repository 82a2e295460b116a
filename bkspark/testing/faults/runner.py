"""One fault run: the cluster, the writer processes and the schedule, then the checker."""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time

from bkspark import errors

from .checker import Checker
from .common import (BOOKIE_ARGS, CLIENT_CONF, LOG_NAME, PASSWORD, REPO_ROOT, make_record,
                     wait_serving)
from .schedule import FAULT_KINDS, Fault, make_schedule
from .workloads import AckFile, log_to


class FaultRun:
    """One run: cluster + workers + schedule, then the checker. See the package docstring."""

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
        self.log_snapshots: list[list] = []       # LogLedger lists
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
        env["PYTHONPATH"] = os.pathsep.join(x for x in (REPO_ROOT, env.get("PYTHONPATH")) if x)
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
        handler = log_to(os.path.join(self.workdir, "runner.log"))
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
        self.log_snapshots.append([e.copy() for e in md.ledgers])

    def _begin(self, f: Fault) -> None:
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
