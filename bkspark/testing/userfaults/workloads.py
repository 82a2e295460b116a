"""The workload processes of a user-level fault run, and the faults they arm on themselves.

Every workload is a process of its own (``python -m bkspark.testing.userfaults worker
--role ROLE ...``) that records each acknowledgement or commit in its ack file, flushed per
line *before* it counts it, so a SIGKILLed workload leaves every ack it saw:

* ``appender`` -- a :class:`~bkspark.log.LogWriter` on one shared log, rolling often;
  ``A log ledger entry id t`` per acknowledged append, ``O`` per open, ``F`` when fenced (it
  then re-takes the log);
* ``tailer`` -- a tailing :class:`~bkspark.log.LogReader` from EARLIEST: ``R ledger entry id``
  per record read (``cursor``: the same, moving a durable cursor, which holds retention back);
* ``keys`` -- more than ``WRITER_KEYS_MAX`` batch commits with distinct writer ids into one
  log (small closed ledgers through :meth:`LogStore.append_ledgers`, the call the Spark batch
  commit makes), then re-runs of the earliest ``(writerId, 0)`` commits;
* ``batch`` / ``stream`` -- the Spark drivers (:mod:`.spark_jobs`).

Faults a workload must apply to itself (a store client lives in its own process):

* **lost metadata answers** (:func:`metadata.testing.lost_answers`, applied and not applied):
  the runner drops an *arm file* ``arm/<n>.<role>.arm`` (JSON); the first process of that role
  that claims it (an atomic rename) wraps its store client for the next matching write and
  reports in ``arm/<n>.result`` whether an answer was lost. Spark's Python workers claim them
  through ``sitehook/sitecustomize.py`` (it patches ``bkspark.spark.conn.log_store``), so the
  lost answer hits the batch commit or the stream planning in the process that runs it.
* **metadata session expiry**: SIGUSR1 for the workloads started here (as in
  :mod:`bkspark.testing.faults`); an arm file of kind ``expire`` for Spark's workers.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import random
import signal
import sys
import threading
import time

from bkspark import errors
from bkspark.testing.faults.workloads import AckFile  # noqa: F401 - (the runner's, re-exported)

PASSWORD = b""                          # the Spark connector's default (it reads every log)
#: logs of a run and what writes them
APP_LOGS = ("app-0", "app-1", "ow-0")   # LogWriter appenders (app-0: the stream's source)
STREAM_SOURCE = "app-0"
STREAM_SINK = "stream-out"
BATCH_LOG = "batch-0"
OVERWRITE_LOG = "ow-0"                  # overwrite jobs while a LogWriter writes it
RETAINED_LOGS = ("app-1", "batch-0")    # retention and truncation cut these
KEYS_LOG = "keys-0"
CURSOR_NAME = "uf-reader"
CLIENT_CONF = dict(add_timeout=3.0, read_timeout=2.0, speculative_read_timeout=0.5,
                   metadata_retries=40)
ARM_TIMEOUT_S = 25.0


def now() -> str:
    return f"{time.time():.4f}"


def log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s.%(msecs)03d %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
        "%H:%M:%S"))
    root = logging.getLogger("bkspark")
    root.addHandler(handler)
    root.setLevel(logging.INFO)


# ---- faults a workload arms on itself ------------------------------------------------------

def install_expiry_handler(store, acks: AckFile) -> None:
    """SIGUSR1: expire this process's metadata session (``expire_session``)."""
    def expire():
        from metadata.testing import expire_session
        try:
            expire_session(store, timeout=20)
            acks.write("S", "expired", now())
        except Exception as exc:  # noqa: BLE001
            acks.write("S", "expiry-failed", type(exc).__name__)

    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=expire, daemon=True).start())


def claim_arm(arm_dir: str, role: str) -> dict | None:
    """Claim one arm file of ``role`` (an atomic rename: one process gets it), or None."""
    try:
        names = sorted(n for n in os.listdir(arm_dir) if n.endswith(f".{role}.arm"))
    except OSError:
        return None
    for name in names:
        path = os.path.join(arm_dir, name)
        claimed = f"{path}.claimed.{os.getpid()}"
        try:
            os.rename(path, claimed)
        except OSError:
            continue                    # another process took it
        try:
            with open(claimed) as f:
                return json.load(f)
        except (OSError, ValueError):
            continue
    return None


def _result(arm_dir: str, arm: dict, **fields) -> None:
    path = os.path.join(arm_dir, f"{arm['id']:04d}.result")
    with open(path + ".tmp", "w") as f:
        json.dump(dict(arm, pid=os.getpid(), t_done=time.time(), **fields), f)
    os.replace(path + ".tmp", path)


_armed_lock = threading.Lock()
_armed_stores: set = set()


def apply_arm(store, arm: dict, arm_dir: str) -> None:
    """Apply a claimed arm to ``store`` in a background thread: ``expire`` its session now, or
    lose the answer of its next matching write (``lost``) within ``ARM_TIMEOUT_S``.

    A lost answer that is *applied* may be held back ``delay`` seconds before the error is
    raised (the answer arrives late, then never): that is when a truncation racing the
    settling re-read lands (the defect class of a commit re-applied after a cut)."""
    if arm["kind"] == "expire":
        def expire():
            from metadata.testing import expire_session
            try:
                expire_session(store, timeout=20)
                _result(arm_dir, arm, expired=True)
            except Exception as exc:  # noqa: BLE001
                _result(arm_dir, arm, expired=False, error=repr(exc))
        threading.Thread(target=expire, daemon=True).start()
        return
    with _armed_lock:
        if id(store) in _armed_stores:  # one injection at a time per store
            _result(arm_dir, arm, lost=[], error="store already armed")
            return
        _armed_stores.add(id(store))
    _lose_one(store, arm, arm_dir)


def _lose_one(store, arm: dict, arm_dir: str) -> None:
    from metadata.layout import SPARK_PENDING, log_path
    from metadata.testing import lost_answers
    prefix = log_path(arm["log"]) if arm.get("log") else ""
    delay = float(arm.get("delay", 0.0))
    hit = threading.local()

    def match(op: str, path: str) -> bool:
        # (a transaction is named by its first operation's path: a Spark batch job's commit
        # begins with the check of its job record, /spark/pending/<job>)
        job_commit = arm.get("role") == "spark" and path.startswith(SPARK_PENDING + "/") \
            and path.count("/") == SPARK_PENDING.count("/") + 1
        ok = op == "transaction" and (not prefix or path == prefix or job_commit or
                                      path.startswith(prefix + "/"))
        if ok and not getattr(hit, "seen", False):
            hit.delay, hit.seen = delay, True
            _result(arm_dir, arm, lost=[[op, path]], matched=True)
        return ok

    real_commit = store._commit

    def slow_commit(*a, **k):
        out = real_commit(*a, **k)
        d = getattr(hit, "delay", 0.0)
        if d:
            hit.delay = 0.0
            time.sleep(d)
        if getattr(hit, "seen", False) and arm.get("truncate") and not getattr(hit, "cut", False):
            hit.cut = True
            _truncate_between(arm, arm_dir, a[0] if a else k.get("ops", []))
        return out

    import contextlib
    stack = contextlib.ExitStack()
    try:
        store._commit = slow_commit          # (lost_answers wraps it; its exit removes both)
        st = stack.enter_context(lost_answers(store, match, count=1,
                                              applied=bool(arm.get("applied", True))))
    except Exception as exc:  # noqa: BLE001
        store.__dict__.pop("_commit", None)
        with _armed_lock:
            _armed_stores.discard(id(store))
        _result(arm_dir, arm, lost=[], error=repr(exc))
        return

    def wait():                 # armed now (synchronously); disarmed once hit or timed out
        deadline = time.monotonic() + ARM_TIMEOUT_S
        while not st.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        lost = [list(x) for x in st.lost]
        stack.close()
        store.__dict__.pop("_commit", None)
        with _armed_lock:
            _armed_stores.discard(id(store))
        _result(arm_dir, arm, lost=lost)
    threading.Thread(target=wait, daemon=True).start()


def _truncate_between(arm: dict, arm_dir: str, ops) -> None:
    """Between a commit to the batch log that was applied and the loss of its answer, another
    client truncates the whole log (the interleaving of a retention pass or ``shell``
    truncation racing the commit's settling re-read), made certain here."""
    from bkspark.client import BookKeeper
    from bkspark.log import LogStore
    from metadata.layout import log_path
    if not arm.get("uri") or not any(op[1] == log_path(BATCH_LOG) for op in ops if len(op) > 1):
        return
    try:
        with BookKeeper(arm["uri"], **CLIENT_CONF) as bk:
            logs = LogStore(bk, password=PASSWORD)
            removed = logs.truncate_segments(BATCH_LOG, logs.bounds(BATCH_LOG)[1])
        outcome = {"truncated": removed}
    except Exception as exc:  # noqa: BLE001 - the fault could not be made; the run goes on
        outcome = {"truncated": None, "error": repr(exc)}
    with open(os.path.join(arm_dir, f"{arm['id']:04d}.cut"), "w") as f:
        json.dump(dict(outcome, t=time.time()), f)


def arm_poller(store, arm_dir: str, role: str, stop: threading.Event | None = None) -> None:
    """A daemon thread claiming this role's arm files every 0.1 s and applying them."""
    def loop():
        while stop is None or not stop.is_set():
            arm = claim_arm(arm_dir, role)
            if arm is not None:
                apply_arm(store, arm, arm_dir)
            time.sleep(0.1)
    threading.Thread(target=loop, daemon=True, name=f"arm-{role}").start()


# ---- appender -------------------------------------------------------------------------------

WINDOW = 8


def appender_main(args) -> None:
    from bkspark.client import BookKeeper
    from bkspark.log import LogStore
    log_to_stderr()
    rng = random.Random(args.seed * 7919 + args.worker_id)
    acks = AckFile(args.acks)
    wid = args.worker_id
    ensemble = 2 if args.log == STREAM_SOURCE else 3
    with BookKeeper(args.uri, **CLIENT_CONF) as bk:
        install_expiry_handler(bk.store, acks)
        arm_poller(bk.store, args.arm_dir, f"appender-{args.log}")
        logs = LogStore(bk, password=PASSWORD, ensemble_size=ensemble, write_quorum=2,
                        ack_quorum=2)
        acks.write("W", "appender", os.getpid(), args.log)
        seq = 0
        while True:
            try:
                if args.log == "ow-0":      # (long ledgers: overwrites land mid-ledger)
                    roll = dict(roll_bytes=400_000, roll_age_s=rng.uniform(3.0, 6.0))
                elif args.log == STREAM_SOURCE:     # (each ledger is a task of a batch)
                    roll = dict(roll_bytes=400_000, roll_age_s=rng.uniform(2.0, 5.0))
                else:
                    roll = dict(roll_bytes=rng.randint(2_000, 8_000),
                                roll_age_s=rng.uniform(1.0, 4.0))
                writer = logs.open_writer(args.log, **roll)
            except errors.BKError as exc:
                acks.write("N", type(exc).__name__, now())
                time.sleep(0.3)
                continue
            acks.write("O", args.log, writer.epoch, writer.ledger_id, now())
            window: collections.deque = collections.deque()

            def on_done(f, s):
                try:
                    pos = f.result()
                except BaseException as exc:  # noqa: BLE001
                    acks.write("X", s, type(exc).__name__, now())
                    return
                acks.write("A", args.log, pos.ledger_id, pos.entry_id, f"a:{wid}:{s}", now())

            failed = None
            while failed is None:
                payload = f"a:{wid}:{seq}:".encode() + b"x" * rng.randint(20, 200)
                try:
                    fut = writer.append_async(payload)
                except errors.BKError as exc:
                    failed = exc
                    break
                fut.add_done_callback(lambda f, s=seq: on_done(f, s))
                seq += 1
                window.append(fut)
                while len(window) > WINDOW or (window and window[0].done()):
                    try:
                        window.popleft().result()
                    except BaseException as exc:  # noqa: BLE001
                        failed = exc
                        break
                time.sleep(rng.uniform(0.02, 0.05))
            for fut in window:
                try:
                    fut.result(timeout=30)
                except BaseException:  # noqa: BLE001
                    pass
            acks.write("F" if isinstance(failed, errors.LogFencedError) else "E",
                       type(failed).__name__, now())
            try:
                writer.close()
            except BaseException:  # noqa: BLE001
                pass
            time.sleep(rng.uniform(0.1, 0.5))


# ---- tailing readers ------------------------------------------------------------------------

def tailer_main(args) -> None:
    """Tail ``args.log`` from EARLIEST; ``--cursor``: also move the durable cursor."""
    from bkspark.client import BookKeeper
    from bkspark.log import EARLIEST, LogStore, Position
    log_to_stderr()
    acks = AckFile(args.acks)
    with BookKeeper(args.uri, **CLIENT_CONF) as bk:
        install_expiry_handler(bk.store, acks)
        logs = LogStore(bk, password=PASSWORD)
        acks.write("W", "tailer", os.getpid(), args.log)
        start = EARLIEST
        if args.cursor:
            try:
                start = logs.cursor(args.log, CURSOR_NAME) or EARLIEST
            except errors.BKError:
                start = EARLIEST
        last_commit = time.monotonic()
        while True:
            try:
                logs.create(args.log)
                reader = logs.open_reader(args.log, start, tail=True, poll_timeout_s=1.0)
                acks.write("B", args.log, json.dumps(start if isinstance(start, str)
                                                     else list(start)), now())
                with reader:
                    while True:
                        for rec in reader.read_batch(200):
                            _, value, _, _ = _decode(rec.data)
                            if not args.cursor:     # (the cursor reader only moves it)
                                acks.write("R", rec.position.ledger_id,
                                           rec.position.entry_id, _payload_id(value))
                            start = Position(rec.position.ledger_id, rec.position.entry_id + 1)
                        if args.cursor and time.monotonic() - last_commit > 1.0 \
                                and isinstance(start, Position):
                            logs.commit_cursor(args.log, CURSOR_NAME, start)
                            acks.write("C", start.ledger_id, start.entry_id, now())
                            last_commit = time.monotonic()
            except errors.BKError as exc:
                acks.write("E", type(exc).__name__, str(exc).replace("\n", " ")[:200], now())
                if "no longer in the log" in str(exc):
                    acks.write("T", "restart-earliest", now())
                    start = EARLIEST        # (cut by retention / truncation: start over)
                time.sleep(0.5)


def _decode(data):
    from bkspark.spark.codec import decode_record
    return decode_record(data)


def _payload_id(value) -> str:
    """The id of an entry's value: its first three ``:`` fields (``a:wid:seq``, ``j:job:n``)."""
    if value is None:
        return "null"
    text = bytes(value)[:80].decode("ascii", "replace")
    return ":".join(text.split(":")[:3])


# ---- writer keys beyond the remembered ones --------------------------------------------------

def keys_main(args) -> None:
    """Commit ``args.count`` writer ids (``kw-<i>``, sequence 0) to the keys log, each one
    small closed ledger, then re-run the earliest ones: a re-run must append nothing."""
    from concurrent.futures import ThreadPoolExecutor

    from bkspark.client import BookKeeper
    from bkspark.log import LogStore
    from bkspark.spark.codec import encode_record
    log_to_stderr()
    acks = AckFile(args.acks)
    with BookKeeper(args.uri, **CLIENT_CONF) as bk:
        install_expiry_handler(bk.store, acks)
        logs = LogStore(bk, password=PASSWORD)
        logs.create(KEYS_LOG)
        acks.write("W", "keys", os.getpid(), KEYS_LOG)
        done = {int(p[1].split("-")[1]) for p in _lines(args.acks) if p[0] == "K"}

        def commit(i: int, rerun: bool) -> None:
            job = f"kw-{i}"
            for attempt in range(20):
                started = int(time.time() * 1000)
                acks.write("J", job, "rerun-start" if rerun else "start", KEYS_LOG,
                           "keys", 1, now())
                try:
                    lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2,
                                          password=PASSWORD)
                    lh.append(encode_record(f"j:{job}:0".encode()))
                    lh.close()
                    applied = logs.append_ledgers(KEYS_LOG, [lh.ledger_id], writer_id=job,
                                                  sequence=0, writer_started_ms=started)
                    acks.write("J", job, "rerun-committed" if rerun else "committed", now(),
                               int(applied))
                    if not rerun:
                        acks.write("K", job)
                    return
                except errors.BKError as exc:
                    acks.write("J", job, "rerun-failed" if rerun else "failed", now(),
                               type(exc).__name__)
                    time.sleep(0.2)

        with ThreadPoolExecutor(1) as pool:
            list(pool.map(lambda i: commit(i, False),
                          [i for i in range(args.count) if i not in done]))
        for i in range(args.reruns):
            commit(i, True)
        acks.write("D", "keys-done", now())
        while True:
            time.sleep(3600)


def _lines(path: str):
    try:
        with open(path) as f:
            return [line.split() for line in f if line.endswith("\n") and line.strip()]
    except OSError:
        return []


def worker_main(argv) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="bkspark.testing.userfaults worker")
    p.add_argument("--role", required=True,
                   choices=["appender", "tailer", "keys", "batch", "stream"])
    p.add_argument("--uri", required=True)
    p.add_argument("--log", default=None)
    p.add_argument("--worker-id", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--acks", required=True)
    p.add_argument("--arm-dir", required=True)
    p.add_argument("--cursor", action="store_true")
    p.add_argument("--count", type=int, default=1100)
    p.add_argument("--reruns", type=int, default=5)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--mode", default="normal")
    p.add_argument("--run-id", default="r0")
    p.add_argument("--query-id", default=None)
    p.add_argument("--sink", default=None)
    p.add_argument("--available-now", action="store_true")
    a = p.parse_args(argv)
    if a.role == "appender":
        appender_main(a)
    elif a.role == "tailer":
        tailer_main(a)
    elif a.role == "keys":
        keys_main(a)
    else:
        from . import spark_jobs
        (spark_jobs.batch_main if a.role == "batch" else spark_jobs.stream_main)(a)
    return 0


def patch_spark_conn() -> None:
    """In a Spark Python worker of a run (``sitehook/sitecustomize.py``): the LogStore a
    sink's or a batch job's ``commit`` makes first claims an arm file of role
    ``$BKSPARK_UF_ROLE`` and applies it to the store client of that process (only there: a
    worker that plans or reads would hold the arm and never commit)."""
    from bkspark.spark import conn, writer
    arm_dir = os.environ["BKSPARK_UF_ARM_DIR"]
    role = os.environ.get("BKSPARK_UF_ROLE", "spark")
    original = conn.log_store
    committing = threading.local()

    def log_store(opts):
        logs = original(opts)
        if getattr(committing, "on", False):
            committing.on = False
            arm = claim_arm(arm_dir, role)
            if arm is not None:
                apply_arm(logs.store, dict(arm, uri=opts.metadata_uri), arm_dir)
        return logs
    conn.log_store = log_store

    def claiming(commit):
        def wrapped(self, *args, **kwargs):
            # (a batch job with a writer id is kept exactly once by its key whatever a lost
            # answer does: the faults go to the plain commits to the batch log, which rest on
            # the settling -- and which another client then truncates, _truncate_between)
            committing.on = isinstance(self, writer.BookKeeperStreamWriter) or (
                self.opts.writer_id is None and self.log_name == BATCH_LOG)
            try:
                return commit(self, *args, **kwargs)
            finally:
                committing.on = False
        return wrapped
    writer.BookKeeperBatchWriter.commit = claiming(writer.BookKeeperBatchWriter.commit)
    writer.BookKeeperStreamWriter.commit = claiming(writer.BookKeeperStreamWriter.commit)

    # the streaming source tells when it planned a micro-batch (the replan fault waits for it)
    from bkspark.spark import stream
    plan = stream.BookKeeperStreamReader.partitions

    def partitions(self, start, end):
        parts = plan(self, start, end)
        with open(os.path.join(arm_dir, f"planned.{os.getpid()}.{time.time():.4f}"), "w"):
            pass
        return parts
    stream.BookKeeperStreamReader.partitions = partitions
