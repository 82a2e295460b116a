"""Changes that take a log's tail, and lost answers settled by the writer's own token
(issue 45), on both metadata stores and real bookies.

* An overwrite, a truncation reaching the tail, an unlist or a deletion fences the writer of
  the open ledger first: its next append fails with LogFencedError, as after a takeover --
  before, an overwrite left it appending, acknowledged, into a ledger it then deleted.
* A change whose answer was lost is settled by its stamp among the head's recent stamps,
  never by the list's content: a truncation between the lost answer and the re-read made an
  append apply twice and the log name a deleted ledger.
* A ledger the log listed and truncated is never listed again.
"""
from __future__ import annotations

import pytest

from bkspark import errors
from bkspark.client import BookKeeper
from bkspark.log import LogStore
from bkspark.log.segments import LedgerTruncatedError
from metadata.layout import log_path
from metadata.log_segments import (APPLIED, NOT_APPLIED, RECENT_CHANGES, UNKNOWN, LogHead,
                                   change_outcome)
from metadata.testing import lost_answers
from metadata.update import OutcomeUnknownError

from .helpers import closed_ledger, read_all




def assert_every_listed_ledger_exists(bk, logs, name):
    for lid in logs.get(name)[0].ledger_ids():
        bk.ledger_metadata(lid)         # NoSuchLedgerError if a listed ledger was deleted


@pytest.fixture
def other(cluster):
    """A second client: another process's view of the same log."""
    with BookKeeper(cluster.metadata_uri) as client:
        yield LogStore(client, password=b"pw")


# ---- the tail's writer is fenced first -------------------------------------------------------

def test_an_overwrite_fences_the_live_writer(bk, logs, other, log_name):
    writer = logs.open_writer(log_name)
    writer.append(b"old")
    new = closed_ledger(bk, [b"new"])
    assert other.overwrite(log_name, [new])
    with pytest.raises(errors.LogFencedError):
        writer.append(b"late")          # before: acknowledged, then lost with its ledger
    writer.close()                      # (before: NoSuchLedgerError)
    assert read_all(logs, log_name) == [b"new"]
    assert_every_listed_ledger_exists(bk, logs, log_name)


def test_a_truncation_reaching_the_tail_fences_the_live_writer(bk, logs, other, log_name):
    writer = logs.open_writer(log_name)
    writer.append(b"a")
    _, nxt = other.bounds(log_name)
    assert other.truncate_segments(log_name, nxt) == [writer.ledger_id]
    with pytest.raises(errors.LogFencedError):
        writer.append(b"b")
    writer.close()
    assert logs.get(log_name)[0].ledger_ids() == []


def test_unlisting_the_open_ledger_fences_its_writer(bk, logs, other, log_name):
    writer = logs.open_writer(log_name)
    writer.append(b"a")
    other.unlist_ledger(log_name, writer.ledger_id)
    with pytest.raises(errors.LogFencedError):
        writer.append(b"b")
    writer.close()


def test_deleting_a_log_fences_its_writer(bk, logs, other, log_name):
    writer = logs.open_writer(log_name)
    writer.append(b"a")
    other.delete(log_name)
    with pytest.raises(errors.LogFencedError):
        writer.append(b"b")
    writer.close()


# ---- lost answers settled by the change's own stamp -----------------------------------------

def test_a_lost_answer_and_a_truncation_never_apply_an_append_twice(bk, logs, other, log_name):
    logs.create(log_name)
    logs.append_ledgers(log_name, [closed_ledger(bk, [b"base"])])
    mine = closed_ledger(bk, [b"x1", b"x2"])
    truncated = []
    with lost_answers(bk.store, log_path(log_name)) as injected:
        settle = bk.store.sync

        def sync(path="/"):
            if injected.lost and not truncated:     # between the lost answer and the re-read
                truncated.extend(other.truncate_segments(log_name, other.bounds(log_name)[1]))
            return settle(path)
        bk.store.sync = sync
        assert logs.append_ledgers(log_name, [mine]) is True
    assert injected.lost == [("transaction", log_path(log_name))]
    assert mine in truncated            # it had been applied, and was truncated away
    assert logs.get(log_name)[0].ledger_ids() == []     # before: [mine], a deleted ledger
    assert_every_listed_ledger_exists(bk, logs, log_name)


def test_a_lost_overwrite_and_a_truncation_are_settled_by_the_stamp(bk, logs, other, log_name):
    logs.create(log_name)
    logs.append_ledgers(log_name, [closed_ledger(bk, [b"base"])])
    mine = closed_ledger(bk, [b"new"])
    truncated = []
    with lost_answers(bk.store, log_path(log_name)) as injected:
        settle = bk.store.sync

        def sync(path="/"):
            if injected.lost and not truncated:
                truncated.extend(other.truncate_segments(log_name, other.bounds(log_name)[1]))
            return settle(path)
        bk.store.sync = sync
        assert logs.overwrite(log_name, [mine]) is True
    assert mine in truncated
    assert logs.get(log_name)[0].ledger_ids() == []
    assert_every_listed_ledger_exists(bk, logs, log_name)


def test_a_truncated_ledger_is_never_listed_again(bk, logs, log_name):
    logs.create(log_name)
    lid = closed_ledger(bk, [b"a"])
    logs.append_ledgers(log_name, [lid])
    logs.append_ledgers(log_name, [closed_ledger(bk, [b"b"])])

    def cut_without_cleanup(edit):      # the truncation stored; its deletion not yet done
        edit.truncate_before(edit.head.first + 1)
    logs.update(log_name, cut_without_cleanup)
    with pytest.raises(LedgerTruncatedError, match="listed once"):
        logs.append_ledgers(log_name, [lid])
    assert read_all(logs, log_name) == [b"b"]


def test_a_lost_answer_beyond_the_recent_stamps_is_reported_unknown(bk, logs, other, log_name):
    logs.create(log_name)
    mine = closed_ledger(bk, [b"m"])
    others = [closed_ledger(bk, [b"o%d" % i]) for i in range(RECENT_CHANGES + 1)]
    busy = []
    with lost_answers(bk.store, log_path(log_name)) as injected:
        settle = bk.store.sync

        def sync(path="/"):
            if injected.lost and not busy:          # many changes before the re-read
                for lid in others:
                    other.append_ledgers(log_name, [lid])
                busy.append(True)
                other.truncate_segments(log_name, other.bounds(log_name)[1])
            return settle(path)
        bk.store.sync = sync
        with pytest.raises(OutcomeUnknownError, match="unknown"):
            logs.append_ledgers(log_name, [mine])
    assert_every_listed_ledger_exists(bk, logs, log_name)


def test_change_outcome_reads_the_recent_stamps():
    head = LogHead(name="x", properties={"__recent": ["a", "b", "c"]})
    assert change_outcome(head, 10, "b", 8) == APPLIED
    assert change_outcome(LogHead(name="x", properties={"__recent": ["0123abcd"]}), 3,
                          "0123abcd99887766", 2) \
        == APPLIED                                               # (its token: 8 characters)
    assert change_outcome(head, 10, "z", 8) == NOT_APPLIED     # 8..10 covered, absent
    assert change_outcome(head, 10, "z", 7) == NOT_APPLIED     # its version 8 is covered
    assert change_outcome(head, 10, "z", 6) == UNKNOWN         # version 7 is not
    assert change_outcome(LogHead(name="x"), 4, "z", 4) == NOT_APPLIED
    assert change_outcome(LogHead(name="x"), 5, "z", 4) == UNKNOWN
    head = LogHead(name="x")
    for _ in range(RECENT_CHANGES + 5):
        head.restamp()
    assert len(head.recent) == RECENT_CHANGES and head.recent[-1] == head.stamp[:8]
    assert LogHead.deserialize(head.serialize()).recent == head.recent
    # clients that predate the stamps read the head: its fields are theirs (the stamps are a
    # property, which they read as any other)
    import json
    assert set(json.loads(head.serialize().partition(b"\n")[2])) == {
        "name", "uid", "first", "next", "gc", "rev", "writers", "expired", "properties", "stamp"}


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_a_commit_with_a_mark_is_settled_by_it_beyond_the_recent_stamps(bk, logs, other,
                                                                       log_name, applied):
    """A Spark job's commit creates its own record in its transaction: a lost answer is
    settled by that record however many changes came before the re-read."""
    logs.create(log_name)
    parent = f"/marks-{log_name}"
    bk.store.create(parent, b"")
    mine = closed_ledger(bk, [b"m"])
    others = [closed_ledger(bk, [b"o%d" % i]) for i in range(RECENT_CHANGES + 1)]
    busy = []
    with lost_answers(bk.store, log_path(log_name), applied=applied) as injected:
        settle = bk.store.sync

        def sync(path="/"):
            if injected.lost and not busy:
                busy.append(True)
                for lid in others:
                    other.append_ledgers(log_name, [lid])
            return settle(path)
        bk.store.sync = sync
        assert logs.append_ledgers(log_name, [mine], mark=f"{parent}/committed") is True
    assert injected.lost
    listed = logs.get(log_name)[0].ledger_ids()
    assert listed.count(mine) == 1 and len(listed) == len(others) + 1
    assert bk.store.exists(f"{parent}/committed") is not None


# ---- what the fences and settlements must not break (review of issue 45's fixes) -----------

def test_a_log_whose_open_ledger_lost_its_metadata_can_be_repaired_and_deleted(bk, logs, other,
                                                                              log_name):
    writer = logs.open_writer(log_name)
    writer.append(b"a")
    lid = writer.ledger_id
    bk.delete_ledger(lid)               # the open tail's metadata is gone: nothing to fence
    other.unlist_ledger(log_name, lid)
    assert not other.lists(log_name, lid)
    other.delete(log_name)
    assert not other.exists(log_name)


def test_deleting_a_log_whose_writer_cannot_be_fenced_needs_force(cluster, bk, logs, other,
                                                                  log_name):
    writer = logs.open_writer(log_name)
    writer.append(b"a")
    lid = writer.ledger_id
    for i in range(3):
        cluster.set_faults(i, [dict(op="fence", action="fail", ledger_id=lid),
                               dict(op="read_lac", action="fail", ledger_id=lid)])
    try:
        with pytest.raises(errors.BKError, match="force=True"):
            other.delete(log_name)
        assert other.exists(log_name)
        other.delete(log_name, force=True)
    finally:
        cluster.clear_faults()
    assert not other.exists(log_name)


def test_a_lost_answer_then_the_log_deleted_is_reported_unknown_not_applied_again(
        bk, logs, other, log_name):
    logs.create(log_name)
    mine = closed_ledger(bk, [b"m"])
    deleted = []
    with lost_answers(bk.store, log_path(log_name)) as injected:
        settle = bk.store.sync

        def sync(path="/"):
            if injected.lost and not deleted:       # between the lost answer and the re-read
                deleted.append(True)
                other.delete(log_name)              # deletes the log and the ledgers it lists
            return settle(path)
        bk.store.sync = sync
        with pytest.raises(OutcomeUnknownError, match="deleted"):
            logs.append_ledgers(log_name, [mine])
    assert not logs.exists(log_name)    # (before: created again, naming the deleted ledger)


def test_a_refused_commit_leaves_the_live_writer_alone(bk, logs, other, log_name, monkeypatch):
    from metadata import log_segments as ls
    monkeypatch.setattr(ls, "WRITER_KEYS_MAX", 2)
    logs.create(log_name)
    for w in ("job", "x", "y"):
        logs.append_ledgers(log_name, [], writer_id=w, sequence=0, writer_started_ms=ls.now_ms())
    writer = logs.open_writer(log_name)
    writer.append(b"live")
    with pytest.raises(ls.WriterKeyExpiredError):
        other.append_ledgers(log_name, [closed_ledger(bk, [b"rerun"])], writer_id="job",
                             sequence=0, writer_started_ms=ls.now_ms())
    writer.append(b"after")             # still the owner: the refusal fenced nothing
    writer.close()
    assert read_all(logs, log_name) == [b"live", b"after"]
