"""The writer processes of a fault run: ledger writers and log writers that record every
acknowledgement they see in an ack file (flushed per line, so a SIGKILL loses none)."""
from __future__ import annotations

import collections
import logging
import os
import random
import signal
import sys
import threading
import time

from bkspark import errors

from .common import CLIENT_CONF, LEDGER_CONFIGS, LOG_NAME, PASSWORD, make_record


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


def log_to(path_or_stream, level=None) -> "logging.Handler":
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
    log_to(sys.stderr)
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


#: appends a workload keeps in flight
WINDOW = 8


def _drain(window: collections.deque, keep: int) -> BaseException | None:
    """Take the answered futures off the front of ``window``, and wait for more until at
    most ``keep`` are pending; the first failure (then stop), else None."""
    while len(window) > keep or (window and window[0].done()):
        try:
            window.popleft().result()
        except BaseException as exc:  # noqa: BLE001 - a workload records every failure
            return exc
    return None


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
        failed = _drain(window, WINDOW)
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
            failed = _drain(window, WINDOW) is not None
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
