"""Re-replication of one ledger's fragments against real bookie processes.

* closed ledger with several fragments, a dead member: entries copied from the survivors,
  membership swapped by CAS, every entry on Qw live bookies (ListEntries);
* the only possible replacement already has the ledger *fenced*: the copy must use
  RECOVERY_ADD (BookKeeper #4163);
* entries missing on a live, fenced bookie are found by the auditor's full check and copied
  back with RECOVERY_ADD (a fenced ledger repaired);
* an empty closed ledger needs no copy; an open last fragment is left alone unless fencing
  is allowed; a metadata conflict never loses the other writer's change.
"""
from __future__ import annotations

import threading

import pytest

from bkspark.testing.cluster import bookie_channel
from bkspark import errors
from bkspark.client import BookKeeper, DigestManager
from bkspark.client import quorum
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.recovery.auditor import Auditor, AuditorConfig
from bkspark.recovery.replicator import (FULL, OPEN, PARTIAL, LedgerReplicator, fragments,
                                         list_entries)
from bkspark.recovery.throttle import BURST_S, Throttle
from bkspark.recovery.urm import UnderReplicationManager
from bkspark.recovery.worker import ReplicationWorker, WorkerConfig
from bkspark.testing.cluster import BookieCluster
from metadata import ledgers as ledger_store
from metadata import registry
from metadata.ledger_metadata import LedgerMetadata, LedgerState

from .helpers import PW, read_back, replication_problems, wait_until, write_ledger

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("rr-cluster")
    with BookieCluster(f"sqlite://{d}/meta.db", num_bookies=4, data_dir=d,
                       session_timeout=3.0) as c:
        yield c


@pytest.fixture
def c(cluster):
    yield cluster
    for i, b in enumerate(cluster.bookies):
        if not b.alive:
            cluster.start(i)


@pytest.fixture
def bk(c):
    with BookKeeper(c.metadata_uri, add_timeout=5, read_timeout=5) as client:
        yield client


def kill_and_wait(c, bk, bookie):
    c.kill(c.bookie_ids.index(bookie))
    wait_until(lambda: bookie not in registry.list_bookies(bk.store), 30,
               what=f"{bookie} to unregister")


def stub(bookie):
    ch = bookie_channel(bookie)
    return pb_grpc.BookieStub(ch), ch


def test_closed_ledger_with_fragments_is_rereplicated(c, bk):
    lh, payloads = write_ledger(bk, 30, close=False)
    # second fragment: force an ensemble change by killing a member mid-ledger
    first = lh.metadata.last_ensemble()
    kill_and_wait(c, bk, first[1])
    more = [b"more-%d" % i for i in range(30)]
    for p in more:
        lh.append(p)
    lh.close()
    c.start(c.bookie_ids.index(first[1]))
    md = bk.ledger_metadata(lh.ledger_id)
    assert len(md.ensembles) == 2 and md.state is LedgerState.CLOSED
    # now lose a bookie of the second fragment that is also in the first
    victim = next(b for b in md.ensembles[1][1] if b in md.ensembles[0][1])
    kill_and_wait(c, bk, victim)
    res = LedgerReplicator(bk).replicate_ledger(lh.ledger_id)
    assert res.status == FULL, res
    assert res.fragments_replicated == 2
    md2 = bk.ledger_metadata(lh.ledger_id)
    assert victim not in md2.all_bookies()
    # nothing but the one member of each fragment changed; state, end and length kept
    assert (md2.state, md2.last_entry_id, md2.length) == (md.state, md.last_entry_id, md.length)
    for (f1, b1), (f2, b2) in zip(md.ensembles, md2.ensembles):
        assert f1 == f2 and sum(x != y for x, y in zip(b1, b2)) == 1
    assert not replication_problems(bk, lh.ledger_id, 60)
    read_back(bk, lh.ledger_id, payloads + more)


def test_copy_to_a_bookie_that_has_the_ledger_fenced_uses_recovery_adds(c, bk):
    lh, payloads = write_ledger(bk, 20)
    ens = lh.metadata.last_ensemble()
    (other,) = [b for b in c.bookie_ids if b not in ens]
    # the only candidate replacement has the ledger fenced (as after a recovery that fenced
    # a later ensemble)
    s, ch = stub(other)
    r = s.Read(pb.ReadRequest(ledger_id=lh.ledger_id, entry_id=-1,
                              flags=pb.ReadRequest.FENCE_LEDGER,
                              master_key=master_key_of(bk, lh.ledger_id)), timeout=10)
    assert r.status in (errors.EOK, errors.ENOENTRY, errors.ENOLEDGER)
    victim = ens[2]
    kill_and_wait(c, bk, victim)
    res = LedgerReplicator(bk).replicate_ledger(lh.ledger_id)
    assert res.status == FULL, res
    md = bk.ledger_metadata(lh.ledger_id)
    assert md.ensembles[0][1][2] == other
    assert not replication_problems(bk, lh.ledger_id, 20)
    # still fenced for normal writers
    body = DigestManager(lh.ledger_id, "crc32c").frame(100, 19, 1, b"x")
    r = s.Add(pb.AddRequest(ledger_id=lh.ledger_id, entry_id=100,
                            master_key=master_key_of(bk, lh.ledger_id),
                            body=body), timeout=10)
    assert r.status == errors.EFENCED
    ch.close()
    read_back(bk, lh.ledger_id, payloads)


def master_key_of(bk, lid: int) -> bytes:
    return bk.ledger_metadata(lid).keys.derive(PW).master_key


def _manual_ledger(bk, ensemble, n, skip, qw=2):
    """A CLOSED ledger written entry by entry to its write sets, skipping ``skip`` =
    {(entry, bookie)} -- entries that a live bookie should hold but lacks."""
    md = ledger_store.create_ledger(bk.store, LedgerMetadata.new(ensemble, qw, 2, password=PW))
    keys = md.keys.derive(PW)
    dm = DigestManager(md.ledger_id, md.digest_type, keys.mac_key)
    length = 0
    for e in range(n):
        payload = b"m%04d" % e
        length += len(payload)
        body = dm.frame(e, e - 1, length, payload)
        for b in quorum.write_set_bookies(e, ensemble, qw):
            if (e, b) in skip:
                continue
            r = bk.ctx.pool.get(b).add(md.ledger_id, e, body, keys.master_key).result()
            assert r.status == errors.EOK
    closed = md.with_closed(n - 1, length)
    ledger_store.write_ledger(bk.store, closed, ledger_store.CREATED_VERSION)
    return md.ledger_id, [b"m%04d" % e for e in range(n)]


def test_fenced_ledger_missing_entries_on_live_bookie_repaired(c, bk):
    ensemble = c.bookie_ids[:3]
    lacking = quorum.write_set_bookies(5, ensemble, 2)[1]
    lid, payloads = _manual_ledger(bk, ensemble, 12, skip={(5, lacking)})
    # recovery fences every bookie of the ensemble: the repair must use RECOVERY_ADD
    for b in ensemble:
        s, ch = stub(b)
        s.Read(pb.ReadRequest(ledger_id=lid, entry_id=-1, flags=pb.ReadRequest.FENCE_LEDGER,
                              master_key=master_key_of(bk, lid)), timeout=10)
        ch.close()
    assert 5 not in list_entries(bk.ctx, lacking, lid)
    assert replication_problems(bk, lid, 12)
    # the auditor's periodic full check finds it ...
    auditor = Auditor(bk, AuditorConfig(), "test-auditor")
    auditor.check_all_ledgers()
    urm = UnderReplicationManager(bk.store)
    assert lid in urm.list()
    # ... the cluster-wide switch holds workers back ...
    worker = ReplicationWorker(bk, WorkerConfig(), "test-worker")
    urm.disable()
    try:
        assert worker.run_once() is False and lid in urm.list()
    finally:
        urm.enable()
    # ... and a worker repairs it and removes the record
    wait_until(lambda: worker.run_once() or lid not in urm.list(), 30,
               what="a worker pass")
    assert lid not in urm.list()
    assert 5 in list_entries(bk.ctx, lacking, lid)
    assert not replication_problems(bk, lid, 12)
    read_back(bk, lid, payloads)


def test_empty_and_open_ledgers(c, bk):
    empty = bk.create_ledger(3, 2, 2, password=PW)
    empty.close()
    open_lh, payloads = write_ledger(bk, 10, close=False)
    victim = next(b for b in open_lh.metadata.last_ensemble()
                  if b in empty.metadata.last_ensemble())
    kill_and_wait(c, bk, victim)
    rep = LedgerReplicator(bk)
    res = rep.replicate_ledger(empty.ledger_id)
    assert res.status == FULL and res.entries == 0
    assert victim not in bk.ledger_metadata(empty.ledger_id).all_bookies()
    # open last fragment: untouched unless fencing is allowed
    res = rep.replicate_ledger(open_lh.ledger_id)
    assert res.status == OPEN
    md = bk.ledger_metadata(open_lh.ledger_id)
    assert md.state is LedgerState.OPEN and victim in md.all_bookies()
    res = rep.replicate_ledger(open_lh.ledger_id, fence_open=True)
    assert res.status == FULL and res.fenced
    md = bk.ledger_metadata(open_lh.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 9   # nothing truncated
    assert not replication_problems(bk, open_lh.ledger_id, 10)
    read_back(bk, open_lh.ledger_id, payloads)
    # the old writer is fenced
    with pytest.raises(errors.BKError):
        open_lh.append(b"late", timeout=20)


def test_full_write_quorum_ledger_is_streamed(c, bk):
    lh, payloads = write_ledger(bk, 300, size=200, e=3, qw=3, qa=2)
    victim = lh.metadata.last_ensemble()[1]
    kill_and_wait(c, bk, victim)
    res = LedgerReplicator(bk).replicate_ledger(lh.ledger_id)
    assert res.status == FULL and res.entries == 300
    assert not replication_problems(bk, lh.ledger_id, 300)
    read_back(bk, lh.ledger_id, payloads)


class _Observed(LedgerReplicator):
    """The replicator, noting which bookie each ranged read of a copy starts on and how many
    entries are read one by one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.streamed_from: list[str] = []
        self.single_reads = 0

    def _stream(self, lid, first, count, members, *rest):
        self.streamed_from.append(members[0])
        return super()._stream(lid, first, count, members, *rest)

    def _read(self, bookie, lid, x):
        self.single_reads += 1
        return super()._read(bookie, lid, x)


def test_striped_ledger_is_copied_by_range_reads_from_every_survivor(c, bk):
    """E=3 Qw=2: a lost member's entries alternate between two write sets, so no survivor
    holds a consecutive run of them; each survivor streams its residue class (ReadRange
    with step E) and nothing is read entry by entry."""
    lh, payloads = write_ledger(bk, 600, size=300)
    ens = lh.metadata.last_ensemble()
    victim = ens[0]
    kill_and_wait(c, bk, victim)
    rep = _Observed(bk)
    res = rep.replicate_ledger(lh.ledger_id)
    assert res.status == FULL and res.entries == 400, res      # 2 of every 3 entries
    assert sorted(set(rep.streamed_from)) == sorted(ens[1:]), rep.streamed_from
    assert rep.single_reads == 0
    assert not replication_problems(bk, lh.ledger_id, 600)
    read_back(bk, lh.ledger_id, payloads)


def test_a_range_read_that_meets_a_gap_goes_on_from_another_replica(c, bk):
    """Qw=E=3: a survivor that lacks entries stops its stream at the first gap; the stream
    goes on from the other survivor, and every entry still arrives (no per-entry reads)."""
    ensemble = c.bookie_ids[:3]
    victim, holey = ensemble[0], ensemble[1]
    lid, payloads = _manual_ledger(bk, ensemble, 90, skip={(30, holey), (31, holey),
                                                           (32, holey)}, qw=3)
    kill_and_wait(c, bk, victim)
    rep = _Observed(bk)
    res = rep.replicate_ledger(lid)
    assert res.status == FULL and res.entries == 90, res
    assert rep.single_reads == 0
    assert sorted(set(rep.streamed_from)) == sorted(ensemble[1:])   # spread over both
    new = bk.ledger_metadata(lid).ensembles[0][1][0]
    assert list_entries(bk.ctx, new, lid).ranges == [(0, 89)]
    read_back(bk, lid, payloads)


def test_an_entry_no_survivor_holds_leaves_the_fragment_untouched(c, bk):
    ensemble = c.bookie_ids[:3]
    lid, _ = _manual_ledger(bk, ensemble, 40, skip={(17, b) for b in ensemble[1:]}, qw=3)
    victim = ensemble[0]
    kill_and_wait(c, bk, victim)
    res = LedgerReplicator(bk).replicate_ledger(lid)
    assert res.status == PARTIAL and "entry 17" in " ".join(res.notes), res
    assert bk.ledger_metadata(lid).ensembles[0][1] == ensemble      # no swap without a copy


def test_a_throttled_copy_keeps_to_its_rate(c, bk):
    """The copy asks the throttle before every write: on the throttle's own timeline (a
    fake clock that only its sleeps move) the copy of N bytes at R bytes/s takes N/R,
    less the one burst a throttle allows."""
    lh, payloads = write_ledger(bk, 300, size=1000)
    victim = lh.metadata.last_ensemble()[2]
    kill_and_wait(c, bk, victim)
    now = [0.0]

    def sleep(s):
        now[0] += s
    throttle = Throttle(mb_per_s=0.05, clock=lambda: now[0], sleep=sleep)   # 50,000 B/s
    res = LedgerReplicator(bk, throttle=throttle).replicate_ledger(lh.ledger_id)
    assert res.status == FULL and res.entries == 200
    expected = res.bytes / 50_000
    assert expected - BURST_S - 0.05 <= now[0] <= expected, (now[0], expected)
    read_back(bk, lh.ledger_id, payloads)


def test_quick_restart_within_the_delay_publishes_nothing(c, bk):
    lh, _ = write_ledger(bk, 5)
    victim = lh.metadata.last_ensemble()[0]
    urm = UnderReplicationManager(bk.store)
    auditor = Auditor(bk, AuditorConfig(lost_bookie_recovery_delay=120, audit_interval=1),
                      "t-auditor")
    stop = threading.Event()
    t = threading.Thread(target=auditor.run, args=(lambda: not stop.is_set(),), daemon=True)
    t.start()
    try:
        kill_and_wait(c, bk, victim)
        wait_until(lambda: victim in auditor.first_missing, 30, what="the auditor to notice")
        c.start(c.bookie_ids.index(victim))
        wait_until(lambda: victim not in auditor.first_missing, 30,
                   what="the auditor to see the bookie back")
        assert auditor.published == 0 and urm.list() == []
    finally:
        stop.set()
        t.join(10)


def test_fragments_model():
    md = LedgerMetadata.new(["a", "b", "c"], 2, 2).with_ensemble(10, ["a", "d", "c"])
    fr = fragments(md)
    assert [(f.first, f.last) for f in fr] == [(0, 9), (10, None)]
    assert fr[0].entries_of(0, 3, 2) == [0, 2, 3, 5, 6, 8, 9]
    closed = md.with_closed(7, 100)
    assert [(f.first, f.last, f.is_empty) for f in fragments(closed)] == \
        [(0, 7, False), (10, 7, True)]
