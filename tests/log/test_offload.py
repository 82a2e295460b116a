"""Offload (issue 52, items 1-2): a log's closed ledgers become Parquet files that pyarrow
(and Spark, tests/spark/test_spark_offload.py) read as the log's rows, written crash-safe
and recorded by one metadata change -- on both metadata stores, with real bookies."""
from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from bkspark import errors
from bkspark.log import offload
from bkspark.log.offload import Location, OffloadPolicy, collect_orphans
from bkspark.recovery import offload as offload_pass
from bkspark.recovery.offload import run
from bkspark.spark.codec import encode_record
from metadata.testing import lost_answers

from .helpers import closed_ledger, read_all


def _fill(bk, logs, name, ledgers, rows=5, start=0):
    """``ledgers`` closed ledgers of ``rows`` records (key, value, time, a header) listed in
    ``name``; the records' (key, value, ts) in order."""
    out = []
    for i in range(ledgers):
        datas = []
        for j in range(rows):
            n = start + i * rows + j
            ts = 1_700_000_000_000_000 + n
            datas.append(encode_record(f"v{n}".encode(), key=f"k{n % 3}".encode(),
                                       timestamp_us=ts, headers=[("h", b"x")]))
            out.append((f"k{n % 3}".encode(), f"v{n}".encode(), ts))
        logs.append_ledgers(name, [closed_ledger(bk, datas)])
    return out


def _offloading(bk, logs, name, tmp_path, ledgers, **fill) -> Location:
    """Log ``name`` of ``ledgers`` closed ledgers (:func:`_fill`) whose policy offloads every
    closed ledger to ``tmp_path``; that Location."""
    logs.create(name)
    _fill(bk, logs, name, ledgers, **fill)
    logs.set_offload(name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)                # (after_ms=1: every closed ledger is due)
    return Location(str(tmp_path))


def _table(where: Location, name: str) -> pa.Table:
    """What a Parquet reader of the log's directory sees (an empty table: no file)."""
    t = ds.dataset(where.log_dir(name), format="parquet").to_table()
    return t.sort_by("offset") if t.num_columns else t


# ---- the policy (pure) ---------------------------------------------------------------------

def test_the_policy_parses_and_bad_ones_name_the_fix(tmp_path):
    p = OffloadPolicy.parse(str(tmp_path), after="1h", beyond="10GiB")
    assert (p.after_ms, p.beyond_bytes) == (3_600_000, 10 << 30)
    assert OffloadPolicy.from_property(p.to_property()) == p
    with pytest.raises(errors.BadRequestError, match="is relative: give an absolute path"):
        OffloadPolicy("history", after_ms=1)
    with pytest.raises(errors.BadRequestError, match="needs after_ms and/or beyond_bytes"):
        OffloadPolicy(str(tmp_path))
    with pytest.raises(errors.BadRequestError, match="bad offload property"):
        OffloadPolicy.from_property({"location": str(tmp_path), "days": 3})
    assert offload.parse_file_name(offload.file_name(42, 7)) == (42, 7)
    assert offload.parse_file_name("_tmp-00000000000000000042-7-ab.parquet") is None


# ---- offload and read back -----------------------------------------------------------------

def test_closed_ledgers_become_parquet_with_the_logs_rows_and_are_recorded(
        bk, logs, log_name, tmp_path):
    logs.create(log_name)
    rows = _fill(bk, logs, log_name, 4)
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)
    done = run(logs, log_name)
    entries = logs.segments(log_name)
    assert list(done) == [e.ledger_id for e in entries]
    where = Location(str(tmp_path))
    t = _table(where, log_name)
    assert t.column("offset").to_pylist() == list(range(20))
    assert list(zip(t.column("key").to_pylist(), t.column("value").to_pylist(),
                    [v.value for v in t.column("timestamp")])) == \
        rows                                              # (.value: microseconds)
    assert t.column("headers").to_pylist()[0] == [("h", b"x")]
    assert t.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    for e in entries:               # recorded: files, ranges, rows, bytes, checksum
        (f,) = e.offloaded["files"]
        assert (f["first"], f["last"], f["rows"]) == (0, 4, 5)
        path = os.path.join(where.log_dir(log_name), f["name"])
        assert os.path.getsize(path) == f["bytes"]
        md = pq.ParquetFile(path).metadata
        stats = md.row_group(0).column(0).statistics
        assert (stats.min, stats.max) == (e.offset, e.offset + 4)
    assert run(logs, log_name) == {}                    # nothing left: nothing rewritten
    assert read_all(logs, log_name)                     # the bookies' copy is still read


def test_the_policy_offloads_old_or_far_ledgers_oldest_first_and_never_an_open_one(
        bk, logs, log_name, tmp_path):
    logs.create(log_name)
    _fill(bk, logs, log_name, 3)
    now = logs.store.clock.now_ms()
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=3_600_000))
    assert run(logs, log_name, now_ms=now) == {}                        # none an hour old
    assert len(run(logs, log_name, now_ms=now + 3_600_001)) == 3
    size = logs.segments(log_name)[0].length
    _fill(bk, logs, log_name, 3, start=15)
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), beyond_bytes=2 * size))
    done = run(logs, log_name, now_ms=now)
    assert list(done) == [logs.segments(log_name)[3].ledger_id]   # the 4th: 2 after it
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    with logs.open_writer(log_name) as w:               # an open ledger at the end
        w.append(b"open")
        done = run(logs, log_name, now_ms=now + 10 * 3_600_000, max_ledgers=99)
        listed = logs.segments(log_name)
        assert list(done) == [e.ledger_id for e in listed[4:6]] and not listed[6].closed
        assert listed[6].offloaded is None


def test_arrow_entries_keep_their_columns_plus_offsets(bk, logs, log_name, tmp_path):
    from bkspark.spark import codec
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw",
                          custom_metadata=codec.arrow_ledger_metadata(schema, "{}"))
    for i in range(3):
        b = pa.RecordBatch.from_arrays([pa.array([i * 10, i * 10 + 1]),
                                        pa.array([f"a{i}", None])], schema=schema)
        lh.append(bytes(codec.encode_arrow(b)))
    lh.close()
    logs.create(log_name)
    logs.append_ledgers(log_name, [lh.ledger_id])
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)
    run(logs, log_name)
    t = pq.read_table(Location(str(tmp_path)).log_dir(log_name))
    assert t.column_names == ["id", "name", "_offset", "_ledger_id", "_entry_id"]
    assert t.column("id").to_pylist() == [0, 1, 10, 11, 20, 21]
    assert t.column("_offset").to_pylist() == [0, 0, 1, 1, 2, 2]


def _cuts(costs: list[int], limit: int) -> list[tuple[int, int]]:
    """The entry ranges of a ledger's files: a file ends with the entry whose cost reaches
    ``limit``, summed from the file's first entry."""
    out, first, size = [], 0, 0
    for eid, c in enumerate(costs):
        size += c
        if size >= limit:
            out.append((first, eid))
            first, size = eid + 1, 0
    return out + ([(first, len(costs) - 1)] if first < len(costs) else [])


@pytest.mark.parametrize("chunk_rows", [1, 4, 8192])
def test_a_ledger_is_cut_into_files_by_its_entries_bytes_alone(bk, logs, log_name, tmp_path,
                                                               monkeypatch, chunk_rows):
    """Where a ledger of record entries is cut into files follows the entries' lengths
    (their length plus 44 bytes a row), not how converted rows happen to be batched (before:
    a file could end only where a batch of 8192 converted rows did, so a pass converting in
    other batches -- another pyarrow build, another chunk size -- published other names,
    and a crashed pass's file showed its rows twice)."""
    monkeypatch.setattr(offload_pass, "RECORD_CHUNK_ROWS", chunk_rows)
    datas = [encode_record(b"v" * (7 * j % 50), key=b"k", timestamp_us=j) for j in range(12)]
    costs = [len(d) + 44 for d in datas]
    monkeypatch.setattr(offload_pass, "FILE_ENTRY_BYTES", sum(costs[:3]))
    logs.create(log_name)
    logs.append_ledgers(log_name, [closed_ledger(bk, datas)])
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)
    run(logs, log_name)
    files = logs.segments(log_name)[0].offloaded["files"]
    want = _cuts(costs, sum(costs[:3]))
    assert [(f["first"], f["last"]) for f in files] == want and len(want) > 3
    assert sorted(os.listdir(Location(str(tmp_path)).log_dir(log_name))) == \
        [offload.file_name(first, logs.segments(log_name)[0].ledger_id) for first, _ in want]
    assert _table(Location(str(tmp_path)), log_name).column("offset").to_pylist() == \
        list(range(12))


def test_an_arrow_ledger_is_cut_by_the_buffers_its_entries_declare(bk, logs, log_name,
                                                                   tmp_path, monkeypatch):
    """An Arrow entry counts the sizes of the buffers its IPC message declares plus 24 bytes
    a row (the three position columns): a fact of its bytes, whatever build decodes it."""
    from bkspark.spark import codec
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw",
                          custom_metadata=codec.arrow_ledger_metadata(schema, "{}"))
    costs = []
    for n in (100, 50, 200, 10, 300, 40, 60):
        strings = [f"s{i}" for i in range(n)]
        b = pa.RecordBatch.from_arrays([pa.array(range(n), pa.int64()), pa.array(strings)],
                                       schema=schema)
        lh.append(bytes(codec.encode_arrow(b)))
        # int64 values; string offsets (n + 1 int32) and characters; no validity bitmaps
        costs.append(8 * n + 4 * (n + 1) + sum(map(len, strings)) + 24 * n)
    lh.close()
    limit = costs[0] + costs[1] + 1
    monkeypatch.setattr(offload_pass, "FILE_ENTRY_BYTES", limit)
    logs.create(log_name)
    logs.append_ledgers(log_name, [lh.ledger_id])
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)
    run(logs, log_name)
    files = logs.segments(log_name)[0].offloaded["files"]
    assert [(f["first"], f["last"]) for f in files] == _cuts(costs, limit) == \
        [(0, 2), (3, 4), (5, 6)]


# ---- crash safety --------------------------------------------------------------------------

def test_a_file_that_does_not_read_back_as_written_is_not_published_or_recorded(
        bk, logs, log_name, tmp_path, monkeypatch):
    logs.create(log_name)
    _fill(bk, logs, log_name, 2)
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    real = Location.write

    def corrupt(self, path, table):            # what reaches the disk is not what was converted
        return real(self, path, table.set_column(4, "value", pa.array([b"?"] * table.num_rows,
                                                                      pa.binary())))
    monkeypatch.setattr(Location, "write", corrupt)
    time.sleep(0.01)
    with pytest.raises(offload.OffloadError, match="differs from what was written"):
        run(logs, log_name)
    assert os.listdir(Location(str(tmp_path)).log_dir(log_name)) == []    # temp removed
    assert all(e.offloaded is None for e in logs.segments(log_name))
    monkeypatch.setattr(Location, "write", real)
    assert len(run(logs, log_name)) == 2


def test_lost_answers_of_the_record_are_settled_not_doubled(bk, logs, log_name, tmp_path):
    _offloading(bk, logs, log_name, tmp_path, 2)
    with lost_answers(logs.store, count=1):
        done = run(logs, log_name)
    assert len(done) == 2 and all(e.offloaded for e in logs.segments(log_name))
    assert _table(Location(str(tmp_path)), log_name).num_rows == 10


def test_a_location_the_policy_left_is_swept_until_it_holds_nothing(bk, logs, log_name,
                                                                    tmp_path, monkeypatch):
    """The policy moves from A to B: A is remembered and swept as the current location is --
    the file a crash published at A for a ledger then recorded at B goes, an old temp file
    goes, a file recorded at A stays (retention's) -- and A is forgotten once it holds nothing
    of the log and an hour has passed since the policy left it (a pass that read the old
    policy may still write there). Before, only B was swept: A's crashed files stayed for
    good, visible to ``spark.read.parquet`` of A as rows of a ledger that lives at B."""
    def previous():
        return [p["location"] for p in offload.previous_locations(logs.properties(log_name))]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    where_a = _offloading(bk, logs, log_name, a, 3)
    run(logs, log_name, max_ledgers=1)                          # ledger 0 recorded at A
    first, second, third = logs.segments(log_name)
    crashed = offload_pass.offload_ledger(logs, log_name, second, where_a)   # not recorded
    d = where_a.log_dir(log_name)
    old_tmp = os.path.join(d, "_tmp-00000000000000000005-1.parquet.dead.inprogress")
    open(old_tmp, "wb").close()
    os.utime(old_tmp, (time.time() - 2 * offload.TEMP_GRACE_S,) * 2)
    logs.set_offload(log_name, OffloadPolicy(b, after_ms=1))
    assert previous() == [a]
    assert sorted(run(logs, log_name)) == [second.ledger_id, third.ledger_id]    # at B
    removed = offload.sweep_locations(logs, log_name)
    assert sorted(removed) == sorted([crashed["files"][0]["name"], os.path.basename(old_tmp)])
    assert _visible(where_a, log_name) == [first.offloaded["files"][0]["name"]]
    assert previous() == [a]                                    # it still holds one
    assert _table(Location(b), log_name).column("offset").to_pylist() == list(range(5, 15))
    logs.truncate_segments(log_name, first.seq + 1)             # retention cuts ledger 0
    assert _visible(where_a, log_name) == []
    assert offload.sweep_locations(logs, log_name) == [] and previous() == [a]   # (< 1 h)
    monkeypatch.setattr(offload, "TEMP_GRACE_S", 0.0)
    assert offload.sweep_locations(logs, log_name) == []
    assert offload.PREVIOUS not in logs.properties(log_name)    # empty, left long ago
    # removing the policy remembers its location; naming it again forgets it; at most 8
    logs.set_offload(log_name, None)
    assert previous() == [b]
    logs.set_offload(log_name, OffloadPolicy(b, after_ms=1))
    assert offload.PREVIOUS not in logs.properties(log_name)
    for i in range(10):
        logs.set_offload(log_name, OffloadPolicy(str(tmp_path / f"m{i}"), after_ms=1))
    assert previous() == [str(tmp_path / f"m{i}") for i in range(1, 9)]   # (B, m0: oldest)


@pytest.mark.parametrize("spelling", ["slash", "uri", "symlink"])
def test_the_same_directory_spelt_otherwise_is_not_a_move_and_keeps_its_files(
        bk, logs, log_name, tmp_path, spelling):
    """The policy set again naming its directory another way -- a trailing ``/``, a
    ``file://`` URI, a symlink to it -- is not a move, and the sweep deletes none of the files
    recorded under the first spelling (before: every one, the only copy once dropped)."""
    hist = str(tmp_path / "hist")
    logs.create(log_name)
    _fill(bk, logs, log_name, 3)
    logs.set_offload(log_name, OffloadPolicy(hist, after_ms=1, keep_on_bookies_ms=0))
    time.sleep(0.01)
    assert len(run(logs, log_name)) == 3 and len(offload_pass.drop_copies(logs, log_name)) == 2
    before = read_all(logs, log_name)
    assert len(before) == 15
    if spelling == "symlink":
        os.symlink(hist, str(tmp_path / "link"))
    same = {"slash": hist + "/", "uri": "file://" + hist, "symlink": str(tmp_path / "link")}
    logs.set_offload(log_name, OffloadPolicy(same[spelling], after_ms=1, keep_on_bookies_ms=0))
    assert offload.PREVIOUS not in logs.properties(log_name)
    assert offload.sweep_locations(logs, log_name) == []
    assert read_all(logs, log_name) == before


def test_a_location_left_again_while_the_sweep_judged_it_is_kept(bk, logs, log_name, tmp_path,
                                                                 monkeypatch):
    """The sweep judges previous location A empty and left long ago; meanwhile the policy
    returns to A and leaves it again: A, left just now, stays remembered (before: forgotten by
    name)."""
    a, c = str(tmp_path / "a"), str(tmp_path / "c")
    logs.create(log_name)
    logs.set_offload(log_name, OffloadPolicy(a, after_ms=1))
    logs.set_offload(log_name, OffloadPolicy(c, after_ms=1))
    monkeypatch.setattr(offload, "TEMP_GRACE_S", 0.0)           # A: left long enough ago
    real_files = Location.files

    def files(self, directory):
        out = real_files(self, directory)
        if self.uri == a and directory.endswith(f"log={log_name}") and not moved:
            moved.append(1)             # (A listed: judged on the entry read before)
            logs.set_offload(log_name, OffloadPolicy(a, after_ms=1))
            logs.set_offload(log_name, OffloadPolicy(c, after_ms=1))
        return out
    moved: list = []
    monkeypatch.setattr(Location, "files", files)
    offload.sweep_locations(logs, log_name)
    assert moved and [p["location"] for p in
                      offload.previous_locations(logs.properties(log_name))] == [a]


def test_orphans_are_collected_published_unrecorded_files_kept(bk, logs, log_name, tmp_path):
    where = _offloading(bk, logs, log_name, tmp_path, 3)
    run(logs, log_name, max_ledgers=2)
    d = where.log_dir(log_name)
    third = logs.segments(log_name)[2]
    # a crash between publishing and recording the third ledger; an old crashed temp file
    rec = offload_pass.offload_ledger(logs, log_name, third, where)
    old_tmp = os.path.join(d, "_tmp-00000000000000000010-1.parquet.dead.inprogress")
    young_tmp = os.path.join(d, "_tmp-00000000000000000010-1.parquet.beef.inprogress")
    for p in (old_tmp, young_tmp):
        open(p, "wb").close()
    os.utime(old_tmp, (time.time() - 2 * offload.TEMP_GRACE_S,) * 2)
    first = logs.segments(log_name)[0]
    stray = os.path.join(d, offload.file_name(10**6, 10**6))       # a ledger never listed
    open(stray, "wb").close()
    logs.truncate_segments(log_name, first.seq + 1)             # retention cut the first
    assert not os.path.exists(os.path.join(d, first.offloaded["files"][0]["name"]))
    removed = collect_orphans(logs, log_name)
    assert sorted(removed) == sorted([os.path.basename(old_tmp), os.path.basename(stray)])
    assert os.path.exists(os.path.join(d, rec["files"][0]["name"]))    # kept: recorded next
    assert list(run(logs, log_name)) == [third.ledger_id]
    assert _table(where, log_name).column("offset").to_pylist() == list(range(5, 15))


_CRASHER = """
import os, signal, sys
from bkspark.client import BookKeeper
from bkspark.log import LogStore, offload
from bkspark.recovery import offload as offload_pass
step = sys.argv[2]

calls = []

def crash_after(fn, nth=1):
    def wrapped(*a, **kw):
        out = fn(*a, **kw)
        calls.append(1)
        if len(calls) == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    return wrapped

if step == "record":
    offload_pass.record = crash_after(offload_pass.record)
elif step == "amid-renames":        # a file per entry: killed after the 2nd of 5 renames
    offload_pass.FILE_ENTRY_BYTES = 1
    offload.Location.publish = crash_after(offload.Location.publish, 2)
else:
    setattr(offload.Location, step, crash_after(getattr(offload.Location, step)))
bk = BookKeeper(sys.argv[1])
offload_pass.run(LogStore(bk, password=b"pw"), sys.argv[3])
sys.exit(3)         # (not reached: every step it can crash after is taken)
"""


@pytest.mark.parametrize("step", ["write", "verify", "publish", "amid-renames", "record"])
def test_a_process_killed_after_each_step_leaves_nothing_visible_half_done(
        bk, logs, log_name, tmp_path, cluster, step, monkeypatch):
    """kill -9 of the offloading process after writing the temp file, after reading it back,
    after publishing it, amid the renames of a ledger of several files, after recording it:
    a Parquet reader of the directory sees a prefix of the log, each entry once (whole
    files, published in offset order), nothing is recorded that is not complete, and the
    next pass completes the log exactly once."""
    import subprocess
    import sys
    name = f"{log_name}"[:100]
    _offloading(bk, logs, name, tmp_path, 2)
    proc = subprocess.run([sys.executable, "-c", _CRASHER, cluster.metadata_uri, step, name],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    where = Location(str(tmp_path))
    t = _table(where, name)
    seen = t.column("offset").to_pylist() if t.num_columns else []
    assert seen == list(range(len(seen)))           # a prefix: nothing twice, no gap
    # whole ledgers -- or, amid the renames of one, its first files: offsets 0 and 1
    assert len(seen) == 2 if step == "amid-renames" else len(seen) % 5 == 0
    for e in logs.segments(name):
        if e.offloaded:             # recorded: its files are there, whole
            for f in e.offloaded["files"]:
                assert pq.read_metadata(os.path.join(where.log_dir(name), f["name"])).num_rows \
                    == f["rows"]
    if step == "amid-renames":      # (the same rule as the killed pass: the same file names)
        monkeypatch.setattr(offload_pass, "FILE_ENTRY_BYTES", 1)
        monkeypatch.setattr(offload_pass, "RECORD_CHUNK_ROWS", 1)
    run(logs, name)
    assert _table(where, name).column("offset").to_pylist() == list(range(10))
    assert all(e.offloaded for e in logs.segments(name))
    assert collect_orphans(logs, name) == []


_DROP_CRASHER = """
import os, signal, sys
from bkspark.client import BookKeeper
from bkspark.log import LogStore
from bkspark.recovery import offload as offload_pass
step, updates = sys.argv[2], []
real_update, real_delete = LogStore.update, BookKeeper.delete_ledgers

def update(self, *a, **kw):
    out = real_update(self, *a, **kw)
    updates.append(1)
    if (step, len(updates)) in (("mark", 1), ("advance", 2)):
        os.kill(os.getpid(), signal.SIGKILL)
    return out

def delete_ledgers(self, ids):
    real_delete(self, ids)
    os.kill(os.getpid(), signal.SIGKILL)
LogStore.update = update
if step == "delete":
    BookKeeper.delete_ledgers = delete_ledgers
offload_pass.drop_copies(LogStore(BookKeeper(sys.argv[1]), password=b"pw"), sys.argv[3])
sys.exit(3)         # (not reached)
"""


@pytest.mark.parametrize("step", ["mark", "delete", "advance"])
def test_a_process_killed_after_each_step_of_a_drop_loses_nothing(
        bk, logs, log_name, tmp_path, cluster, step):
    """kill -9 of the process dropping the bookies' copy after marking it, after deleting the
    ledgers, after moving the mark: every reader reads the log as before, from whichever copy
    is there, and the next pass finishes the drop exactly."""
    import subprocess
    import sys
    name = f"{log_name}"[:100]
    _, before = _dropping(bk, logs, name, tmp_path, 3)
    run(logs, name)
    ids = [e.ledger_id for e in logs.segments(name)]
    proc = subprocess.run([sys.executable, "-c", _DROP_CRASHER, cluster.metadata_uri, step,
                           name], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert read_all(logs, name) == before
    again = offload_pass.drop_copies(logs, name)
    assert again == ([] if step == "advance" else ids[:2])
    assert [_exists(bk, lid) for lid in ids] == [False, False, True]
    assert offload.progress_of(logs.properties(name), offload.DROPPED)["next"] == \
        logs.segments(name)[-1].seq
    assert read_all(logs, name) == before


# ---- the service, retention ------------------------------------------------------------------

def test_the_retention_service_offloads_and_a_retention_cut_deletes_the_files(
        bk, logs, log_name, tmp_path):
    from bkspark.log.retention import RetentionPolicy
    from bkspark.recovery.retention import RetentionService
    _offloading(bk, logs, log_name, tmp_path, 3)
    service = RetentionService(bk, "test-offload")
    service.run_once()
    where = Location(str(tmp_path))
    assert service.offloaded_ledgers >= 3 and service.offload_failures == 0
    entries = logs.segments(log_name)
    assert all(e.offloaded for e in entries)
    assert service.offloaded_bytes >= sum(f["bytes"] for e in entries for f in e.offloaded["files"])
    logs.set_retention(log_name, RetentionPolicy(bytes=1))          # cuts all but the last
    assert service.run_once()[log_name] == [e.ledger_id for e in entries[:2]]
    assert sorted(os.listdir(where.log_dir(log_name))) == [entries[2].offloaded["files"][0]["name"]]
    assert _table(where, log_name).column("offset").to_pylist() == list(range(10, 15))
    assert log_name in service._swept           # its directory was swept for orphans ...
    logs.delete(log_name)
    service.run_once()
    assert log_name not in service._swept       # ... and a deleted log's time is forgotten


def test_a_location_that_fails_is_counted_and_retried_nothing_recorded(
        bk, logs, log_name, tmp_path):
    from bkspark.recovery.retention import RetentionService
    logs.create(log_name)
    _fill(bk, logs, log_name, 1)
    blocked = tmp_path / "file-not-dir"
    blocked.write_bytes(b"")                    # the location is a file: no directory there
    logs.set_offload(log_name, OffloadPolicy(str(blocked), after_ms=1))
    time.sleep(0.01)
    service = RetentionService(bk, "test-offload-fail")
    service.run_once()
    assert service.offload_failures == 1 and service.offloaded_ledgers == 0
    assert logs.segments(log_name)[0].offloaded is None
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path / "ok"), after_ms=1))
    service.run_once()
    assert service.offloaded_ledgers == 1 and logs.segments(log_name)[0].offloaded


def test_files_of_ledgers_a_truncation_or_an_overwrite_removes_go_with_them_even_mid_offload(
        bk, logs, log_name, tmp_path, monkeypatch):
    """A cut whose ledgers were offloaded deletes their files; an overwrite too; and a cut
    landing between an offload's publish and its record (the record then finds the ledger
    gone) leaves no file a Parquet reader sees."""
    from bkspark.log import Position
    where = _offloading(bk, logs, log_name, tmp_path, 3)
    run(logs, log_name, max_ledgers=1)
    entries = logs.segments(log_name)
    logs.truncate(log_name, Position(entries[1].ledger_id, 0))        # a user's truncation
    assert _table(where, log_name).num_rows == 0
    real = offload_pass.record

    def cut_first(logs_, name, *args):                      # the cut lands before the record
        logs.truncate(name, Position(entries[2].ledger_id, 0))
        return real(logs_, name, *args)
    monkeypatch.setattr(offload_pass, "record", cut_first)
    run(logs, log_name, max_ledgers=1)                      # offloads the second ledger
    monkeypatch.setattr(offload_pass, "record", real)
    assert _table(where, log_name).num_rows == 0
    assert [f for f in os.listdir(where.log_dir(log_name)) if not f.startswith("_")] == []
    run(logs, log_name)
    assert _table(where, log_name).column("offset").to_pylist() == list(range(10, 15))
    logs.overwrite(log_name, [closed_ledger(bk, [b"new"])])
    assert _table(where, log_name).num_rows == 0


def test_an_entry_that_does_not_decode_fails_its_log_only(bk, logs, log_name, tmp_path):
    """A record entry cut short (its flags promise a key it does not hold) fails the offload
    of its log with an OffloadError naming the entry; the service's pass goes on to the next
    log (before: the decoder's struct.error escaped the pass, every pass)."""
    from bkspark.log.retention import RetentionPolicy
    from bkspark.recovery.retention import RetentionService
    poisoned, good = f"{log_name}-a", f"{log_name}-b"
    logs.create(poisoned)
    logs.append_ledgers(poisoned, [closed_ledger(bk, [b"\xffBKR\x01\x02\x00"])])
    logs.set_offload(poisoned, OffloadPolicy(str(tmp_path), after_ms=1))
    logs.create(good)
    _fill(bk, logs, good, 3)
    logs.set_retention(good, RetentionPolicy(bytes=1))
    time.sleep(0.01)
    with pytest.raises(offload.OffloadError, match="entry 0 does not decode as a record"):
        run(logs, poisoned)
    service = RetentionService(bk, "test-offload-poison")
    removed = service.run_once()
    assert service.offload_failures == 1 and len(removed[good]) == 2


def test_marking_old_segments_offloaded_leaves_readers_copies_of_the_list_valid(
        bk, logs, log_name, tmp_path):
    """A pass records old segments; a LogStore's copy of the list stays valid (its next
    ``get`` reads the head and the last segments, not all of them again) -- before, each pass
    raised the head's ``rev`` and every reader re-read the whole list."""
    from tests.log.test_log_segments import counted
    logs.create(log_name)
    _fill(bk, logs, log_name, 30, rows=1)
    logs.get(log_name)                                  # a copy of the whole list
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)
    assert len(run(logs, log_name, max_ledgers=5)) == 5
    with counted(logs.store) as seen:
        md, _ = logs.get(log_name)
    assert len(md.ledgers) == 30 and seen["reads"] <= 8, seen
    assert [bool(e.offloaded) for e in logs.segments(log_name)][:6] == [True] * 5 + [False]


def test_deleting_the_log_or_unlisting_a_ledger_deletes_their_files(bk, logs, log_name, tmp_path):
    where = _offloading(bk, logs, log_name, tmp_path, 3)
    run(logs, log_name)
    logs.unlist_ledger(log_name, logs.segments(log_name)[1].ledger_id)
    assert _table(where, log_name).column("offset").to_pylist() == \
        list(range(5)) + list(range(10, 15))
    logs.delete(log_name)
    assert _table(where, log_name).num_rows == 0
    logs.create(log_name)                               # the name again: nothing of the old log
    _fill(bk, logs, log_name, 1)
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)
    run(logs, log_name)
    assert _table(where, log_name).column("offset").to_pylist() == list(range(5))


# ---- what a second review reproduced -------------------------------------------------------

def _visible(where: Location, name: str) -> list[str]:
    d = where.log_dir(name)
    return sorted(f for f in os.listdir(d) if not f.startswith("_")) if os.path.isdir(d) else []


def test_a_log_deleted_mid_offload_keeps_no_file(bk, logs, log_name, tmp_path, monkeypatch):
    """The log is deleted between an offload's publish and its record: the deletion did not
    know of these files, so the offload deletes them (before: they stayed for good -- no log,
    no policy, no sweep)."""
    where = _offloading(bk, logs, log_name, tmp_path, 2)
    real = offload_pass.record

    def delete_first(logs_, name, *args):
        logs.delete(name)
        return real(logs_, name, *args)
    monkeypatch.setattr(offload_pass, "record", delete_first)
    with pytest.raises(errors.NoSuchLogError):
        run(logs, log_name)
    assert _visible(where, log_name) == []


def test_a_ledger_listed_again_elsewhere_mid_offload_is_not_recorded_with_old_offsets(
        bk, logs, log_name, tmp_path, monkeypatch):
    where = _offloading(bk, logs, log_name, tmp_path, 3)
    target = logs.segments(log_name)[0].ledger_id
    real = offload_pass.record

    def relist_first(logs_, name, done, *args):
        if target in done:
            logs.unlist_ledger(name, target)
            logs.append_ledgers(name, [target])         # listed again: offsets 15..19
        return real(logs_, name, done, *args)
    monkeypatch.setattr(offload_pass, "record", relist_first)
    assert run(logs, log_name, max_ledgers=1) == {}
    assert logs.entry_of(log_name, target).offloaded is None
    assert _visible(where, log_name) == []
    monkeypatch.setattr(offload_pass, "record", real)
    run(logs, log_name)
    assert _table(where, log_name).column("offset").to_pylist() == list(range(5, 20))


def test_a_ledger_is_published_whole_or_not_at_all(bk, logs, log_name, tmp_path, monkeypatch):
    """A ledger of several files whose last entry does not decode, or which a cut deletes
    while it is read: none of its files is published (before: the first ones were, and the
    sweep kept them -- a listed ledger's)."""
    from bkspark.log import Position
    monkeypatch.setattr(offload_pass, "FILE_ENTRY_BYTES", 1)      # a file per entry
    logs.create(log_name)
    good = [encode_record(f"v{j}".encode(), timestamp_us=1) for j in range(3)]
    logs.append_ledgers(log_name, [closed_ledger(bk, good + [b"\xffBKR\x01\x02\x00"])])
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)
    where = Location(str(tmp_path))
    with pytest.raises(offload.OffloadError, match="entry 3 does not decode"):
        run(logs, log_name)
    assert _visible(where, log_name) == [] and os.listdir(where.log_dir(log_name)) == []
    other = f"{log_name}-cut"
    _offloading(bk, logs, other, tmp_path, 2)
    first, second = (e.ledger_id for e in logs.segments(other))
    real_write = Location.write

    def write_then_cut(self, path, table):
        got = real_write(self, path, table)
        if logs.entry_of(other, first) is not None:
            logs.truncate(other, Position(second, 0))       # deletes the ledger being read
        return got
    monkeypatch.setattr(Location, "write", write_then_cut)
    run(logs, other, max_ledgers=1)
    assert not [f for f in _visible(where, other) if f.endswith(f"-{first}.parquet")]


def test_the_sweep_judges_files_on_a_synced_read(bk, logs, log_name, tmp_path, monkeypatch):
    """The sweep lists the files, then syncs the log's head, then reads what the log lists: a
    file is never deleted on a store server's older view (on ZooKeeper a read may lag the
    writes of another process -- one that listed and offloaded the ledger meanwhile)."""
    where = _offloading(bk, logs, log_name, tmp_path, 1)
    run(logs, log_name)
    calls = []
    real_sync, real_get_many = logs.store.sync, logs.store.get_many
    real_files = Location.files
    monkeypatch.setattr(Location, "files",
                        lambda self, d: calls.append("list") or real_files(self, d))
    monkeypatch.setattr(logs.store, "sync", lambda path="/": calls.append(("sync", path))
                        or real_sync(path))
    monkeypatch.setattr(logs.store, "get_many", lambda paths, *a, **k: calls.append("read")
                        or real_get_many(paths, *a, **k))
    assert collect_orphans(logs, log_name) == []
    assert calls.index("list") < calls.index(("sync", f"/logs/{log_name}")) < \
        len(calls) - 1 - calls[::-1].index("read")
    assert _table(where, log_name).num_rows == 5


# ---- the bookies' copy dropped: the files are the only copy ---------------------------------

def _dropping(bk, logs, name, tmp_path, ledgers, keep_ms=0, **fill):
    """:func:`_offloading`, the policy dropping the bookies' copy ``keep_ms`` after; every
    entry's bytes, read from the bookies before anything is dropped."""
    where = _offloading(bk, logs, name, tmp_path, ledgers, **fill)
    logs.set_offload(name, OffloadPolicy(str(tmp_path), after_ms=1, keep_on_bookies_ms=keep_ms))
    return where, read_all(logs, name)


def _exists(bk, lid) -> bool:
    try:
        bk.ledger_metadata(lid)
        return True
    except errors.NoSuchLedgerError:
        return False


def test_the_keep_on_bookies_policy_parses_and_bad_values_name_the_fix(tmp_path):
    p = OffloadPolicy.parse(str(tmp_path), after="1h", keep="7d")
    assert p.keep_on_bookies_ms == 7 * 86_400_000
    assert OffloadPolicy.from_property(p.to_property()) == p
    assert OffloadPolicy.parse(str(tmp_path), after="1h", keep="0").keep_on_bookies_ms == 0
    assert "bookies keep their copy" in OffloadPolicy(str(tmp_path), after_ms=1).describe()
    with pytest.raises(errors.BadRequestError, match="keep_on_bookies_ms must be an int >= 0"):
        OffloadPolicy(str(tmp_path), after_ms=1, keep_on_bookies_ms=-1)
    with pytest.raises(errors.BadRequestError, match="keep-on-bookies 'soon': give"):
        OffloadPolicy.parse(str(tmp_path), after="1h", keep="soon")


def test_after_keep_on_bookies_the_copy_is_dropped_and_readers_get_the_same_bytes(
        bk, logs, log_name, tmp_path, monkeypatch):
    logs.create(log_name)
    _fill(bk, logs, log_name, 3)
    raw = [b"plain %d" % i for i in range(4)] + [b"", b"\xff\x00 not a record"]
    logs.append_ledgers(log_name, [closed_ledger(bk, raw)])          # a producer's own bytes
    _fill(bk, logs, log_name, 2, start=100)
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1,
                                             keep_on_bookies_ms=3_600_000))
    before = read_all(logs, log_name)
    time.sleep(0.01)
    now = logs.store.clock.now_ms()
    run(logs, log_name, now_ms=now)
    entries = logs.segments(log_name)
    assert [e.offloaded.get("encoding") for e in entries] == ["record"] * 3 + ["raw"] + \
        ["record"] * 2
    assert offload_pass.drop_copies(logs, log_name, now_ms=now) == []      # kept an hour
    dropped = offload_pass.drop_copies(logs, log_name, now_ms=now + 3_600_001)
    assert dropped == [e.ledger_id for e in entries[:-1]]        # never the last listed
    assert not any(_exists(bk, lid) for lid in dropped) and _exists(bk, entries[-1].ledger_id)
    again = logs.segments(log_name)
    assert [offload.on_bookies(e.offloaded) for e in again] == [False] * 5 + [True]
    assert read_all(logs, log_name) == before                           # byte for byte
    third = again[2]
    from bkspark.log import Position
    from bkspark.log import reader as reader_module
    passes = []
    real = reader_module.read_entries
    monkeypatch.setattr(reader_module, "read_entries", lambda *a: passes.append(a[3]) or real(*a))
    with logs.open_reader(log_name, Position(third.ledger_id, 3), tail=False,
                          batch_size=2) as r:
        assert [x.data for x in r] == before[13:]
    assert len(passes) == 3             # one pass over each dropped ledger's files, not a batch
    stats = logs.stats(log_name)
    assert stats["dropped_entries"] == 26 and stats["dropped_bytes"] == \
        sum(e.length for e in entries[:-1])
    assert offload_pass.drop_copies(logs, log_name, now_ms=now + 3_600_001) == []
    assert offload.progress_of(logs.properties(log_name), offload.DROPPED)["next"] == \
        again[-1].seq


def test_a_ledger_whose_files_do_not_give_back_its_entries_keeps_its_copy(
        bk, logs, log_name, tmp_path):
    from bkspark.spark import codec
    logs.create(log_name)
    mixed = [encode_record(b"v", key=b"k"), b"plain"]          # two encodings in one ledger
    logs.append_ledgers(log_name, [closed_ledger(bk, mixed)])
    # a record without a value and bytes after it (decoded without them): the entries'
    # bytes chained are those re-encoded, split otherwise -- the check counts boundaries
    from bkspark.log.records import MAGIC
    shifted = [encode_record(b"v0", key=b"k"), MAGIC + bytes([1, 8]) + MAGIC + bytes([1, 0]),
               b"hello"]
    logs.append_ledgers(log_name, [closed_ledger(bk, shifted)])
    # plain bytes, then a record without a value (no raw entry gives it back)
    logs.append_ledgers(log_name, [closed_ledger(bk, [b"plain", encode_record(None, key=b"k")])])
    schema = pa.schema([("id", pa.int64())])
    batch = pa.RecordBatch.from_arrays([pa.array(range(100))], schema=schema)
    arrow = {}
    for compression in ("zstd", None):          # each given back compressed as it was
        lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw",
                              custom_metadata=codec.arrow_ledger_metadata(schema, "{}"))
        lh.append(bytes(codec.encode_arrow(batch, compression)))
        lh.append(bytes(codec.encode_arrow(batch.slice(10, 5), compression)))
        lh.close()
        logs.append_ledgers(log_name, [lh.ledger_id])
        arrow[compression] = lh.ledger_id
    _fill(bk, logs, log_name, 2)
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1, keep_on_bookies_ms=0))
    before = read_all(logs, log_name)
    time.sleep(0.01)
    run(logs, log_name)
    entries = logs.segments(log_name)
    assert [e.offloaded.get("encoding") for e in entries] == [None] * 3 + [
        "arrow+zstd", "arrow", "record", "record"]
    dropped = offload_pass.drop_copies(logs, log_name)
    assert dropped == [arrow["zstd"], arrow[None], entries[5].ledger_id]  # others passed over
    assert all(_exists(bk, e.ledger_id) for e in entries[:3])
    assert read_all(logs, log_name) == before
    got = codec.decode_arrow(before[10], schema)                # (the slice, uncompressed)
    assert got.column(0).to_pylist() == list(range(10, 15))


def test_a_crash_between_marking_and_deleting_is_finished_by_the_next_pass(
        bk, logs, log_name, tmp_path, monkeypatch):
    _, before = _dropping(bk, logs, log_name, tmp_path, 3)
    run(logs, log_name)
    ids = [e.ledger_id for e in logs.segments(log_name)]

    def crash(ledger_ids):
        raise errors.MetadataConnectionError("the process died here")
    monkeypatch.setattr(logs.bk, "delete_ledgers", crash)
    with lost_answers(logs.store, count=1):             # and the mark's answer lost
        with pytest.raises(errors.MetadataConnectionError):
            offload_pass.drop_copies(logs, log_name)
    assert [offload.on_bookies(e.offloaded) for e in logs.segments(log_name)] == \
        [False, False, True]
    assert all(_exists(bk, lid) for lid in ids)         # marked, not deleted yet
    assert read_all(logs, log_name) == before           # (read from the files already)
    monkeypatch.undo()
    assert offload_pass.drop_copies(logs, log_name) == ids[:2]
    assert not _exists(bk, ids[0]) and not _exists(bk, ids[1])
    assert read_all(logs, log_name) == before


def test_a_reader_whose_ledger_is_dropped_under_it_goes_on_from_the_files(
        bk, logs, log_name, tmp_path, cluster, monkeypatch):
    from bkspark.log import EARLIEST
    from bkspark.testing.cluster import bookie_http
    _, before = _dropping(bk, logs, log_name, tmp_path, 3)
    run(logs, log_name)
    with logs.open_reader(log_name, EARLIEST, tail=False, batch_size=3) as r:
        got = [x.data for x in r.read_batch()]          # from the bookies, through a handle
        offload_pass.drop_copies(logs, log_name)
        for b in cluster.bookies:                       # their entries gone too
            assert bookie_http(b, "/api/v1/bookie/gc", "POST", {}, timeout=60)[0] == 200
        stale = r._locate                               # the list as read before the drop
        monkeypatch.setattr(r, "_locate", lambda first, nxt: monkeypatch.undo() or
                            stale(first, nxt).copy(offloaded=None))
        got += [x.data for x in r]
    assert got == before
    assert not _exists(bk, logs.segments(log_name)[0].ledger_id)


def test_missing_files_keep_the_copy_and_a_cut_removes_a_dropped_ledger(
        bk, logs, log_name, tmp_path):
    from bkspark.log import Position
    where, before = _dropping(bk, logs, log_name, tmp_path, 4)
    run(logs, log_name)
    entries = logs.segments(log_name)
    os.remove(os.path.join(where.log_dir(log_name), entries[1].offloaded["files"][0]["name"]))
    with pytest.raises(offload.OffloadError, match="is missing; the bookies keep their copy"):
        offload_pass.drop_copies(logs, log_name)
    assert [_exists(bk, e.ledger_id) for e in entries] == [False, True, True, True]
    assert read_all(logs, log_name) == before
    logs.truncate(log_name, Position(entries[2].ledger_id, 0))    # cuts a dropped ledger
    assert [e.ledger_id for e in logs.segments(log_name)] == [e.ledger_id for e in entries[2:]]
    assert sorted(os.listdir(where.log_dir(log_name))) == sorted(
        e.offloaded["files"][0]["name"] for e in entries[2:])
    assert read_all(logs, log_name) == before[10:]


# ---- two offloaders, and what the review of the drop found ------------------------------------

def _second_store(cluster):
    """Another process's view: its own client and LogStore."""
    from bkspark.client import BookKeeper
    from bkspark.log import LogStore
    other = BookKeeper(cluster.metadata_uri)
    return other, LogStore(other, password=b"pw", ensemble_size=3, write_quorum=2, ack_quorum=2)


def test_an_offloader_that_lost_the_race_never_replaces_the_record_the_drop_relied_on(
        bk, logs, log_name, tmp_path, cluster, monkeypatch):
    """A has written ledger 0's files; meanwhile B offloads, records and drops it. A publishes
    nothing over B's files and records nothing over B's record: the ledger stays readable
    from the files B's record names."""
    where, before = _dropping(bk, logs, log_name, tmp_path, 3)
    other, logs_b = _second_store(cluster)
    real = offload_pass.offload_ledger
    calls = []

    def slow_a(logs_, name, entry, where_, now_ms=None):
        if not calls:
            calls.append(1)
            offload_pass.run(logs_b, name)
            assert offload_pass.drop_copies(logs_b, name)
        return real(logs_, name, entry, where_, now_ms)
    monkeypatch.setattr(offload_pass, "offload_ledger", slow_a)
    assert offload_pass.run(logs, log_name) == {}               # every ledger B's
    monkeypatch.undo()
    segs = logs.segments(log_name)
    assert [offload.on_bookies(e.offloaded) for e in segs] == [False, False, True]
    assert read_all(logs, log_name) == before
    first = segs[0]             # and a record of another offloader is never written over
    theirs = {**first.offloaded, "at": first.offloaded["at"] + 1, "on_bookies": True}
    assert offload.record(logs, log_name, {first.ledger_id: theirs}, None) == {first.ledger_id}
    assert logs.segments(log_name)[0].offloaded == first.offloaded
    assert sorted(os.listdir(where.log_dir(log_name))) == sorted(
        e.offloaded["files"][0]["name"] for e in segs)
    other.close()


def test_a_drop_deletes_only_what_its_stored_change_marked(
        bk, logs, log_name, tmp_path, cluster, monkeypatch):
    """The mark's first attempt loses to a change of ledger 0's record: the attempt that is
    stored does not mark it, and it is not deleted (it was before: the first attempt's
    choice was kept)."""
    _, before = _dropping(bk, logs, log_name, tmp_path, 3)
    run(logs, log_name)
    segs = logs.segments(log_name)
    other, logs_b = _second_store(cluster)
    rec0 = segs[0].offloaded
    real_update = logs.update
    raced = []

    def update(name, change, **kw):
        def racing(edit):
            change(edit)
            if not raced:
                raced.append(1)
                logs_b.update(name, lambda e: e.mark_offloaded(segs[0].ledger_id,
                                                               {**rec0, "at": rec0["at"] + 1}))
        return real_update(name, racing, **kw)
    monkeypatch.setattr(logs, "update", update)
    assert offload_pass.drop_copies(logs, log_name) == [segs[1].ledger_id]
    monkeypatch.undo()
    assert _exists(bk, segs[0].ledger_id) and not _exists(bk, segs[1].ledger_id)
    assert read_all(logs, log_name) == before
    other.close()


def test_a_ledger_that_does_not_offload_keeps_no_other_ledger_on_the_bookies(
        bk, logs, log_name, tmp_path):
    """The service drops the others' copies all the same, and the stats count only what was
    dropped (not what the drop passed over and the bookies keep)."""
    from bkspark.recovery.retention import RetentionService
    logs.create(log_name)
    _fill(bk, logs, log_name, 3)
    logs.append_ledgers(log_name, [closed_ledger(bk, [b"\xffBKR\x01\x02\x00"])])  # undecodable
    _fill(bk, logs, log_name, 1, start=100)
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1, keep_on_bookies_ms=0))
    time.sleep(0.01)
    service = RetentionService(bk, "test-offload-drop")
    service.run_once()
    assert service.dropped_ledgers == 3 and service.offload_failures >= 1
    # a ledger passed over (no encoding: mixed entries) is not counted as dropped
    name2 = f"{log_name}-kept"
    logs.create(name2)
    _fill(bk, logs, name2, 1)
    logs.append_ledgers(name2, [closed_ledger(bk, [encode_record(b"v"), b"plain"])])
    _fill(bk, logs, name2, 2, start=10)
    logs.set_offload(name2, OffloadPolicy(str(tmp_path), after_ms=1, keep_on_bookies_ms=0))
    time.sleep(0.01)
    run(logs, name2)
    assert len(offload_pass.drop_copies(logs, name2)) == 2
    stats = logs.stats(name2)
    segs = logs.segments(name2)
    assert stats["dropped_entries"] == 10 and stats["dropped_bytes"] == \
        segs[0].length + segs[2].length
    assert offload_pass.kept_runs([[0, 5, 0, 50]] * 70, [])[0] == [0, 5, 0, 50]


def test_an_arrow_column_named_like_the_offload_columns_is_offloaded_and_read(
        bk, logs, log_name, tmp_path):
    from bkspark.spark import codec
    schema = pa.schema([("_entry_id", pa.string()), ("v", pa.int64())])
    lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw",
                          custom_metadata=codec.arrow_ledger_metadata(schema, "{}"))
    for i in range(3):
        lh.append(bytes(codec.encode_arrow(pa.RecordBatch.from_arrays(
            [pa.array([f"x{i}", None]), pa.array([i, -i])], schema=schema))))
    lh.close()
    logs.create(log_name)
    logs.append_ledgers(log_name, [lh.ledger_id])
    _fill(bk, logs, log_name, 1)
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1, keep_on_bookies_ms=0))
    before = read_all(logs, log_name)
    time.sleep(0.01)
    assert len(run(logs, log_name)) == 2
    assert logs.segments(log_name)[0].offloaded.get("encoding") == "arrow"
    assert offload_pass.drop_copies(logs, log_name) == [lh.ledger_id]
    assert read_all(logs, log_name) == before


def test_a_seek_by_time_reading_a_ledger_whose_copy_is_dropped_goes_on_from_the_files(
        bk, logs, log_name, tmp_path, cluster):
    from bkspark.spark.reader import _ledger_entries
    from bkspark.testing.cluster import bookie_http
    _, before = _dropping(bk, logs, log_name, tmp_path, 3)
    run(logs, log_name)
    entry = logs.segments(log_name)[0]
    got = _ledger_entries(logs, log_name, entry, entry.last_entry_id, chunk=2)
    first = [next(got), next(got)]                      # from the bookies
    offload_pass.drop_copies(logs, log_name)
    for b in cluster.bookies:
        assert bookie_http(b, "/api/v1/bookie/gc", "POST", {}, timeout=60)[0] == 200
    rest = list(got)                                    # the files, from entry 2 on
    assert [eid for eid, _ in first + rest] == list(range(5))
    assert [bytes(d) for _, d in first + rest] == before[:5]


def test_what_the_second_review_of_the_drop_found(bk, logs, log_name, tmp_path, monkeypatch):
    """A NaN offloads (verification said a NaN differed from itself, and stopped the log's
    offload for good); entries a writer split from one batch are given back byte for byte
    (a slice encoded otherwise); a drop pass that scanned a kept ledger another pass already
    counted does not count it twice; a malformed kept list is ignored."""
    from bkspark.spark import codec
    schema = pa.schema([("x", pa.float64()), ("s", pa.string())])
    big = pa.RecordBatch.from_arrays([pa.array([float("nan"), 1.5, None] * 4000),
                                      pa.array(["a", None, "bc"] * 4000)], schema=schema)
    lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw",
                          custom_metadata=codec.arrow_ledger_metadata(schema, "{}"))
    pieces = list(codec.split_batch(big, 40 << 10))
    assert len(pieces) > 2
    for p in pieces:
        lh.append(bytes(codec.encode_arrow(p, "lz4")))
    lh.close()
    logs.create(log_name)
    logs.append_ledgers(log_name, [lh.ledger_id])
    logs.append_ledgers(log_name, [closed_ledger(bk, [encode_record(b"v"), b"mixed"])])  # kept
    _fill(bk, logs, log_name, 2)
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1, keep_on_bookies_ms=0))
    before = read_all(logs, log_name)
    time.sleep(0.01)
    assert len(run(logs, log_name)) == 4
    segs = logs.segments(log_name)
    assert [e.offloaded.get("encoding") for e in segs] == ["arrow+lz4", None, "record", "record"]
    stale = logs.properties(log_name)               # a pass that scanned before another moved
    assert offload_pass.drop_copies(logs, log_name) == [lh.ledger_id, segs[2].ledger_id]
    assert read_all(logs, log_name) == before
    mark = offload.progress_of(logs.properties(log_name), offload.DROPPED)
    real = logs.properties

    def rewound(name):                      # (the other pass's view: the mark not moved yet)
        return stale if name == log_name else real(name)
    logs.update(log_name, lambda e: e.properties.update({offload.DROPPED: {**mark, "next": 2}}))
    monkeypatch.setattr(logs, "properties", rewound)
    offload_pass.drop_copies(logs, log_name)
    monkeypatch.undo()
    got = offload.progress_of(logs.properties(log_name), offload.DROPPED)["kept"]
    assert got == [[segs[1].offset, 2, segs[1].byte_offset, segs[1].length]]
    # junk in the mark's kept list: ignored by the stats and the next drop
    logs.update(log_name, lambda e: e.properties.update(
        {offload.DROPPED: {**mark, "kept": [7, [0, 5, 0, None], ["0", 5, 0, 10]]}}))
    assert logs.stats(log_name)["dropped_entries"] == mark["offset"]
    assert offload_pass.kept_runs(7, []) == [] and offload.valid_runs([[1, 2, 3, True]]) == []


@pytest.mark.parametrize("same_rows", [True, False], ids=["same-rows", "other-rows"])
def test_a_file_replaced_with_other_bytes_is_dropped_only_if_it_gives_back_its_entries(
        bk, logs, log_name, tmp_path, same_rows):
    """A racing offloader of another pyarrow build may replace a published file with the
    same rows in other bytes: the drop accepts it once it gives back the entries it is
    recorded with (before: its size alone stopped every later drop of the log, for good);
    a file whose rows differ stops the drop, naming it, and the bookies keep their copy."""
    where, before = _dropping(bk, logs, log_name, tmp_path, 3)
    run(logs, log_name)
    first = logs.segments(log_name)[0]
    path = f"{where.log_dir(log_name)}/{first.offloaded['files'][0]['name']}"
    t = pq.read_table(path)
    if not same_rows:
        values = t.column("value").to_pylist()
        t = t.set_column(t.schema.get_field_index("value"), "value",
                         pa.array([b"changed"] + values[1:], pa.binary()))
    pq.write_table(t, path, compression="snappy")           # (zstd, as offloaded, before)
    assert os.path.getsize(path) != first.offloaded["files"][0]["bytes"]
    if same_rows:
        assert offload_pass.drop_copies(logs, log_name) == \
            [e.ledger_id for e in logs.segments(log_name)[:2]]
        assert read_all(logs, log_name) == before
        return
    with pytest.raises(offload.OffloadError, match="does not give back entries 0..4"):
        offload_pass.drop_copies(logs, log_name)
    assert _exists(bk, first.ledger_id) and offload.on_bookies(
        logs.segments(log_name)[0].offloaded)


def test_many_small_arrow_entries_are_merged_while_their_file_fills(bk, logs, log_name,
                                                                    tmp_path, monkeypatch):
    """A file of many one-row Arrow entries holds merged batches, not one per entry (each
    kept its objects and its entry's buffer: ~4 KB an entry for a few bytes of rows, GBs
    for a file of a million entries); the split and the rows are unchanged."""
    from bkspark.spark import codec
    monkeypatch.setattr(offload_pass, "ARROW_MERGE_BATCHES", 4)
    schema = pa.schema([("id", pa.int8())])
    lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw",
                          custom_metadata=codec.arrow_ledger_metadata(schema, "{}"))
    for i in range(22):
        lh.append(bytes(codec.encode_arrow(pa.record_batch([pa.array([i], pa.int8())],
                                                           schema=schema))))
    lh.close()
    logs.create(log_name)
    logs.append_ledgers(log_name, [lh.ledger_id])
    logs.set_offload(log_name, OffloadPolicy(str(tmp_path), after_ms=1))
    time.sleep(0.01)
    written = []
    real = Location.write
    monkeypatch.setattr(Location, "write",
                        lambda self, path, table: written.append(table) or real(self, path, table))
    run(logs, log_name)
    assert [t.column("id").num_chunks for t in written] == [7]     # 5 merged + 2 pending
    assert pq.read_table(Location(str(tmp_path)).log_dir(log_name)).column(
        "id").to_pylist() == list(range(22))
