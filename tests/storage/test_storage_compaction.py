"""Checkpoint / LastLogMark / journal GC, deletion + compaction, and concurrent use."""
import glob
import os
import random
import threading
import time

import pytest

from bkspark import errors
from bkspark.bookie.storage import Storage, StorageConfig


def cfg(d, **kw):
    base = dict(journal_dir=os.path.join(d, "j"), ledger_dirs=[os.path.join(d, "l0"), os.path.join(d, "l1")])
    base.update(kw)
    return StorageConfig(**base)


def logs(d):
    return sorted(glob.glob(os.path.join(d, "l*", "*.log")))


def test_compaction_reclaims_deleted_ledgers(tmp_path):
    d = str(tmp_path)
    s = Storage(cfg(d, entry_log_max_size=64 << 10, compaction_threshold=0.5, compaction_max_bytes_per_pass=1 << 30))
    body = b"q" * 1000
    for rnd in range(8):  # interleave three ledgers in every log
        for lid in (1, 2, 3):
            s.add_entries([(lid, rnd * 30 + i, b"k", False, body + bytes([lid, i])) for i in range(30)])
        s.checkpoint()
    before = logs(d)
    assert len(before) >= 4
    assert s.compact()["logs_compacted"] == 0  # everything live
    s.delete_ledger(1)
    s.delete_ledger(2)
    st = s.compact()
    assert st["logs_compacted"] >= len(before) - 1, st
    assert st["bytes_reclaimed"] > 0 and st["entries_copied"] > 0
    # the deleted ledgers' ranges, under the delete's range tombstone, were not scanned (led_gone)
    assert st["deleted_skipped"] >= 2 * (len(before) - 1), st
    after = logs(d)
    assert len(after) < len(before)
    assert set(before) - set(after)  # old files really removed
    for i in range(240):
        assert s.read_entry(3, i) == body + bytes([3, i % 30])
    for lid in (1, 2):
        assert not s.has_ledger(lid)
    s.close()
    s = Storage(cfg(d, entry_log_max_size=64 << 10))
    try:
        for i in range(240):
            assert s.read_entry(3, i) == body + bytes([3, i % 30])
        assert s.ledgers() == [3]
        # re-creating a deleted ledger id starts empty (old index records are not resurrected)
        assert s.add_entries([(1, 5, b"new", False, b"fresh")]) == [0]
        assert s.list_entries(1) == [(5, 5)]
    finally:
        s.close()
    s = Storage(cfg(d))
    try:
        assert s.list_entries(1) == [(5, 5)] and s.master_key(1) == b"new"
    finally:
        s.close()


def test_compaction_pass_is_bounded(tmp_path):
    d = str(tmp_path)
    s = Storage(cfg(d, entry_log_max_size=32 << 10, compaction_threshold=0.9, compaction_max_bytes_per_pass=20 << 10))
    try:
        for rnd in range(10):
            s.add_entries([(10 + rnd % 2, rnd * 40 + i, b"k", False, b"z" * 900) for i in range(40)])
            s.checkpoint()
        s.delete_ledger(10)
        passes = 0
        copied = []
        while True:
            st = s.compact()
            passes += 1
            copied.append(st["bytes_copied"])
            if st["logs_compacted"] == 0 or passes > 50:
                break
        assert passes > 2, copied  # the work was split across passes
        assert max(copied) <= 40 << 10, copied  # budget (one log may exceed it alone)
        for rnd in range(1, 10, 2):
            for i in range(40):
                assert s.read_entry(11, rnd * 40 + i) == b"z" * 900
    finally:
        s.close()


def test_lastlogmark_and_journal_gc(tmp_path):
    d = str(tmp_path)
    c = cfg(d, journal_max_size_mb=1, journal_max_backups=2, checkpoint_interval_s=3600)
    s = Storage(c)
    try:
        m0 = s.last_log_mark()
        for b in range(40):
            s.add_entries([(1, b * 20 + i, b"k", False, os.urandom(5000)) for i in range(20)])  # ~4 MB
        assert len(glob.glob(os.path.join(d, "j", "*.txn"))) >= 4
        s.checkpoint()
        m1 = s.last_log_mark()
        assert m1 > m0
        ids = sorted(int(os.path.basename(p)[:-4], 16) for p in glob.glob(os.path.join(d, "j", "*.txn")))
        older = [i for i in ids if i < m1[0]]
        assert len(older) <= 2, (ids, m1)
        # lastMark written to every ledger dir
        for ld in c.ledger_dirs:
            assert os.path.getsize(os.path.join(ld, "lastMark")) == 32
    finally:
        s.close()


@pytest.mark.timeout(120)
def test_an_old_journal_is_renamed_and_cut_by_the_reaper_not_the_checkpoint(tmp_path):
    """A journal the checkpoint no longer needs is renamed out of the journal names and handed
    to the reaper thread, which cuts it a step at a time (8 MiB) before its unlink: the
    checkpoint returns at once (cutting on its thread, the write cache's only flusher, held
    adds 0.4-0.7 s), adds go on, and a leftover renamed journal -- a kill mid-cut -- is
    removed at the next open, never replayed."""
    d = str(tmp_path)
    s = Storage(cfg(d, journal_max_size_mb=40, journal_max_backups=0, checkpoint_interval_s=3600))
    body = b"j" * (64 << 10)
    try:
        for at in range(0, 1280, 64):           # 80 MiB: two full journal files
            assert s.add_entries([(1, e, b"k", False, body) for e in range(at, at + 64)]) == \
                [0] * 64
        oldest = min(glob.glob(os.path.join(d, "j", "*.txn")))
        size = os.path.getsize(oldest)
        assert size > 36 << 20
        s._store.set_pause_point("reap-cut")
        s.checkpoint()                          # (returns: the reaper does the cutting)
        assert s._store.pause_wait(60.0), "the old journal was not cut before its unlink"
        assert not os.path.exists(oldest)
        assert os.path.getsize(oldest + ".del") == size - (8 << 20)
        assert s.add_entries([(2, 0, b"k", False, b"meanwhile")]) == [0]
        s.checkpoint()
        with open(oldest + ".left", "wb") as f:         # what a kill mid-cut leaves
            f.write(b"\0" * 4096)
        os.rename(oldest + ".left", os.path.join(d, "j", "00000000000000ff.txn.del"))
        s._store.pause_release()
    finally:
        s._store.pause_release()
        s.close()
    assert not os.path.exists(oldest + ".del")
    s = Storage(cfg(d))
    try:
        assert glob.glob(os.path.join(d, "j", "*.del")) == []
        assert s.read_range(1, 0, 1279) == [(e, body) for e in range(1280)]
        assert s.read_range(2, 0, 0) == [(0, b"meanwhile")]
    finally:
        s.close()


@pytest.mark.timeout(180)
def test_more_old_journals_than_the_reapers_queue_wait_renamed_for_it(tmp_path):
    """More old journals than the reaper's queue holds (64): the checkpoint renames them all and
    removes none itself (a large unlink on its thread stalls flushes); the reaper takes the rest
    from the directory once its queue is empty. Only journals' reaper names are taken: an
    operator's ``notes.del`` stays."""
    d = str(tmp_path)
    jdir = os.path.join(d, "j")
    s = Storage(cfg(d, journal_max_size_mb=40, journal_max_backups=1000))
    body = b"j" * (64 << 10)
    try:
        for at in range(0, 1280, 64):           # a first journal to cut (40 MiB)
            assert s.add_entries([(1, e, b"k", False, body) for e in range(at, at + 64)]) == \
                [0] * 64
    finally:
        s.close()
    for i in range(70):                         # ... and 70 small ones (one an open)
        s = Storage(cfg(d, journal_max_size_mb=40, journal_max_backups=1000))
        try:
            assert s.add_entries([(2, i, b"k", False, b"x")]) == [0]
        finally:
            s.close()
    open(os.path.join(jdir, "notes.del"), "wb").close()
    old = len(glob.glob(os.path.join(jdir, "*.txn"))) - 1
    s = Storage(cfg(d, journal_max_size_mb=40, journal_max_backups=0))
    try:
        s._store.set_pause_point("reap-cut")
        s.checkpoint()
        assert s._store.pause_wait(60.0)
        assert len(glob.glob(os.path.join(jdir, "*.txn.del"))) >= old      # none unlinked
        s._store.pause_release()
        deadline = time.monotonic() + 60
        while glob.glob(os.path.join(jdir, "*.txn.del")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert glob.glob(os.path.join(jdir, "*.txn.del")) == []
        assert os.path.exists(os.path.join(jdir, "notes.del"))
        assert s.read_range(2, 0, 69) == [(i, b"x") for i in range(70)]
    finally:
        s._store.pause_release()
        s.close()


_KILLED_MID_REAP = """
import sys, time
from bkspark.bookie.storage import Storage, StorageConfig
d = sys.argv[1]
s = Storage(StorageConfig(journal_dir=d + "/j", ledger_dirs=[d + "/l0"], journal_max_size_mb=40,
                          journal_max_backups=0, checkpoint_interval_s=3600))
s.add_entries([(5, e, b"k", False, b"five") for e in range(10)])
body = b"j" * (64 << 10)
for at in range(0, 576, 64):
    s.add_entries([(1, e, b"k", False, body) for e in range(at, at + 64)])
s.delete_ledger(5)                      # near the end of the first journal
for at in range(576, 1280, 64):
    s.add_entries([(1, e, b"k", False, body) for e in range(at, at + 64)])
s._store.set_pause_point("reap-cut")
s.checkpoint()
assert s._store.pause_wait(60)
print("PAUSED", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_a_journal_killed_mid_cut_is_never_replayed_even_without_a_mark(tmp_path):
    """kill -9 while the reaper cuts an old journal, then every lastMark copy lost (a replay
    then reads every journal it finds): the cut journal, renamed before the cut, is removed at
    open, not replayed -- its prefix would bring back a ledger deleted past the cut."""
    import signal
    import subprocess
    import sys
    d = str(tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.Popen([sys.executable, "-c", _KILLED_MID_REAP, d], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONPATH=root))
    try:
        for line in p.stdout:
            if line.startswith("PAUSED"):
                break
        assert glob.glob(os.path.join(d, "j", "*.txn.del")), "not killed mid-cut"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    for mark in glob.glob(os.path.join(d, "l0", "lastMark*")):
        os.unlink(mark)
    s = Storage(StorageConfig(journal_dir=os.path.join(d, "j"), ledger_dirs=[os.path.join(d, "l0")]))
    try:
        assert not s.has_ledger(5)
        assert glob.glob(os.path.join(d, "j", "*.del")) == []
        assert len(s.read_range(1, 0, 1279)) == 1280
    finally:
        s.close()


def test_concurrent_add_read_checkpoint_compact(tmp_path):
    d = str(tmp_path)
    s = Storage(cfg(d, write_cache_bytes=256 << 10, entry_log_max_size=64 << 10, compaction_threshold=0.7,
                    checkpoint_interval_s=0.05, journal_max_group_wait_ms=0.5))
    stop = threading.Event()
    errs = []
    acked = {}
    lock = threading.Lock()

    def adder(lid):
        n = 0
        try:
            while not stop.is_set():
                st = s.add_entries([(lid, n + i, b"k", False, bytes([lid]) * (100 + i)) for i in range(20)])
                assert st == [0] * 20
                with lock:
                    acked[lid] = n + 19
                n += 20
        except Exception as e:
            errs.append(e)

    def reader():
        rnd = random.Random(1)
        try:
            while not stop.is_set():
                with lock:
                    items = list(acked.items())
                for lid, last in items:
                    e = rnd.randint(0, last)
                    assert s.read_entry(lid, e) == bytes([lid]) * (100 + e % 20)
                    rr = s.read_range(lid, e, last, 1 << 16)
                    assert rr and rr[0][0] == e
        except Exception as e:
            errs.append(e)

    def churn():
        rnd = random.Random(2)
        k = 100
        try:
            while not stop.is_set():
                s.add_entries([(k, i, b"k", False, b"d" * 500) for i in range(50)])
                if rnd.random() < 0.7:
                    s.delete_ledger(k)
                k += 1
                s.compact()
        except Exception as e:
            errs.append(e)

    ts = [threading.Thread(target=adder, args=(i,)) for i in (1, 2)] + \
         [threading.Thread(target=reader), threading.Thread(target=churn)]
    for t in ts:
        t.start()
    stop.wait(3.0)
    stop.set()
    for t in ts:
        t.join()
    try:
        assert not errs, errs
        st = s.stats()
        assert st["checkpoints"] > 1
    finally:
        s.close()
    s = Storage(cfg(d))
    try:
        for lid, last in acked.items():
            assert s.list_entries(lid)[0] == (0, last) or s.list_entries(lid)[0][1] >= last
            for e in range(0, last + 1, 7):
                assert s.read_entry(lid, e) == bytes([lid]) * (100 + e % 20)
    finally:
        s.close()


def test_compaction_never_loses_entries_after_restart_without_checkpoint(tmp_path):
    d = str(tmp_path)
    c = cfg(d, entry_log_max_size=16 << 10, compaction_threshold=0.99)
    s = Storage(c)
    for r in range(6):
        s.add_entries([(r % 3, r * 10 + i, b"k", False, b"%d" % (r * 10 + i) * 100) for i in range(10)])
        s.checkpoint()
    s.delete_ledger(0)
    s.compact()
    s._store.close(checkpoint=False)
    s = Storage(c)
    try:
        assert not s.has_ledger(0)
        for r in range(6):
            if r % 3:
                for i in range(10):
                    assert s.read_entry(r % 3, r * 10 + i) == b"%d" % (r * 10 + i) * 100
    finally:
        s.close()


@pytest.mark.parametrize("left", ["log+idx", "idx"])
def test_kill_between_compaction_state_write_and_unlink_leaves_no_stale_data(tmp_path, left):
    # compaction writes the new log, then its synced index batch without its victims, then unlinks them
    # (.log, then .idx): a kill before the unlinks leaves the victims on disk, unlisted.
    # Reopening must read the compacted copies (the new log has the later id), not resurrect
    # deleted ledgers, and a later compaction must reclaim the leftovers.  A kill between the
    # two unlinks leaves only the index: opening removes it (nothing else ever would).
    import shutil
    d = str(tmp_path)
    conf = dict(entry_log_max_size=64 << 10, compaction_threshold=0.5, compaction_max_bytes_per_pass=1 << 30)
    s = Storage(cfg(d, **conf))
    body = b"q" * 1000
    for rnd in range(8):
        for lid in (1, 2, 3):
            s.add_entries([(lid, rnd * 30 + i, b"k", False, body + bytes([lid, i])) for i in range(30)])
        s.checkpoint()
    saved = str(tmp_path / "saved")
    os.makedirs(saved)
    for p in glob.glob(os.path.join(d, "l*", "*.[li][od][gx]")):
        shutil.copy(p, os.path.join(saved, os.path.basename(os.path.dirname(p)) + "-" + os.path.basename(p)))
    s.delete_ledger(1)
    s.delete_ledger(2)
    assert s.compact()["logs_compacted"] > 0
    compacted = logs(d)
    s.close()
    restored = []
    for p in glob.glob(os.path.join(saved, "*")):
        sub, name = os.path.basename(p).split("-", 1)
        dst = os.path.join(d, sub, name)
        if not os.path.exists(dst) and (left == "log+idx" or name.endswith(".idx")):
            shutil.copy(p, dst)
            restored.append(dst)
    assert restored
    for reopen in range(2):
        s = Storage(cfg(d, **conf))
        try:
            if left == "idx":
                assert not [p for p in restored if os.path.exists(p)], "orphan indexes stayed"
            for i in range(240):
                assert s.read_entry(3, i) == body + bytes([3, i % 30])
            assert s.ledgers() == [3]
            if reopen == 0:
                s.compact()
                assert set(logs(d)) <= set(compacted), "the victims left by the kill were not reclaimed"
        finally:
            s.close()


def test_compaction_copies_beside_flushes_and_close_aborts_it(tmp_path):
    # A pass copying a large live log must not stop the write cache's flushes: holding the
    # checkpoint lock for its whole copy, it once let the cache fill and adds wait for seconds.
    # Paced to 1 MB/s, this pass copies for 16 s; adds that need many flushes, and an explicit
    # checkpoint, complete while it is still copying.  Close then aborts it, losing nothing.
    d = str(tmp_path)
    conf = dict(entry_log_max_size=8 << 20, compaction_threshold=0.9, write_cache_bytes=1 << 20,
                compaction_max_bytes_per_pass=1 << 30)
    s = Storage(cfg(d, **conf))
    body = b"c" * 4000
    for rnd in range(100):      # ledgers 1 and 2 interleaved: ~32 MB, 4 sealed logs ~half live
        for lid in (1, 2):
            s.add_entries([(lid, rnd * 40 + i, b"k", False, body + bytes([lid, i])) for i in range(40)])
    s.checkpoint()
    s.delete_ledger(2)
    s.close()
    s = Storage(cfg(d, compaction_rate_bytes_per_s=1 << 20, **conf))
    outcome = []

    def compact():
        try:
            outcome.append(s.compact())
        except errors.BKError as exc:
            outcome.append(exc)
    t = threading.Thread(target=compact)
    t.start()
    for _ in range(3000):
        if s.stats()["compaction_copying_bytes"] > 0 or not t.is_alive():
            break
        threading.Event().wait(0.01)
    assert s.stats()["compaction_copying_bytes"] > 0 and t.is_alive(), outcome
    flushes = s.stats()["flushes"]
    for k in range(100):        # ~4 MB through a 1 MiB write cache: flush after flush
        assert s.add_entries([(3, k * 10 + i, b"k", False, body) for i in range(10)]) == [0] * 10
    s.checkpoint()
    st = s.stats()
    assert st["flushes"] >= flushes + 4, (flushes, st["flushes"])
    assert t.is_alive() and st["compaction_copying_bytes"] > 0, "the pass was not still copying"
    s.close()                   # aborts the pass at its next chunk
    t.join(60)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], errors.BKError), outcome
    s = Storage(cfg(d, **conf))
    try:
        assert s.ledgers() == [1, 3]
        for e in range(0, 4000, 13):
            assert s.read_entry(1, e) == body + bytes([1, e % 40])
        for e in range(1000):
            assert s.read_entry(3, e) == body
        st = s.compact()        # the interrupted pass is finished off
        assert st["logs_compacted"] > 0 and st["bytes_reclaimed"] > 0, st
        for e in range(0, 4000, 7):
            assert s.read_entry(1, e) == body + bytes([1, e % 40])
    finally:
        s.close()


def _interleaved_small(s, ledgers, per, size=200):
    """``per`` small entries in each of ``ledgers``, interleaved in every entry log."""
    for at in range(0, per, 20):
        for lid in ledgers:
            assert s.add_entries([(lid, e, b"k", False, b"%d:%d|" % (lid, e) * (size // 10))
                                  for e in range(at, min(per, at + 20))]) == [0] * min(20, per - at)
    s.checkpoint()


def _check_small(s, lid, per, size=200):
    got = s.read_range(lid, 0, per - 1)
    assert [e for e, _ in got] == list(range(per))
    assert all(b == b"%d:%d|" % (lid, e) * (size // 10) for e, b in got)


def _pass_paused_between_batches(d, per, **config):
    """A storage (``config``: more of its settings) whose three interleaved ledgers of ``per``
    small entries lost two, and a compaction pass (on a thread) paused between two of its
    re-pointing batches: ``(storage, thread, result)``, ``result["st"]`` the pass's stats or the
    BKError that ended it."""
    s = Storage(cfg(d, compaction_threshold=0.5, compaction_max_bytes_per_pass=1 << 30,
                    entry_log_max_size=128 << 10, write_cache_bytes=64 << 10, **config))
    _interleaved_small(s, (1, 2, 3), per)
    s.delete_ledger(1)
    s.delete_ledger(2)
    s.checkpoint()
    s._store.set_pause_point("compaction-repointed")
    res = {}

    def compact():
        try:
            res["st"] = s.compact()
        except errors.BKError as exc:
            res["st"] = exc
    t = threading.Thread(target=compact)
    t.start()
    assert s._store.pause_wait(60.0), "the re-pointing never paused between two batches"
    return s, t, res


@pytest.mark.timeout(120)
def test_flushes_run_between_the_batches_of_a_large_re_pointing(tmp_path):
    """A pass that copied many small entries re-points them in batches, each holding off
    flushes only while it is written: between two batches a flush (here a checkpoint, with
    adds to another ledger) completes. One batch for the whole pass held every flush off for
    seconds, the write cache filled and adds waited (bench/gc_stall.py). Both the finished pass
    and the reopened storage read every entry."""
    d = str(tmp_path)
    s, t, res = _pass_paused_between_batches(d, 6000)
    try:
        done = threading.Event()

        def flush():
            assert s.add_entries([(9, e, b"k", False, b"new") for e in range(100)]) == [0] * 100
            s.checkpoint()
            done.set()
        f = threading.Thread(target=flush)
        f.start()
        assert done.wait(20), "a flush waited for the whole re-pointing"
        _check_small(s, 3, 6000)            # half re-pointed: every entry reads
        s._store.pause_release()
        t.join(60)
        f.join(10)
        assert res["st"]["entries_copied"] > 4096, res     # (more than one batch)
        _check_small(s, 3, 6000)
    finally:
        s._store.pause_release()
        s.close()
    s = Storage(cfg(d))
    try:
        _check_small(s, 3, 6000)
        assert s.read_range(9, 0, 99) == [(e, b"new") for e in range(100)]
    finally:
        s.close()


@pytest.mark.timeout(120)
def test_a_storage_closed_between_re_pointing_batches_reads_everything_after_reopening(tmp_path):
    """Closed between two batches (each synced: what a kill leaves too), some entries point at
    their copies and the rest at the originals; reopened, every entry reads, and a new pass
    finishes the job."""
    d = str(tmp_path)
    s, t, res = _pass_paused_between_batches(d, 6000)
    closed = False
    try:
        s.close()
        closed = True
        t.join(60)
        assert isinstance(res["st"], errors.BKError), res     # the pass was cut short
    finally:
        if not closed:
            s._store.pause_release()
            s.close()
    s = Storage(cfg(d, compaction_threshold=0.5, compaction_max_bytes_per_pass=1 << 30))
    try:
        _check_small(s, 3, 6000)
        before = len(logs(d))
        s.compact()
        _check_small(s, 3, 6000)
        assert len(logs(d)) <= before
    finally:
        s.close()
    s = Storage(cfg(d))
    try:
        _check_small(s, 3, 6000)
    finally:
        s.close()


@pytest.mark.timeout(120)
def test_entries_of_a_ledger_deleted_mid_pass_are_not_looked_up(tmp_path):
    """A ledger deleted while its copies wait to be re-pointed is skipped by the batches after
    the delete (its entries are dead): a lookup in the range its delete just dropped took ~2 ms,
    so 20,000 of them held flushes off for 27 s in all (batches of 1-2 s each)."""
    s, t, res = _pass_paused_between_batches(str(tmp_path), 20000)
    try:
        held = s.stats()["t_c_repoint_ns"]
        s.delete_ledger(3)
        s.checkpoint()                      # its range delete applied to the index
        s._store.pause_release()
        t.join(100)
        assert res["st"]["entries_copied"] <= 1024, res
        assert (s.stats()["t_c_repoint_ns"] - held) / 1e9 < 5.0
        assert not s.has_ledger(3)
    finally:
        s._store.pause_release()
        s.close()


@pytest.mark.timeout(120)
def test_a_ledger_deleted_and_created_again_mid_pass_is_not_sought_entry_by_entry(tmp_path):
    """A ledger deleted and created again while its copies wait to be re-pointed is found (the
    new one), so its copied entries are looked up -- in the range the delete just dropped,
    ~1.4 ms a seek: sought entry by entry, the rest of the pass held flushes off ~30 s in all
    (0.36-0.6 s a batch when sought 256 at a time). An entry no run covers makes every entry
    before the next run absent without another seek. Nothing is re-pointed onto the new one."""
    s, t, res = _pass_paused_between_batches(str(tmp_path), 20000)
    try:
        held = s.stats()["t_c_repoint_ns"]
        s.delete_ledger(3)
        assert s.add_entries([(3, 0, b"k", False, b"new incarnation")]) == [0]
        s.checkpoint()                      # the range delete and the new record applied
        s._store.pause_release()
        t.join(100)
        assert res["st"]["entries_copied"] <= 1024, res
        assert (s.stats()["t_c_repoint_ns"] - held) / 1e9 < 5.0
        assert s.read_range(3, 0, 0) == [(0, b"new incarnation")]
    finally:
        s._store.pause_release()
        s.close()


@pytest.mark.timeout(120)
def test_entries_written_again_mid_pass_keep_their_new_location(tmp_path):
    """Entries a pass copied and that are written again before their batch is re-pointed (a
    recovery's re-add; the bytes differ here to tell the copies apart) keep the location of
    the new write: the re-point moves only entries the index still points at the originals
    of. (Re-pointing them anyway -- the check dropped -- read the pass's old copies.) The
    bytes may differ only with ``replace_entries``, the engine's test setting."""
    d = str(tmp_path)
    s, t, res = _pass_paused_between_batches(d, 6000, replace_entries=True)
    again = [(3, e, b"k", False, b"again %d" % e) for e in range(5000, 5100)]
    try:
        assert s.add_entries(again) == [0] * 100
        s.checkpoint()
        s._store.pause_release()
        t.join(60)
        assert res["st"]["entries_copied"] > 4096, res
        got = s.read_range(3, 4990, 5109)
        assert got[10:110] == [(e, d_) for _, e, _, _, d_ in again]
        assert got[:10] == [(e, b"3:%d|" % e * 20) for e in range(4990, 5000)]
    finally:
        s._store.pause_release()
        s.close()
    s = Storage(cfg(d, replace_entries=True))
    try:
        assert s.read_range(3, 5000, 5099) == [(e, d_) for _, e, _, _, d_ in again]
    finally:
        s.close()


@pytest.mark.timeout(120)
def test_a_large_victim_log_is_cut_a_step_at_a_time_before_its_unlink(tmp_path):
    """A compacted-away entry log larger than a step (8 MiB) shrinks a step at a time before
    it is unlinked: freeing its blocks at once stalled the journal's fdatasyncs (ext4 with
    ``discard``; bench/fs_delete_stall.py). Mid-way the file is shorter and unlisted; the
    surviving ledger reads, and after the pass and a reopen the file is gone."""
    d = str(tmp_path)
    s = Storage(cfg(d, compaction_threshold=0.5, entry_log_max_size=40 << 20,
                    compaction_max_bytes_per_pass=1 << 30))
    body = b"x" * (64 << 10)
    try:
        for at in range(0, 640, 64):            # 40 MiB of ledger 1: a log of its own
            assert s.add_entries([(1, e, b"k", False, body) for e in range(at, at + 64)]) == \
                [0] * 64
        s.checkpoint()
        assert s.add_entries([(2, e, b"k", False, b"two %d" % e) for e in range(10)]) == [0] * 10
        s.checkpoint()
        big = max(logs(d), key=os.path.getsize)
        size = os.path.getsize(big)
        assert size > 40 << 20
        s.delete_ledger(1)
        s.checkpoint()
        s._store.set_pause_point("delete-cut")
        res = {}
        t = threading.Thread(target=lambda: res.update(st=s.compact()))
        t.start()
        assert s._store.pause_wait(60.0), "the log was not cut before its unlink"
        assert os.path.getsize(big) == size - (8 << 20)
        assert s.read_range(2, 0, 9) == [(e, b"two %d" % e) for e in range(10)]
        s._store.pause_release()
        t.join(60)
        assert not os.path.exists(big) and res["st"]["logs_deleted"] >= 1, res
    finally:
        s._store.pause_release()
        s.close()
    s = Storage(cfg(d))
    try:
        assert not os.path.exists(big)
        assert s.read_range(2, 0, 9) == [(e, b"two %d" % e) for e in range(10)]
    finally:
        s.close()
