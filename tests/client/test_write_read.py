"""Write path, reads, LAC and tailing against in-process bookies (real gRPC service)."""
from __future__ import annotations

import threading
import time

import pytest

from bkspark.client import BookKeeper
from bkspark.client.digest import DigestManager
from bkspark.errors import (BadRequestError, FencedError, LedgerClosedError,
                            NoSuchEntryError, NoSuchLedgerError, UnauthorizedError)
from metadata.ledger_metadata import LedgerState
from metadata.ledgers import write_ledger


@pytest.fixture
def bk(mem_cluster):
    with BookKeeper(mem_cluster.metadata_uri, add_timeout=5, read_timeout=5) as client:
        yield client


@pytest.mark.parametrize("digest", ["crc32c", "hmac", "crc32", "dummy"])
def test_append_close_read(bk, digest):
    with bk.create_ledger(3, 2, 2, digest=digest, password=b"pw",
                          custom_metadata={"app": b"x"}) as lh:
        assert [lh.append(b"a%d" % i) for i in range(5)] == list(range(5))
        assert lh.append_many([b"b%d" % i for i in range(100)]) == list(range(5, 105))
        assert lh.append_async(b"c").result(10) == 105
        assert lh.last_add_confirmed == 105
    lid = lh.ledger_id
    assert lid in bk.list_ledgers()
    with bk.open_ledger(lid, password=b"pw") as rh:
        assert rh.is_closed and rh.last_add_confirmed == 105
        assert rh.metadata.custom_metadata == {"app": b"x"}
        data = [e.data for e in rh.read(0, 105)]
        assert data == [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(100)] + [b"c"]
        assert rh.length == sum(map(len, data))
        assert [e.entry_id for e in rh.read(100, 102)] == [100, 101, 102]
        with pytest.raises(NoSuchEntryError):
            list(rh.read(0, 106))
    bk.delete_ledger(lid)
    assert lid not in bk.list_ledgers()
    with pytest.raises(NoSuchLedgerError):
        bk.open_ledger(lid, password=b"pw")


def test_zookeeper_metadata(zk_uri):
    """The same client on the ZooKeeper store (in-process bookies registered there)."""
    from memory_bookie import MemCluster
    c = MemCluster(zk_uri, 3)
    try:
        with BookKeeper(c.metadata_uri) as bk:
            with bk.create_ledger(3, 2, 2, password=b"z") as lh:
                lh.append_many([b"a", b"b", b"c"])
            lh2 = bk.create_ledger(3, 3, 2, password=b"z")
            lh2.append(b"open")
            rh = bk.open_ledger(lh2.ledger_id, password=b"z")     # recovery over ZK CAS
            assert rh.is_closed and [e.data for e in rh.read(0)] == [b"open"]
            assert [e.data for e in bk.open_ledger(lh.ledger_id, b"z").read(0)] == [
                b"a", b"b", b"c"]
            assert set(bk.list_ledgers()) >= {lh.ledger_id, lh2.ledger_id}
    finally:
        c.close()


def test_empty_ledger(bk):
    lh = bk.create_ledger(3, 2, 2)
    lh.close()
    rh = bk.open_ledger(lh.ledger_id)
    assert rh.is_closed and rh.last_add_confirmed == -1 and list(rh.read(0)) == []
    lh = bk.create_ledger(3, 2, 2)       # never written, recovered: closed empty
    rh = bk.open_ledger(lh.ledger_id)
    assert rh.is_closed and rh.last_add_confirmed == -1 and rh.length == 0


def test_quorums_validated(bk):
    with pytest.raises(BadRequestError, match="E >= Qw >= Qa"):
        bk.create_ledger(ensemble_size=2, write_quorum=3, ack_quorum=2)
    with pytest.raises(BadRequestError, match="E >= Qw >= Qa"):
        bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=3)
    with pytest.raises(BadRequestError):
        bk.create_ledger(3, 2, 2, digest="md5")


def test_wrong_password_is_unauthorized(bk):
    with bk.create_ledger(3, 2, 2, password=b"right") as lh:
        lh.append(b"x")
    with pytest.raises(UnauthorizedError, match="wrong password"):
        bk.open_ledger(lh.ledger_id, password=b"wrong")
    with pytest.raises(UnauthorizedError):
        bk.open_ledger(lh.ledger_id, password=b"wrong", recovery=False)


def test_entries_carry_header_and_lac_order(bk, mem_cluster):
    lh = bk.create_ledger(3, 3, 2, password=b"pw")
    futs = [lh.append_async(b"x" * i) for i in range(1, 200)]
    order = []
    for f in futs:
        f.add_done_callback(lambda f: order.append(f.result()))
    assert [f.result(10) for f in futs] == list(range(199))
    assert order == sorted(order)
    lh.close()
    d = DigestManager(lh.ledger_id, "crc32c", b"pw")
    b = mem_cluster.bookies[0]
    deadline = time.monotonic() + 30    # Qa=2 < Qw=3: the third copies land on their own
    while len(b.storage.entries.get(lh.ledger_id, {})) < 199:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    stored = b.storage.entries[lh.ledger_id]
    total = 0
    for eid in range(199):
        total += eid + 1
        got_eid, lac, length, payload = d.verify(stored[eid], eid)
        assert length == total and lac < eid and payload == b"x" * (eid + 1)


def test_striping_places_entries_on_write_sets(bk, mem_cluster):
    with bk.create_ledger(3, 2, 2) as lh:
        lh.append_many([b"%d" % i for i in range(30)])
        ens = lh.metadata.last_ensemble()
    for i, bid in enumerate(ens):
        held = set(mem_cluster.by_id(bid).storage.entries[lh.ledger_id])
        assert held == {e for e in range(30) if (i - e) % 3 < 2}


def test_back_pressure_bounds_outstanding_bytes(mem_cluster):
    with BookKeeper(mem_cluster.metadata_uri, max_outstanding_bytes=256 << 10) as bk:
        lh = bk.create_ledger(3, 2, 2)
        for b in mem_cluster.bookies:   # bookies answer slowly: the queue must not grow
            b.service.faults.set_rules([_rule("add", "delay", delay_ms=20)])
        peak = [0]
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                peak[0] = max(peak[0], lh._outstanding)
                time.sleep(0.001)
        t = threading.Thread(target=watch)
        t.start()
        futs = [lh.append_async(b"z" * 4096) for _ in range(400)]
        assert futs[-1].result(60) == 399
        stop.set()
        t.join()
        assert peak[0] <= (256 << 10) + 4096 + 200
        lh.close()


def test_tailing_without_recovery(bk):
    lh = bk.create_ledger(3, 2, 2, password=b"pw")
    lh.append_many([b"e%d" % i for i in range(10)])
    rh = bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
    assert not rh.is_closed
    assert rh.metadata.state is LedgerState.OPEN           # no fencing, no recovery
    # the piggybacked LAC trails the writer's: entries of the last batch are unconfirmed
    lac = rh.read_last_add_confirmed()
    assert lac <= 9
    with pytest.raises(BadRequestError, match="beyond the last add confirmed"):
        list(rh.read(0, 10))
    assert [e.data for e in rh.read_unconfirmed(9, 9)] == [b"e9"]
    # long poll: wakes when the writer advances the LAC
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("lac", rh.read_lac_long_poll(lac, 10)))
    t.start()
    lh.append(b"e10")
    lh.append(b"e11")
    t.join(20)
    assert got["lac"] > lac
    assert [e.data for e in rh.read(0, got["lac"])][-1] == b"e%d" % got["lac"]
    lh.append(b"e12")
    assert lh.append(b"e13") == 13           # the writer was not fenced
    lh.close()
    previous = rh.last_add_confirmed
    assert rh.read_lac_long_poll(previous, 5) > previous
    assert rh.read_last_add_confirmed() == 13 and rh.is_closed


def test_idle_writer_publishes_explicit_lac(mem_cluster):
    with BookKeeper(mem_cluster.metadata_uri, explicit_lac_interval=0.2) as bk:
        lh = bk.create_ledger(3, 2, 2)
        lh.append_many([b"a", b"b", b"c"])
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        # piggybacked LACs trail; the explicit LAC reaches 2 once the writer is idle
        assert rh.read_lac_long_poll(1, 10) == 2
        assert [e.data for e in rh.read(0)] == [b"a", b"b", b"c"]
        lh.close()


def test_open_closed_ledger_needs_no_recovery(bk):
    lh = bk.create_ledger(3, 2, 2)
    lh.close()
    rh = bk.open_ledger(lh.ledger_id)
    assert rh.is_closed and rh.last_add_confirmed == -1 and rh.length == 0


def test_close_conflicts_follow_the_protocol(bk):
    lh = bk.create_ledger(3, 2, 2)
    lh.append(b"x")
    md, version = bk.ctx.read_metadata(lh.ledger_id)
    write_ledger(bk.store, md.with_in_recovery(), version)          # somebody started recovery
    with pytest.raises(FencedError, match="being recovered"):
        lh.close()
    lh2 = bk.create_ledger(3, 2, 2)
    lh2.append(b"x")
    md, version = bk.ctx.read_metadata(lh2.ledger_id)
    write_ledger(bk.store, md.with_closed(0, 1), version)           # closed elsewhere at our LAC: ok
    lh2.close()
    lh3 = bk.create_ledger(3, 2, 2)
    lh3.append(b"x")
    md, version = bk.ctx.read_metadata(lh3.ledger_id)
    write_ledger(bk.store, md.with_closed(5, 1), version)           # closed elsewhere at another end
    with pytest.raises(LedgerClosedError, match="entry 5"):
        lh3.close()
    with pytest.raises(LedgerClosedError):
        lh3.append(b"more")


def test_digest_mismatch_served_from_another_replica(bk, mem_cluster):
    with bk.create_ledger(3, 2, 2, password=b"pw") as lh:
        lh.append_many([b"entry-%d" % i for i in range(9)])
        ens = lh.metadata.last_ensemble()
    for eid in range(9):     # corrupt every entry on the first replica of its write set
        st = mem_cluster.by_id(ens[eid % 3]).storage
        body = bytearray(st.entries[lh.ledger_id][eid])
        body[-1] ^= 0xFF
        st.entries[lh.ledger_id][eid] = bytes(body)
    rh = bk.open_ledger(lh.ledger_id, password=b"pw")
    assert [e.data for e in rh.read(0, 8)] == [b"entry-%d" % i for i in range(9)]


def test_digest_mismatch_in_range_read_falls_over(bk, mem_cluster):
    with bk.create_ledger(3, 3, 2) as lh:
        lh.append_many([b"r%d" % i for i in range(20)])
    deadline = time.monotonic() + 30    # Qa=2 < Qw=3: the third copies land on their own
    while any(len(b.storage.entries.get(lh.ledger_id, {})) < 20 for b in mem_cluster.bookies):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for b in mem_cluster.bookies:       # a different corrupt entry on every bookie
        i = mem_cluster.bookies.index(b)
        st = b.storage.entries[lh.ledger_id]
        st[5 + i] = st[5 + i][:-1] + b"!"
    rh = bk.open_ledger(lh.ledger_id)
    assert [e.data for e in rh.read(0, 19)] == [b"r%d" % i for i in range(20)]


def test_range_read_falls_over_to_another_bookie(bk, mem_cluster):
    with bk.create_ledger(3, 3, 3) as lh:
        lh.append_many([b"q%d" % i for i in range(50)])
        ens = lh.metadata.last_ensemble()
    mem_cluster.by_id(ens[0]).stop()              # the bookie a range read starts with
    rh = bk.open_ledger(lh.ledger_id)
    assert [e.data for e in rh.read(0, 49)] == [b"q%d" % i for i in range(50)]
    assert bk.ctx.health.is_suspect(ens[0])


def test_speculative_read_after_timeout(mem_cluster):
    with BookKeeper(mem_cluster.metadata_uri, speculative_read_timeout=0.2,
                    read_timeout=30) as bk:
        with bk.create_ledger(3, 2, 2) as lh:
            lh.append_many([b"s%d" % i for i in range(6)])
            ens = lh.metadata.last_ensemble()
        for bid in ens:   # every bookie answers reads slowly... except the second replicas
            mem_cluster.by_id(bid).service.faults.set_rules(
                [_rule("read", "delay", delay_ms=20_000, entry_id=e)
                 for e in range(6) if ens[e % 3] == bid])
        rh = bk.open_ledger(lh.ledger_id)
        t0 = time.monotonic()
        assert [e.data for e in rh.read(0, 5)] == [b"s%d" % i for i in range(6)]
        assert time.monotonic() - t0 < 15   # not waiting for the 20 s replicas
        for b in mem_cluster.bookies:
            b.service.faults.set_rules([])


def test_appends_from_many_threads(bk):
    lh = bk.create_ledger(3, 2, 2)
    ids = []
    lock = threading.Lock()

    def worker(k):
        for i in range(200):
            eid = lh.append(b"%d-%d" % (k, i))
            with lock:
                ids.append(eid)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ids) == list(range(800))
    lh.close()
    assert bk.open_ledger(lh.ledger_id).last_add_confirmed == 799


def _rule(op, action, delay_ms=0, entry_id=None, ledger_id=0, error=501, count=0):
    from bkspark.bookie.faults import ANY_ENTRY, FaultRule
    return FaultRule(op=op, action=action, delay_ms=delay_ms, error=error, ledger_id=ledger_id,
                     entry_id=ANY_ENTRY if entry_id is None else entry_id, remaining=count)
