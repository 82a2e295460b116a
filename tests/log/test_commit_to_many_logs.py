"""One commit to many logs (issue 50: exactly-once routing by a column), on both metadata
stores and real bookies: :meth:`LogStore.append_to_logs` lists every log's ledgers in one
transaction, or none; its idempotency key lives in every log it names; a lost answer at any
metadata write of it is settled from what is stored, and a retry under the same key leaves
each ledger listed once."""
from __future__ import annotations

import itertools

import pytest

from bkspark import errors
from metadata.testing import lost_answers
from metadata.update import OutcomeUnknownError

from .helpers import closed_ledger, read_all

LOGS = 5


def _names(log_name, tag=""):
    return [f"{log_name}{tag}-{i}" for i in range(LOGS)]


def _ledgers(bk, names, tag):
    return {n: [closed_ledger(bk, [f"{tag}:{n}:{j}".encode() for j in range(3)])] for n in names}


def _expected(ledgers_by_log, tag):
    return {n: [f"{tag}:{n}:{j}".encode() for j in range(3)] for n in ledgers_by_log}


def test_a_commit_lists_every_logs_ledgers_and_its_key_in_every_log(bk, logs, log_name):
    names = _names(log_name)
    logs.create(names[0])                           # one exists; the others are created
    first = _ledgers(bk, names, "a")
    assert logs.append_to_logs(first, writer_id="job", sequence=0) is True
    assert {n: read_all(logs, n) for n in names} == _expected(first, "a")
    assert all(logs.writer_sequence(n, "job") == 0 for n in names)
    # the same key again, through any subset of the logs: applied already, nothing appended,
    # the repeat's ledgers deleted
    again = _ledgers(bk, names[2:], "b")
    assert logs.append_to_logs(again, writer_id="job", sequence=0) is False
    assert {n: read_all(logs, n) for n in names} == _expected(first, "a")
    for lid in (lid for ids in again.values() for lid in ids):
        with pytest.raises(errors.NoSuchLedgerError):
            bk.ledger_metadata(lid)


def test_a_commit_refused_in_one_log_changes_no_log(bk, logs, log_name):
    """An owner superseded in one log (a newer epoch committed there) is refused for all
    (missing logs are created first, empty, as a commit to one log does)."""
    names = _names(log_name)
    logs.append_ledgers(names[3], _ledgers(bk, names[3:4], "x")[names[3]], writer_id="q",
                        sequence=5, epoch=2)
    before = {n: read_all(logs, n) if logs.exists(n) else [] for n in names}
    with pytest.raises(errors.LogFencedError, match="superseded"):
        logs.append_to_logs(_ledgers(bk, names, "y"), writer_id="q", sequence=6, epoch=1)
    assert {n: read_all(logs, n) for n in names} == before


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_a_lost_answer_at_every_write_of_the_commit_is_settled(bk, logs, log_name, applied):
    """The answer of the k-th metadata write of the commit is lost (k = 0, 1, ...: the
    creation of each new log, then the transaction), and the caller retries under the same
    key after an unknown outcome: every log ends up holding its rows exactly once."""
    for k in itertools.count():
        names = _names(log_name, f"-k{k}")
        committed = _ledgers(bk, names, f"k{k}")
        counter = itertools.count()
        with lost_answers(bk.store, lambda op, path: next(counter) == k,
                          applied=applied) as injected:
            try:
                logs.append_to_logs(committed, writer_id="w", sequence=0)
            except OutcomeUnknownError:
                pass
        retry = _ledgers(bk, names, f"k{k}")       # the same rows, written again by a retry
        first_try_listed = all(lid in logs.get(n)[0].ledger_ids()
                               for n in names if logs.exists(n) for lid in committed[n])
        if logs.append_to_logs(retry, writer_id="w", sequence=0):
            committed = retry
        else:
            assert first_try_listed
        for n in names:
            assert read_all(logs, n) == _expected(committed, f"k{k}")[n]
            assert logs.get(n)[0].ledger_ids() == committed[n]
        if not injected.lost:
            break
    assert k >= LOGS                    # every creation and the transaction had their turn


def test_a_key_log_alone_keeps_the_writers_key_whichever_logs_a_commit_names(bk, logs,
                                                                             log_name):
    """A routed writer's commits name different logs each time; its key lives in one key
    log, changed by every commit: a repeat is recognised whatever logs it names, a stale
    owner is refused, and the target logs keep no key of it (nothing to expire there)."""
    names, keys = _names(log_name), f"__keys-{log_name}"[:200]
    first = _ledgers(bk, names[:2], "p")
    assert logs.append_to_logs(first, writer_id="r", sequence=0, epoch=1, key_log=keys)
    assert logs.writer_sequence(keys, "r") == 0
    assert all(logs.writer_sequence(n, "r") == -1 for n in names[:2])
    # batch 0 again, routed to other logs this time: applied already, nothing appended
    again = _ledgers(bk, names[3:], "p")
    assert logs.append_to_logs(again, writer_id="r", sequence=0, epoch=1, key_log=keys) is False
    assert not any(logs.exists(n) and read_all(logs, n) for n in names[3:])
    # a later batch to yet other logs, then a superseded owner
    later = _ledgers(bk, names[2:3], "q")
    assert logs.append_to_logs(later, writer_id="r", sequence=1, epoch=2, key_log=keys)
    with pytest.raises(errors.LogFencedError, match="superseded"):
        logs.append_to_logs(_ledgers(bk, names[4:], "z"), writer_id="r", sequence=2,
                            epoch=1, key_log=keys)
    # a batch without rows still moves the key
    assert logs.append_to_logs({}, writer_id="r", sequence=2, epoch=2, key_log=keys)
    assert logs.writer_sequence(keys, "r") == 2
    assert {n: read_all(logs, n) for n in names[:3]} == {**_expected(first, "p"),
                                                         **_expected(later, "q")}


def test_a_commit_too_large_for_one_transaction_is_refused_before_fencing(bk, logs, log_name,
                                                                         monkeypatch):
    """ZooKeeper drops a request over 1 MiB (a lost answer at every retry); a commit that
    would not fit is refused clearly -- before it fences the live writer of any log."""
    from metadata.store import TransactionTooLargeError
    names = _names(log_name)[:2]
    writer = logs.open_writer(names[0])
    writer.append(b"live")
    ledgers = {n: [closed_ledger(bk, [b"x"]) for _ in range(10)] for n in names}
    monkeypatch.setattr(logs.store, "max_transaction_bytes", 4000, raising=False)
    with pytest.raises(TransactionTooLargeError, match="commit fewer ledgers at once"):
        logs.append_to_logs(ledgers, writer_id="big", sequence=0)
    writer.append(b"still the writer")          # not fenced
    monkeypatch.undo()
    assert logs.append_to_logs(ledgers, writer_id="big", sequence=0)
    with pytest.raises(errors.LogFencedError):
        writer.append(b"fenced now")            # (a commit that goes through fences it)
    assert read_all(logs, names[0])[:2] == [b"live", b"still the writer"]
