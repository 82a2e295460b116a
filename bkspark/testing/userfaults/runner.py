"""One user-level fault run: the cluster, the workload processes, the schedule, retention
and truncation, then the checker (package docstring)."""
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
from bkspark.testing.faults.common import REPO_ROOT, wait_serving

from .checker import Checker
from .schedule import FAULT_KINDS, STREAM_SEQUENCE, Fault, make_schedule
from .workloads import (APP_LOGS, BATCH_LOG, CLIENT_CONF, KEYS_LOG, PASSWORD, RETAINED_LOGS,
                        STREAM_SINK, STREAM_SOURCE, AckFile, now)

#: bookies of a run: small caches and journals, but milder than the ledger campaign's (five
#: bookies share two cores with two Spark drivers here)
BOOKIE_ARGS = ["--write-cache-mb", "2", "--checkpoint-interval-s", "2",
               "--journal-max-size-mb", "2", "--entry-log-max-size-mb", "4",
               "--gc-interval-s", "5", "--disk-check-interval-s", "1"]
SITEHOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sitehook")
NUM_BOOKIES = 5
KEYS_COUNT = 1100           # > metadata.log_segments.WRITER_KEYS_MAX (1,000)
#: after the run's seconds, scenarios still in flight (a Spark query) get this long to finish.
#: The streaming query's faults each wait for a micro-batch of a new driver, and on two busy
#: vCPUs (2026-11-28: load ~12, a third of the time stolen) a restart took 1.5-3 minutes to its
#: first micro-batch (a SparkSession 40-120 s; a first micro-batch with no rows 73 s of
#: addBatch, 10 s on the idle machine: six Python daemons started one after the other); the
#: three restarts then ended ~420 s after the run's seconds began
SCENARIO_GRACE_S = 480
#: a one-off query's driver is killed after this long (a new JVM reading the source from its
#: start: 115-130 s on two busy vCPUs, 2026-11-28)
ONE_OFF_S = 240
#: slots still running after the run's seconds, while scenarios finish (_retire_load): the
#: query, its source's appender, and the keys workload (idle once its keys are committed)
KEPT_AFTER_RUN = ("stream", f"appender-{STREAM_SOURCE}", "keys")
#: the log retained by time: where a skewed clock's retention would cut too early
TIME_RETAINED_LOG = "app-1"
#: its retention time: the skewed shell's removals are judged against the ledgers closed less
#: than this before the shell returned, so it must outlast the shell's own run (a new Python
#: under libfaketime: more than 3.5 s on two busy vCPUs, 2026-11-28, when a 4 s retention
#: left the checker nothing to judge and a reverted clock check went unseen)
TIME_RETAINED_MS = 20_000
#: niceness of the load workloads (appenders, tailers, the keys workload): on two busy cores
#: they took the CPU a starting Spark driver needs (a SparkSession took 2 minutes, and Spark's
#: fixed 10 s wait for a new Python worker to connect back was missed again and again); the
#: bookies and the streaming driver keep the default; the batch driver's endless write jobs
#: yield to the streaming query too (BATCH_NICE), whose faults each wait for a micro-batch
LOAD_NICE = 10
BATCH_NICE = 5


class UserFaultRun:
    def __init__(self, seed: int, duration: float, store: str, workdir: str, *,
                 zookeeper=None, verbose: bool = False, kinds=FAULT_KINDS,
                 keys_count: int = KEYS_COUNT):
        self.seed, self.duration, self.store_kind = seed, duration, store
        self.kinds = tuple(kinds)
        self.workdir = workdir
        self.zookeeper = zookeeper
        self.verbose = verbose
        self.keys_count = keys_count
        self.schedule = make_schedule(seed, duration, NUM_BOOKIES, warmup=3.0, kinds=kinds)
        self.faults_applied: collections.Counter = collections.Counter()
        self.fault_errors: list[str] = []
        self.arm_dir = os.path.join(workdir, "arm")
        os.makedirs(self.arm_dir, exist_ok=True)
        self.events = AckFile(os.path.join(workdir, "runner.events"))
        self.procs: dict[str, subprocess.Popen] = {}     # slot -> process
        self.incarnation: collections.Counter = collections.Counter()
        self.paused: set[int] = set()
        self.held: set[int] = set()     # paused by the replan fault: no other fault resumes
        self._spark_armed_until = 0.0   # a Spark commit's lost answer may hit until then
        self._bg: list[threading.Thread] = []
        self._scenarios: list[threading.Thread] = []    # faults the run waits for
        self._stream_faults: list[Fault] = []           # the query's, applied in order
        self._stream_lock = threading.Lock()
        self._reported: set = set()                     # (log, ledger) seen listed, deleted
        self._stop = threading.Event()
        self._arm_seq = 0
        self._driver_lock = threading.RLock()
        self._takeovers = 0
        self._awaited: collections.Counter = collections.Counter()   # pending driver faults
        self.checkpoint = os.path.join(workdir, "ckpt-0")
        self.prev_checkpoint = self.checkpoint
        self.stream_mode = "normal"
        self.uri = ""
        self.started = 0.0
        self.warmup = 0.0

    def say(self, *a):
        if self.verbose:
            print(f"[{time.strftime('%H:%M:%S')} seed={self.seed}]", *a, flush=True)

    # ---- processes ------------------------------------------------------------------------
    def _spawn(self, slot: str, role: str, *extra: str, spark: bool = False) -> None:
        self.incarnation[slot] += 1
        run_id = f"{slot}-{self.incarnation[slot]}"
        acks = os.path.join(self.workdir, f"{run_id}.acks")
        cmd = [sys.executable, "-m", "bkspark.testing.userfaults", "worker", "--role", role,
               "--uri", self.uri, "--seed", str(self.seed), "--acks", acks,
               "--arm-dir", self.arm_dir, "--run-id", run_id,
               "--worker-id", str(len(self.incarnation) * 100 + self.incarnation[slot]),
               *extra]
        env = dict(os.environ)
        paths = [REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if spark:
            paths.insert(0, SITEHOOK)
            env["BKSPARK_UF_ARM_DIR"] = self.arm_dir
            env["BKSPARK_UF_ROLE"] = role if role == "stream" else "spark"
            env["BKSPARK_HOME"] = os.path.join(self.workdir, "home")
        nice = 0 if role == "stream" else BATCH_NICE if spark else LOAD_NICE
        if nice:
            cmd = ["nice", "-n", str(nice), *cmd]       # (execs: the same pid)
        env["PYTHONPATH"] = os.pathsep.join(paths)
        log = open(os.path.join(self.workdir, f"{run_id}.log"), "ab")
        self.procs[slot] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)
        log.close()
        self.events.write("P", slot, run_id, self.procs[slot].pid, now())

    def _kill(self, slot: str) -> None:
        """SIGKILL the slot's process group (a Spark driver: its JVM and Python workers)."""
        proc = self.procs.get(slot)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def _spawn_slot(self, slot: str) -> None:
        if slot.startswith("appender-"):
            self._spawn(slot, "appender", "--log", slot[len("appender-"):])
        elif slot == "tailer":
            self._spawn(slot, "tailer", "--log", STREAM_SOURCE)
        elif slot == "cursor":
            self._spawn(slot, "tailer", "--log", "app-1", "--cursor")
        elif slot == "keys":
            self._spawn(slot, "keys", "--count", str(self.keys_count))
        elif slot == "batch":
            self._spawn(slot, "batch", spark=True)
        elif slot == "stream":
            self._spawn(slot, "stream", "--checkpoint", self.checkpoint, "--mode",
                        self.stream_mode, spark=True)

    SLOTS = ("appender-app-0", "appender-app-1", "appender-ow-0", "tailer", "cursor", "keys",
             "batch", "stream")

    def _respawn_dead(self) -> None:
        with self._driver_lock:
            self._respawn_dead_locked()

    def _respawn_dead_locked(self) -> None:
        for slot, proc in list(self.procs.items()):
            rc = proc.poll()
            if rc is None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGKILL)     # (what is left of a driver's group)
            except ProcessLookupError:
                pass
            if slot == "stream":
                if self.stream_mode == "lost":
                    # the lost-checkpoint run refused to run (or died): back to the old one
                    self.checkpoint = self.prev_checkpoint
                self.stream_mode = "normal"
            elif slot != "keys" or rc != 0:
                self.fault_errors.append(f"{slot} exited on its own (rc {rc}); respawned")
            self._spawn_slot(slot)

    # ---- the run ----------------------------------------------------------------------------
    def run(self) -> dict:
        from bkspark.client import BookKeeper
        from bkspark.log import LogStore
        from bkspark.log.retention import RetentionPolicy
        from bkspark.testing.cluster import BookieCluster
        from metadata.testing import unique_root
        if self.store_kind == "zk":
            self.uri = self.zookeeper.uri(unique_root("userchaos"))
        else:
            self.uri = f"sqlite:///{os.path.join(self.workdir, 'meta.db')}"
        with open(os.path.join(self.workdir, "schedule.json"), "w") as f:
            json.dump([x.to_json() for x in self.schedule], f, indent=0)
        cluster = BookieCluster(self.uri, num_bookies=NUM_BOOKIES,
                                data_dir=os.path.join(self.workdir, "bookies"),
                                extra_args=BOOKIE_ARGS, session_timeout=2.0)
        self.cluster = cluster
        cluster.start_all()
        cluster.publish_credentials_to(os.path.join(self.workdir, "home"))   # (Spark jobs')
        self.started = time.monotonic()
        self.events.write("T0", now())
        try:
            with BookKeeper(self.uri, **CLIENT_CONF) as bk:
                self.bk = bk
                self.logs = LogStore(bk, password=PASSWORD)
                for name in APP_LOGS + (BATCH_LOG, STREAM_SINK, KEYS_LOG):
                    self.logs.create(name)
                self.logs.set_retention(TIME_RETAINED_LOG, RetentionPolicy(ms=TIME_RETAINED_MS))
                self.logs.set_retention(BATCH_LOG, RetentionPolicy(bytes=20_000))
                for slot in self.SLOTS:
                    self._spawn_slot(slot)
                self._background(self._retention_loop)
                self._background(self._monitor_loop)
                self._background(self._stream_fault_loop,
                                 sum(1 for f in self.schedule if f.kind in STREAM_SEQUENCE))
                self._scenarios.append(self._bg[-1])
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline and not (
                        self._ready("batch", "J") and self._ready("stream", "Q")):
                    self._respawn_dead()
                    time.sleep(0.5)
                self.events.write("T1", "drivers-up", now())
                self.warmup = time.monotonic() - self.started
                self.started = time.monotonic()
                self._drive()
                self._stop.set()
                for slot in list(self.procs):
                    self._kill(slot)
                for t in self._bg:
                    t.join(60)
                self._heal()
            result = Checker(self.uri, self.workdir, say=self.say).check()
        finally:
            self._stop.set()
            for slot in list(self.procs):
                self._kill(slot)
            cluster.stop_all()
        result.update(seed=self.seed, store=self.store_kind, duration=self.duration,
                      kinds=None if set(self.kinds) == set(FAULT_KINDS) else list(self.kinds),
                      faults=dict(self.faults_applied), fault_errors=self.fault_errors[:30],
                      lost_answers_hit=self._lost_hits(),
                      warmup_seconds=round(self.warmup, 1),
                      wall_seconds=round(time.monotonic() - self.started + self.warmup, 1))
        return result

    def _lost_hits(self) -> dict:
        hits: collections.Counter = collections.Counter()
        for name in os.listdir(self.arm_dir):
            if name.endswith(".result"):
                try:
                    with open(os.path.join(self.arm_dir, name)) as f:
                        r = json.load(f)
                except (OSError, ValueError):
                    continue
                if r.get("kind") == "lost" and r.get("lost"):
                    hits[f"{r['role']}:{'applied' if r.get('applied') else 'not-applied'}"] += 1
                elif r.get("kind") == "expire" and r.get("expired"):
                    hits[f"{r['role']}:expired"] += 1
        return dict(hits)

    def _drive(self) -> None:
        actions = []
        for i, f in enumerate(self.schedule):
            actions.append((f.t, i, 0, f))
            if f.duration:
                actions.append((f.t + f.duration, i, 1, f))
        actions.sort(key=lambda a: (a[0], a[1], a[2]))
        next_check = 0.0
        for t, _, phase, fault in actions:
            while True:
                elapsed = time.monotonic() - self.started
                if elapsed >= next_check:
                    self._respawn_dead()
                    self._keys_done()
                    next_check = elapsed + 0.5
                if elapsed >= t:
                    break
                time.sleep(min(0.05, t - elapsed))
            try:
                if phase == 0:
                    self.say("begin", fault.kind, fault.target, round(fault.duration, 2),
                             fault.params or "")
                    self.events.write("F", fault.kind, fault.target,
                                      json.dumps(fault.params, separators=(",", ":")), now())
                    if self._apply(fault) is not False:
                        self.faults_applied[fault.kind] += 1
                else:
                    self._end(fault)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be applied
                self.fault_errors.append(f"{fault.kind}@{fault.t:.1f}: {type(exc).__name__}: "
                                         f"{exc}"[:300])
                self.say("fault error", fault.kind, exc)
        while time.monotonic() - self.started < self.duration or (
                any(t.is_alive() for t in self._scenarios)
                and time.monotonic() - self.started < self.duration + SCENARIO_GRACE_S):
            if time.monotonic() - self.started >= self.duration:
                self._retire_load()
            self._respawn_dead()
            self._keys_done()
            time.sleep(0.5)

    def _retire_load(self) -> None:
        """Once the run's seconds are over, stop the load no scenario in flight needs (what
        it did so far is checked as at any run's end): the streaming scenarios still in flight
        then get the two cores. Kept: :data:`KEPT_AFTER_RUN` (a scenario's second query must
        see the source grow), a driver a pending fault waits for, and the batch driver while a
        lost answer armed for it may still hit."""
        with self._driver_lock:
            armed = time.monotonic() < self._spark_armed_until
            for slot in list(self.procs):
                if slot in KEPT_AFTER_RUN or self._awaited[slot] or (slot == "batch" and armed):
                    continue
                self._kill(slot)
                del self.procs[slot]
                self.events.write("RT", slot, now())

    def _keys_done(self) -> None:
        flag = os.path.join(self.workdir, "keys.done")
        if os.path.exists(flag):
            return
        for name in os.listdir(self.workdir):
            if name.startswith("keys-") and name.endswith(".acks"):
                with open(os.path.join(self.workdir, name)) as f:
                    if any(line.startswith("D keys-done") for line in f):
                        open(flag, "w").close()
                        return

    # ---- faults -----------------------------------------------------------------------------
    def _pause(self, i: int) -> None:
        self.cluster.pause(i, anywhere=self.store_kind == "zk")
        self.paused.add(i)

    def _apply(self, f: Fault):
        c = self.cluster
        if f.kind in ("bookie_pause", "bookie_pause_tail", "bookie_kill") and self.held:
            return False            # (the replan fault holds two bookies: no third one down)
        if f.kind == "bookie_pause":
            self._pause(f.target)
        elif f.kind == "bookie_kill":
            c.kill(f.target)
        elif f.kind == "bookie_pause_tail":
            last = self.logs.last_listed(STREAM_SOURCE)
            if last is None:
                return False
            md = self.bk.ledger_metadata(last.ledger_id)
            ensemble = list(md.last_ensemble())
            targets = [i for i, b in enumerate(c.bookies) if b.bookie_id in ensemble]
            f.params["paused"] = targets
            f.params["ledger"] = last.ledger_id
            for i in targets:
                if c.bookies[i].alive and i not in self.paused:
                    self._pause(i)
        elif f.kind in ("lost_answer_applied", "lost_answer_not_applied"):
            role = f.params["role"]
            applied = f.kind == "lost_answer_applied"
            log = {"spark": BATCH_LOG, "stream": STREAM_SINK}.get(role) or \
                role[len("appender-"):]
            # (a Spark commit's applied lost answer: another client truncates the batch log
            # before the answer is lost -- the settling re-read then sees the cut)
            self._arm("lost", role, log=log, applied=applied, delay=f.params.get("delay", 0.0),
                      truncate=role == "spark" and applied)
            if role == "spark":         # (the batch driver is not killed while it may hit)
                self._spark_armed_until = time.monotonic() + 40
        elif f.kind == "session_expire":
            role = f.params["role"]
            if role in ("spark", "stream"):
                self._arm("expire", role)
            else:
                slot = role
                proc = self.procs[slot]
                if not self._ready(slot):
                    return False
                proc.send_signal(signal.SIGUSR1)
        elif f.kind == "takeover":
            self._background(self._takeover, f.params["log"])
        elif f.kind in STREAM_SEQUENCE:
            with self._stream_lock:
                self._stream_faults.append(f)
            return False                # counted once applied (by _stream_fault_loop)
        elif f.kind == "stream_reset_checkpoint":
            self._background(self._reset_checkpoint, f)
            self._scenarios.append(self._bg[-1])
            return False                # counted once applied
        elif f.kind in ("batch_driver_kill", "python_worker_kill"):
            self._await(f)          # (before the thread starts: _retire_load must see it)
            self._background(self._driver_fault, f)
            return False                # counted once applied
        elif f.kind == "truncate":
            self._background(self._truncate, f.params["log"])
        elif f.kind == "shell_retention":
            self._background(self._shell_retention)
        elif f.kind == "clock_skew":
            self._background(self._skewed_retention, f.params["offset"])

    def _scenario_deadline(self) -> float:
        """When a fault waiting for a driver gives up: the end of the run's bound (its
        seconds, then SCENARIO_GRACE_S for scenarios in flight), less a margin for the kill
        and the respawn. Not a fixed wait: on 2 busy cores a restarted driver has taken
        over 120 s to commit its first micro-batch, and a fault given up is a kind the run
        never tested."""
        return self.started + self.duration + SCENARIO_GRACE_S - 15.0

    def _stream_fault_loop(self, count: int) -> None:
        """Apply the streaming query's faults of the schedule one after the other, in the
        schedule's order (each waits for the query to commit a micro-batch: on a busy machine
        a driver takes long to start, and a fault that kills it before it committed anything
        tests nothing); ends once all ``count`` were applied, or given up."""
        done = 0
        while done < count and not self._stop.is_set():
            with self._stream_lock:
                f = self._stream_faults.pop(0) if self._stream_faults else None
            if f is None:
                time.sleep(0.2)
                continue
            if f.kind == "stream_replan_paused":
                self._replan_paused(f)
            else:
                self._await(f)
                self._driver_fault(f)
            done += 1

    def _driver_fault(self, f: Fault) -> None:
        """Faults of the Spark drivers wait (up to :meth:`_scenario_deadline`) until the
        driver is up: a JVM starting under load takes long, and killing it then exercises
        nothing."""
        slot = self._slot_of(f)
        try:
            self._driver_fault_of(f, slot)
        finally:
            with self._driver_lock:
                self._awaited[slot] -= 1

    @staticmethod
    def _slot_of(f: Fault) -> str:
        """The driver slot a driver fault waits for."""
        return "batch" if f.kind == "batch_driver_kill" else f.params.get("driver", "stream")

    def _await(self, f: Fault) -> None:
        """Count the driver fault ``f`` as pending (:meth:`_driver_fault` uncounts it)."""
        with self._driver_lock:
            self._awaited[self._slot_of(f)] += 1

    def _driver_fault_of(self, f: Fault, slot: str) -> None:
        # (the query's faults wait for a committed micro-batch of the running driver: a
        # checkpoint lost before anything was committed tests nothing)
        need = "J" if slot == "batch" else "Q" if f.kind == "python_worker_kill" else "P"
        deadline = self._scenario_deadline()
        while not self._stop.is_set() and time.monotonic() < deadline:
            with self._driver_lock:
                armed = slot == "batch" and time.monotonic() < self._spark_armed_until
                if not armed and self._ready(slot, need=need):
                    if f.kind == "python_worker_kill":
                        if not self._kill_python_worker(slot):
                            time.sleep(0.5)
                            continue
                    elif f.kind == "batch_driver_kill":
                        self._kill("batch")
                        self._spawn_slot("batch")
                    elif f.kind == "stream_driver_kill":
                        self._kill("stream")
                        self.stream_mode = "normal"
                        self._spawn_slot("stream")
                    else:
                        self._kill("stream")
                        self.prev_checkpoint = self.checkpoint
                        self.checkpoint = os.path.join(self.workdir,
                                                       f"ckpt-{self.incarnation['stream']}")
                        self.stream_mode = "lost"
                        self.events.write("L", "lost-checkpoint", self.prev_checkpoint,
                                          self.checkpoint, now())
                        self._spawn_slot("stream")
                    self.faults_applied[f.kind] += 1
                    self.events.write("FA", f.kind, now())
                    return
            time.sleep(0.3)
        self.fault_errors.append(f"{f.kind}@{f.t:.1f}: driver not ready in time")

    def _replan_paused(self, f: Fault) -> None:
        """Kill the streaming driver right after it wrote a batch's offsets (before that
        batch committed), silence every bookie of the source's open ledger, and restart the
        driver (and stop the source's writer): Spark plans the batch again from its offset log
        (``partitions`` without ``latestOffset``) while no bookie of that ledger answers. The bookies come back once
        the new driver's source planned it (or after 60 s)."""
        deadline = self._scenario_deadline()
        paused: list[int] = []
        stopped: list[subprocess.Popen] = []
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                with self._driver_lock:     # (held from the kill to the respawn)
                    # (only while no other bookie is down: three must stay writable for the
                    # restarted query's sink, E=3)
                    quiet = not self.paused and all(b.alive for b in self.cluster.bookies)
                    batch = self._kill_after_offsets() \
                        if quiet and self._ready("stream", need="P") else None
                    if batch is not None:
                        # every bookie of the ledger the batch ends in (the source's tail
                        # when it was planned), held paused: another fault's end must not
                        # resume it early
                        ledger = self._batch_end_ledger(batch)
                        ensemble = list(self.bk.ledger_metadata(ledger).last_ensemble()) \
                            if ledger is not None else []
                        for i, b in enumerate(self.cluster.bookies):
                            if b.bookie_id in ensemble and b.alive:
                                if i not in self.paused:
                                    self._pause(i)
                                self.held.add(i)
                                paused.append(i)
                        # (its writer stopped too: it would replace the silent bookies by an
                        # ensemble change, whose new members answer the LAC read)
                        writer = self.procs.get(f"appender-{STREAM_SOURCE}")
                        if writer is not None and self._stop_outside_writes(writer):
                            stopped.append(writer)
                        self.stream_mode = "normal"
                        self._spawn_slot("stream")
                        self.faults_applied[f.kind] += 1
                        self.events.write("FA", f.kind, json.dumps(paused, separators=(",", ":")),
                                          now())
                        break
                time.sleep(0.3)
            else:
                self.fault_errors.append(f"{f.kind}@{f.t:.1f}: no batch planned in time")
                return
            # paused until the new driver planned the batch again (its source says so through
            # the run's sitehook; at most 60 s): a correct source plans it whole without the
            # bookies, and its reads and commit then go on once they are back
            killed = time.time()
            until = time.monotonic() + 60
            while time.monotonic() < until and not self._stop.is_set() \
                    and not self._planned_since(killed):
                time.sleep(0.1)
            self._stop.wait(0.5)
        finally:
            for i in paused:
                self.held.discard(i)
                self.cluster.resume(i)
                self.paused.discard(i)
            for proc in stopped:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)

    def _reset_checkpoint(self, f: Fault) -> None:
        """A query of its own (``queryId`` ``uf-lc-<k>``, source ``app-0``, sink
        ``lc-out-<k>``, ``Trigger.AvailableNow``) runs once, then again on a new checkpoint
        under the same ``queryId`` (the first one's was lost) while the source keeps growing:
        the second run must continue exactly or be refused -- never commit its batch 0 as
        "already applied" and drop the new rows (the checker reads ``lc-out-<k>``)."""
        k = self.faults_applied[f.kind] + 1
        qid, sink = f"uf-lc-{k}", f"lc-out-{k}"
        self.logs.create(sink)
        self.events.write("LC", k, sink, qid, now())
        for part in ("a", "b"):
            # (a run that fails for another reason -- say, no bookie of the source's open
            # ledger answered -- is tried again: the scenario is the second checkpoint's
            # batch 0 reaching the sink's commit)
            for attempt in range(3):
                run_id = f"lc{k}-{part}{attempt}"
                rc = self._one_off(run_id, qid, sink,
                                   os.path.join(self.workdir, f"ckpt-lc{k}-{part}"))
                self.events.write("LR", k, part, rc, now())
                if self._stop.wait(1.0):
                    return
                if rc == 3 and self._query_outcome(run_id) in ("stopped", "refused"):
                    break
        self.faults_applied[f.kind] += 1

    def _query_outcome(self, run_id: str) -> str:
        """How a one-off query ended: ``stopped`` (done), ``refused`` (the sink refused
        another Spark query's commit) or ``failed``."""
        try:
            with open(os.path.join(self.workdir, f"{run_id}.acks")) as f:
                ends = [line for line in f if line.startswith(f"Q {run_id} ") and
                        " start " not in line]
        except OSError:
            return "failed"
        return ends[-1].split()[2] if ends else "failed"

    def _one_off(self, run_id: str, query_id: str, sink: str, checkpoint: str) -> int | None:
        """Run one Trigger.AvailableNow query in a driver of its own; its exit code (None:
        killed after ONE_OFF_S, or when the run ends)."""
        cmd = [sys.executable, "-m", "bkspark.testing.userfaults", "worker", "--role", "stream",
               "--uri", self.uri, "--seed", str(self.seed),
               "--acks", os.path.join(self.workdir, f"{run_id}.acks"), "--arm-dir",
               os.path.join(self.workdir, "no-arms"), "--run-id", run_id, "--checkpoint",
               checkpoint, "--query-id", query_id, "--sink", sink, "--available-now"]
        env = dict(os.environ, BKSPARK_HOME=os.path.join(self.workdir, "home"))
        env["PYTHONPATH"] = os.pathsep.join(
            [REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        with open(os.path.join(self.workdir, f"{run_id}.log"), "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        until = time.monotonic() + ONE_OFF_S
        while proc.poll() is None and time.monotonic() < until and not self._stop.is_set():
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # (what is left of the driver's group)
        except ProcessLookupError:
            pass
        return proc.returncode

    def _stop_outside_writes(self, proc: subprocess.Popen) -> bool:
        """SIGSTOP a workload, never inside a write transaction of the embedded store (it
        would hold every writer of the store: LocalCluster.pause)."""
        from bkspark.localcluster import sqlite_write_locked
        for _ in range(50):
            if proc.poll() is not None:
                return False
            proc.send_signal(signal.SIGSTOP)
            if not sqlite_write_locked(self.uri):
                return True
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.02)
        return False

    def _planned_since(self, t: float) -> bool:
        """Whether the streaming source planned a micro-batch after ``t`` (wall clock)."""
        for name in os.listdir(self.arm_dir):
            if name.startswith("planned."):
                try:
                    if float(name.split(".", 2)[2]) > t:
                        return True
                except ValueError:
                    continue
        return False

    def _batch_end_ledger(self, batch: int) -> int | None:
        """The source ledger a micro-batch's planned end lies in (its offsets file)."""
        try:
            with open(os.path.join(self.checkpoint, "offsets", str(batch))) as f:
                for line in f.read().splitlines()[2:]:
                    end = json.loads(line).get(STREAM_SOURCE)
                    if end:
                        return int(end["ledger"])
        except (OSError, ValueError, AttributeError, KeyError):
            pass
        return None

    def _kill_after_offsets(self) -> int | None:
        """Wait (up to 10 s) for the streaming query to write the offsets of a new batch and
        SIGKILL its driver at once; the batch, if it was killed before that batch committed."""
        offsets = os.path.join(self.checkpoint, "offsets")
        commits = os.path.join(self.checkpoint, "commits")

        def batches(d):
            try:
                return {int(n) for n in os.listdir(d) if n.isdigit()}
            except OSError:
                return set()
        known = batches(offsets)
        until = time.monotonic() + 10
        while time.monotonic() < until:
            new = batches(offsets) - known
            if new:
                self._kill("stream")
                n = max(new)
                if n in batches(commits):
                    self.events.write("FR", "replan-missed", n, now())
                    self._spawn_slot("stream")
                    return None
                self.events.write("FR", "killed-before-commit", n, now())
                return n
            time.sleep(0.005)
        return None

    def _end(self, f: Fault) -> None:
        c = self.cluster
        if f.kind == "bookie_pause":
            if f.target not in self.held:
                c.resume(f.target)
                self.paused.discard(f.target)
        elif f.kind == "bookie_pause_tail":
            for i in f.params.get("paused", []):
                if i not in self.held:
                    c.resume(i)
                    self.paused.discard(i)
        elif f.kind == "bookie_kill":
            c.start(f.target)

    def _ready(self, slot: str, need: str = "W") -> bool:
        """The slot's process is alive and wrote a line starting with ``need``."""
        proc = self.procs.get(slot)
        if proc is None or proc.poll() is not None:
            return False
        path = os.path.join(self.workdir, f"{slot}-{self.incarnation[slot]}.acks")
        try:
            with open(path) as f:
                return any(line.startswith(need + " ") for line in f)
        except OSError:
            return False

    def _arm(self, kind: str, role: str, **params) -> None:
        self._arm_seq += 1
        arm = dict(id=self._arm_seq, kind=kind, role=role, t_armed=time.time(), **params)
        path = os.path.join(self.arm_dir, f"{self._arm_seq:04d}.{role}.arm")
        with open(path + ".tmp", "w") as f:
            json.dump(arm, f)
        os.replace(path + ".tmp", path)

    def _kill_python_worker(self, driver: str):
        proc = self.procs.get(driver)
        if proc is None or proc.poll() is not None:
            return False
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            # (pyspark.daemon makes itself a process group of its own: found by ancestry)
            procs = {}
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ")
                    with open(f"/proc/{pid}/stat") as fh:
                        stat = fh.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                procs[int(pid)] = (int(stat[1]), cmd)

            def descends(pid: int) -> bool:
                for _ in range(10):
                    pid = procs.get(pid, (0, b""))[0]
                    if pid == proc.pid:
                        return True
                    if pid <= 1:
                        return False
                return False
            daemons, workers = [], []
            for pid, (ppid, cmd) in procs.items():
                if b"java" in cmd.split(b" ")[0] or not descends(pid) or not (
                        b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd
                        or b"pyspark.sql" in cmd):
                    continue
                (daemons if b"pyspark.daemon" in cmd else workers).append((pid, ppid))
            daemon_pids = {p for p, _ in daemons}
            children = [p for p, pp in daemons + workers if pp in daemon_pids]
            victims = children or [p for p, _ in workers]
            if victims:
                victim = victims[int(time.monotonic() * 1000) % len(victims)]
                os.kill(victim, signal.SIGKILL)
                self.events.write("K", "python-worker", driver, victim, now())
                return True
            time.sleep(0.1)
        return False

    def _background(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._bg.append(t)

    def _cut(self, log: str, how: str, t0: str, removed) -> None:
        self.events.write("C", log, how, t0, now(), len(removed) if removed is not None else -1)

    def _truncate(self, log: str) -> None:
        """Truncate before the second-to-last listed ledger (app-1: respecting cursors)."""
        from bkspark.log import Position
        t0 = now()
        try:
            segs = self.logs.segments(log)
            if len(segs) < 3:
                return
            removed = self.logs.truncate(log, Position(segs[-2].ledger_id, 0),
                                         force=log != "app-1")
            self._cut(log, "truncate", t0, removed)
        except errors.BadRequestError as exc:
            self.events.write("CR", log, "refused", str(exc).replace("\n", " ")[:120])
        except errors.BKError as exc:
            self._cut(log, "truncate-error", t0, None)
            self.fault_errors.append(f"truncate {log}: {exc!r}"[:300])

    def _shell_retention(self) -> None:
        t0 = now()
        cmd = [sys.executable, "-m", "bkspark.cli.main", "shell", "--metadata", self.uri,
               "--json", "apply-retention", *RETAINED_LOGS]
        env = dict(os.environ, PYTHONPATH=REPO_ROOT)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        for log in RETAINED_LOGS:
            self._cut(log, "shell", t0, None)
        if out.returncode != 0:
            self.fault_errors.append(f"shell apply-retention rc {out.returncode}: "
                                     f"{out.stderr[-200:]}")

    def _skewed_retention(self, offset: str) -> None:
        """``bkspark shell apply-retention`` of the time-retained log from a host whose wall
        clock is ``offset`` off (libfaketime). Whatever it removes must have been closed for
        the log's retention time, judged on the true clock: the list is read before (each
        segment's ``closed_ms``), and a removed ledger closed more recently -- or not listed
        closed yet when the shell started, less than that time before it ended -- is a
        violation (``V retention-too-early``): a host's wrong clock deleted fresh data."""
        from bkspark.testing.clockskew import skewed_env
        log = TIME_RETAINED_LOG
        keep_ms = self.logs.retention(log).ms
        closed = {e.ledger_id: e.closed_ms for e in self.logs.segments(log) if e.closed}
        t0 = time.time()
        cmd = [sys.executable, "-m", "bkspark.cli.main", "shell", "--metadata", self.uri,
               "--json", "apply-retention", log]
        env = skewed_env(offset, dict(os.environ, PYTHONPATH=REPO_ROOT))
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        t1 = time.time()
        self._cut(log, "skewed-shell", f"{t0:.4f}", None)
        if out.returncode != 0:         # (refused: this host's clock is off the store's)
            self.events.write("CR", log, "skewed-refused", offset, out.stderr.strip()
                              .replace("\n", " ")[-160:])
            return
        try:
            rows = json.loads(out.stdout)
            removed = [lid for r in rows if r.get("log") == log for lid in r.get("removed", [])]
        except (ValueError, AttributeError, TypeError):
            self.fault_errors.append(f"clock_skew: unreadable shell output {out.stdout[-200:]!r}")
            return
        young_after = (t1 * 1000) - keep_ms + 500      # (0.5 s for stamps' resolution)
        # how many listed ledgers the check could judge: 0 means it was blind this time
        self.events.write("CR", log, "skewed-judged",
                          str(sum(1 for ms in closed.values() if ms > young_after)))
        for lid in removed:
            closed_ms = closed.get(lid)
            if (closed_ms if closed_ms is not None else t0 * 1000) > young_after:
                self.events.write("V", "retention-too-early", log, lid, now())

    def _retention_loop(self) -> None:
        from bkspark.log.retention import enforce
        while not self._stop.wait(1.0):
            for log in RETAINED_LOGS:
                t0 = now()
                try:
                    cut = enforce(self.logs, log)
                    if cut.removed:
                        self._cut(log, "retention", t0, cut.removed)
                        self.faults_applied["retention_cut"] += 1
                except errors.BKError:
                    self._cut(log, "retention-error", t0, None)

    MONITORED = APP_LOGS + (BATCH_LOG, STREAM_SINK, KEYS_LOG)

    def _monitor_loop(self) -> None:
        """While the run goes on, check the end of every log (where a commit lands) for a
        listed ledger whose metadata is gone. The end state alone can miss it: a later cut
        may remove it from the list again. A ledger found missing is checked once more after
        a sync (it may have been truncated and deleted between the two reads): still listed
        and still missing is recorded (``V`` in ``runner.events``) for the checker."""
        while not self._stop.wait(0.3):
            for log in self.MONITORED:
                try:
                    self._check_listed_exist(
                        log, self.logs.segments(log, max(0, self.logs.bounds(log)[1] - 6)))
                except errors.BKError:
                    continue

    def _check_listed_exist(self, log: str, entries) -> None:
        """Record (``V``) every ledger of ``entries`` (read from the log's list) whose metadata
        is gone while the log, read again after a sync, still lists it."""
        for entry in entries:
            lid = entry.ledger_id
            if (log, lid) in self._reported:
                continue
            try:
                self.bk.ledger_metadata(lid)
                continue
            except errors.NoSuchLedgerError:
                pass
            self.bk.store.sync("/")
            if self.logs.lists(log, lid):
                try:
                    self.bk.ledger_metadata(lid)
                except errors.NoSuchLedgerError:
                    self._reported.add((log, lid))
                    self.events.write("V", "log-names-deleted-ledger", log, lid, now())

    def _takeover(self, log: str) -> None:
        from bkspark.log import LogStore
        self._takeovers += 1
        n = self._takeovers
        acks = AckFile(os.path.join(self.workdir, f"takeover-{n}.acks"))
        logs = LogStore(self.bk, password=PASSWORD, ensemble_size=2 if log == STREAM_SOURCE
                        else 3, write_quorum=2, ack_quorum=2)
        try:
            writer = logs.open_writer(log)
            acks.write("O", log, writer.epoch, writer.ledger_id, now())
            for seq in range(10):
                pos = writer.append(f"t:{n}:{seq}:".encode())
                acks.write("A", log, pos.ledger_id, pos.entry_id, f"t:{n}:{seq}", now())
            writer.close()
        except errors.BKError as exc:
            acks.write("X", type(exc).__name__, now())

    def _heal(self) -> None:
        c = self.cluster
        for i, b in enumerate(c.bookies):
            b.signal(signal.SIGCONT)
            if not b.alive:
                c.start(i)
        wait_serving(c)
        c.clear_faults()
