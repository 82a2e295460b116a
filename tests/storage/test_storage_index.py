"""The on-disk index (RocksDB, bookie_native/README.md "The index"): kill -9 at each step of the
checkpoint protocol, conversion of a directory written by format 1, and memory bounded by the
ledger cache whatever the store holds.

The kills use the engine's test hook (SIGKILL at a named step): ``Store.set_crash_point(step)``, or
the environment variable BKSPARK_STORAGE_CRASH_AT=<step> for steps of the open itself.
"""
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from bkspark import errors
from bkspark.bookie.storage import Storage, StorageConfig
from tests.storage.v1_fixture import check_store_matches_v1_manifest, extract_v1_store, v1_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cfg(d, **kw):
    kw.setdefault("checkpoint_interval_s", 3600.0)  # checkpoints only when asked (and at open)
    kw.setdefault("replace_entries", True)          # (re-adds with new bodies: the rewrite paths)
    kw.setdefault("entry_log_max_size", 256 << 10)
    return StorageConfig(journal_dir=os.path.join(d, "j"), ledger_dirs=[os.path.join(d, "l")],
                         journal_max_size_mb=1, write_cache_bytes=1 << 20, **kw)


def body(ledger, entry, gen=0):
    return (f"{ledger}:{entry}:{gen}|".encode() * 20)[: 60 + (ledger * 13 + entry * 7) % 300]


# A child that writes a history, checkpoints once (which the hook may kill), then -- if still
# alive -- writes more and exits without close.  Everything it writes is acknowledged before the
# checkpoint starts.  Ledger 1: 0..199 over two flushes; 2: fenced; 3: explicit LAC; 4: deleted
# after its entries reached the index; 5: deleted and re-created with fewer entries, other bodies;
# 6: entries 10..19 re-added with new bodies.
CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {repo!r})
    from tests.storage.test_storage_index import cfg, body
    from bkspark.bookie.storage import Storage
    d = sys.argv[1]
    s = Storage(cfg(d))
    s.add_entries([(1, e, b"k1", False, body(1, e)) for e in range(100)])
    for lid in (2, 3, 4, 5, 6):
        s.add_entries([(lid, e, b"k%d" % lid, False, body(lid, e)) for e in range(30)])
    s.checkpoint()
    s.add_entries([(1, e, b"k1", False, body(1, e)) for e in range(100, 200)])
    s.fence(2, b"k2")
    s.set_explicit_lac(3, b"lac-of-3")
    s.delete_ledger(4)
    s.delete_ledger(5)
    s.add_entries([(5, e, b"k5b", False, body(5, e, 1)) for e in range(10)])
    s.add_entries([(6, e, b"k6", False, body(6, e, 1)) for e in range(10, 20)])
    print("ACKED", flush=True)
    s._store.set_crash_point(os.environ["CRASH"])  # (the engine's test hook: SIGKILL at that step)
    s.checkpoint()
    print("CHECKPOINTED", flush=True)
    os._exit(0)
""")


def run_child(d, crash_at):
    p = subprocess.run([sys.executable, "-c", CHILD.format(repo=REPO), d],
                       env=dict(os.environ, PYTHONPATH=REPO, CRASH=crash_at),
                       capture_output=True, text=True, timeout=120)
    return p


def check_history(s):
    assert sorted(s.ledgers()) == [1, 2, 3, 5, 6]
    assert s.list_entries(1) == [(0, 199)]
    for e in range(200):
        assert s.read_entry(1, e) == body(1, e)
    assert s.is_fenced(2) and not s.is_fenced(1)
    assert s.explicit_lac(3) == b"lac-of-3"
    assert not s.has_ledger(4)
    assert s.list_entries(5) == [(0, 9)] and s.master_key(5) == b"k5b"
    for e in range(10):
        assert s.read_entry(5, e) == body(5, e, 1)
    with pytest.raises(errors.NoSuchEntryError):
        s.read_entry(5, 10)  # (the deleted incarnation had 0..29)
    for e in range(30):
        assert s.read_entry(6, e) == body(6, e, 1 if 10 <= e < 20 else 0)


@pytest.mark.parametrize("step", ["index-batch-written", "index-synced", "mark-written"])
def test_kill9_at_each_checkpoint_step_loses_nothing(tmp_path, step):
    # index-batch-written: the flush's index batch is written (not synced), the mark not moved;
    # index-synced: the index is durable, the mark not yet moved (the reverse of the first: the
    # journal replays records the index already holds); mark-written: before old journals go.
    d = str(tmp_path)
    p = run_child(d, step)
    assert "ACKED" in p.stdout and "CHECKPOINTED" not in p.stdout, (p.stdout, p.stderr)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr)
    for reopen in range(2):  # the recovery itself is durable: a second open finds the same
        s = Storage(cfg(d))
        try:
            check_history(s)
            if reopen == 0 and step != "mark-written":
                assert s.stats()["replayed_records"] > 0
        finally:
            s.close()


def test_checkpoint_without_kill_for_reference(tmp_path):
    d = str(tmp_path)
    p = run_child(d, "")
    assert "CHECKPOINTED" in p.stdout and p.returncode == 0, p.stderr
    s = Storage(cfg(d))
    try:
        check_history(s)
    finally:
        s.close()


# ---------------------------------------------------------------- format 1 conversion
def open_v1(tmp_path, **kw):
    j, led = extract_v1_store(tmp_path)
    return j, led, v1_config(j, led)


def test_format1_directory_is_converted_once_and_loses_nothing(tmp_path, caplog):
    j, led, conf = open_v1(tmp_path)
    assert os.path.exists(os.path.join(led, "ledgers.state"))
    with caplog.at_level("WARNING"):
        s = Storage(conf)
    try:
        assert s.stats()["index_converted_entries"] > 0
        assert "converted" in caplog.text and led in caplog.text
        check_store_matches_v1_manifest(s)
        assert s.compact() is not None  # the converted live-byte counts drive a pass without harm
        check_store_matches_v1_manifest(s)
    finally:
        s.close()
    assert not os.path.exists(os.path.join(led, "ledgers.state"))
    assert os.path.isdir(os.path.join(led, "index")) and not os.path.exists(os.path.join(led, "index.tmp"))
    s = Storage(conf)
    try:
        assert s.stats()["index_converted_entries"] == 0  # once
        check_store_matches_v1_manifest(s)
    finally:
        s.close()


@pytest.mark.parametrize("step", ["convert-before-rename", "convert-after-rename"])
def test_conversion_killed_midway_is_redone_or_finished(tmp_path, step):
    j, led, conf = open_v1(tmp_path)
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {REPO!r})
        from tests.storage.v1_fixture import v1_config
        from bkspark.bookie.storage import Storage
        Storage(v1_config({j!r}, {led!r}))
    """)
    p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, BKSPARK_STORAGE_CRASH_AT=step),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    if step == "convert-before-rename":  # format 1 untouched, a partial index beside it
        assert os.path.exists(os.path.join(led, "ledgers.state"))
        assert os.path.isdir(os.path.join(led, "index.tmp")) and not os.path.exists(os.path.join(led, "index"))
    else:  # converted; the old state file not removed yet
        assert os.path.exists(os.path.join(led, "ledgers.state")) and os.path.isdir(os.path.join(led, "index"))
    s = Storage(conf)
    try:
        check_store_matches_v1_manifest(s)
    finally:
        s.close()
    assert not os.path.exists(os.path.join(led, "ledgers.state"))


def test_damaged_format1_directory_refuses_and_stays_as_it_was(tmp_path):
    j, led, conf = open_v1(tmp_path)
    sp = os.path.join(led, "ledgers.state")
    data = bytearray(open(sp, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(sp, "wb").write(bytes(data))
    with pytest.raises(errors.BookieIOError, match="ledger state file .* corrupt"):
        Storage(conf)
    assert open(sp, "rb").read() == bytes(data) and not os.path.exists(os.path.join(led, "index"))


# ---------------------------------------------------------------- memory: the ledger cache
def test_ledger_cache_is_bounded_and_open_reads_nothing(tmp_path):
    d = str(tmp_path)
    n = 3000
    s = Storage(cfg(d, ledger_cache_entries=100))
    try:
        for base in range(0, n, 500):
            s.add_entries([(lid, e, b"k", False, body(lid, e)) for lid in range(base, base + 500) for e in (0, 1)])
            s.checkpoint()
        st = s.stats()
        assert st["ledgers_cached"] <= 100 + 64, st["ledgers_cached"]  # (+ a bounded eviction walk)
        s.fence(7, b"k")
        s.set_explicit_lac(8, b"lac8")
        for lid in range(0, n, 7):  # cold reads load, the cache stays bounded
            assert s.read_entry(lid, 1) == body(lid, 1)
        assert s.stats()["ledgers_cached"] <= 100 + 64
        assert s.is_fenced(7) and s.explicit_lac(8) == b"lac8"
    finally:
        s.close()
    s = Storage(cfg(d, ledger_cache_entries=100))
    try:
        assert s.stats()["ledgers_cached"] == 0  # opening loads no ledger
        assert sorted(s.ledgers()) == list(range(n))
        assert s.is_fenced(7) and not s.is_fenced(9) and s.explicit_lac(8) == b"lac8"
        assert s.list_entries(2999) == [(0, 1)]
        assert s.read_range(1234, 0, 1) == [(0, body(1234, 0)), (1, body(1234, 1))]
    finally:
        s.close()


def index_files(d, suffix):
    index = os.path.join(d, "l", "index")
    return [os.path.getsize(os.path.join(index, f)) for f in os.listdir(index) if f.endswith(suffix)]


@pytest.mark.parametrize("memtable_mib", [1, 16])
def test_the_index_memtable_setting_bounds_its_write_ahead_log(tmp_path, memtable_mib):
    # ~6 MB of index writes (a ledger record and a location per ledger): more than four 1 MiB
    # memtables, less than one of 16 MiB
    d = str(tmp_path)
    s = Storage(cfg(d, index_memtable_bytes=memtable_mib << 20))
    try:
        for base in range(0, 90_000, 3000):
            s.add_entries([(lid, 0, b"k", False, b"e") for lid in range(base, base + 3000)])
            s.checkpoint()
        wal, ssts = sum(index_files(d, ".log")), index_files(d, ".sst")
        if memtable_mib == 1:  # flushed to SSTs as memtables fill; the WAL held to four of them
            assert ssts and wal <= 4 << 20, (wal, ssts)
        else:
            assert not ssts and wal > 4 << 20, (wal, ssts)
        assert s.read_entry(12_345, 0) == b"e" and s.read_entry(89_999, 0) == b"e"
    finally:
        s.close()


def test_a_recreated_ledger_never_shows_the_deleted_incarnation(tmp_path):
    # the deleted incarnation's locations stay in the index until the next flush's batch removes
    # them; meanwhile reads of the new incarnation must not see them -- nor after a restart
    d = str(tmp_path)
    s = Storage(cfg(d, ledger_cache_entries=0))
    try:
        s.add_entries([(9, e, b"old", False, body(9, e)) for e in range(50)])
        s.checkpoint()  # in the index
        s.delete_ledger(9)
        with pytest.raises(errors.NoSuchLedgerError):
            s.read_entry(9, 0)
        s.add_entries([(9, e, b"new", False, body(9, e, 2)) for e in range(5)])
        assert s.list_entries(9) == [(0, 4)] and s.master_key(9) == b"new"
        with pytest.raises(errors.NoSuchEntryError):
            s.read_entry(9, 5)
        assert s.read_last(9) == (4, body(9, 4, 2))
        s.checkpoint()
        assert s.list_entries(9) == [(0, 4)]
        assert s.read_range(9, 0, 100) == [(e, body(9, e, 2)) for e in range(5)]
    finally:
        s._store.close(checkpoint=False)
    s = Storage(cfg(d))
    try:
        assert s.list_entries(9) == [(0, 4)] and s.master_key(9) == b"new"
        assert s.read_range(9, 0, 100) == [(e, body(9, e, 2)) for e in range(5)]
    finally:
        s.close()


def test_unlisted_entry_logs_are_removed_at_open(tmp_path):
    # a log no index row lists (a flush whose batch never became durable, a log torn at creation,
    # a compaction victim a kill left) holds nothing the index points at: removed at open
    d = str(tmp_path)
    s = Storage(cfg(d))
    s.add_entries([(1, e, b"k", False, body(1, e)) for e in range(20)])
    s.close()
    ldir = os.path.join(d, "l")
    stray = os.path.join(ldir, "000000ff.log")
    shutil.copy(os.path.join(ldir, sorted(p for p in os.listdir(ldir) if p.endswith(".log"))[0]), stray)
    open(os.path.join(ldir, "000000fe.idx"), "wb").write(b"x" * 10)
    s = Storage(cfg(d))
    try:
        assert not os.path.exists(stray) and not os.path.exists(os.path.join(ldir, "000000fe.idx"))
        assert [s.read_entry(1, e) for e in range(20)] == [body(1, e) for e in range(20)]
        s.add_entries([(2, 0, b"k", False, b"after")])
        s.checkpoint()
        assert s.read_entry(2, 0) == b"after"
    finally:
        s.close()


def test_runs_cut_by_re_adds_and_compaction_keep_every_entry_and_exact_live_bytes(tmp_path):
    # a flush indexes a ledger's consecutive entries as one run record; re-adding entries inside
    # runs (and compaction moving some) must cut those runs: every entry reads its latest body,
    # and the live bytes the logs are credited with are exactly the bytes of the current copies
    d = str(tmp_path)
    conf = dict(entry_log_max_size=64 << 10, compaction_threshold=0.9, compaction_max_bytes_per_pass=1 << 30,
                compaction_rate_bytes_per_s=0)
    s = Storage(cfg(d, **conf))
    latest = {}

    def add(entries, gen):
        s.add_entries([(1, e, b"k", False, body(1, e, gen)) for e in entries])
        latest.update({e: body(1, e, gen) for e in entries})

    def check(st):
        assert st.list_entries(1) == [(0, max(latest))]
        assert st.read_range(1, 0, max(latest)) == sorted(latest.items())
        assert st.stats()["entry_log_live_bytes"] == sum(24 + len(b) for b in latest.values())

    try:
        add(range(1000), 0)
        s.checkpoint()
        add(range(10, 20), 1)            # inside a run
        add([0, 511, 512, 999], 2)       # run edges (runs hold at most 512 entries)
        add(range(995, 1010), 3)         # across the last run's end, past it
        s.checkpoint()
        check(s)
        add(range(100, 300), 4)          # leaves older copies behind: compaction moves the rest
        s.checkpoint()
        assert s.compact()["logs_compacted"] > 0
        check(s)
    finally:
        s.close()
    s = Storage(cfg(d, **conf))
    try:
        check(s)
        assert [s.read_entry(1, e) for e in (0, 15, 511, 512, 1009)] == [latest[e] for e in (0, 15, 511, 512, 1009)]
    finally:
        s.close()


def test_every_run_form_reads_back_each_entry(tmp_path):
    # runs of equal lengths are stored as one length, others as varints of 1 to 3 bytes: each
    # entry must read back (point, range, after reopen) whichever form and varint width it got
    d = str(tmp_path)
    sizes = [0, 1, 127, 128, 129, 16383, 16384, 16385, 70000, 5, 300]
    uniform = {e: bytes([e % 251]) * 100 for e in range(1500)}                # three runs of 512 max
    mixed = {e: bytes([e % 251]) * sizes[e % len(sizes)] for e in range(600)}
    s = Storage(cfg(d))
    try:
        s.add_entries([(1, e, b"k", False, b) for e, b in uniform.items()])
        s.add_entries([(2, e, b"k", False, b) for e, b in mixed.items()])
        s.checkpoint()
    finally:
        s.close()
    s = Storage(cfg(d))
    try:
        for lid, want in ((1, uniform), (2, mixed)):
            assert s.list_entries(lid) == [(0, max(want))]
            assert s.read_range(lid, 0, max(want)) == sorted(want.items())
            for e in random.Random(lid).sample(sorted(want), 200):
                assert s.read_entry(lid, e) == want[e]
    finally:
        s.close()
