"""Under-replication records, worker locks, the switch and the auditor election, on both
metadata stores (SQLite lease / ZooKeeper with kazoo's Election recipe)."""
from __future__ import annotations

import threading
import time

import pytest

from bkspark.recovery.election import LeaderElection
from bkspark.errors import NodeExistsError
from bkspark.recovery.urm import UnderReplicationManager
from metadata.layout import UR_DISABLE, underreplicated_path

from .helpers import wait_until


def test_records_and_locks(store_factory):
    a = UnderReplicationManager(store_factory(), "worker-a")
    b_store = store_factory()
    b = UnderReplicationManager(b_store, "worker-b")
    assert a.list() == []
    assert a.mark(7, ["bk1:3181"], by="auditor")
    assert not a.mark(7, ["bk1:3181"])           # idempotent
    assert a.mark(12345678901, [])
    assert a.list() == [7, 12345678901]
    assert underreplicated_path(7).endswith("/0000/0000/0000/0007/urL0000000007")

    version = a.try_lock(7)
    assert version is not None
    assert b.try_lock(7) is None                 # another worker skips it
    assert b.lock_holder(7) == "worker-a"
    # the auditor re-marks the ledger while worker a works: its delete must not succeed
    assert b.mark(7, ["bk2:3181"])
    assert not a.mark_replicated(7, version)
    assert a.get(7)[0]["missing"] == ["bk1:3181", "bk2:3181"]
    assert a.lock_holder(7) is None              # lock released anyway

    version = b.try_lock(7)
    assert b.mark_replicated(7, version)
    assert a.list() == [12345678901]

    # a worker's lock is ephemeral: it vanishes with its session
    assert b.try_lock(12345678901) is not None
    b_store.close()
    wait_until(lambda: a.try_lock(12345678901) is not None, 30, what="the lock to vanish")
    a.release(12345678901)
    assert a.try_lock(99) is None                # no record: nothing to lock


def test_an_autorecovery_endpoint_belongs_to_one_live_session(store_factory):
    a_store, b_store = store_factory(), store_factory()
    a, b = UnderReplicationManager(a_store, "a"), UnderReplicationManager(b_store, "b")
    assert a.endpoints() == {}
    ident = "host-1:42:ab/cd"                   # any text: quoted into one node name
    a.publish_endpoint(ident, {"host": "127.0.0.1", "http_port": 8001})
    # published again by its own session (a create whose answer was lost, a session
    # re-established): kept as it is
    a.publish_endpoint(ident, {"host": "127.0.0.1", "http_port": 8001})
    assert b.endpoints() == {ident: {"host": "127.0.0.1", "http_port": 8001,
                                     "session": str(a_store.session_id)}}
    # another live session under the same identifier is refused, naming the fix
    with pytest.raises(NodeExistsError, match="its own --id"):
        b.publish_endpoint(ident, {"host": "127.0.0.2", "http_port": 8002})
    # the record is ephemeral: once a's session ends, b may publish
    a_store.close()
    wait_until(lambda: b.endpoints() == {}, 30, what="the endpoint to vanish with its session")
    b.publish_endpoint(ident, {"host": "127.0.0.2", "http_port": 8002})
    assert b.endpoints()[ident]["http_port"] == 8002


def test_switch_and_delay(store):
    urm = UnderReplicationManager(store)
    assert urm.is_enabled()
    urm.disable()
    urm.disable()
    assert not urm.is_enabled() and store.exists(UR_DISABLE) is not None
    urm.enable()
    assert urm.is_enabled()
    assert urm.lost_bookie_recovery_delay(30.0) == 30.0
    urm.set_lost_bookie_recovery_delay(5)
    urm.set_lost_bookie_recovery_delay(2.5)
    assert urm.lost_bookie_recovery_delay(30.0) == 2.5


def test_election_exactly_one_leader_and_failover(store_factory):
    leaders = []
    lock = threading.Lock()
    elections = []
    stores = []

    def make(name):
        s = store_factory(session_timeout=3.0)
        stores.append(s)

        def lead(still_leader):
            with lock:
                leaders.append(name)
            while still_leader():
                threading.Event().wait(0.1)
            with lock:
                leaders.remove(name)

        e = LeaderElection(s, name, lead, poll_interval=0.1)
        e.start()
        elections.append(e)
        return e

    e1, e2, e3 = make("a1"), make("a2"), make("a3")
    urm = UnderReplicationManager(stores[0])
    wait_until(lambda: len(leaders) == 1, 30, what="one leader")
    first = leaders[0]
    assert urm.auditor() == first
    assert sum(e.is_leader for e in elections) == 1
    # the leader's process "dies": its session ends
    i = ["a1", "a2", "a3"].index(first)
    elections[i]._stop.set()          # its thread must not re-enter
    stores[i].close()
    wait_until(lambda: len(leaders) == 1 and leaders[0] != first, 30,
               what="a new leader")
    assert urm.__class__(stores[(i + 1) % 3]).auditor() == leaders[0]
    for j, e in enumerate(elections):
        if j != i:
            e.stop()
    wait_until(lambda: not leaders, 10, what="leaders to step down")


def test_an_idle_worker_takes_an_announced_record_at_once(store_factory):
    """Workers poll rarely (here every 10 minutes) but watch the auditor's announcements:
    a record announced after they went idle is taken within the store's notification
    latency. (The record names a ledger that does not exist: the worker drops it.)"""
    from bkspark.client import BookKeeper
    from bkspark.recovery.worker import ReplicationWorker, WorkerConfig
    auditor = UnderReplicationManager(store_factory(), "auditor")
    with BookKeeper(store=store_factory()) as bk:
        worker = ReplicationWorker(bk, WorkerConfig(threads=2, poll_interval=600))
        worker.start()
        try:
            time.sleep(0.5)                     # both threads found nothing and went idle
            assert auditor.mark(424242, ["gone:1"], by="auditor")
            auditor.announce()
            wait_until(lambda: auditor.list() == [], 15)
        finally:
            worker.stop()
