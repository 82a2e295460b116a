"""Protocol scenarios against real bookie processes (BookieCluster, fault injection on).

Every scenario of issue 5 item 8: the seed's fencing example, the negative-threshold table of
"Closing Ledgers Safely", unknown answers abort recovery, a slow bookie during recovery,
ensemble change under load without losing an acknowledged entry, concurrent recoverers,
wrong password, E < Qw, digest mismatch served by another replica. No wall-clock asserts.
"""
from __future__ import annotations

import threading
import time

import pytest

from bkspark.testing.cluster import bookie_channel
from bkspark import errors
from bkspark.errors import (BadRequestError, FencedError, LedgerClosedError,
                            LedgerRecoveryError, UnauthorizedError)
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.testing.cluster import BookieCluster
from metadata.ledger_metadata import LedgerState
from bookie_helpers import client, idx, raw_read, recover_concurrently, wait_until  # noqa: E402,E501

PW = b"pw"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    with BookieCluster(f"sqlite://{d}/meta.db", num_bookies=4, data_dir=d,
                       fault_injection=True) as c:
        yield c


@pytest.fixture
def c(cluster):
    """The module's cluster, with faults cleared and every bookie running after the test."""
    yield cluster
    for i, b in enumerate(cluster.bookies):
        if not b.alive:
            cluster.start(i)
        else:
            cluster.resume(i)
    cluster.clear_faults()


def partial_entry_12(c, bk, qw=2, qa=2):
    """Seed setup: E=3, entries 0-11 acknowledged, entry 12 stored on one bookie only."""
    lh = bk.create_ledger(3, qw, qa, password=PW)
    assert lh.append_many([b"e%d" % i for i in range(12)]) == list(range(12))
    ens = lh.metadata.last_ensemble()
    # write set of 12 = ens[0], ens[1] (12 mod 3 = 0): the add never reaches ens[1]
    c.set_faults(idx(c, ens[1]), [dict(op="add", action="drop", ledger_id=lh.ledger_id,
                                       entry_id=12, count=1)])
    f12 = lh.append_async(b"e12")
    wait_until(lambda: raw_read(ens[0], lh.ledger_id, 12).status == errors.EOK,
               "entry 12 on the first bookie")
    assert raw_read(ens[1], lh.ledger_id, 12).status == errors.ENOENTRY
    assert not f12.done() and lh.last_add_confirmed == 11
    return lh, ens, f12


def test_fencing_example_of_the_seed(c):
    """Reader recovers while the writer still writes: closed at 12 after write-back; the
    writer's adds of 12 and 13 fail fenced, never succeed."""
    with client(c) as writer_bk, client(c) as reader_bk:
        lh, ens, f12 = partial_entry_12(c, writer_bk)
        rh = reader_bk.open_ledger(lh.ledger_id, password=PW)
        assert rh.is_closed and rh.metadata.last_entry_id == 12
        assert [e.data for e in rh.read(0, 12)] == [b"e%d" % i for i in range(13)]
        assert rh.length == sum(len(b"e%d" % i) for i in range(13))
        # written back: entry 12 now on its whole write set
        assert raw_read(ens[1], lh.ledger_id, 12).status == errors.EOK
        f13 = lh.append_async(b"e13")
        with pytest.raises(FencedError):
            f13.result(30)
        with pytest.raises(FencedError):
            f12.result(30)
        with pytest.raises(FencedError):
            lh.append(b"e14")
        assert lh.last_add_confirmed == 11
        with pytest.raises(LedgerClosedError):      # closed at 12 by the reader, not 11
            lh.close()
        md = reader_bk.ledger_metadata(lh.ledger_id)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 12


def test_writer_streaming_during_recovery_never_succeeds_past_the_end(c):
    """Recovery in the middle of a busy writer: every entry acknowledged to the writer is
    within the closed ledger and readable; nothing after the end was acknowledged."""
    with client(c) as writer_bk, client(c) as reader_bk:
        lh = writer_bk.create_ledger(3, 2, 2, password=PW)
        acked, failed = [], []
        stop = threading.Event()

        def on_done(f):
            (failed if f.exception() else acked).append(f)

        def write():
            i = 0
            while not stop.is_set():
                try:
                    f = lh.append_async(b"w%d" % i)
                except errors.BKError:
                    break
                f.add_done_callback(on_done)
                i += 1
                if i % 50 == 0:
                    time.sleep(0.001)
        t = threading.Thread(target=write)
        t.start()
        wait_until(lambda: len(acked) > 500, "some acknowledged entries")
        rh = reader_bk.open_ledger(lh.ledger_id, password=PW)
        stop.set()
        t.join(30)
        wait_until(lambda: not lh._pending, "the writer's pending adds to finish")
        last = rh.metadata.last_entry_id
        ack_ids = sorted(f.result() for f in acked)
        assert ack_ids == list(range(len(ack_ids)))
        assert ack_ids[-1] <= last
        assert all(isinstance(f.exception(), FencedError) for f in failed)
        data = [e.data for e in rh.read(0, last)]
        assert data == [b"w%d" % i for i in range(last + 1)]


@pytest.mark.parametrize("qw", [2, 3])
def test_recovery_after_writer_crash_with_a_long_unconfirmed_tail(c, qw):
    """A pipelining writer vanishes: the piggybacked LACs trail by thousands of entries;
    recovery keeps every acknowledged entry (entries already on Qa bookies are recognised
    from the bookies' entry listings, the rest read and written back)."""
    wbk = client(c)
    lh = wbk.create_ledger(3, qw, 2, password=PW)
    futs = [lh.append_many_async([b"t%d-%d" % (k, i) for i in range(500)]) for k in range(10)]
    futs[-1].result(60)
    acked = lh.last_add_confirmed
    # a partial last entry: only on one bookie of its write set
    ens = lh.metadata.last_ensemble()
    c.set_faults(idx(c, ens[(5000 + 1) % 3]), [dict(op="add", action="drop",
                                                     ledger_id=lh.ledger_id, entry_id=5000)])
    if qw == 3:
        c.set_faults(idx(c, ens[(5000 + 2) % 3]), [dict(
            op="add", action="drop", ledger_id=lh.ledger_id, entry_id=5000)])
    lh.append_async(b"partial")
    wait_until(lambda: raw_read(ens[5000 % 3], lh.ledger_id, 5000).status == errors.EOK,
               "entry 5000 on one bookie")
    wbk.close()                                   # the writer "crashes"
    c.clear_faults()
    with client(c) as rbk:
        rh = rbk.open_ledger(lh.ledger_id, password=PW)
        assert rh.last_add_confirmed == 5000 >= acked
        data = [e.data for e in rh.read(0, 5000)]
        assert data[:5000] == [b"t%d-%d" % (k, i) for k in range(10) for i in range(500)]
        assert data[5000] == b"partial"
        assert rh.length == sum(map(len, data))
        # the partial entry was written back to its whole write set (Qa acks were awaited,
        # the rest arrive on their own)
        for k in range(qw):
            wait_until(lambda k=k: raw_read(ens[(5000 + k) % 3], lh.ledger_id,
                                            5000).status == errors.EOK, "write-back")


# WQ, AQ, negative answers required ("Closing Ledgers Safely")
NEGATIVE_TABLE = [(2, 1, 2), (2, 2, 1), (3, 1, 3), (3, 2, 2), (3, 3, 1)]


@pytest.mark.parametrize("qw,qa,need", NEGATIVE_TABLE)
def test_negative_threshold_table_with_real_bookies(c, qw, qa, need):
    """Entry 5 is absent everywhere; `need` NoSuchEntry answers close the ledger at 4,
    `need - 1` (the rest of the write set failing with EIO: unknown) abort recovery."""
    with client(c) as bk:
        lh = bk.create_ledger(3, qw, qa, password=PW)
        lh.append_many([b"n%d" % i for i in range(5)])
        lid = lh.ledger_id
        ws = [lh.metadata.last_ensemble()[(5 + k) % 3] for k in range(qw)]

        def fail_entry5(n_unknown):
            for k, b in enumerate(ws):
                rules = [dict(op="read", action="fail", error=errors.EIO, ledger_id=lid,
                              entry_id=5)] if k < n_unknown else []
                c.set_faults(idx(c, b), rules)

        # one negative short of the threshold: unknown -> abort, ledger not closed
        fail_entry5(qw - (need - 1))
        with client(c) as rbk:
            with pytest.raises(LedgerRecoveryError, match="entry 5"):
                rbk.open_ledger(lid, password=PW)
            assert rbk.ledger_metadata(lid).state is LedgerState.IN_RECOVERY
        # exactly the threshold of negatives: unrecoverable -> closed at 4
        fail_entry5(qw - need)
        with client(c) as rbk:
            rh = rbk.open_ledger(lid, password=PW)
            assert rh.is_closed and rh.last_add_confirmed == 4
            assert [e.data for e in rh.read(0, 4)] == [b"n%d" % i for i in range(5)]


@pytest.mark.parametrize("action", ["fail", "drop"])
def test_unknown_answers_abort_recovery(c, action):
    """EIO / no answer from the bookies of entry 12's write set: recovery aborts with
    LedgerRecoveryError and never closes; once they answer again recovery completes."""
    with client(c) as wbk, client(c, read_timeout=2, speculative_read_timeout=0) as rbk:
        lh, ens, f12 = partial_entry_12(c, wbk)
        lid = lh.ledger_id
        for b in ens[:2]:
            c.set_faults(idx(c, b), [dict(op="read", action=action, error=errors.EIO,
                                          ledger_id=lid, entry_id=12)])
        with pytest.raises(LedgerRecoveryError, match="entry 12"):
            rbk.open_ledger(lid, password=PW)
        md = rbk.ledger_metadata(lid)
        assert md.state is LedgerState.IN_RECOVERY and md.last_entry_id == -1
        c.clear_faults()    # "retry later": the bookies answer again
        rh = rbk.open_ledger(lid, password=PW)
        assert rh.is_closed and rh.last_add_confirmed == 12
        with pytest.raises(FencedError):
            f12.result(30)


def test_unknown_fencing_answers_abort_recovery(c):
    with client(c) as wbk, client(c, read_timeout=2) as rbk:
        lh = wbk.create_ledger(3, 2, 2, password=PW)
        lh.append_many([b"x"] * 5)
        ens = lh.metadata.last_ensemble()
        for b in ens[:2]:       # (E - Qa) + 1 = 2 fenced bookies needed; only 1 answers
            c.set_faults(idx(c, b), [dict(op="read", action="fail", error=errors.EIO,
                                          ledger_id=lh.ledger_id, entry_id=-1)])
        with pytest.raises(LedgerRecoveryError, match="fencing"):
            rbk.open_ledger(lh.ledger_id, password=PW)
        assert rbk.ledger_metadata(lh.ledger_id).state is LedgerState.IN_RECOVERY
        c.clear_faults()
        rh = rbk.open_ledger(lh.ledger_id, password=PW)
        assert rh.last_add_confirmed == 4
        with pytest.raises(FencedError):     # the writer noticed IN_RECOVERY / fence
            lh.append(b"late")


@pytest.mark.parametrize("slow", [0, 1])
def test_slow_bookie_during_recovery(c, slow):
    """One bookie of entry 12's write set answers every read 1.5 s late -- the one holding
    entry 12 (slow=0) or the one without it (slow=1): recovery waits for it (a late positive
    answer still counts within the grace period) and closes at 12."""
    with client(c) as wbk, client(c, read_timeout=10, recovery_negative_grace=5) as rbk:
        lh, ens, f12 = partial_entry_12(c, wbk)
        c.set_faults(idx(c, ens[slow]), [dict(op="read", action="delay", delay_ms=1500,
                                              ledger_id=lh.ledger_id)])
        rh = rbk.open_ledger(lh.ledger_id, password=PW)
        assert rh.is_closed and rh.last_add_confirmed == 12
        assert [e.data for e in rh.read(0, 12)] == [b"e%d" % i for i in range(13)]
        with pytest.raises(FencedError):
            f12.result(30)


@pytest.mark.parametrize("how", ["kill", "pause"])
def test_ensemble_change_under_load_loses_no_acknowledged_entry(c, how):
    with client(c, add_timeout=2) as bk:
        lh = bk.create_ledger(3, 2, 2, password=PW)
        ens = lh.metadata.last_ensemble()
        victim = idx(c, ens[1])
        futs = []
        for i in range(6000):
            futs.append(lh.append_async(b"load-%d" % i))
            if i == 2000:
                futs[1000].result(30)
                c.kill(victim) if how == "kill" else c.pause(victim)
        ids = [f.result(60) for f in futs]
        assert ids == list(range(6000))
        md = lh.metadata
        assert len(md.ensembles) >= 2 and ens[1] not in md.last_ensemble()
        assert set(md.last_ensemble()) & set(c.bookie_ids) == set(md.last_ensemble())
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=PW)
        assert rh.last_add_confirmed == 5999
        assert [e.data for e in rh.read(0, 5999)] == [b"load-%d" % i for i in range(6000)]
        c.resume(victim)


def test_stuck_bookie_outside_the_ack_quorum_is_replaced(c):
    """Qw=3, Qa=2 and one bookie paused: adds keep being acknowledged by the other two, the
    paused bookie's unsent backlog stays bounded and it is replaced by an ensemble change --
    once its backlog passes twice the bound, not after a time in which a fast writer queues
    gigabytes for it (it was 3.5 GB in 10 s: the client's memory, and the other bookies'
    disks, grew with the writer's rate)."""
    with client(c, add_timeout=1, max_bookie_backlog_bytes=1 << 20) as bk:
        lh = bk.create_ledger(3, 3, 2, password=PW)
        ens = lh.metadata.last_ensemble()
        lh.append(b"warm")
        c.pause(idx(c, ens[2]))
        payload = b"p" * 65536
        n = 1
        deadline = time.monotonic() + 60
        while ens[2] in lh.metadata.last_ensemble():
            assert time.monotonic() < deadline, "the paused bookie was never replaced"
            lh.append_many([payload] * 8)
            n += 8
        assert n * len(payload) < 64 << 20, f"{n} entries written before the replacement"
        assert lh.append(b"after") == n
        lh.close()
        c.resume(idx(c, ens[2]))
        rh = bk.open_ledger(lh.ledger_id, password=PW)
        assert rh.last_add_confirmed == n
        assert [e.data for e in rh.read(n - 1, n)] == [payload, b"after"]


def test_two_concurrent_recoverers_converge(c):
    with client(c) as wbk:
        lh, ens, f12 = partial_entry_12(c, wbk)
        results = recover_concurrently(c, lh.ledger_id, PW)
        assert results[0] == results[1]
        md = wbk.ledger_metadata(lh.ledger_id)
        assert md.state is LedgerState.CLOSED and results[0][0] == md.last_entry_id == 12


def test_wrong_password_and_bad_quorums(c):
    with client(c) as bk:
        with pytest.raises(BadRequestError, match="E >= Qw >= Qa"):
            bk.create_ledger(ensemble_size=2, write_quorum=3, ack_quorum=2)
        with bk.create_ledger(3, 2, 2, password=b"secret") as lh:
            lh.append(b"x")
        for recovery in (True, False):
            with pytest.raises(UnauthorizedError, match="wrong password"):
                bk.open_ledger(lh.ledger_id, password=b"guess", recovery=recovery)
        # a bookie refuses a fencing read with the wrong master key
        ens = lh.metadata.last_ensemble()
        with bookie_channel(ens[0]) as ch:
            r = pb_grpc.BookieStub(ch).Read(pb.ReadRequest(
                ledger_id=lh.ledger_id, entry_id=-1, flags=pb.ReadRequest.FENCE_LEDGER,
                master_key=b"guess".ljust(20, b".")), timeout=10)
        assert r.status == errors.EUA


def test_fencing_a_ledger_the_bookie_never_saw_still_fences_it(c):
    """Recovery counts NoSuchLedger fence answers as fenced: the bookie must then refuse
    the old writer's adds for that ledger."""
    with client(c) as bk:
        lh = bk.create_ledger(3, 3, 2, password=PW)
        (bid,) = [b for b in c.bookie_ids if b not in lh.metadata.last_ensemble()]
        lid, mk = lh.ledger_id, lh._master_key
        with bookie_channel(bid) as ch:
            stub = pb_grpc.BookieStub(ch)
            r = stub.Read(pb.ReadRequest(ledger_id=lid, entry_id=-1, master_key=mk,
                                         flags=pb.ReadRequest.FENCE_LEDGER), timeout=10)
            assert r.status in (errors.ENOLEDGER, errors.ENOENTRY, errors.EOK)
            body = b"".join([lid.to_bytes(8, "big"), (0).to_bytes(8, "big"),
                             (-1).to_bytes(8, "big", signed=True), (1).to_bytes(8, "big"),
                             b"\0\0\0\0", b"x"])
            r = stub.Add(pb.AddRequest(ledger_id=lid, entry_id=0, master_key=mk, body=body),
                         timeout=10)
            assert r.status == errors.EFENCED
        lh.close()


def test_fencing_claims_no_ledger_id_for_another_key(c):
    """A client fencing ids the metadata does not list yet (ids are sequential: the next
    ones are easy to guess) leaves no record on the bookies, so the ledgers later created
    with those ids are written by their own keys; fencing a listed ledger with a key that is
    not its own is refused. Before, the first key a bookie saw claimed the id for good and
    the real writer got "wrong password"."""
    with client(c) as bk:
        probe = bk.create_ledger(3, 3, 2, password=PW)
        probe.close()
        upcoming = range(probe.ledger_id + 1, probe.ledger_id + 20)
        squatter = b"s" * 20
        for bid in c.bookie_ids:
            with bookie_channel(bid) as ch:
                stub = pb_grpc.BookieStub(ch)
                for lid in upcoming:
                    r = stub.Read(pb.ReadRequest(ledger_id=lid, entry_id=-1,
                                                 master_key=squatter,
                                                 flags=pb.ReadRequest.FENCE_LEDGER), timeout=10)
                    assert r.status == errors.ENOLEDGER, errors.status_name(r.status)
        for _ in range(3):
            lh = bk.create_ledger(3, 3, 2, password=PW)
            assert lh.ledger_id in upcoming
            (bid,) = [b for b in c.bookie_ids if b not in lh.metadata.last_ensemble()]
            with bookie_channel(bid) as ch:
                r = pb_grpc.BookieStub(ch).Read(pb.ReadRequest(
                    ledger_id=lh.ledger_id, entry_id=-1, master_key=squatter,
                    flags=pb.ReadRequest.FENCE_LEDGER), timeout=10)
                assert r.status == errors.EUA
            assert lh.append_many([b"mine-%d" % i for i in range(3)]) == [0, 1, 2]
            lh.close()
            rh = bk.open_ledger(lh.ledger_id, password=PW)
            assert [e.data for e in rh.read(0, 2)] == [b"mine-%d" % i for i in range(3)]


def test_digest_mismatch_served_from_another_replica(c):
    with client(c) as bk:
        lh = bk.create_ledger(3, 3, 2, password=PW)
        lh.append_many([b"d%d" % i for i in range(4)])
        ens = lh.metadata.last_ensemble()
        first = ens[4 % 3]      # first replica asked for entry 4
        c.set_faults(idx(c, first), [dict(op="add", action="drop", ledger_id=lh.ledger_id,
                                          entry_id=4, count=1)])
        assert lh.append(b"d4") == 4          # acknowledged by the two others
        lh.append(b"d5")
        lh.close()
        # a corrupt copy of entry 4 on the first replica
        good = raw_read(ens[(4 + 1) % 3], lh.ledger_id, 4).body
        bad = good[:-1] + bytes([good[-1] ^ 0xFF])
        with bookie_channel(first) as ch:
            r = pb_grpc.BookieStub(ch).Add(pb.AddRequest(
                ledger_id=lh.ledger_id, entry_id=4, master_key=lh.metadata.keys.derive(PW).master_key,
                flags=pb.AddRequest.RECOVERY_ADD, body=bad), timeout=10)
        assert r.status == errors.EOK
        assert raw_read(first, lh.ledger_id, 4).body == bad
        rh = bk.open_ledger(lh.ledger_id, password=PW)
        assert rh.read_entry(4).data == b"d4"                       # per-entry read
        assert [e.data for e in rh.read(4, 5)] == [b"d4", b"d5"]   # range read from `first`
        assert [e.data for e in rh.read(0, 5)] == [b"d%d" % i for i in range(6)]


def test_one_append_many_larger_than_a_bookie_frame(c):
    """One call of 72 MiB (the bookies' frame limit is max_message_bytes, 64 MiB) goes out as
    several add messages: every entry acknowledged, none refused or replaced."""
    big = [bytes([i]) * (2 << 20) for i in range(36)]
    with client(c) as bk:
        lh = bk.create_ledger(3, 2, 2, password=PW)
        assert lh.append_many(big, timeout=120) == list(range(36))
        assert lh.ensemble_changes == 0
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=PW)
        assert [e.data for e in rh.read(0, 35)] == big
