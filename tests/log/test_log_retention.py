"""Automatic retention (issue 30, item 4): per-log policies by age and size, cursors holding
them back (or not), applied by a pass that reads what it removes, and by the elected service
of autorecovery. On both metadata stores, with real bookies and real ledgers where ledgers are
deleted or read."""
from __future__ import annotations

import json
import time

import pytest

from bkspark import errors
from bkspark.log import EARLIEST, Position
from bkspark.log.retention import (
    RetentionPolicy,
    enforce,
    parse_duration_ms,
    parse_size_bytes,
    plan,
)
from metadata.layout import log_path
from metadata.testing import lost_answers

from .test_log_segments import append_fake, closed_ledger, counted, read_all

HOUR = 3_600_000


# ---- the policy (pure) ---------------------------------------------------------------------

def test_policy_values_parse_with_units_and_bad_ones_name_the_fix():
    assert parse_duration_ms("7d") == 7 * 24 * HOUR and parse_duration_ms("90s") == 90_000
    assert parse_duration_ms("1500") == 1500 and parse_duration_ms(250) == 250
    assert parse_duration_ms("1.5h") == HOUR * 3 // 2 and parse_duration_ms("2w") == 14 * 24 * HOUR
    assert parse_size_bytes("10GiB") == 10 << 30 and parse_size_bytes("500MB") == 500_000_000
    assert parse_size_bytes("64k") == 64 << 10 and parse_size_bytes(4096) == 4096
    with pytest.raises(errors.BadRequestError, match="give milliseconds or a number with a unit"):
        parse_duration_ms("7 days")
    with pytest.raises(errors.BadRequestError, match="must be more than 0"):
        parse_size_bytes("0")
    for huge in ("9" * 400, "9000000000TiB", "1" + "0" * 30):  # (an OverflowError before)
        with pytest.raises(errors.BadRequestError, match="is too large: give at most 2"):
            parse_size_bytes(huge)
    with pytest.raises(errors.BadRequestError, match="is too large"):
        parse_duration_ms("9" * 400)
    with pytest.raises(errors.BadRequestError, match="retention ms must be a positive int"):
        RetentionPolicy(ms=-1)
    with pytest.raises(errors.BadRequestError, match="bad retention property"):
        RetentionPolicy.from_property({"ms": 5, "days": 3})
    policy = RetentionPolicy(ms=7 * 24 * HOUR, bytes=10 << 30)
    assert RetentionPolicy.from_property(policy.to_property()) == policy
    assert policy.describe() == "1w, 10GiB, keeps cursors active within 1w"
    assert RetentionPolicy().keeps_everything and RetentionPolicy.from_property(None) is None


# ---- one pass ---------------------------------------------------------------------------------

def write_ledgers(bk, logs, name, count, entries=3, size=100):
    """``count`` real closed ledgers of ``entries`` entries of ``size`` bytes, appended one
    commit each (so each gets its own closed_ms)."""
    ids = []
    for i in range(count):
        lid = closed_ledger(bk, [bytes([65 + i % 26]) * size for _ in range(entries)])
        logs.append_ledgers(name, [lid])
        ids.append(lid)
    return ids


def gone(bk, lid) -> bool:
    try:
        bk.ledger_metadata(lid)
        return False
    except errors.NoSuchLedgerError:
        return True


def test_size_retention_keeps_the_log_within_one_ledger_of_its_limit(bk, logs, log_name):
    ids = write_ledgers(bk, logs, log_name, 8)              # 300 bytes each
    assert logs.closed_bytes(log_name) == 2400
    logs.set_retention(log_name, RetentionPolicy(bytes=1000))
    cut = enforce(logs, log_name)
    # Kafka's rule: a ledger goes while the log without it still holds >= 1000 bytes
    assert cut.removed == ids[:4] and cut.by_size == 4 and cut.by_age == 0
    assert logs.get(log_name)[0].ledger_ids() == ids[4:]
    assert logs.closed_bytes(log_name) == 1200 and all(gone(bk, lid) for lid in ids[:4])
    assert read_all(logs, log_name) == [bytes([65 + i]) * 100 for i in range(4, 8) for _ in range(3)]
    assert enforce(logs, log_name).removed == []            # within the policy now
    stats = logs.stats(log_name)
    assert (stats["segments"], stats["entries"], stats["bytes"]) == (4, 12, 1200)
    assert (stats["first_offset"], stats["end_offset"]) == (12, 24)


def test_age_retention_never_removes_the_last_or_an_open_ledger(bk, logs, log_name):
    ids = write_ledgers(bk, logs, log_name, 4)
    logs.set_retention(log_name, RetentionPolicy(ms=HOUR))
    assert enforce(logs, log_name).removed == []            # all younger than an hour
    later = int(time.time() * 1000) + 2 * HOUR
    cut = enforce(logs, log_name, now_ms=later)
    assert cut.removed == ids[:3] and cut.by_age == 3       # the last one stays: offsets go on
    assert logs.get(log_name)[0].ledger_ids() == ids[3:]
    # a streaming writer's open ledger at the end: the closed one before it may go, not it
    with logs.open_writer(log_name) as w:
        w.append(b"tail")
        listed = logs.get(log_name)[0].ledgers
        assert listed[-1].state == "open"
        cut = enforce(logs, log_name, now_ms=later)
        assert cut.removed == ids[3:] and logs.get(log_name)[0].ledger_ids() == [w.ledger_id]
        assert enforce(logs, log_name, now_ms=later + 10 * HOUR).removed == []
        w.append(b"more")
    assert read_all(logs, log_name) == [b"tail", b"more"]
    # offsets continue where the removed ledgers left them
    assert logs.offset_range(log_name) == (12, 14)


def test_an_active_cursor_holds_retention_back_an_idle_one_does_not(bk, logs, log_name):
    ids = write_ledgers(bk, logs, log_name, 6)
    logs.set_retention(log_name, RetentionPolicy(bytes=300, cursor_active_ms=HOUR))
    logs.commit_cursor(log_name, "slow", Position(ids[2], 1))
    logs.commit_cursor(log_name, "fast", Position(ids[5], 0))
    cut = enforce(logs, log_name)
    assert cut.removed == ids[:2] and cut.held_by == "slow"
    assert logs.cursor_lags(log_name)["slow"][1] == 2 + 3 * 3
    # a cursor keeps its own ledger, also once read to its end
    logs.commit_cursor(log_name, "slow", Position(ids[3], 3))
    assert enforce(logs, log_name).removed == [ids[2]]
    logs.commit_cursor(log_name, "fast", Position(ids[4], 0))
    assert enforce(logs, log_name).removed == []
    # once idle for longer than cursor_active_ms a cursor holds nothing
    assert enforce(logs, log_name, now_ms=int(time.time() * 1000) + 2 * HOUR).removed == [ids[3], ids[4]]
    # a cursor record written before cursors carried a time counts as active
    logs.store.set(f"{log_path(log_name)}/cursors/fast",
                   json.dumps(Position(-1, 0).to_json()).encode())
    assert logs.cursor_records(log_name)["fast"] == (Position(-1, 0), None)


def test_passing_cursors_leaves_a_reader_behind_the_cut_to_find_its_data_gone(bk, logs, log_name):
    ids = write_ledgers(bk, logs, log_name, 4)
    logs.commit_cursor(log_name, "behind", Position(ids[0], 0))
    logs.set_retention(log_name, RetentionPolicy(bytes=300, pass_cursors=True))
    assert enforce(logs, log_name).removed == ids[:3]
    assert logs.cursor_lags(log_name)["behind"][1] == 3          # the whole (remaining) log
    with pytest.raises(errors.BKError, match="no longer in the log"):
        with logs.open_reader(log_name, logs.cursor(log_name, "behind"), tail=False) as reader:
            list(reader)


def test_a_pass_reads_what_it_removes_whatever_the_log_length(logs, log_name):
    # 5,000 segments (metadata only): a pass that removes 100 reads about that many records
    # and commits one truncation plus batches of the removed records
    for start in range(10_000, 15_000, 500):          # (a ZooKeeper request stays < 1 MB)
        append_fake(logs, log_name, list(range(start, start + 500)))
    policy = RetentionPolicy(bytes=4_900)               # each fake ledger is 1 byte
    logs.set_retention(log_name, policy)
    with counted(logs.store) as seen:
        cut = plan(logs, log_name, policy)
    assert cut.before == 100 and seen["reads"] < 400
    with counted(logs.store) as seen:
        removed = logs.truncate_segments(log_name, cut.before)
        logs.collect_truncated(log_name)
    assert len(removed) == 100 and seen["reads"] < 1500 and max(seen["txn_ops"]) <= 2 * 64 + 2
    assert logs.bounds(log_name)[0] == 100 and logs.closed_bytes(log_name) == 4_900
    head = logs.store.get(log_path(log_name))[0]
    assert len(head) < 600


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_a_truncation_whose_answer_was_lost_removes_exactly_the_policy(bk, logs, log_name, applied):
    ids = write_ledgers(bk, logs, log_name, 5)
    logs.set_retention(log_name, RetentionPolicy(bytes=600))
    with lost_answers(bk.store, lambda op, p: op == "transaction" and p == log_path(log_name),
                      applied=applied) as injected:
        cut = enforce(logs, log_name)
    assert injected.lost and cut.removed == ids[:3]
    assert logs.get(log_name)[0].ledger_ids() == ids[3:]
    assert all(gone(bk, lid) for lid in ids[:3]) and not any(gone(bk, lid) for lid in ids[3:])


def test_policy_is_set_at_creation_changed_and_removed(logs, log_name):
    policy = RetentionPolicy(ms=HOUR)
    logs.create(log_name, retention=policy)
    assert logs.retention(log_name) == policy
    logs.create(log_name, retention=RetentionPolicy(bytes=5))   # exists: left as it is
    assert logs.retention(log_name) == policy
    logs.set_retention(log_name, RetentionPolicy(bytes=5, pass_cursors=True))
    assert logs.retention(log_name) == RetentionPolicy(bytes=5, pass_cursors=True)
    logs.set_retention(log_name, None)
    assert logs.retention(log_name) is None
    assert enforce(logs, log_name).removed == []
    with pytest.raises(errors.NoSuchLogError):
        logs.set_retention(log_name + "-none", policy)


# ---- the service ------------------------------------------------------------------------------

def test_autorecovery_applies_policies_with_one_elected_enforcer(cluster, bk, logs, log_name):
    from bkspark.recovery.service import AutoRecovery, AutoRecoveryConfig
    ids = write_ledgers(bk, logs, log_name, 5)
    config = AutoRecoveryConfig(run_auditor=False, run_worker=False, retention_interval=0.3)
    with AutoRecovery(cluster.metadata_uri, config, "ar-1") as one, \
            AutoRecovery(cluster.metadata_uri, config, "ar-2") as two:
        logs.set_retention(log_name, RetentionPolicy(bytes=600))
        deadline = time.monotonic() + 30
        while logs.get(log_name)[0].ledger_ids() != ids[3:]:
            assert time.monotonic() < deadline, "the retention service did not apply the policy"
            time.sleep(0.2)
        # one enforcer at a time (leadership may move under load, so both may have served):
        # the three ledgers were cut once, not once per enforcer
        while one.retention.removed + two.retention.removed < 3:
            assert time.monotonic() < deadline, "the removals were never counted"
            time.sleep(0.05)
        assert one.retention.removed + two.retention.removed == 3
        assert not (one.retention.is_leader and two.retention.is_leader)
        # more data: the next passes keep the log at its policy
        more = write_ledgers(bk, logs, log_name, 3)
        while logs.get(log_name)[0].ledger_ids() != more[1:]:
            assert time.monotonic() < deadline, "the retention service stopped applying it"
            time.sleep(0.2)
    assert all(gone(bk, lid) for lid in ids + more[:1])
    assert read_all(logs, log_name) == [bytes([65 + i]) * 100 for i in (1, 2) for _ in range(3)]


def test_a_pass_plans_again_only_logs_whose_head_changed_or_whose_oldest_ledger_aged(bk, logs,
                                                                                    log_name):
    """Issue 51: a pass over idle logs is a pipelined read of their heads; a log is planned
    again when its head changes, when its oldest ledger reaches the policy's age, and every
    pass while a cursor holds its cut (cursors move without the head)."""
    from bkspark.recovery.retention import RetentionService
    quiet = [f"{log_name}-q{i:02d}" for i in range(40)]
    for i, name in enumerate(quiet):
        append_fake(logs, name, [900_000 + 10 * i, 900_001 + 10 * i])
        if i % 2:
            logs.set_retention(name, RetentionPolicy(bytes=1 << 20))   # within its bound
    aged, held = f"{log_name}-aged", f"{log_name}-held"
    aged_ids = write_ledgers(bk, logs, aged, 2)
    logs.set_retention(aged, RetentionPolicy(ms=3000))
    held_ids = write_ledgers(bk, logs, held, 3)
    logs.commit_cursor(held, "c", Position(held_ids[0], 0))
    logs.set_retention(held, RetentionPolicy(bytes=300))
    service = RetentionService(bk, "test-retention")
    assert service.run_once() == {}
    total = len(logs.list_logs())
    with counted(logs.store) as seen:
        assert service.run_once() == {}
    # every head once, and the held log planned again (~15 reads); before: ~14 reads a log
    assert seen["reads"] <= total + 30, seen
    logs.commit_cursor(held, "c", Position(held_ids[2], 0))       # the head does not change
    assert service.run_once() == {held: held_ids[:2]}
    logs.set_retention(quiet[0], RetentionPolicy(bytes=1))         # a quiet log changes
    append_fake(logs, quiet[0], [990_000])
    assert list(service.run_once()) == [quiet[0]]
    time.sleep(3.2)                                                # the aged log's first ledger
    assert service.run_once() == {aged: aged_ids[:1]}              # (never the last)


def test_a_node_under_logs_that_is_not_a_log_stops_no_pass(bk, logs, log_name):
    """A child of /logs with an invalid name (written by another tool) is left out of the
    listing: the retention pass still reaches every real log (before, it failed the whole
    pipelined read of its chunk, every pass)."""
    from bkspark.recovery.retention import RetentionService
    ids = write_ledgers(bk, logs, log_name, 3)
    logs.set_retention(log_name, RetentionPolicy(bytes=300))
    logs.store.create(f"/logs/.not a log {log_name}", b"{}")
    try:
        assert f".not a log {log_name}" not in logs.list_logs()
        assert RetentionService(bk, "test-bad-name").run_once()[log_name] == ids[:2]
    finally:
        logs.store.delete(f"/logs/.not a log {log_name}")
