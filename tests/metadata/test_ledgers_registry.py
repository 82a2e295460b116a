"""Ledger manager, bookie registry, cookies and log metadata on both stores."""
from __future__ import annotations

import threading
import time

import pytest

from bkspark.errors import (
    BadRequestError,
    BadVersionError,
    MetadataFormatError,
    NodeExistsError,
    NoNodeError,
    NoSuchLedgerError,
)
from metadata import layout, ledgers, registry
from metadata import testing as mt
from metadata.ledger_metadata import LedgerMetadata, LedgerState
from metadata.log_metadata import LogMetadata


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def new_md(**kw):
    return LedgerMetadata.new(["b1:1", "b2:1", "b3:1"], 2, 2, password=b"pw", **kw)


def test_ledger_lifecycle(store):
    md = ledgers.create_ledger(store, new_md())
    assert md.ledger_id > 0
    assert store.exists(layout.ledger_path(md.ledger_id)) == ledgers.CREATED_VERSION
    read, version = ledgers.read_ledger(store, md.ledger_id)
    assert read == md and version == 0
    v1 = ledgers.write_ledger(store, read.with_in_recovery(), version)
    with pytest.raises(BadVersionError):  # a second writer using the old version loses
        ledgers.write_ledger(store, read.with_closed(10, 100), version)
    closed = ledgers.read_ledger(store, md.ledger_id)[0].with_closed(10, 100)
    ledgers.write_ledger(store, closed, v1)
    assert ledgers.read_ledger(store, md.ledger_id)[0].state is LedgerState.CLOSED
    ledgers.delete_ledger(store, md.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        ledgers.read_ledger(store, md.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        ledgers.delete_ledger(store, md.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        ledgers.write_ledger(store, closed, 0)


@pytest.mark.parametrize("applied", [True, False])
def test_delete_ledgers_in_batches_skips_those_gone_and_settles_a_lost_answer(store, applied):
    ids = [ledgers.create_ledger(store, new_md()).ledger_id for _ in range(7)]
    ledgers.delete_ledger(store, ids[3])                    # gone already: its batch falls back
    with mt.lost_answers(store, lambda op, path: op == "transaction", applied=applied) as lost:
        ledgers.delete_ledgers(store, ids, batch=3)
    assert lost.lost and lost.lost[0][0] == "transaction"   # the first batch's answer was lost
    assert not any(ledgers.ledger_exists(store, lid) for lid in ids)
    ledgers.delete_ledgers(store, ids)                      # all gone: nothing to do


def test_create_ledger_rejects_invalid_metadata(store):
    bad = new_md().copy(write_quorum=4)
    with pytest.raises(BadRequestError, match="write_quorum"):
        ledgers.create_ledger(store, bad)


def test_create_ledger_with_explicit_id_and_list(store):
    registry.ensure_layout(store)
    ids = [ledgers.create_ledger(store, new_md()).ledger_id for _ in range(3)]
    big = ledgers.create_ledger(store, new_md(ledger_id=12_345_678_901_234)).ledger_id
    with pytest.raises(NodeExistsError):
        ledgers.create_ledger(store, new_md(ledger_id=big))
    store.create("/logs/x", b"")  # other nodes under the root are not ledgers
    assert list(ledgers.list_ledgers(store)) == sorted(ids) + [big]
    assert ledgers.ledger_exists(store, big)


def test_unlisted_ledgers_reads_one_listing_per_directory(store, monkeypatch):
    """What a bookie's garbage collection asks: which of its ledgers the store no longer
    lists -- without a read per ledger."""
    registry.ensure_layout(store)
    ids = [ledgers.create_ledger(store, new_md()).ledger_id for _ in range(4)]
    big = ledgers.create_ledger(store, new_md(ledger_id=12_345_678_901_234)).ledger_id
    ledgers.delete_ledger(store, ids[1])
    never = ids[-1] + 20_000                    # another leaf directory, never created
    calls = []
    children = store.children
    monkeypatch.setattr(store, "children", lambda path: (calls.append(path), children(path))[1])
    assert ledgers.unlisted_ledgers(store, [*ids, big, never]) == sorted([ids[1], never])
    assert sorted(calls) == sorted({layout.ledger_path(i).rpartition("/")[0]
                                    for i in (ids[0], big, never)})
    assert ledgers.unlisted_ledgers(store, []) == []


def test_corrupt_ledger_record(store):
    store.create(layout.ledger_path(5), b"garbage")
    with pytest.raises(MetadataFormatError, match="ledger 5"):
        ledgers.read_ledger(store, 5)
    other = new_md(ledger_id=6)
    store.create(layout.ledger_path(7), other.serialize())
    with pytest.raises(MetadataFormatError, match="holds ledger id 6"):
        ledgers.read_ledger(store, 7)


def test_watch_ledger(store_factory):
    a, b = store_factory(), store_factory()
    md = ledgers.create_ledger(a, new_md())
    seen = []
    cancel = ledgers.watch_ledger(b, md.ledger_id, lambda m, v: seen.append((m, v)))
    assert seen[-1] == (md, 0)
    ledgers.write_ledger(a, md.with_closed(3, 30), 0)
    wait_for(lambda: seen[-1][1] == 1 and seen[-1][0].state is LedgerState.CLOSED)
    ledgers.delete_ledger(a, md.ledger_id)
    wait_for(lambda: seen[-1] == (None, None))
    cancel()


def test_ensure_layout_and_instance_id(store_factory):
    a, b = store_factory(), store_factory()
    ids = []
    threads = [threading.Thread(target=lambda s=s: ids.append(registry.ensure_layout(s)))
               for s in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 4 and len(set(ids)) == 1
    assert registry.instance_id(a) == ids[0]
    for path in layout.LAYOUT_NODES + (layout.LAYOUT, layout.INSTANCEID):
        assert a.exists(path) is not None, path


def test_register_list_watch_bookies(store_factory):
    bookie, client = store_factory(), store_factory()
    registry.ensure_layout(client)
    seen = []
    cancel = registry.watch_bookies(client, seen.append)
    assert seen == [{}]
    info = {"address": "127.0.0.1:3181", "rack": "/r1"}
    assert registry.register_bookie(bookie, "127.0.0.1:3181", info) == "/available/127.0.0.1:3181"
    registry.register_bookie(bookie, "ro:1", {"address": "ro:1"}, readonly=True)
    assert registry.list_bookies(client) == {"127.0.0.1:3181": info}
    assert registry.list_bookies(client, readonly=True) == {"ro:1": {"address": "ro:1"}}
    wait_for(lambda: seen[-1] == {"127.0.0.1:3181": info})
    with pytest.raises(NodeExistsError, match="already registered"):
        registry.register_bookie(client, "127.0.0.1:3181", info)
    bookie.close()  # the bookie dies: its registration goes with its session
    wait_for(lambda: seen[-1] == {})
    assert registry.list_bookies(client, readonly=True) == {}
    cancel()


def test_register_waits_for_stale_registration(store_factory):
    old, new = store_factory(), store_factory()
    registry.register_bookie(old, "b:1", {"v": 1})
    threading.Timer(0.5, old.close).start()
    registry.register_bookie(new, "b:1", {"v": 2}, wait=10)
    assert registry.list_bookies(new) == {"b:1": {"v": 2}}


def test_reregister_after_session_expiry(store_factory):
    bookie, client = store_factory(), store_factory()
    done = threading.Event()

    def reregister():
        registry.register_bookie(bookie, "b:1", {"v": 2})
        done.set()

    bookie.on_session_lost(reregister)
    registry.register_bookie(bookie, "b:1", {"v": 1})
    mt.expire_session(bookie)
    assert done.wait(10)
    assert registry.list_bookies(client) == {"b:1": {"v": 2}}


def test_unregister_and_corrupt_registration(store):
    registry.ensure_layout(store)
    assert registry.unregister_bookie(store, "b:1") is False
    registry.register_bookie(store, "b:1", {})
    assert registry.unregister_bookie(store, "b:1") is True
    store.create("/available/bad:1", b"{not json")
    with pytest.raises(MetadataFormatError, match="bad:1"):
        registry.list_bookies(store)
    with pytest.raises(BadRequestError):
        registry.register_bookie(store, "b:2", "not a dict")


def test_cookies(store):
    with pytest.raises(NoNodeError):
        registry.read_cookie(store, "b:1")
    cookie = {"instance_id": "x", "dirs": ["/d"]}
    assert registry.write_cookie(store, "b:1", cookie) == 0
    with pytest.raises(NodeExistsError):
        registry.write_cookie(store, "b:1", cookie)
    assert registry.read_cookie(store, "b:1") == (cookie, 0)
    v = registry.write_cookie(store, "b:1", {**cookie, "dirs": ["/e"]}, version=0)
    with pytest.raises(BadVersionError):
        registry.write_cookie(store, "b:1", cookie, version=0)
    registry.delete_cookie(store, "b:1", version=v)
    with pytest.raises(NoNodeError):
        registry.read_cookie(store, "b:1")


def test_log_metadata_in_store(store):
    md = LogMetadata("events").with_ledger(1, first_offset=0).with_writer_sequence("w1", 5)
    store.create(layout.log_path("events"), md.serialize())
    data, version = store.get(layout.log_path("events"))
    back = LogMetadata.deserialize(data)
    assert back == md and back.ledger_ids() == [1] and back.writers == {"w1": 5}
    store.set(layout.log_path("events"), back.with_ledger(2).serialize(), version=version)
    with pytest.raises(BadVersionError):
        store.set(layout.log_path("events"), back.with_ledger(3).serialize(), version=version)
