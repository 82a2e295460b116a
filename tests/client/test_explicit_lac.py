"""Explicit LAC of an idle writer, against real bookie processes (BookieCluster).

A writer's LAC reaches the bookies piggybacked on its next entry; when the add stream goes
idle, the writer sends it explicitly (WriteLac) ``explicit_lac_delay`` later, and the bookies
wake their long-polling readers. The writers here keep ``explicit_lac_interval`` (the old,
periodic path) at 30 s unless a test is about it: a reader that sees a lone last entry within
its long poll (a few seconds) can only have been told by the delayed send. No wall-clock
asserts: every bound is a long poll's own timeout.
"""
from __future__ import annotations

import threading
import time

import pytest

from bkspark.client import BookKeeper
from bkspark.testing.cluster import BookieCluster, bookie_http

SLOW_INTERVAL = 30.0        # the periodic path never fires within a test
POLL = 8.0                  # a reader's long poll (bookies cap one at 10 s)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data = tmp_path_factory.mktemp("explicit-lac")
    with BookieCluster(f"sqlite:///{data}/meta.db", num_bookies=3, data_dir=data,
                       fault_injection=True) as c:
        yield c


@pytest.fixture
def reader_bk(cluster):
    with BookKeeper(cluster.metadata_uri, read_timeout=5) as bk:
        yield bk


def write_lac_requests(cluster) -> int:
    """WriteLac requests the bookies answered so far (their /metrics, every status)."""
    total = 0
    for b in cluster.bookies:
        body = bookie_http(b, "/metrics")[1].decode()
        for line in body.splitlines():
            if line.startswith("bookie_write_lac_requests_total{"):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


class LongPoll(threading.Thread):
    """``rh.read_lac_long_poll(previous, POLL)`` on a thread (started before the add)."""

    def __init__(self, rh, previous: int):
        super().__init__(daemon=True)
        self.rh, self.previous, self.lac = rh, previous, None

    def run(self):
        self.lac = self.rh.read_lac_long_poll(self.previous, POLL)

    def result(self) -> int:
        self.join(POLL + 30)
        return self.lac


def test_lone_last_entry_wakes_a_long_polling_reader_of_another_client(cluster, reader_bk):
    """Each lone entry of a trickle writer (entry e carries LAC e-1) becomes visible to a
    reader already waiting in a long poll: the writer's WriteLac, sent once the add stream
    went idle, wakes it. Before, only the periodic path (here 30 s) told the bookies."""
    with BookKeeper(cluster.metadata_uri, explicit_lac_interval=SLOW_INTERVAL) as wbk:
        lh = wbk.create_ledger(3, 2, 2, password=b"pw")
        rh = reader_bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert rh.last_add_confirmed == -1
        for e in range(3):
            poll = LongPoll(rh, e - 1)
            poll.start()
            assert lh.append(b"lone-%d" % e) == e
            assert poll.result() == e, "the lone entry never became visible to the reader"
            assert rh.read_entry(e).data == b"lone-%d" % e
        assert lh.explicit_lac_rounds == 3      # one per idle period
        lh.close()


def test_trickle_sends_a_write_lac_only_when_the_lac_moved(cluster, reader_bk):
    """One WriteLac round (to the E bookies) per lone entry, and none while the writer stays
    idle with an unchanged LAC -- not after the delay again, not from the periodic path."""
    with BookKeeper(cluster.metadata_uri, explicit_lac_interval=0.3) as wbk:
        lh = wbk.create_ledger(3, 2, 2, password=b"pw")
        rh = reader_bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        before = write_lac_requests(cluster)
        for e in range(4):
            lh.append(b"t%d" % e)
            assert rh.read_lac_long_poll(e - 1, POLL) == e
        rounds = lh.explicit_lac_rounds
        assert rounds == 4
        time.sleep(1.5)         # several delays, the 0.3-s interval and the 0.5-s ticks
        assert lh.explicit_lac_rounds == rounds
        assert write_lac_requests(cluster) - before == 3 * rounds
        lh.close()


@pytest.mark.parametrize("mode", ["pipelined", "one at a time"])
def test_steady_adds_send_no_write_lac_per_add(cluster, mode):
    """Adds that keep coming carry the LAC themselves: a steady writer sends WriteLac only when
    it stops (once), not per add -- also when every add is acknowledged before the next one
    is appended (the stream goes idle between adds for less than the delay)."""
    n = 2000 if mode == "pipelined" else 300
    with BookKeeper(cluster.metadata_uri, explicit_lac_interval=SLOW_INTERVAL) as wbk:
        lh = wbk.create_ledger(3, 2, 2, password=b"pw")
        before = write_lac_requests(cluster)
        if mode == "pipelined":
            futures = [lh.append_async(b"s%d" % i) for i in range(n)]
            assert futures[-1].result(60) == n - 1
        else:
            for i in range(n):
                lh.append(b"s%d" % i)
        lh.flush(30)
        deadline = time.monotonic() + POLL     # the stop's round, when it has been sent
        while lh.explicit_lac_rounds == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        rounds = lh.explicit_lac_rounds
        # one round when the writer stopped; a few more only if this process stalled for
        # longer than the delay between two adds (a loaded machine) -- never one per add
        assert 1 <= rounds <= 5, rounds
        time.sleep(0.3)
        assert write_lac_requests(cluster) - before == 3 * lh.explicit_lac_rounds
        lh.close()


def test_write_lac_no_bookie_stored_is_sent_again_after_the_interval(cluster, reader_bk):
    """Every bookie fails the delayed WriteLac: the LAC is not lost -- once idle for
    ``explicit_lac_interval`` the writer sends it again, and then never more."""
    for i in range(3):
        cluster.set_faults(i, [{"op": "write_lac", "action": "fail", "count": 1}])
    try:
        with BookKeeper(cluster.metadata_uri, explicit_lac_interval=0.3) as wbk:
            lh = wbk.create_ledger(3, 2, 2, password=b"pw")
            rh = reader_bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
            lh.append(b"only")
            assert rh.read_lac_long_poll(-1, POLL) == 0
            time.sleep(1.2)
            assert lh.explicit_lac_rounds == 2
            lh.close()
    finally:
        cluster.clear_faults()


def test_no_explicit_lac_when_turned_off(cluster, reader_bk):
    """``explicit_lac_interval=0``: no WriteLac at all (the delayed send is off too); the
    bookies know the LAC piggybacked on the entries only."""
    with BookKeeper(cluster.metadata_uri, explicit_lac_interval=0) as wbk:
        lh = wbk.create_ledger(3, 2, 2, password=b"pw")
        lh.append_many([b"a", b"b"])
        lh.append(b"c")
        rh = reader_bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert rh.read_lac_long_poll(1, 1.0) == 1
        assert lh.explicit_lac_rounds == 0
        lh.close()


def test_flush_lac_publishes_to_a_quorum_and_returns_the_lac(cluster, reader_bk):
    """``flush_lac`` with the delayed send off: on return a LAC read with quorum coverage by
    another client sees every appended entry."""
    with BookKeeper(cluster.metadata_uri, explicit_lac_delay=0,
                    explicit_lac_interval=SLOW_INTERVAL) as wbk:
        lh = wbk.create_ledger(3, 2, 2, password=b"pw")
        assert lh.flush_lac(10) == -1 and lh.explicit_lac_rounds == 0   # nothing to publish
        futures = [lh.append_async(b"f%d" % i) for i in range(5)]
        assert lh.flush_lac(30) == 4
        assert all(f.done() for f in futures)
        rh = reader_bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert rh.read_last_add_confirmed() == 4
        assert [e.data for e in rh.read(0)] == [b"f%d" % i for i in range(5)]
        lh.close()
