"""LogStore.stats_many (issue 51): what ``stats`` and ``cursor_lags`` give of a log, for many
logs at once, in pipelined reads whose number does not grow with the logs' (``bkspark shell
logs`` reads through it). On both metadata stores (``cluster`` is parametrized), with real
bookies where a ledger is open."""
from __future__ import annotations

import contextlib
import itertools
import json
import math

import pytest

from bkspark import errors
from bkspark.cli.main import main as cli
from bkspark.log import Position
from bkspark.log import segments as seg
from bkspark.log import store as store_module
from bkspark.log.retention import RetentionPolicy
from metadata.layout import log_path
from metadata.log_metadata import LogMetadata

from .helpers import closed_ledger

_fake_ids = itertools.count(9_000_000)      # ledger ids no bookie holds (closed: never opened)


def append_fake(logs, name, count, entries=3, length=30) -> list[int]:
    """List ``count`` closed ledgers of ``entries`` entries and ``length`` bytes (metadata
    only), creating the log if needed; their ids."""
    ids = [next(_fake_ids) for _ in range(count)]

    def change(edit):
        edit.prefetch(ids)
        for lid in ids:
            edit.append(lid, state="closed", last_entry_id=entries - 1, length=length)
    logs.update(name, change, create=True)
    return ids


def unlist(logs, name, lid) -> None:
    logs.update(name, lambda edit: edit.unlist(lid))


def stats_as_before(logs, name) -> dict:
    """``stats`` as the per-log code computed it before ``stats_many``: each figure from
    reads of its own (bounds, offset stamps of the ends, the whole list where they are
    missing, retention, bytes)."""
    first, nxt = logs.bounds(name)
    span = logs.offset_range(name)
    entries = span[1] - span[0] if span else sum(n for _, n in logs.entry_counts(name))
    policy = logs.retention(name)
    offload = logs.offload_policy(name)
    offloaded = [e for e in logs.segments(name) if e.offloaded is not None]
    done = sum(e.entry_count() for e in offloaded)
    dropped = [e for e in offloaded if e.offloaded.get("on_bookies") is False]
    return {"segments": nxt - first, "entries": entries, "bytes": logs.closed_bytes(name),
            "first_offset": span[0] if span else None, "end_offset": span[1] if span else None,
            "retention": policy.to_property() if policy else None,
            "offload": offload.to_property() if offload else None, "offloaded_entries": done,
            "offloaded_bytes": sum(e.length for e in offloaded),
            "offload_lag": entries - done if offload else None,
            "dropped_entries": sum(e.entry_count() for e in dropped),
            "dropped_bytes": sum(e.length for e in dropped)}


def assert_same_as_per_log(logs, names, got) -> None:
    """``got`` (stats_many with cursors) gives each log what ``stats`` and ``cursor_lags``
    give, and what the per-log code computed before."""
    for name in names:
        doc = dict(got[name])
        lags = doc.pop("cursor_lags")
        assert doc == logs.stats(name) == stats_as_before(logs, name), name
        assert lags == logs.cursor_lags(name), name


@contextlib.contextmanager
def counting(store):
    """Count the reads of the metadata store (the real store answers them) while inside."""
    calls = {"get": 0, "get_many": 0, "children": 0, "exists": 0, "sync": 0}
    for method in calls:
        def counted(*args, _real=getattr(store, method), _name=method, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        setattr(store, method, counted)
    try:
        yield calls
    finally:
        for method in calls:
            store.__dict__.pop(method, None)


def assert_pipelined(calls, logs_with_cursors, far_cursors, chunks) -> None:
    """The reads of stats_many with cursors: at most five pipelined reads a chunk of logs
    (heads, end segments, cursor nodes, cursor records, ledger index), a listing per log with
    cursors, the segment of each cursor's ledger at neither end of its log, and nothing
    else."""
    assert calls["get"] == far_cursors and calls["exists"] == 0 and calls["sync"] == 0, calls
    assert calls["get_many"] <= 5 * chunks, calls
    assert calls["children"] == logs_with_cursors, calls


def test_stats_many_gives_what_stats_gives_for_every_shape_of_log(bk, logs, log_name):
    def n(shape):
        return f"{log_name}-{shape}"
    logs.create(n("empty"))
    append_fake(logs, n("one"), 1)
    append_fake(logs, n("closed"), 7)                           # more than TAIL segments
    ids = append_fake(logs, n("truncated"), 8)
    logs.truncate_segments(n("truncated"), logs.entry_of(n("truncated"), ids[3]).seq)
    ids = append_fake(logs, n("unlisted-first"), 6)             # read on its own
    unlist(logs, n("unlisted-first"), ids[0])
    ids = append_fake(logs, n("unlisted-middle"), 6)
    unlist(logs, n("unlisted-middle"), ids[2])
    ids = append_fake(logs, n("all-unlisted"), 2)
    unlist(logs, n("all-unlisted"), ids[0])
    unlist(logs, n("all-unlisted"), ids[1])
    append_fake(logs, n("retained"), 3)
    logs.set_retention(n("retained"), RetentionPolicy(bytes=1000, ms=3_600_000))
    v1 = LogMetadata(n("format1"))                              # one record, no byte stamps
    for lid in [next(_fake_ids) for _ in range(5)]:
        v1 = v1.with_ledger(lid, state="closed", last_entry_id=1, length=20)
    bk.store.create(log_path(n("format1")), v1.serialize())
    bk.store.create(log_path(n("format1-empty")), LogMetadata(n("format1-empty")).serialize())
    # a streaming writer's open ledger after closed ones: its entries up to the LAC
    logs.append_ledgers(n("open"), [closed_ledger(bk, [b"c%d" % i for i in range(4)])])
    names = [n(s) for s in ("empty", "one", "closed", "truncated", "unlisted-first",
                            "unlisted-middle", "all-unlisted", "retained", "format1",
                            "format1-empty", "open")]
    with logs.open_writer(n("open")) as writer:
        for i in range(3):
            writer.append(b"o%d" % i)
        writer.flush()
        got = logs.stats_many(names, cursors=True)
        assert_same_as_per_log(logs, names, got)
        assert got[n("open")]["entries"] == 7 and got[n("open")]["end_offset"] == 7
    assert got[n("empty")] == {"segments": 0, "entries": 0, "bytes": 0, "first_offset": None,
                               "end_offset": None, "retention": None, "cursor_lags": {},
                               "offload": None, "offloaded_entries": 0, "offloaded_bytes": 0,
                               "offload_lag": None, "dropped_entries": 0, "dropped_bytes": 0}
    assert (got[n("closed")]["entries"], got[n("closed")]["bytes"]) == (21, 210)
    assert (got[n("truncated")]["segments"], got[n("truncated")]["first_offset"]) == (5, 9)
    assert (got[n("unlisted-first")]["entries"], got[n("unlisted-first")]["bytes"]) == (15, 150)
    # (an unlisted ledger between the ends is counted, as by closed_bytes)
    assert (got[n("unlisted-middle")]["entries"], got[n("unlisted-middle")]["bytes"]) == (18, 180)
    assert got[n("all-unlisted")]["segments"] == 2 and got[n("all-unlisted")]["entries"] == 0
    assert got[n("retained")]["retention"] == \
        RetentionPolicy(bytes=1000, ms=3_600_000).to_property()
    assert (got[n("format1")]["entries"], got[n("format1")]["bytes"]) == (10, 100)


def test_missing_invalid_and_deleted_logs_get_their_error(logs, log_name):
    append_fake(logs, log_name, 2)
    logs.create(f"{log_name}-deleting")
    logs.update(f"{log_name}-deleting", lambda edit: edit.properties.update({seg.DELETED: True}))
    names = [log_name, f"{log_name}-missing", "not/a/name", f"{log_name}-deleting", log_name]
    got = logs.stats_many(names, cursors=True)
    assert list(got) == [log_name, f"{log_name}-missing", "not/a/name", f"{log_name}-deleting"]
    assert got[log_name]["entries"] == 6 and got[log_name]["cursor_lags"] == {}
    assert isinstance(got[f"{log_name}-missing"], errors.NoSuchLogError)
    assert str(got[f"{log_name}-missing"]) == f"no log named '{log_name}-missing'"
    assert isinstance(got["not/a/name"], errors.BadRequestError)
    assert isinstance(got[f"{log_name}-deleting"], seg.LogDeletedError)
    with pytest.raises(errors.NoSuchLogError, match="no log named"):
        logs.stats(f"{log_name}-missing")
    with pytest.raises(seg.LogDeletedError):
        logs.stats(f"{log_name}-deleting")
    with pytest.raises(errors.BadRequestError, match="invalid log name"):
        logs.stats("not/a/name")


def test_a_log_that_changes_between_its_head_and_its_segments_is_read_again(bk, logs, log_name):
    ids = append_fake(logs, log_name, 8)
    before = logs.stats(log_name)
    real = bk.store.get_many
    cut = []

    def get_many(paths, *args, **kwargs):
        got = real(paths, *args, **kwargs)
        if not cut and log_path(log_name) in paths:        # right after the heads' read
            cut.append(logs.truncate_segments(log_name, logs.entry_of(log_name, ids[2]).seq))
        return got
    bk.store.get_many = get_many
    try:
        got = logs.stats_many([log_name])[log_name]
    finally:
        bk.store.__dict__.pop("get_many", None)
    assert cut == [ids[:2]]                     # (its records removed: segment 0 is gone)
    assert got == logs.stats(log_name) != before
    assert (got["segments"], got["entries"], got["first_offset"]) == (6, 18, 6)


def test_cursor_lags_of_many_logs_are_those_of_cursor_lags(bk, logs, log_name):
    def n(shape):
        return f"{log_name}-{shape}"
    ids = append_fake(logs, n("cursors"), 8)
    cursors = {"first": Position(ids[0], 1),        # the first segment: read already
               "far": Position(ids[2], 2),          # neither end: through the ledger index
               "far-too": Position(ids[2], 0),      # (the same ledger: looked up once)
               "near": Position(ids[6], 1),         # among the last segments
               "done": Position(ids[7], 99),        # past the end
               "gone": Position(123_456_789, 0),    # not listed: the whole log is ahead
               "nothing": Position(-1, 0)}          # (a cursor of an empty log)
    for cursor, position in cursors.items():
        logs.commit_cursor(n("cursors"), cursor, position)
    cut = append_fake(logs, n("truncated"), 6)
    logs.commit_cursor(n("truncated"), "behind", Position(cut[0], 1))
    logs.truncate_segments(n("truncated"), 3)
    ids = append_fake(logs, n("unlisted-first"), 6)
    logs.commit_cursor(n("unlisted-first"), "c", Position(ids[4], 0))
    unlist(logs, n("unlisted-first"), ids[0])
    v1 = LogMetadata(n("format1"))
    for lid in [next(_fake_ids) for _ in range(3)]:
        v1 = v1.with_ledger(lid, state="closed", last_entry_id=1, length=20)
    bk.store.create(log_path(n("format1")), v1.serialize())
    logs.commit_cursor(n("format1"), "c", Position(v1.ledgers[1].ledger_id, 1))
    append_fake(logs, n("cursor-deleted"), 2)
    logs.commit_cursor(n("cursor-deleted"), "c", Position(-1, 0))
    logs.delete_cursor(n("cursor-deleted"), "c")             # (its cursors node stays)
    append_fake(logs, n("none"), 2)
    names = [n(s) for s in ("cursors", "truncated", "unlisted-first", "format1",
                            "cursor-deleted", "none")]
    got = logs.stats_many(names, cursors=True)
    assert_same_as_per_log(logs, names, got)
    lags = {c: lag for c, (_, lag) in got[n("cursors")]["cursor_lags"].items()}
    assert list(lags) == sorted(cursors)
    assert lags == {"first": 23, "far": 16, "far-too": 18, "near": 5, "done": 0, "gone": 24,
                    "nothing": 24}
    assert got[n("truncated")]["cursor_lags"] == {"behind": (Position(cut[0], 1), 9)}
    assert got[n("format1")]["cursor_lags"]["c"][1] == 3
    assert got[n("cursor-deleted")]["cursor_lags"] == got[n("none")]["cursor_lags"] == {}


def test_reads_do_not_grow_with_the_number_of_logs(bk, logs, log_name, monkeypatch):
    names = [f"{log_name}-{i:03d}" for i in range(200)]
    with_cursors = names[::20]
    far = 0                                     # cursors whose ledger is at neither end
    for batch in (names[i:i + 50] for i in range(0, len(names), 50)):
        ids = {name: [next(_fake_ids) for _ in range(5 + i % 3)] for i, name in enumerate(batch)}

        def change(edits):
            for name, edit in edits.items():
                edit.prefetch(ids[name])
                for lid in ids[name]:
                    edit.append(lid, state="closed", last_entry_id=2, length=30)
        logs.update_logs(batch, change, create=True)
        for name in batch:
            if name in with_cursors:
                logs.commit_cursor(name, "near", Position(ids[name][-1], 1))
                logs.commit_cursor(name, "far", Position(ids[name][1], 0))
                far += len(ids[name]) - seg.TAIL > 1
    expected = {name: {**stats_as_before(logs, name), "cursor_lags": logs.cursor_lags(name)}
                for name in names}

    with counting(bk.store) as calls:
        got = logs.stats_many(names, cursors=True)
    assert got == expected
    assert 0 < far < len(with_cursors)
    chunks = math.ceil(len(names) / store_module.STATS_CHUNK)
    assert_pipelined(calls, len(with_cursors), far, chunks)

    monkeypatch.setattr(store_module, "STATS_CHUNK", 64)       # 4 chunks
    with counting(bk.store) as calls:
        got = logs.stats_many(names, cursors=True)
    assert got == expected
    assert_pipelined(calls, len(with_cursors), far, chunks=4)

    # the per-log loop (`bkspark shell logs` before stats_many): reads that grow with the logs
    with counting(bk.store) as calls:
        for name in names:
            stats_as_before(logs, name)
            logs.cursor_lags(name)
    with pytest.raises(AssertionError):
        assert_pipelined(calls, len(with_cursors), far, chunks=4)
    assert calls["get"] + calls["get_many"] >= 5 * len(names)


def test_shell_logs_shows_what_the_per_log_reads_give(bk, cluster, logs, log_name, capsys):
    ids = append_fake(logs, log_name, 6)
    logs.commit_cursor(log_name, "c1", Position(ids[1], 1))
    logs.set_retention(log_name, RetentionPolicy(bytes=10_000))
    append_fake(logs, f"{log_name}-plain", 2)
    names = [log_name, f"{log_name}-plain"]
    assert cli(["shell", "logs", *names, "--ledgers", "--metadata", cluster.metadata_uri,
                "--json"]) == 0
    docs = json.loads(capsys.readouterr().out)
    expected = [{"log": name, **stats_as_before(logs, name),
                 "cursors": {c: {"position": str(p), "lag": lag}
                             for c, (p, lag) in logs.cursor_lags(name).items()},
                 "ledgers": logs.get(name)[0].ledger_ids()} for name in names]
    assert docs == expected
    assert docs[0]["cursors"]["c1"]["lag"] == 14
    assert cli(["shell", "logs", *names, "--metadata", cluster.metadata_uri]) == 0
    table = capsys.readouterr().out
    assert "c1=14" in table and "180 B" in table and "60 B" in table
