"""Lost answers and cut-off writers (issue 26), on both metadata stores and real bookies.

A metadata write whose answer is lost may have been applied. The log layer must settle it
from what is stored (after a sync), never delete a ledger the log may list, and a writer cut
off from bookies or metadata must learn that it was fenced once it can read the metadata.
The lost answers are injected in the store client (:func:`metadata.testing.lost_answers`):
the write really is applied (on ZooKeeper the connection really drops), only its answer is
replaced by a connection error.
"""
from __future__ import annotations

import dataclasses
import time

import pytest

from bkspark import errors
from bkspark.client import BookKeeper
from bkspark.log import EARLIEST, CheckpointStore, LogStore
from metadata.layout import ledger_path, log_path
from metadata.log_entry import LogLedger
from metadata.log_segments import LogHead, encode_segment, ledger_index_path, segment_path
from metadata.testing import lost_answers
from metadata.update import OutcomeUnknownError


def read_all(logs, name):
    with logs.open_reader(name, EARLIEST, tail=False) as reader:
        return [r.data for r in reader]


def closed_ledger(bk, datas, ensemble_size=3):
    lh = bk.create_ledger(ensemble_size=ensemble_size, write_quorum=2, ack_quorum=2,
                          password=b"pw")
    for d in datas:
        lh.append(d)
    lh.close()
    return lh.ledger_id


def assert_every_listed_ledger_exists(bk, logs, name):
    md, _ = logs.get(name)
    for lid in md.ledger_ids():
        bk.ledger_metadata(lid)         # NoSuchLedgerError if a listed ledger was deleted


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_roll_whose_answer_was_lost_keeps_the_log_readable(bk, logs, log_name, applied):
    writer = logs.open_writer(log_name)
    first = [b"a%d" % i for i in range(3)]
    for d in first:
        writer.append(d)
    old_ledger = writer.ledger_id
    with lost_answers(bk.store, log_path(log_name), applied=applied) as injected:
        writer.roll()
    assert injected.lost == [("transaction", log_path(log_name))]
    assert writer.ledger_id != old_ledger
    second = [b"b%d" % i for i in range(3)]
    for d in second:
        writer.append(d)
    writer.close()
    assert_every_listed_ledger_exists(bk, logs, log_name)
    assert read_all(logs, log_name) == first + second
    with logs.open_writer(log_name) as again:       # a new writer opens the log as usual
        again.append(b"c")
    assert read_all(logs, log_name) == first + second + [b"c"]


def test_roll_in_doubt_is_settled_by_the_next_append(bk, logs, log_name):
    """The roll's answer is lost and the store stays out of reach: the roll reports an
    unknown outcome; once the store answers, the next append settles it (the new ledger was
    listed) and goes on in that ledger."""
    writer = logs.open_writer(log_name)
    writer.append(b"a")
    with lost_answers(bk.store, log_path(log_name), unreachable_after=True):
        with pytest.raises(OutcomeUnknownError):
            writer.roll()
    writer.append(b"b")
    listed = logs.get(log_name)[0].ledger_ids()
    assert listed[-1] == writer.ledger_id and len(listed) == 2
    writer.close()
    assert_every_listed_ledger_exists(bk, logs, log_name)
    assert read_all(logs, log_name) == [b"a", b"b"]


def test_open_writer_whose_answer_was_lost_writes_its_listed_ledger(bk, logs, log_name):
    logs.create(log_name)
    with lost_answers(bk.store, log_path(log_name)) as injected:
        writer = logs.open_writer(log_name)
    assert injected.lost == [("transaction", log_path(log_name))]
    md, _ = logs.get(log_name)
    assert md.ledger_ids() == [writer.ledger_id], "one open, one listed ledger"
    writer.append(b"x")
    writer.close()
    assert read_all(logs, log_name) == [b"x"]


def test_checkpoint_compaction_survives_lost_answers(bk, logs, log_name):
    query = log_name[-60:]
    store = CheckpointStore(logs, query, compact_after=3)
    ckpt_log = log_path(store.log_name)
    with lost_answers(bk.store, ckpt_log, count=2) as injected:
        for batch in range(8):          # compacts twice: a roll and a truncate each
            store.commit(batch, {"batch": batch})
    assert len(injected.lost) == 2
    store.close()
    assert_every_listed_ledger_exists(bk, logs, store.log_name)
    with CheckpointStore(logs, query) as reopened:
        assert reopened.latest() == (7, {"batch": 7})
        assert reopened.batch_ids() == list(range(8))


def test_commit_whose_answer_was_lost_is_applied_exactly_once(bk, logs, log_name):
    first = closed_ledger(bk, [b"r1", b"r2"])
    logs.create(log_name)
    with lost_answers(bk.store, log_path(log_name)) as injected:
        assert logs.append_ledgers(log_name, [first], writer_id="job", sequence=0) is True
    assert injected.lost == [("transaction", log_path(log_name))]
    # Spark re-runs the tasks (new ledgers) and commits the same sequence again
    retry = closed_ledger(bk, [b"r1", b"r2"])
    assert logs.append_ledgers(log_name, [retry], writer_id="job", sequence=0) is False
    assert logs.get(log_name)[0].ledger_ids() == [first]
    with pytest.raises(errors.NoSuchLedgerError):
        bk.ledger_metadata(retry)        # the duplicate was proven unlisted and deleted
    assert read_all(logs, log_name) == [b"r1", b"r2"]


def test_commit_in_doubt_keeps_its_ledgers(bk, logs, log_name):
    """The answer is lost and the store stays out of reach: the commit reports an unknown
    outcome (not a failure), and no cleanup deletes what it may have listed."""
    lid = closed_ledger(bk, [b"only"])
    logs.create(log_name)
    with lost_answers(bk.store, log_path(log_name), unreachable_after=True):
        with pytest.raises(OutcomeUnknownError):
            logs.append_ledgers(log_name, [lid], writer_id="job", sequence=0)
        with pytest.raises(errors.MetadataConnectionError):
            logs.delete_unreferenced(log_name, [lid])     # cannot prove: deletes nothing
    bk.ledger_metadata(lid)
    assert logs.get(log_name)[0].ledger_ids() == [lid]    # it had been applied
    assert logs.delete_unreferenced(log_name, [lid]) == []
    assert read_all(logs, log_name) == [b"only"]


def test_a_write_issued_before_a_cleanup_cannot_list_what_it_deleted(bk, logs, log_name):
    """A commit whose answer was lost may still be on its way; the cleanup's proof (a
    compare-and-set of the list) makes that write fail instead of listing a deleted ledger."""
    logs.create(log_name)
    lid = closed_ledger(bk, [b"late"])
    data, version = bk.store.get(log_path(log_name))
    head = LogHead.deserialize(data)
    late_write = bk.store.transaction()             # an append of lid, built on that head
    late_write.set(log_path(log_name), dataclasses.replace(head, next=head.next + 1).serialize(),
                   version=version)
    late_write.create(segment_path(log_name, head.next), encode_segment(LogLedger(lid)))
    late_write.create(ledger_index_path(log_name, lid), str(head.next).encode())
    assert logs.delete_unreferenced(log_name, [lid]) == [lid]
    with pytest.raises(errors.BadVersionError):
        late_write.commit()
    assert_every_listed_ledger_exists(bk, logs, log_name)


def test_log_delete_whose_answer_was_lost(bk, logs, log_name):
    lid = closed_ledger(bk, [b"x"])
    logs.append_ledgers(log_name, [lid])
    path = log_path(log_name)
    with lost_answers(bk.store, lambda op, p: p == path) as injected:
        logs.delete(log_name)
    assert injected.lost == [("transaction", log_path(log_name))]
    assert not logs.exists(log_name)
    with pytest.raises(errors.NoSuchLedgerError):
        bk.ledger_metadata(lid)


# ---- cut off, then fenced ---------------------------------------------------------------

@pytest.fixture
def quick_bk(cluster):
    """A client that replaces an unanswering bookie after 1 s."""
    with BookKeeper(cluster.metadata_uri, add_timeout=1.0) as client:
        yield client


def _silence(cluster, i, ledger_id):
    """Bookie ``i`` takes ``ledger_id``'s adds and never answers them (a bookie this client
    cannot reach, while everything else can)."""
    cluster.set_faults(i, [dict(op="add", action="drop", ledger_id=ledger_id)])


def _first_of_ensemble(cluster, bk, ledger_id, entry_id=3):
    """Index in the cluster of the first bookie of ``entry_id``'s write set."""
    ensemble = bk.ledger_metadata(ledger_id).last_ensemble()
    return cluster.bookie_ids.index(ensemble[entry_id % len(ensemble)])


def _wait_failed(handle, timeout=60.0):
    deadline = time.monotonic() + timeout
    while handle.failure is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handle.failure is not None, "the handle should have failed"
    return handle.failure


def test_log_writer_cut_off_from_bookies_learns_it_was_fenced(cluster, bk, quick_bk, log_name):
    """E=3 on three bookies, one silent: the ensemble change finds no replacement and the
    writer's ledger fails with NotEnoughBookiesError. After the heal a new writer takes the log
    over. The old writer's next appends must say LogFencedError, not repeat the first error."""
    old_logs = LogStore(quick_bk, password=b"pw", ensemble_size=3, write_quorum=2, ack_quorum=2)
    old = old_logs.open_writer(log_name)
    acked = [old.append(b"a%d" % i) for i in range(3)]
    victim = _first_of_ensemble(cluster, bk, old.ledger_id)    # in entry 3's write set
    _silence(cluster, victim, old.ledger_id)
    try:
        pending = old.append_async(b"in-doubt")
        with pytest.raises(errors.NotEnoughBookiesError):
            pending.result(60)
    finally:
        cluster.clear_faults(victim)
    new = LogStore(bk, password=b"pw").open_writer(log_name)
    new.append(b"b0")
    for _ in range(3):
        with pytest.raises(errors.LogFencedError):
            old.append(b"after-takeover")
    new.close()
    data = read_all(LogStore(bk, password=b"pw"), log_name)
    assert data[:3] == [b"a0", b"a1", b"a2"] and data[-1] == b"b0" and len(acked) == 3
    assert b"after-takeover" not in data


def test_log_writer_cut_off_resumes_in_a_new_ledger_when_nobody_took_over(cluster, bk, quick_bk,
                                                                         log_name):
    old_logs = LogStore(quick_bk, password=b"pw", ensemble_size=3, write_quorum=2, ack_quorum=2)
    writer = old_logs.open_writer(log_name)
    writer.append(b"a0")
    first_ledger = writer.ledger_id
    victim = _first_of_ensemble(cluster, bk, first_ledger, entry_id=1)
    _silence(cluster, victim, first_ledger)
    try:
        with pytest.raises(errors.NotEnoughBookiesError):
            writer.append_async(b"not-written").result(60)
    finally:
        cluster.clear_faults(victim)
    writer.append(b"a1")                # closes the failed ledger at its LAC, goes on
    assert writer.ledger_id != first_ledger
    writer.close()
    assert read_all(old_logs, log_name) == [b"a0", b"a1"]


def test_ledger_handle_cut_off_from_metadata_learns_it_was_fenced(cluster, bk, quick_bk):
    """The ensemble change cannot reach the metadata store (its writes are refused and the
    store cannot be re-read): the handle fails with an unknown outcome. After the heal another
    client recovers the ledger; the old handle then reports FencedError."""
    lh = quick_bk.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"pw")
    lh.append(b"e0")
    victim = _first_of_ensemble(cluster, bk, lh.ledger_id, entry_id=1)
    path = ledger_path(lh.ledger_id)
    _silence(cluster, victim, lh.ledger_id)
    try:
        with lost_answers(quick_bk.store, path, count=100, applied=False,
                          unreachable_after=True) as injected:
            with pytest.raises(errors.MetadataConnectionError):
                lh.append_async(b"e1").result(60)
            assert isinstance(_wait_failed(lh), errors.MetadataConnectionError)
            assert injected.lost
        cluster.clear_faults(victim)                                    # the heal
        recovered = bk.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert recovered.metadata.state.name == "CLOSED"
        with pytest.raises(errors.FencedError):
            lh.append(b"e2")
        with pytest.raises(errors.FencedError):
            lh.append(b"e3")
    finally:
        cluster.clear_faults(victim)
