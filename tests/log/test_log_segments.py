"""Segmented log metadata (issue 30): a head plus one record per ledger, changed by transactions
whose size does not depend on the list's length; format-1 logs converted; bounded writer keys.
On both metadata stores (``cluster`` is parametrized), with real bookies where ledgers are read."""
from __future__ import annotations

import contextlib
import itertools
import threading
import time

import pytest

from bkspark import errors
from bkspark.log import LogStore, Position
from bkspark.log import segments as seg
from metadata import log_segments as ls
from metadata.layout import log_path
from metadata.log_metadata import LogMetadata
from metadata.testing import lost_answers

from .helpers import closed_ledger, read_all


def closed(lid, n=1):
    return dict(state="closed", last_entry_id=n - 1, length=n)


def append_fake(logs, name, ids):
    """List ledger ids through the public update API (metadata only: no bookie is asked)."""
    def change(edit):
        edit.prefetch(ids)
        for lid in ids:
            edit.append(lid, **closed(lid))
    logs.update(name, change, create=True)


@contextlib.contextmanager
def counted(store):
    """Count the operations of every transaction and the records read, while inside."""
    seen = {"txn_ops": [], "reads": 0}
    commit, get, get_many = store._commit, store.get, store.get_many

    def count_commit(ops):
        seen["txn_ops"].append(len(ops))
        return commit(ops)

    def count_get(path):
        seen["reads"] += 1
        return get(path)

    def count_get_many(paths, *a, **k):
        seen["reads"] += len(paths)
        return get_many(paths, *a, **k)
    store._commit, store.get, store.get_many = count_commit, count_get, count_get_many
    try:
        yield seen
    finally:
        for attr in ("_commit", "get", "get_many"):
            store.__dict__.pop(attr, None)


def test_a_long_log_costs_each_change_and_read_what_it_touches(logs, bk, log_name):
    # 50,000 segments built through the public API; then an append, a range read and a
    # refresh of a reader's copy each cost a few records, and the head stays small
    n = 50_000
    logs.create(log_name)
    for start in range(0, n, 1000):
        append_fake(logs, log_name, range(10_000 + start, 10_000 + start + 1000))
    head_data, _ = bk.store.get(log_path(log_name))
    assert len(head_data) < 1024
    md, _ = logs.get(log_name)                      # the whole list, once
    assert len(md.ledgers) == n and md.ledger_ids()[:2] == [10_000, 10_001]
    assert [e.offset for e in md.ledgers[:3]] == [0, 1, 2] and md.ledgers[-1].offset == n - 1
    with counted(bk.store) as seen:
        append_fake(logs, log_name, [99])
    assert seen["txn_ops"] == [1 + 2]               # head + segment + ledger index record
    assert seen["reads"] <= 2 + ls.GC_BATCH          # the head, the tail the change looks at
    with counted(bk.store) as seen:
        md, _ = logs.get(log_name)                  # this store's copy, brought up to date
    assert md.ledger_ids()[-2:] == [10_000 + n - 1, 99] and md.ledgers[-1].offset == n
    assert seen["reads"] <= 1 + seg.OPEN_TAIL + 1
    with counted(bk.store) as seen:
        part = logs.segments(log_name, 25_000, 25_010)
    assert [e.ledger_id for e in part] == list(range(35_000, 35_010))
    assert seen["reads"] == 1 + 10
    assert logs.lists(log_name, 40_000) and not logs.lists(log_name, 7)
    assert len(bk.store.get(log_path(log_name))[0]) == len(head_data)
    # a streaming micro-batch's planning: from a position to the end, reading only that range
    from bkspark.spark.reader import resolve_start, spans
    with counted(bk.store) as seen:
        got = spans(logs, log_name, Position(10_000 + n - 1, 0), None, True)
        latest = resolve_start(logs, log_name, "latest")
    assert [(lid, first, last) for lid, first, last, _ in got] == [(10_000 + n - 1, 0, 0), (99, 0, 0)]
    assert got[-1][3].offset == n and latest == Position(99, 1)
    assert seen["reads"] <= 12
    # a reader from a position near the end reads the head and its segments, not the list
    real = closed_ledger(bk, [b"r0", b"r1"])
    logs.append_ledgers(log_name, [real])
    with counted(bk.store) as seen:
        with logs.open_reader(log_name, Position(real, 0), tail=False) as reader:
            assert [r.data for r in reader] == [b"r0", b"r1"]
    assert seen["reads"] <= 25


def test_truncation_is_one_small_change_and_its_records_go_in_batches(logs, bk, log_name):
    logs.create(log_name)
    append_fake(logs, log_name, range(1000, 1300))
    with counted(bk.store) as seen:
        logs.update(log_name, lambda edit: edit.truncate_before(edit.entry(1250).seq))
    assert len(seen["txn_ops"]) == 1 and seen["txn_ops"][0] <= 1 + 2 * ls.GC_BATCH
    md, _ = logs.get(log_name)
    assert md.ledger_ids() == list(range(1250, 1300))
    assert [e.offset for e in md.ledgers[:2]] == [250, 251]       # offsets are kept
    assert not logs.lists(log_name, 1000) and logs.lists(log_name, 1250)
    store = bk.store
    left = lambda: len(store.children(ls.segments_path(log_name)))  # noqa: E731
    assert left() == 300                            # (the truncation itself reads nothing more)
    for _ in range(4):                              # commits leave them alone (quick attempts)
        append_fake(logs, log_name, [next_id(logs, log_name)])
    assert left() == 304
    with counted(bk.store) as seen:                 # the truncating caller removes them
        assert logs.collect_truncated(log_name) == 4            # 250 records, a batch each
    assert all(n <= 1 + 2 * ls.GC_BATCH for n in seen["txn_ops"])
    head = ls.LogHead.deserialize(store.get(log_path(log_name))[0])
    assert head.gc == head.first == 250 and head.next == 304
    assert left() == 54 and len(store.children(ls.ledgers_index_path(log_name))) == 54


def test_a_truncation_and_its_collection_finish_under_a_stream_of_commits(logs, bk, log_name):
    """What the retention service meets: writers committing back to back while it cuts. The
    cut and the removal of its records must win the head between commits (their attempts
    read nothing but the head), and the commits must stay the size of what they append."""
    logs.create(log_name)
    append_fake(logs, log_name, range(20_000, 20_300))
    stop = threading.Event()
    errors_seen: list = []
    sizes: list[int] = []
    commit = bk.store._commit

    def counting(ops):
        sizes.append(len(ops))
        return commit(ops)

    ids = itertools.count(10**9)            # (apart from every other test's fake ids)

    def writer(w):
        try:
            while not stop.is_set():
                append_fake(logs, log_name, [next(ids)])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors_seen.append(exc)
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.2)
        removed = logs.truncate_segments(log_name, logs.entry_of(log_name, 20_250).seq)
        bk.store._commit = counting
        time.sleep(0.3)                             # commits after the cut
    finally:
        stop.set()
        for t in threads:
            t.join()
        bk.store.__dict__.pop("_commit", None)
    assert not errors_seen
    assert removed == list(range(20_000, 20_250))
    head = ls.LogHead.deserialize(bk.store.get(log_path(log_name))[0])
    assert head.gc == head.first                    # every truncated record removed
    assert len(bk.store.children(ls.segments_path(log_name))) == head.next - head.first
    assert sizes and max(sizes) <= 4                # head + segment + index (+ a parent)


_fake_ids = itertools.count(5000)


def next_id(logs, name):
    return next(_fake_ids)


def test_format1_log_is_read_as_is_and_converted_on_first_write(logs, bk, log_name):
    # a record written by the single-record code (format 1), with writer keys and epochs
    lids = [closed_ledger(bk, [b"a%d" % i for i in range(3)]) for _ in range(3)]
    v1 = LogMetadata(log_name, writers={"q1": 7}, properties={"epoch:q1": 2, "writer_epoch": 4})
    for lid in lids:
        v1 = v1.with_ledger(lid, state="closed", last_entry_id=2, length=6)
    bk.store.create(log_path(log_name), v1.with_offsets().serialize())
    md, _ = logs.get(log_name)                      # read without converting
    assert md.ledger_ids() == lids and md.writers == {"q1": 7}
    assert ls.format_version(bk.store.get(log_path(log_name))[0]) == 1
    assert read_all(logs, log_name) == [b"a%d" % i for i in range(3)] * 3
    # an old writer's retried commit is still recognised, and an old owner epoch still fences
    assert logs.append_ledgers(log_name, [closed_ledger(bk, [b"dup"])], writer_id="q1", sequence=7) is False
    with pytest.raises(errors.LogFencedError):
        logs.append_ledgers(log_name, [closed_ledger(bk, [b"old"])], writer_id="q1", sequence=8, epoch=1)
    new = closed_ledger(bk, [b"b"])
    assert logs.append_ledgers(log_name, [new], writer_id="q1", sequence=8, epoch=2)
    head = ls.LogHead.deserialize(bk.store.get(log_path(log_name))[0])
    assert (head.first, head.next) == (0, 4)
    assert {k: v for k, v in head.properties.items() if k != ls.RECENT_PROPERTY} == \
        {"writer_epoch": 4}             # (the head's recent stamps are a property of their own)
    assert head.writers["q1"]["seq"] == 8 and head.writers["q1"]["epoch"] == 2
    md, _ = logs.get(log_name)
    assert md.ledger_ids() == lids + [new] and [e.offset for e in md.ledgers] == [0, 3, 6, 9]
    assert read_all(logs, log_name) == [b"a%d" % i for i in range(3)] * 3 + [b"b"]


def write_format1(store, name, ids):
    """A log record as the format-1 code writes it, listing closed fake ledgers ``ids``."""
    v1 = LogMetadata(name)
    for lid in ids:
        v1 = v1.with_ledger(lid, **closed(lid))
    store.create(log_path(name), v1.serialize())
    return v1


def test_conversion_interrupted_before_the_head_is_set_is_redone(logs, bk, log_name):
    store = bk.store
    v1 = write_format1(store, log_name, range(700, 705))
    data, version = store.get(log_path(log_name))
    # the first attempt wrote every record, then died before the head's compare-and-set
    with lost_answers(store, lambda op, p: op == "set" and p == log_path(log_name), applied=False) as lost:
        seg.convert_v1(store, log_name, data, version)
    assert lost.lost and len(store.children(ls.segments_path(log_name))) == 5
    assert ls.format_version(store.get(log_path(log_name))[0]) == 1
    # meanwhile an old client truncates the format-1 list
    store.set(log_path(log_name), v1.without_ledgers([700, 701]).serialize(), version=version)
    assert logs.get(log_name)[0].ledger_ids() == [702, 703, 704]
    assert logs.convert(log_name) is True
    assert logs.get(log_name)[0].ledger_ids() == [702, 703, 704]
    assert len(store.children(ls.segments_path(log_name))) == 3        # leftovers removed
    assert not logs.lists(log_name, 700) and logs.lists(log_name, 704)
    assert logs.convert(log_name) is False
    append_fake(logs, log_name, [705])
    assert logs.get(log_name)[0].ledger_ids() == [702, 703, 704, 705]


def test_expired_writer_keys_never_let_a_retried_commit_apply_twice(logs, bk, log_name, monkeypatch):
    logs.create(log_name)
    now = [1_000_000_000_000]
    monkeypatch.setattr(bk.store.clock, "now_ms", lambda fresh=False: now[0])
    assert logs.append_ledgers(log_name, [closed_ledger(bk, [b"1"])], writer_id="old", sequence=1)
    started_new = now[0] + 1
    now[0] += ls.WRITER_KEY_MAX_AGE_MS + 1
    # another writer's commit expires the idle key
    assert logs.append_ledgers(log_name, [closed_ledger(bk, [b"2"])], writer_id="w", sequence=0,
                               writer_started_ms=now[0])
    head = ls.LogHead.deserialize(bk.store.get(log_path(log_name))[0])
    assert set(head.writers) == {"w"} and head.expired["count"] == 1
    # the expired writer retries its commit: refused, not applied a second time
    with pytest.raises(ls.WriterKeyExpiredError, match="new writer id"):
        logs.append_ledgers(log_name, [closed_ledger(bk, [b"1 again"])], writer_id="old", sequence=1)
    with pytest.raises(ls.WriterKeyExpiredError):    # started before the expiry: still unsure
        logs.append_ledgers(log_name, [closed_ledger(bk, [b"1 again"])], writer_id="old", sequence=1,
                            writer_started_ms=started_new)
    # a writer that started after the expired key's last commit cannot own it
    assert logs.append_ledgers(log_name, [closed_ledger(bk, [b"3"])], writer_id="fresh", sequence=0,
                               writer_started_ms=now[0])
    assert read_all(logs, log_name) == [b"1", b"2", b"3"]


def test_a_rerun_whose_key_was_expired_by_newer_writers_is_refused(logs, bk, log_name,
                                                                     monkeypatch):
    """(writerId, 0) commits, its key is expired by the most-recent bound, and the job is run
    again (a fresh start time): refused, not applied a second time -- the expired writer ids
    stay in the log's filter. A writer id the log never saw still commits."""
    monkeypatch.setattr(ls, "WRITER_KEYS_MAX", 20)
    logs.create(log_name)
    assert logs.append_ledgers(log_name, [closed_ledger(bk, [b"job7"])], writer_id="job7",
                               sequence=0, writer_started_ms=ls.now_ms())
    for i in range(20):
        logs.append_ledgers(log_name, [], writer_id=f"other-{i}", sequence=0,
                            writer_started_ms=ls.now_ms())
    head = ls.LogHead.deserialize(bk.store.get(log_path(log_name))[0])
    assert "job7" not in head.writers and head.expired["filtered"] == head.expired["count"] == 1
    rerun = closed_ledger(bk, [b"job7"])
    with pytest.raises(ls.WriterKeyExpiredError, match="never seen"):
        logs.append_ledgers(log_name, [rerun], writer_id="job7", sequence=0,
                            writer_started_ms=ls.now_ms() + 1)
    assert logs.append_ledgers(log_name, [closed_ledger(bk, [b"new"])], writer_id="brand-new",
                               sequence=0, writer_started_ms=0)
    assert read_all(logs, log_name) == [b"job7", b"new"]


def test_the_filter_of_expired_writer_ids_holds_what_it_was_given():
    bits = None
    for i in range(300):
        bits = ls.ExpiredWriters.add(bits, f"w{i}")
    assert all(ls.ExpiredWriters.holds(bits, f"w{i}") for i in range(300))
    assert not ls.ExpiredWriters.holds(None, "w1")
    assert len(bits) == ls.FILTER_BITS // 8
    # one shard given 300 ids: few of 10,000 other ids look held (a Bloom filter's odds)
    false = sum(ls.ExpiredWriters.holds(bits, f"x{i}") for i in range(10_000))
    assert false < 200
    assert {ls.ExpiredWriters.shard(f"w{i}") for i in range(2000)} == set(range(ls.FILTER_SHARDS))


def test_the_filter_keeps_refusing_few_new_ids_as_expired_ids_grow():
    """A fixed Bloom filter saturates (one of 256 x 4096 bits refused 23% of new ids at 250,000
    expired ids, 99% at 1 million); generations that double keep the odds of refusing a new
    id below ~0.2% per generation (measured 2026-11-27: 0.18% at 100,000, 0.41% at 300,000,
    0.60% at 1 million expired ids). The records and generations are the ones a log writes
    (:meth:`ExpiredWriters.generation` / ``shard`` / ``add``), filled in memory."""
    records: dict = {}
    n = 300_000
    for i in range(n):
        wid = f"job-{i}"
        g = ls.ExpiredWriters.generation(i)
        key = (g, ls.ExpiredWriters.shard(wid, g))
        records[key] = ls.ExpiredWriters.add(records.get(key), wid, g)
    gens = ls.ExpiredWriters.generations(n)
    assert gens == 3 and {g for g, _ in records} == set(range(gens))

    def held(wid):
        return any(ls.ExpiredWriters.holds(records.get((g, ls.ExpiredWriters.shard(wid, g))),
                                           wid, g) for g in range(gens))
    assert all(held(f"job-{i}") for i in range(0, n, 997))
    refused = sum(held(f"new-{i}") for i in range(20_000))
    assert refused < 200, refused             # (one generation of 256 records: 36%)
    assert all(len(bits) == ls.FILTER_BITS // 8 for bits in records.values())


def test_expired_ids_past_the_first_generation_are_refused_on_both_stores(logs, bk, log_name,
                                                                           monkeypatch):
    """Small generations (2 records of 3 ids, doubling): 60 writers commit while only one key
    is kept, so 59 ids expire into 4 generations of records under the log. Every expired id is
    refused, an id the log never saw commits, and deleting the log removes every record."""
    monkeypatch.setattr(ls, "WRITER_KEYS_MAX", 1)
    monkeypatch.setattr(ls, "FILTER_SHARDS", 2)
    monkeypatch.setattr(ls, "SHARD_CAPACITY", 3)
    logs.create(log_name)
    for i in range(60):
        logs.append_ledgers(log_name, [], writer_id=f"w{i}", sequence=0,
                            writer_started_ms=ls.now_ms())
    head = ls.LogHead.deserialize(bk.store.get(log_path(log_name))[0])
    assert head.expired["filtered"] == 59 and ls.ExpiredWriters.generations(59) == 4
    assert bk.store.children(ls.expired_writers_path(log_name, 3))
    for i in range(59):
        with pytest.raises(ls.WriterKeyExpiredError):
            logs.append_ledgers(log_name, [], writer_id=f"w{i}", sequence=0,
                                writer_started_ms=ls.now_ms())
    assert logs.append_ledgers(log_name, [closed_ledger(bk, [b"x"])], writer_id="never-seen",
                               sequence=0, writer_started_ms=ls.now_ms())
    logs.delete(log_name)
    assert bk.store.exists(ls.expired_writers_path(log_name)) is None


def test_writer_keys_are_bounded_by_count(monkeypatch):
    monkeypatch.setattr(ls, "WRITER_KEYS_MAX", 3)
    head = ls.LogHead("x")
    for i in range(5):
        head.writers[f"w{i}"] = {"seq": i, "t": 100 + i, "epoch": None}
    ls.expire_writers(head, 200, keep="w0")
    assert set(head.writers) == {"w0", "w4", "w3"}
    assert head.expired == {"count": 2, "t": 102}
    assert ls.may_be_expired(head, "w1", None) and ls.may_be_expired(head, "w9", 102)
    assert not ls.may_be_expired(head, "w9", 102 + ls.CLOCK_SKEW_MS + 1)
    assert not ls.may_be_expired(head, "w3", None)


def test_delete_removes_every_record_and_ledger(logs, bk, log_name):
    append_fake(logs, log_name, [6001, 6002])
    logs.update(log_name, lambda edit: edit.truncate_before(edit.entry(6002).seq))
    lid = closed_ledger(bk, [b"x"])
    logs.append_ledgers(log_name, [lid])
    logs.commit_cursor(log_name, "c", Position(6002, 0))
    logs.delete(log_name)
    assert not logs.exists(log_name)
    assert bk.store.exists(log_path(log_name)) is None
    with pytest.raises(errors.NoSuchLedgerError):
        bk.ledger_metadata(lid)
    logs.create(log_name)                           # the name is free again, a new log
    assert logs.get(log_name)[0].ledgers == []


def test_create_finishes_an_interrupted_delete_and_makes_a_new_log(logs, bk, log_name):
    lid = closed_ledger(bk, [b"x"])
    logs.append_ledgers(log_name, [lid])

    def mark(edit):                                 # a delete that stopped after its mark
        edit.properties[seg.DELETED] = True
    logs.update(log_name, mark)
    assert not logs.exists(log_name)
    logs.create(log_name)
    assert logs.get(log_name)[0].ledgers == []
    with pytest.raises(errors.NoSuchLedgerError):   # the old log's ledger went with it
        bk.ledger_metadata(lid)


def test_create_of_an_existing_log_reads_its_head_only(logs, log_name):
    """Spark calls create for every micro-batch of a query: it must not read the list."""
    append_fake(logs, log_name, list(range(8001, 8041)))
    reads = []
    real_get, real_get_many = logs.store.get, logs.store.get_many
    logs.store.get = lambda path, *a, **k: reads.append(path) or real_get(path, *a, **k)
    logs.store.get_many = lambda paths, *a, **k: reads.extend(paths) or real_get_many(paths, *a, **k)
    try:
        LogStore(logs.bk).create(log_name)          # a new LogStore: nothing cached
    finally:
        del logs.store.get, logs.store.get_many
    ours = [p for p in reads if p.startswith(log_path(log_name))]
    assert ours == [log_path(log_name)], ours


def test_unlisting_a_middle_ledger_refreshes_every_copy(logs, bk, log_name):
    logs.create(log_name)
    append_fake(logs, log_name, [7001, 7002, 7003, 7004])
    assert logs.get(log_name)[0].ledger_ids() == [7001, 7002, 7003, 7004]
    logs.unlist_ledger(log_name, 7002)
    assert logs.get(log_name)[0].ledger_ids() == [7001, 7003, 7004]
    assert not logs.lists(log_name, 7002) and logs.logs_listing(7003) == [log_name]




def test_sealing_a_ledger_stamps_the_offsets_listed_after_it(logs, log_name):
    # a writer may list a new ledger while the one before is still open: the new one's offset
    # is unknown until that one is sealed, and is stored then
    logs.create(log_name)
    append_fake(logs, log_name, [8001])
    logs.update(log_name, lambda edit: (edit.append(8002, state="open"), edit.append(8003, state="open")))
    assert [e.offset for e in logs.segments(log_name)] == [0, 1, None]
    logs.update(log_name, lambda edit: edit.update(8002, **closed(8002, 5)))
    assert [e.offset for e in logs.segments(log_name)] == [0, 1, 6]
    append_fake(logs, log_name, [8004])         # (8003 is open: 8004's offset waits for it)
    logs.update(log_name, lambda edit: edit.update(8003, **closed(8003, 2)))
    assert [e.offset for e in logs.segments(log_name)] == [0, 1, 6, 8]
    assert [e.offset for e in logs.get(log_name)[0].ledgers] == [0, 1, 6, 8]


def test_a_read_racing_a_truncation_reads_the_head_again(logs, bk, log_name):
    # the reader read the head, then a truncation committed and removed the records it was
    # about to read: it reads the head again instead of calling the metadata damaged
    from bkspark.log import LogStore
    logs.create(log_name)
    append_fake(logs, log_name, range(9000, 9100))
    other, store, fired = LogStore(bk, password=b"pw"), bk.store, []
    original = store.get_many

    def racing(paths, *a, **k):
        if not fired and any("/segments/" in p for p in paths):
            fired.append(paths[0])
            other.update(log_name, lambda edit: edit.truncate_before(edit.entry(9090).seq))
            other.collect_truncated(log_name)       # (the records go)
        return original(paths, *a, **k)
    store.get_many = racing
    try:
        md, _ = LogStore(bk, password=b"pw").get(log_name)
    finally:
        store.__dict__.pop("get_many", None)
    assert fired and md.ledger_ids() == list(range(9090, 9100))


def test_a_stale_conversion_changes_nothing_a_newer_one_wrote(logs, bk, log_name):
    # two clients convert: B read the format-1 record before it changed, A after; A converts
    # first, then B runs -- every write of B checks its (old) version, so none lands
    store = bk.store
    v1 = write_format1(store, log_name, range(710, 715))
    stale, stale_version = store.get(log_path(log_name))
    store.set(log_path(log_name), v1.without_ledgers([710, 711]).serialize(), version=stale_version)
    assert logs.convert(log_name) is True                                  # A
    seg.convert_v1(store, log_name, stale, stale_version)                  # B
    assert logs.get(log_name)[0].ledger_ids() == [712, 713, 714]
    assert len(store.children(ls.segments_path(log_name))) == 3
    append_fake(logs, log_name, [715])
    assert logs.get(log_name)[0].ledger_ids() == [712, 713, 714, 715]
