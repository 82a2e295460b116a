"""Edges of the storage engine's durability and bounds rules, each driven deterministically with a
test hook of the engine (`Store.set_pause_point`, `set_journal_group_max`, `index_put_raw`,
`set_alloc_fail`; bookie_native/README.md "Python API"):

* a delete -- and a lookup that reports a ledger deleted -- returns only once the DELETE record
  is durable (checked across a kill -9);
* a read never returns bytes of another incarnation of the ledger;
* a journal group never exceeds its bound;
* a malformed location run in the index is an error, never a write out of bounds;
* a failed allocation abandons a compaction pass cleanly.

The steps that may end in a crash run in a child process (edges_child.py).
"""
import os
import signal
import subprocess
import sys
import threading

import pytest

from bkspark import errors
from bkspark.bookie.storage import Storage

sys.path.insert(0, os.path.dirname(__file__))
from edges_child import DELETED_LEDGER, config  # noqa: E402
from test_storage_corruption import parse_journal  # noqa: E402

CHILD = os.path.join(os.path.dirname(__file__), "edges_child.py")


def run_child(*args, timeout=60):
    p = subprocess.run([sys.executable, CHILD, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


# ---------------------------------------------------------------- 1. deletes are durable on return
@pytest.mark.timeout(60)
@pytest.mark.parametrize("variant", ["delete", "has_ledger", "ledgers"])
def test_delete_reported_done_only_once_durable(tmp_path, variant):
    """A first delete_ledger is held after queueing its DELETE record (not synced); a second
    delete_ledger -- or has_ledger / ledgers() -- that reports the ledger deleted must have made
    that record durable: after a kill -9 the ledger stays deleted."""
    d = str(tmp_path)
    rc, so, se = run_child("delete", d, variant)
    assert rc == -signal.SIGKILL, f"child exited {rc}: {so}\n{se[-3000:]}"
    ack = [ln.split() for ln in so.splitlines() if ln.startswith("ACK ")]
    assert len(ack) == 1, so
    _, _, gone, ms = ack[0]
    assert gone == "True", f"{variant} reported ledger {DELETED_LEDGER} present while it is being deleted"
    s = Storage(config(d))
    try:
        back = s.has_ledger(DELETED_LEDGER), DELETED_LEDGER in s.ledgers()
        assert back == (False, False), (
            f"{variant} reported ledger {DELETED_LEDGER} deleted (after {ms} ms) but after kill -9 it is back "
            f"(has_ledger, in ledgers()) = {back}: the delete was not durable")
        with pytest.raises(errors.NoSuchLedgerError):
            s.read_entry(DELETED_LEDGER, 0)
    finally:
        s.close()


# ---------------------------------------------------------------- 2. reads stay in one incarnation
@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["recreated-in-cache", "recreated-and-flushed", "point-read"])
def test_read_never_returns_another_incarnation(tmp_path, case):
    """A read is held between its index scan (step 2) and step 3 while the ledger is deleted and
    re-created by a recovery add of entry 0 (a recovery write-back); it must not return the old
    incarnation's entries."""
    s = Storage(config(str(tmp_path)))
    lid = 5
    try:
        assert s.add_entries([(lid, e, b"k", False, b"old-%d" % e) for e in range(10)]) == [0] * 10
        s.checkpoint()  # the old incarnation's entries are in the index
        s._store.set_pause_point("read-scanned")
        res = {}

        def reader():
            try:
                res["v"] = s.read_entry(lid, 5) if case == "point-read" else s.read_range(lid, 0, 9)
            except Exception as ex:  # noqa: BLE001 - checked below
                res["v"] = ex

        t = threading.Thread(target=reader)
        t.start()
        assert s._store.pause_wait(10.0), "the read never reached the pause point"
        s.delete_ledger(lid)
        assert s.add_entries([(lid, 0, b"k", True, b"new-0")]) == [0]
        if case == "recreated-and-flushed":
            s.checkpoint()  # the new incarnation's entry 0 is in the index, the old ones are gone
        s._store.pause_release()
        t.join(10)
        v = res["v"]
        if case == "point-read":
            assert isinstance(v, errors.NoSuchEntryError), f"entry 5 of the deleted incarnation was read: {v!r}"
        else:
            assert v == [(0, b"new-0")], f"read returned bytes of the deleted incarnation: {v!r}"
        assert s.read_range(lid, 0, 9) == [(0, b"new-0")]
    finally:
        s._store.pause_release()
        s.close()


# ---------------------------------------------------------------- 3. journal groups are bounded
@pytest.mark.timeout(60)
def test_journal_group_never_exceeds_its_bound(tmp_path):
    """With the group bound lowered to 64 KiB (test hook; 1 GiB by default), one add_entries call
    of ~430 KB -- and concurrent calls -- are written as groups within the bound, and all of it
    replays."""
    d = str(tmp_path)
    bound = 64 << 10
    s = Storage(config(d))
    s._store.set_journal_group_max(bound)

    def body(lid, e):
        return bytes([(lid * 7 + e) % 251]) * (1000 + e % 50)

    assert s.add_entries([(1, e, b"k", False, body(1, e)) for e in range(400)]) == [0] * 400
    errs = []

    def adder(lid):
        try:
            for b in range(10):
                st = s.add_entries([(lid, b * 20 + i, b"k", False, body(lid, b * 20 + i)) for i in range(20)])
                assert st == [0] * 20
        except Exception as ex:  # noqa: BLE001
            errs.append(ex)

    ts = [threading.Thread(target=adder, args=(lid,)) for lid in (2, 3, 4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errs, errs
    jfile = os.path.join(d, "j", "%016x.txn" % s.stats()["journal_id"])
    s._store.close(checkpoint=False)  # everything since the open is only in the journal
    groups = parse_journal(jfile)
    sizes = [end - start - 24 for start, end, _ in groups]
    assert sum(len(recs) for _, _, recs in groups) >= 400 + 3 * 200
    assert max(sizes) <= bound, f"journal groups of {sorted(sizes)[-5:]} bytes, bound {bound}"
    s = Storage(config(d))
    try:
        assert s.stats()["replayed_records"] >= 400 + 3 * 200
        assert s.read_range(1, 0, 399) == [(e, body(1, e)) for e in range(400)]
        for lid in (2, 3, 4):
            assert s.read_range(lid, 0, 199) == [(e, body(lid, e)) for e in range(200)]
    finally:
        s.close()


# ---------------------------------------------------------------- 4. malformed index runs
@pytest.mark.timeout(120)
def test_malformed_run_count_is_an_error_not_an_overflow(tmp_path):
    """A location record claiming a uniform run of 2^30 - 1 entries (at most 512 are ever
    written) is corruption: a re-add of one of its entries fails alone (EIO: its read-back --
    an entry is never replaced -- meets the record), else the flush that cuts it fails with
    BookieIOError naming it; a read through it fails so too, and the process does not crash."""
    rc, so, se = run_child("runmax", str(tmp_path), timeout=100)
    assert rc == 0, f"child died (exit {rc}) -- a write out of bounds?\n{so}\n{se[-3000:]}"
    add = [ln for ln in so.splitlines() if ln.startswith("ADD ")]
    res = [ln for ln in so.splitlines() if ln.startswith("RESULT ")]
    read = [ln for ln in so.splitlines() if ln.startswith("READ ")]
    assert add and res, so
    if add[0] == "ADD [0]":
        assert res[0].startswith("RESULT BookieIOError") and "malformed" in res[0], so
    else:
        assert add[0] == "ADD [501]", so
    assert read and read[0].startswith("READ BookieIOError") and "malformed" in read[0], so


# ---------------------------------------------------------------- 5. compaction allocations
@pytest.mark.timeout(120)
def test_compaction_abandons_pass_on_every_failed_allocation(tmp_path):
    """Each allocation of a compaction pass made to fail in turn: the pass fails with
    BookieIOError ("out of memory ..."), nothing is re-pointed or unlinked (every entry reads
    back, every log is still there); the pass without a failure then compacts."""
    rc, so, se = run_child("compact-oom", str(tmp_path), timeout=110)
    lines = so.splitlines()
    assert rc == 0, "\n".join(ln for ln in lines if not ln.startswith("FAILED")) + "\n" + se[-3000:]
    assert any(ln.startswith("DONE") and "bad=0" in ln for ln in lines), so
