"""The metadata store contract: runs unchanged against SQLite and ZooKeeper (``store_uri``)."""
from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from metadata import (
    BadRequestError,
    BadVersionError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    open_store,
)
from metadata import testing as mt

SPAWN = multiprocessing.get_context("spawn")




def run_processes(target, args_list, timeout=120):
    """Start one spawned process per args tuple (released together by an Event); return
    their results in order."""
    with SPAWN.Manager() as manager:
        start = manager.Event()
        with SPAWN.Pool(len(args_list)) as pool:
            results = [pool.apply_async(target, args + (start,)) for args in args_list]
            time.sleep(0.5)  # let every worker open its store and block on the event
            start.set()
            return [r.get(timeout) for r in results]


# ---- basic records and versions ---------------------------------------------------------

def test_create_get_exists_set_delete(store):
    assert store.exists("/a") is None
    assert store.create("/a", b"one") == "/a"
    assert store.get("/a") == (b"one", 0)
    assert store.exists("/a") == 0
    assert store.set("/a", b"two", version=0) == 1
    assert store.get("/a") == (b"two", 1)
    assert store.set("/a", b"three") == 2  # unconditional
    store.delete("/a", version=2)
    assert store.exists("/a") is None
    with pytest.raises(NoNodeError):
        store.get("/a")


def test_empty_and_binary_data(store):
    blob = bytes(range(256)) * 4
    store.create("/bin", blob)
    assert store.get("/bin")[0] == blob
    store.create("/empty")
    assert store.get("/empty") == (b"", 0)
    store.set("/empty", bytearray(b"ba"))
    assert store.get("/empty")[0] == b"ba"


def test_create_existing_raises_node_exists(store):
    store.create("/x", b"1")
    with pytest.raises(NodeExistsError):
        store.create("/x", b"2")
    assert store.get("/x") == (b"1", 0)
    with pytest.raises(NodeExistsError):
        store.create("/", b"")


def test_makepath(store):
    assert store.create("/p/q/r", b"leaf") == "/p/q/r"
    assert store.get("/p/q") == (b"", 0)
    with pytest.raises(NoNodeError):
        store.create("/missing/child", b"", makepath=False)
    assert store.exists("/missing") is None


def test_cas_conflict_raises_bad_version(store):
    store.create("/cas", b"0")
    _, v = store.get("/cas")
    store.set("/cas", b"1", version=v)
    with pytest.raises(BadVersionError):
        store.set("/cas", b"stale", version=v)
    assert store.get("/cas") == (b"1", v + 1)


def test_set_and_delete_missing_raise_no_node(store):
    with pytest.raises(NoNodeError):
        store.set("/nope", b"", version=-1)
    with pytest.raises(NoNodeError):
        store.delete("/nope")


def test_delete_checks_version_and_children(store):
    store.create("/d/child", b"")
    with pytest.raises(NotEmptyError):
        store.delete("/d")
    with pytest.raises(BadVersionError):
        store.delete("/d/child", version=5)
    store.delete("/d/child", version=0)
    store.delete("/d")
    assert store.exists("/d") is None


def test_recreated_node_starts_at_version_zero(store):
    store.create("/r", b"a")
    store.set("/r", b"b")
    store.delete("/r")
    store.create("/r", b"c")
    assert store.get("/r") == (b"c", 0)


def test_children_sorted_and_no_node(store):
    for name in ["b", "a", "c10", "c2"]:
        store.create(f"/kids/{name}", b"")
    store.create("/kids/a/grandchild", b"")
    assert store.children("/kids") == ["a", "b", "c10", "c2"]
    assert store.children("/kids/b") == []
    assert "kids" in store.children("/")
    with pytest.raises(NoNodeError):
        store.children("/absent")


def test_sequential_creates(store):
    paths = [store.create("/seq/n-", b"", sequential=True) for _ in range(5)]
    assert len(set(paths)) == 5
    assert paths == sorted(paths)
    for p in paths:
        suffix = p[len("/seq/n-"):]
        assert len(suffix) == 10 and suffix.isdigit()
    assert store.children("/seq") == [p.rsplit("/", 1)[1] for p in paths]


def test_invalid_paths_and_data_rejected(store):
    for bad in ["", "rel", "/trailing/", "/a//b", "/a/../b", "/a/./b", None, b"/bytes"]:
        with pytest.raises(BadRequestError):
            store.create(bad, b"")
        with pytest.raises(BadRequestError):
            store.get(bad)
    with pytest.raises(BadRequestError):
        store.create("/str-data", "not bytes")
    with pytest.raises(BadRequestError):
        store.set("/x", b"", version=-2)


def test_closed_store_refuses_operations(store_factory):
    s = store_factory()
    s.close()
    s.close()  # idempotent
    with pytest.raises(MetadataError):
        s.get("/")
    with pytest.raises(MetadataError):
        s.sync("/")


def test_sync_then_read_sees_another_client_write(store_factory):
    writer, reader = store_factory(), store_factory()
    for i in range(20):
        writer.create(f"/synced/n{i}", b"%d" % i)
        reader.sync(f"/synced/n{i}")
        assert reader.get(f"/synced/n{i}") == (b"%d" % i, 0)
    reader.sync("/no/such/path")            # a path that does not exist is fine
    with pytest.raises(BadRequestError):
        reader.sync("relative")


# ---- ephemerals and sessions -------------------------------------------------------------

def test_ephemeral_vanishes_when_session_closes(store_factory):
    owner, observer = store_factory(), store_factory()
    owner.create("/eph/node", b"me", ephemeral=True)
    assert observer.get("/eph/node") == (b"me", 0)
    owner.close()
    mt.wait_for(lambda: observer.exists("/eph/node") is None, 5, what="ephemeral removal")
    assert observer.exists("/eph") is not None  # parents created by makepath are persistent


def test_ephemeral_vanishes_when_session_expires(store_factory):
    owner, observer = store_factory(), store_factory()
    lost = threading.Event()
    owner.on_session_lost(lost.set)
    owner.create("/eph2/node", b"me", ephemeral=True)
    owner.create("/eph2/persistent", b"stay")
    old_session = owner.session_id
    mt.expire_session(owner)
    assert owner.session_id != old_session
    mt.wait_for(lambda: observer.exists("/eph2/node") is None, 10, what="ephemeral removal")
    assert lost.wait(10), "on_session_lost callback not called"
    assert observer.get("/eph2/persistent")[0] == b"stay"
    # the store carries on with a new session: it can re-register
    owner.create("/eph2/node", b"again", ephemeral=True)
    assert observer.get("/eph2/node")[0] == b"again"


def test_ephemeral_of_crashed_process_vanishes_after_session_timeout(store, store_uri):
    proc = SPAWN.Process(target=mt.ephemeral_then_die_worker,
                         args=(store_uri, "/crash/eph", 2.0))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert store.exists("/crash/eph") is not None  # owner died without closing
    mt.wait_for(lambda: store.exists("/crash/eph") is None, 15, interval=0.1,
                what="expiry of a dead owner's ephemeral")


def test_ephemeral_cannot_have_children(store):
    store.create("/e", b"", ephemeral=True)
    with pytest.raises(BadRequestError):
        store.create("/e/child", b"")


def test_drop_connection_keeps_session(store_factory):
    owner, observer = store_factory(), store_factory()
    owner.create("/drop/eph", b"", ephemeral=True)
    session = owner.session_id
    mt.drop_connection(owner)
    assert owner.get("/drop/eph")[1] == 0
    assert owner.session_id == session
    assert observer.exists("/drop/eph") is not None


# ---- races --------------------------------------------------------------------------------

def test_concurrent_creators_threads_exactly_one_wins(store_factory):
    stores = [store_factory() for _ in range(4)]
    barrier = threading.Barrier(8)
    wins, errors = [], []

    def attempt(i):
        barrier.wait()
        try:
            stores[i % 4].create("/race/winner", str(i).encode())
            wins.append(i)
        except NodeExistsError:
            pass
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(wins) == 1
    assert stores[0].get("/race/winner")[0] == str(wins[0]).encode()


@pytest.mark.slow
def test_concurrent_creators_processes_exactly_one_wins(store, store_uri):
    results = run_processes(mt.create_race_worker,
                            [(store_uri, "/prace/winner", f"p{i}") for i in range(5)])
    assert sum(results) == 1
    winner = results.index(True)
    assert store.get("/prace/winner")[0] == f"p{winner}".encode()


@pytest.mark.slow
def test_eight_processes_racing_cas_lose_no_increment(store, store_uri):
    n = 40
    store.create("/counter", b"0")
    conflicts = run_processes(mt.cas_increment_worker, [(store_uri, "/counter", n)] * 8)
    data, version = store.get("/counter")
    assert int(data) == 8 * n
    assert version == 8 * n
    print(f"CAS conflicts retried: {sum(conflicts)}")


def test_cas_increment_threads_lose_no_increment(store_factory):
    stores = [store_factory() for _ in range(4)]
    stores[0].create("/tcounter", b"0")
    n = 20

    def work(s):
        for _ in range(n):
            while True:
                data, v = s.get("/tcounter")
                try:
                    s.set("/tcounter", str(int(data) + 1).encode(), version=v)
                    break
                except BadVersionError:
                    pass

    threads = [threading.Thread(target=work, args=(s,)) for s in stores for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert int(stores[0].get("/tcounter")[0]) == 8 * n


# ---- ids ----------------------------------------------------------------------------------------

def test_generate_id_unique_positive(store_factory):
    a, b = store_factory(), store_factory()
    ids = [s.generate_id() for _ in range(20) for s in (a, b)]
    assert len(set(ids)) == len(ids)
    assert all(0 < i < 2 ** 63 for i in ids)


@pytest.mark.slow
def test_generate_id_unique_across_processes(store, store_uri):
    per = 30
    results = run_processes(mt.generate_ids_worker, [(store_uri, per)] * 4)
    ids = [i for r in results for i in r] + [store.generate_id()]
    assert len(ids) == 4 * per + 1
    assert len(set(ids)) == len(ids)
    assert all(0 < i < 2 ** 63 for i in ids)


# ---- watches --------------------------------------------------------------------------------

def test_watch_children_fires_initially_and_on_change(store_factory):
    watcher, writer = store_factory(), store_factory()
    writer.create("/w/a", b"")
    seen = []
    cancel = watcher.watch_children("/w", seen.append)
    assert seen == [["a"]]  # called once at start, synchronously
    writer.create("/w/b", b"")
    mt.wait_for(lambda: seen[-1] == ["a", "b"], 5, what="child add")
    writer.delete("/w/a")
    mt.wait_for(lambda: seen[-1] == ["b"], 5, what="child delete")
    cancel()
    time.sleep(0.1)
    count = len(seen)
    writer.create("/w/c", b"")
    time.sleep(0.8)
    assert len(seen) == count


def test_watch_children_of_missing_node(store_factory):
    watcher, writer = store_factory(), store_factory()
    seen = []
    watcher.watch_children("/later", seen.append)
    assert seen == [[]]
    writer.create("/later/x", b"")
    mt.wait_for(lambda: seen[-1] == ["x"], 5, what="children of a created node")


def test_watch_data_fires_on_set_and_delete(store_factory):
    watcher, writer = store_factory(), store_factory()
    seen = []
    cancel = watcher.watch_data("/wd", lambda data, version: seen.append((data, version)))
    assert seen == [(None, None)]
    writer.create("/wd", b"v0")
    mt.wait_for(lambda: seen[-1] == (b"v0", 0), 5, what="create")
    writer.set("/wd", b"v1")
    mt.wait_for(lambda: seen[-1] == (b"v1", 1), 5, what="set")
    writer.delete("/wd")
    mt.wait_for(lambda: seen[-1] == (None, None), 5, what="delete")
    cancel()


def test_watch_survives_session_expiry(store_factory):
    watcher, writer = store_factory(), store_factory()
    seen = []
    watcher.watch_children("/ws", seen.append)
    mt.expire_session(watcher)
    writer.create("/ws/after", b"")
    mt.wait_for(lambda: seen[-1] == ["after"], 10, what="watch after expiry")


# ---- transactions ----------------------------------------------------------------------------

def test_transaction_commits_all(store):
    store.create("/t/a", b"a")
    store.create("/t/gone", b"")
    txn = store.transaction()
    txn.create("/t/new/deep", b"n")
    txn.set("/t/a", b"a2", version=0)
    txn.delete("/t/gone")
    txn.check("/t/a", 1)
    assert txn.commit() == ["/t/new/deep", 1, None, None]
    assert store.get("/t/new/deep") == (b"n", 0)
    assert store.get("/t/a") == (b"a2", 1)
    assert store.exists("/t/gone") is None


@pytest.mark.parametrize("failing", ["set", "check", "create", "delete"])
def test_transaction_is_all_or_nothing(store, failing):
    store.create("/tx/a", b"a")
    store.create("/tx/exists", b"")
    txn = store.transaction()
    txn.create("/tx/first", b"")
    txn.set("/tx/a", b"changed", version=0)
    expected = {"set": BadVersionError, "check": BadVersionError,
                "create": NodeExistsError, "delete": NoNodeError}[failing]
    if failing == "set":
        txn.set("/tx/a", b"again", version=0)  # version is 1 after the op above
    elif failing == "check":
        txn.check("/tx/exists", 7)
    elif failing == "create":
        txn.create("/tx/exists", b"")
    else:
        txn.delete("/tx/missing")
    with pytest.raises(expected):
        txn.commit()
    assert store.exists("/tx/first") is None
    assert store.get("/tx/a") == (b"a", 0)


def test_a_transaction_over_one_request_is_refused_before_it_is_sent(store):
    """ZooKeeper drops the connection on a request over jute.maxbuffer (1 MiB), which looks
    like a lost answer forever: its store refuses such a transaction up front, clearly; the
    embedded store has no such limit."""
    from metadata.store import MAX_TRANSACTION_BYTES, TransactionTooLargeError
    piece = 200_000
    txn = store.transaction()
    for i in range(MAX_TRANSACTION_BYTES // piece + 1):
        txn.create(f"/big/{i}", b"x" * piece)
    if store.max_transaction_bytes is None:
        txn.commit()
        assert store.exists("/big/5") == 0
        return
    assert store.max_transaction_bytes == MAX_TRANSACTION_BYTES
    with pytest.raises(TransactionTooLargeError, match="exceeds the .*-byte limit"):
        txn.commit()
    assert store.exists("/big/0") is None
    fits = store.transaction()
    for i in range(MAX_TRANSACTION_BYTES // piece - 1):
        fits.create(f"/big/{i}", b"x" * piece)
    fits.commit()
    assert store.exists("/big/0") == 0


def test_transaction_context_manager_and_single_commit(store):
    with store.transaction() as txn:
        txn.create("/cm", b"")
    assert store.exists("/cm") == 0
    with pytest.raises(BadRequestError):
        txn.commit()


def test_transaction_creates_parents_atomically(store):
    txn = store.transaction()
    txn.create("/tp/a", b"a")
    txn.create("/tp/a/b/c", b"c")
    txn.create("/tp/x/y", b"y")
    assert txn.commit() == ["/tp/a", "/tp/a/b/c", "/tp/x/y"]
    assert store.get("/tp/a/b/c") == (b"c", 0)
    assert store.children("/tp") == ["a", "x"]
    failing = store.transaction()
    failing.create("/tq/deep/node", b"")
    failing.check("/tp/a", 5)
    with pytest.raises(BadVersionError):
        failing.commit()
    assert store.exists("/tq") is None  # no parent left behind


def test_transaction_sequential_and_ephemeral(store_factory):
    owner, observer = store_factory(), store_factory()
    txn = owner.transaction()
    txn.create("/ts/n-", b"", sequential=True)
    txn.create("/ts/eph", b"", ephemeral=True)
    seq_path, eph_path = txn.commit()
    assert seq_path.startswith("/ts/n-") and len(seq_path) == len("/ts/n-") + 10
    assert eph_path == "/ts/eph"
    owner.close()
    mt.wait_for(lambda: observer.exists("/ts/eph") is None, 10, what="ephemeral removal")
    assert observer.exists(seq_path) == 0


@pytest.mark.slow
def test_processes_opening_a_fresh_store_together(store_uri):
    # nobody opened this store (sqlite file / zk chroot) before: first opens race
    paths = run_processes(mt.open_and_create_worker, [(store_uri, i) for i in range(4)])
    assert sorted(paths) == [f"/opened/n{i}" for i in range(4)]
    with open_store(store_uri) as s:
        assert s.children("/opened") == [f"n{i}" for i in range(4)]


def test_data_size_limit(store):
    from metadata.store import MAX_DATA_SIZE
    big = b"x" * MAX_DATA_SIZE
    store.create("/big", big)
    assert store.get("/big")[0] == big
    with pytest.raises(BadRequestError, match="limit"):
        store.set("/big", big + b"y")


def test_racing_transactions_on_one_version_exactly_one_applies(store_factory):
    # each contender checks the head at version 0, bumps it and creates its own record: one
    # wins whole, every other fails its check having applied nothing
    setup = store_factory()
    setup.create("/race/head", b"0")
    stores = [store_factory() for _ in range(4)]
    start, outcome = threading.Barrier(len(stores)), {}

    def contend(i, s):
        txn = s.transaction()
        txn.set("/race/head", str(i).encode(), version=0)
        txn.create(f"/race/mine/{i}", b"")
        start.wait()
        try:
            txn.commit()
            outcome[i] = "applied"
        except BadVersionError:
            outcome[i] = "conflict"

    threads = [threading.Thread(target=contend, args=(i, s)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [i for i, o in outcome.items() if o == "applied"]
    assert len(outcome) == len(stores) and len(winners) == 1
    assert setup.get("/race/head") == (str(winners[0]).encode(), 1)
    assert setup.children("/race/mine") == [str(winners[0])]


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_transaction_whose_answer_was_lost_is_settled_from_what_is_stored(store_factory, applied):
    # the commit's answer is lost (after the store applied it, or before it reached the store):
    # the client tells which by the transaction's marker after a sync, and a retry decided from
    # that applies the change exactly once
    from metadata.update import transaction_applied
    s, other = store_factory(), store_factory()
    s.create("/lost/head", b"v0")

    def txn(marker):
        t = s.transaction()
        t.set("/lost/head", b"v1", version=0)
        t.create(marker, b"")
        t.create("/lost/items/a", b"payload")
        return t

    with mt.lost_answers(s, match="/lost", applied=applied) as lost:
        with pytest.raises(MetadataError):
            txn("/lost/commits/c1").commit()
    assert lost.lost == [("transaction", "/lost/head")]
    assert transaction_applied(s, "/lost/commits/c1") is applied
    # all or nothing, as another client sees it too
    other.sync("/lost")
    assert other.get("/lost/head") == ((b"v1", 1) if applied else (b"v0", 0))
    assert (other.exists("/lost/items/a") is not None) is applied
    if applied:
        with pytest.raises(BadVersionError):   # a blind retry fails its check: settle, never guess
            txn("/lost/commits/c1").commit()
    else:
        txn("/lost/commits/c1").commit()
    assert other.get("/lost/head") == (b"v1", 1)
    assert other.get("/lost/items/a") == (b"payload", 0)
