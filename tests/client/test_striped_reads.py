"""Range reads of striped ledgers (Qw < E): every bookie streams its share (ReadRange with a
step), merged in order; a failed or corrupt bookie's share continues on the next replica."""
from __future__ import annotations

import pytest

from bkspark.testing.cluster import bookie_channel
from bkspark.client import BookKeeper
from bkspark.errors import ENOENTRY, EOK
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.testing.cluster import BookieCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("striped")
    with BookieCluster(f"sqlite://{d}/meta.db", num_bookies=3, data_dir=d) as c:
        yield c


def test_bookie_streams_every_kth_entry(cluster):
    with BookKeeper(cluster.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 3, password=b"pw")     # Qa = E: every bookie has all
        lh.append_many([b"e%d" % i for i in range(20)])
        lh.close()
    with bookie_channel(cluster.bookie_ids[0]) as channel:
        replies = list(pb_grpc.BookieStub(channel).ReadRange(pb.ReadRangeRequest(
            ledger_id=lh.ledger_id, first_entry_id=2, last_entry_id=30, step=3), timeout=30))
    entries = [e.entry_id for r in replies for e in r.entries]
    assert entries == list(range(2, 20, 3))
    assert replies[-1].status == ENOENTRY and replies[-1].next_entry_id == 20
    assert all(r.status == EOK for r in replies[:-1])


def test_striped_reads_return_their_connections_for_reuse(cluster):
    """A striped read stops pulling each bookie's stream at its last entry; the stream still
    takes the end frame, so its connection is reused by the next read (no connection -- and
    no bookie thread and buffer -- per range)."""
    with BookKeeper(cluster.metadata_uri) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"pw")
        values = [b"v%d" % i for i in range(90)]
        lh.append_many(values)
        lh.close()
        clients = [bk.ctx.pool.get(b) for b in cluster.bookie_ids]
        with bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False) as rh:
            assert [e.data for e in rh.read(0, 89)] == values
            idle = [list(c._idle_reads) for c in clients]
            assert [len(i) for i in idle] == [1, 1, 1]
            for first, last in ((0, 89), (5, 70), (30, 31)):
                assert [e.data for e in rh.read(first, last)] == values[first:last + 1]
            assert [c._idle_reads for c in clients] == idle      # the same sockets


def test_striped_read_is_complete_and_ordered_and_survives_a_dead_bookie(cluster):
    with BookKeeper(cluster.metadata_uri, read_timeout=3) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"pw")
        values = [b"value-%05d" % i for i in range(600)]
        lh.append_many(values)
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert [e.data for e in rh.read(0, 599)] == values
        assert [e.entry_id for e in rh.read(17, 301)] == list(range(17, 302))
        cluster.kill(1)
        try:
            rh = bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
            assert [e.data for e in rh.read(0, 599)] == values
        finally:
            cluster.start(1)


def test_a_range_started_ahead_is_timed_from_its_first_read(cluster):
    """read() sends its requests at once (a reader starts the next ledgers while it decodes
    one); a range's time limit starts when it is first read, so one started well before its
    turn is neither timed out nor taken for a failing bookie."""
    import time
    with BookKeeper(cluster.metadata_uri, read_range_timeout=1.0) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"pw")
        values = [b"ahead-%03d" % i for i in range(40)]
        lh.append_many(values)
        lh.close()
        with bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False) as rh:
            started = rh.read(0, 39)            # the requests go out now
            time.sleep(1.5)                     # the reader is busy with earlier ranges
            assert [e.data for e in started] == values
        assert not [b for b in cluster.bookie_ids if bk.ctx.health.is_suspect(b)]
