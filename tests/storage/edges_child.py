"""Child process for test_storage_durability_edges: steps that may end in a kill -9 or a crash.

Usage: edges_child.py <mode> <dir> [<variant>]
  delete <dir> <delete|has_ledger|ledgers>
      ledger 7 stored and checkpointed; a first delete_ledger(7) is held by the test pause point
      "delete-enqueued" (its DELETE record queued, not synced); then the variant's call runs and
      its answer is printed ("ACK <variant> <ledger 7 reported deleted?> <ms>"), then SIGKILL.
  runmax <dir>
      a uniform location run of 2^30 - 1 entries written into the index, then a re-add whose
      flush cuts that run; prints "RESULT ok" or "RESULT <exception class> <message>".
  compact-oom <dir>
      allocation n = 1, 2, ... of a compaction pass made to fail (test hook) until a pass makes
      fewer; after every failed pass checks that nothing moved and nothing was unlinked.  Exits 1
      (with "BAD ..." lines) on any violation.
"""
import glob
import os
import signal
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bkspark import errors  # noqa: E402
from bkspark.bookie.storage import Storage, StorageConfig  # noqa: E402

DELETED_LEDGER = 7


def config(d: str, **kw) -> StorageConfig:
    kw.setdefault("checkpoint_interval_s", 3600.0)  # no background checkpoint syncs the journal
    return StorageConfig(journal_dir=os.path.join(d, "j"), ledger_dirs=[os.path.join(d, "l")],
                         journal_max_size_mb=16, **kw)


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def mode_delete(d: str, variant: str) -> None:
    s = Storage(config(d))
    lid = DELETED_LEDGER
    assert s.add_entries([(lid, e, b"k", False, b"x" * 100) for e in range(5)]) == [0] * 5
    s.checkpoint()  # the ledger is in the index; the mark is past its adds
    s._store.set_pause_point("delete-enqueued")
    first = threading.Thread(target=s.delete_ledger, args=(lid,), daemon=True)
    first.start()
    assert s._store.pause_wait(10.0), "the first delete never reached the pause point"
    t0 = time.monotonic()
    if variant == "delete":
        s.delete_ledger(lid)
        gone = True
    elif variant == "has_ledger":
        gone = not s.has_ledger(lid)
    else:
        gone = lid not in s.ledgers()
    ms = (time.monotonic() - t0) * 1000
    out(f"ACK {variant} {gone} {ms:.3f}")
    os.kill(os.getpid(), signal.SIGKILL)


def mode_runmax(d: str) -> None:
    s = Storage(config(d))
    lid, body = 9, b"z" * 100
    assert s.add_entries([(lid, e, b"k", False, body) for e in range(10)]) == [0] * 10
    s.checkpoint()
    key = b"E" + struct.pack(">QQ", lid, 0)
    # the run the flush wrote (first entry log, first record at offset 64, uniform length), as is
    s._store.index_put_raw(key, struct.pack("<IIQI", 1, 0x80000000 | 10, 64, len(body)))
    assert s.read_range(lid, 0, 9) == [(e, body) for e in range(10)], "the crafted copy of the run is not it"
    # the same run claiming 2^30 - 1 entries (the count field's largest value)
    s._store.index_put_raw(key, struct.pack("<IIQI", 1, 0x80000000 | ((1 << 30) - 1), 64, len(body)))
    try:    # a re-add: its read-back (an entry is never replaced) or its flush meets the run
        out(f"ADD {s.add_entries([(lid, 3, b'k', False, body)])}")
    except Exception as ex:  # noqa: BLE001 - reported to the test
        out(f"ADD {type(ex).__name__} {ex}")
    try:
        s.checkpoint()
        out("RESULT ok")
    except Exception as ex:  # noqa: BLE001 - reported to the test
        out(f"RESULT {type(ex).__name__} {ex}")
    try:
        s.read_entry(lid, 5)
        out("READ ok")
    except Exception as ex:  # noqa: BLE001
        out(f"READ {type(ex).__name__} {ex}")
    s._store.close(checkpoint=False)


def mode_compact_oom(d: str) -> None:
    s = Storage(config(d, entry_log_max_size=32 << 10, compaction_threshold=0.9,
                       compaction_rate_bytes_per_s=0, compaction_max_bytes_per_pass=64 << 20))
    data = {}
    for rnd in range(10):  # interleaved ledgers, a checkpoint each round: several mixed entry logs
        for lid in range(1, 5):
            adds = [(lid, rnd * 8 + i, b"k", False, bytes([lid * 16 + rnd]) * (300 + 20 * i)) for i in range(8)]
            assert s.add_entries(adds) == [0] * len(adds)
            data.update({(lid, e): b for _, e, _, _, b in adds})
        s.checkpoint()
    for lid in (2, 4):
        s.delete_ledger(lid)
    data = {k: v for k, v in data.items() if k[0] not in (2, 4)}
    s.checkpoint()
    ldir = os.path.join(d, "l")
    before = set(glob.glob(os.path.join(ldir, "*.log")))
    bad = 0  # violations; a pass that damaged the state ends the loop

    def check(what, failed=True):
        nonlocal bad
        bad0 = bad
        missing = sorted(before - set(glob.glob(os.path.join(ldir, "*.log"))))
        if failed and missing:
            out(f"BAD {what}: unlinked {missing}")
            bad += 1
        for (lid, e), b in data.items():
            try:
                got = s.read_entry(lid, e)
            except errors.BKError as ex:
                out(f"BAD {what}: entry {lid}:{e} unreadable: {ex!r}")
                bad += 1
                break
            if got != b:
                out(f"BAD {what}: entry {lid}:{e} has other bytes")
                bad += 1
                break
        return bad == bad0

    n, r = 0, {}
    while True:
        n += 1
        s._store.set_alloc_fail(n)
        compacted = s.stats()["compacted_logs"]
        try:
            r = s.compact()
        except errors.BookieIOError as ex:
            out(f"FAILED n={n}: {ex}")
            if "out of memory" not in str(ex):
                out(f"BAD n={n}: the error does not say what failed: {ex}")
                bad += 1
            if s.stats()["compacted_logs"] != compacted:
                out(f"BAD n={n}: a failed pass counted compacted logs")
                bad += 1
            if not check(f"after failed allocation {n}"):
                break
            continue
        made = s._store.set_alloc_fail(0)
        out(f"PASSED n={n} allocations={made} {r}")
        if made >= n:
            out(f"BAD n={n}: allocation {n} of {made} failed, yet the pass returned OK")
            bad += 1
        break
    check("after the last pass", failed=False)
    if not bad and not r.get("logs_compacted"):
        out("BAD: the last pass compacted nothing")
        bad += 1
    out(f"DONE allocations_failed={n - 1} bad={bad}")
    s.close()
    sys.exit(1 if bad else 0)


def main():
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "delete":
        mode_delete(d, sys.argv[3])
    elif mode == "runmax":
        mode_runmax(d)
    elif mode == "compact-oom":
        mode_compact_oom(d)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
