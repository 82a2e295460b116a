"""Several journal directories: ledger L's records go to journal L % n, each journal group-commits
on its own and has its own LastLogMark (lastMark, lastMark.<k>); replay reads every journal."""
import glob
import os
import random
import signal
import struct
import subprocess
import sys
import time

import pytest

from bkspark import errors
from bkspark.bookie.storage import Storage, StorageConfig

sys.path.insert(0, os.path.dirname(__file__))
from jdirs_child import body_for, config as child_config  # noqa: E402

from test_storage_crash import run_child  # noqa: E402

CHILD = os.path.join(os.path.dirname(__file__), "jdirs_child.py")
KEY = b"k"


def cfg(d, n=3, **kw):
    base = dict(journal_dirs=[os.path.join(d, f"j{k}") for k in range(n)],
                ledger_dirs=[os.path.join(d, "l0"), os.path.join(d, "l1")],
                write_cache_bytes=1 << 20, checkpoint_interval_s=3600)
    base.update(kw)
    return StorageConfig(**base)


def txn_bytes(d):
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(d, "*.txn")))


def read_mark(path):
    data = open(path, "rb").read()
    assert len(data) == 32 and data[:4] == b"BKSM"
    return struct.unpack_from("<QQ", data, 8)


def body(lid, e):
    return b"%d:%d:" % (lid, e) * 20


def fill(s, ledgers, n):
    # one call spans every journal: each entry goes to its ledger's journal
    batch = [(lid, e, KEY, False, body(lid, e)) for e in range(n) for lid in ledgers]
    assert s.add_entries(batch) == [errors.EOK] * len(batch)


def check(s, ledgers, n, fenced, lacs, deleted):
    for lid in ledgers:
        if lid in deleted:
            assert not s.has_ledger(lid)
            continue
        got = s.read_range(lid, 0, n - 1)
        assert [e for e, _ in got] == list(range(n)), lid
        assert all(b == body(lid, e) for e, b in got)
        assert s.is_fenced(lid) == (lid in fenced)
        assert s.explicit_lac(lid) == lacs.get(lid)


@pytest.mark.parametrize("checkpoint", [True, False])
def test_three_journals_spread_and_survive_reopen(tmp_path, checkpoint):
    d = str(tmp_path)
    c = cfg(d)
    ledgers = list(range(1, 31))
    s = Storage(c)
    assert s.stats()["journals"] == 3
    before = [txn_bytes(j) for j in c.journal_dirs]
    fill(s, ledgers, 40)
    after = [txn_bytes(j) for j in c.journal_dirs]
    # each journal dir got records: every dir's .txn content grew past its initial header page
    for k, j in enumerate(c.journal_dirs):
        assert after[k] >= before[k]
        recs = 0
        for p in glob.glob(os.path.join(j, "*.txn")):
            data = open(p, "rb").read()
            recs += data.count(b"BKSG")
        assert recs > 0, j
    fenced = {3, 7, 8}  # journals 0, 1, 2
    for lid in fenced:
        assert s.fence(lid, KEY) == errors.EOK
    lacs = {4: b"lac4", 5: b"lac5", 6: b"lac6"}
    for lid, v in lacs.items():
        s.set_explicit_lac(lid, v)
    deleted = {9, 10, 11}
    for lid in deleted:
        s.delete_ledger(lid)
    check(s, ledgers, 40, fenced, lacs, deleted)
    s._store.close(checkpoint=checkpoint)
    s2 = Storage(c)
    try:
        if not checkpoint:  # everything came back from the three journals
            assert s2.stats()["replayed_records"] > 0
        check(s2, ledgers, 40, fenced, lacs, deleted)
        # a ledger's records keep going to its journal: more adds after the reopen
        batch = [(lid, 40, KEY, True, body(lid, 40)) for lid in ledgers if lid not in deleted]
        assert s2.add_entries(batch) == [errors.EOK] * len(batch)
    finally:
        s2._store.close(checkpoint=False)
    s3 = Storage(c)
    try:
        for lid in ledgers:
            if lid not in deleted:
                assert s3.read_entry(lid, 40) == body(lid, 40)
        check(s3, ledgers, 40, fenced, lacs, deleted)
    finally:
        s3.close()


def test_single_journal_dirs_is_the_single_journal_layout(tmp_path):
    """journal_dirs=[x] writes exactly what journal_dir=x does: lastMark only, no lastMark.<k>."""
    d = str(tmp_path)
    s = Storage(cfg(d, n=1))
    fill(s, [1, 2, 3], 5)
    s.close()
    assert os.path.exists(os.path.join(d, "l0", "lastMark"))
    assert not glob.glob(os.path.join(d, "l*", "lastMark.*"))
    s = Storage(StorageConfig(journal_dir=os.path.join(d, "j0"), ledger_dirs=[os.path.join(d, "l0"),
                                                                              os.path.join(d, "l1")]))
    try:
        assert s.read_entry(2, 4) == body(2, 4)
        assert s.stats()["journals"] == 1
    finally:
        s.close()


def test_marks_per_journal_move_and_gc_per_journal(tmp_path):
    d = str(tmp_path)
    c = cfg(d, n=3, journal_max_size_mb=1, journal_max_backups=1)
    s = Storage(c)
    try:
        for ld in c.ledger_dirs:
            for name in ("lastMark", "lastMark.1", "lastMark.2"):
                assert os.path.exists(os.path.join(ld, name)), (ld, name)
        assert not os.path.exists(os.path.join(c.ledger_dirs[0], "lastMark.3"))
        marks0 = [read_mark(os.path.join(c.ledger_dirs[0], n)) for n in ("lastMark", "lastMark.1", "lastMark.2")]
        assert s.last_log_mark() == marks0[0]
        big = b"x" * (64 << 10)
        e = 0
        # several MiB into each journal: each rolls over several 1-MiB files
        for _ in range(12):
            batch = [(lid, e + i, KEY, False, big) for lid in (1, 2, 3) for i in range(8)]
            assert s.add_entries(batch) == [errors.EOK] * len(batch)
            e += 8
            s.checkpoint()
        marks1 = [read_mark(os.path.join(c.ledger_dirs[0], n)) for n in ("lastMark", "lastMark.1", "lastMark.2")]
        for k in range(3):
            assert marks1[k] > marks0[k], k  # every journal's mark moved
            assert marks1[k][0] > marks0[k][0] + 2, k  # ... across several rolls
            ids = sorted(int(os.path.basename(p)[:16], 16) for p in glob.glob(os.path.join(c.journal_dirs[k], "*.txn")))
            # gc per journal: files below the mark beyond journal_max_backups (1) are gone
            assert len([i for i in ids if i < marks1[k][0]]) <= 1, (k, ids, marks1[k])
            assert ids[0] > marks0[k][0], (k, ids)
        for ld in c.ledger_dirs:  # the same marks in every ledger dir
            for k, n in enumerate(("lastMark", "lastMark.1", "lastMark.2")):
                assert read_mark(os.path.join(ld, n)) == marks1[k]
    finally:
        s.close()


def test_changed_journal_count_refused_by_the_engine(tmp_path):
    d = str(tmp_path)
    s = Storage(cfg(d, n=2))
    fill(s, [1, 2], 3)
    s.close()
    with pytest.raises(errors.BookieIOError, match="fewer than the 3 configured journal directories"):
        Storage(cfg(d, n=3))
    with pytest.raises(errors.BookieIOError, match="more than the 1 configured journal directories"):
        Storage(cfg(d, n=1))
    s = Storage(cfg(d, n=2))  # the original list still opens
    try:
        assert s.read_entry(2, 2) == body(2, 2)
    finally:
        s.close()


def test_config_journal_dir_and_journal_dirs(tmp_path):
    d = str(tmp_path)
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    assert StorageConfig(journal_dirs=[a, b]).journal_dir_list() == [a, b]
    assert StorageConfig(journal_dir=a, journal_dirs=[a, b]).journal_dir_list() == [a, b]
    assert StorageConfig(journal_dir=a).journal_dir_list() == [a]
    with pytest.raises(ValueError, match="conflicts with journal_dirs"):
        StorageConfig(journal_dir=b, journal_dirs=[a, b])
    with pytest.raises(ValueError, match="twice"):
        StorageConfig(journal_dirs=[a, a])
    with pytest.raises(ValueError, match="journal_dir or journal_dirs"):
        Storage(StorageConfig(ledger_dirs=[os.path.join(d, "l")]))

    from bkspark.bookie.config import BookieConfig
    from bkspark.errors import BadRequestError
    bc = BookieConfig(metadata_uri="sqlite:///x", journal_dirs=[a, b], ledger_dirs=[d]).finalize()
    assert bc.journal_dir == a
    bc = BookieConfig(metadata_uri="sqlite:///x", ledger_dirs=[d])
    bc.update({"journal_dirs": f"{a},{b}"})  # the --journal-dirs a,b flag / config file value
    assert bc.finalize().journal_dirs == [a, b]
    with pytest.raises(BadRequestError, match="conflicts with journal_dirs"):
        BookieConfig(metadata_uri="sqlite:///x", journal_dir=b, journal_dirs=[a, b], ledger_dirs=[d]).finalize()
    from bkspark.bookie.server import storage_config
    sc = storage_config(BookieConfig(metadata_uri="sqlite:///x", journal_dirs=[a, b], ledger_dirs=[d]).finalize())
    assert sc.journal_dir_list() == [a, b]


@pytest.mark.timeout(600)
def test_kill9_with_two_journals_loses_nothing_acknowledged(tmp_path):
    seed0 = random.randrange(1 << 30)
    rnd = random.Random(seed0)
    d = str(tmp_path)
    acked: dict[int, set[int]] = {}
    fenced: set[int] = set()
    lac: dict[int, int] = {}
    for run in range(6):
        for ln in run_child(d, run, rnd.randrange(1 << 30), rnd.uniform(0.1, 0.6), child=CHILD):
            parts = ln.split()
            if parts and parts[0] == "A":
                lid, a, b = map(int, parts[1:])
                acked.setdefault(lid, set()).update(range(a, b + 1))
            elif parts and parts[0] == "F":
                fenced.add(int(parts[1]))
            elif parts and parts[0] == "L":
                lac[int(parts[1])] = int(parts[2])
        s = Storage(child_config(d))
        try:
            for lid, ents in acked.items():
                for e in sorted(ents):
                    assert s.read_entry(lid, e) == body_for(lid, e), f"seed {seed0} run {run}: {lid}:{e}"
            for lid in fenced:
                assert s.is_fenced(lid), f"seed {seed0} run {run}: fence of {lid} lost"
            for lid, step in lac.items():
                got = s.explicit_lac(lid)
                assert got is not None and int(got[3:]) >= step, f"seed {seed0} run {run}: LAC of {lid}"
        finally:
            if run % 2:
                s._store.close(checkpoint=False)
            else:
                s.close()
    assert sum(len(v) for v in acked.values()) > 0
    assert all(glob.glob(os.path.join(d, j, "*.txn")) for j in ("j0", "j1"))
