"""Range reads sent together (``BookieClient.read_ranges``, ``RangeBatch``): one send and one
data-port connection per bookie for many small ranges, answered in order -- and each range
still complete, ordered, its own errors its own, whatever order the ranges are read in, with
a stalled or dead bookie failing over as a lone range does."""
from __future__ import annotations

import gc
import threading
import time

import pytest

from bkspark.client import BookKeeper, RangeBatch
from bkspark.errors import (BadRequestError, BookieUnavailableError, NoSuchEntryError,
                            NoSuchLedgerError, OperationTimeoutError)
from bkspark.testing.cluster import BookieCluster

PW = b"pw"
ENTRIES = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipelined")
    with BookieCluster(f"sqlite://{d}/meta.db", num_bookies=3, data_dir=d) as c:
        yield c


def small_ledgers(bk, n: int, write_quorum: int) -> dict[int, list[bytes]]:
    """``n`` closed ledgers of ENTRIES entries (E=3), by id."""
    out = {}
    for i in range(n):
        lh = bk.create_ledger(3, write_quorum, write_quorum, password=PW)
        values = [b"L%d-e%d" % (i, j) for j in range(ENTRIES)]
        lh.append_many(values)
        lh.close()
        out[lh.ledger_id] = values
    return out


def payloads(it) -> list[tuple[int, bytes]]:
    """``(entry_id, body)`` pairs of a range iterator, bodies copied (they are views)."""
    return [(eid, bytes(body)) for eid, body in it]


def check(pairs, values, first=0, step=1):
    """Entry ids first, first+step, ... and each body ending in its value (after the
    digest header)."""
    assert [eid for eid, _ in pairs] == list(range(first, first + step * len(pairs), step))
    for eid, body in pairs:
        assert body.endswith(values[eid]), (eid, body)


def pipeline_of(it):
    """The _Pipeline under a range iterator of ``read_ranges``."""
    return it.gi_frame.f_locals["chunks"]._pipeline


def fresh_client(bk, bookie_id):
    """The bookie's client with no idle range connection (so the test sees its own)."""
    client = bk.ctx.pool.get(bookie_id)
    with client._lock:
        idle, client._idle_reads = client._idle_reads, []
    for sock in idle:
        sock.close()
    return client


def test_ranges_sent_together_are_answered_in_order_on_one_connection(cluster):
    with BookKeeper(cluster.metadata_uri) as bk:
        ledgers = small_ledgers(bk, 30, write_quorum=3)      # every bookie holds every entry
        client = fresh_client(bk, cluster.bookie_ids[0])
        its = client.read_ranges([(lid, 0, ENTRIES - 1, 1) for lid in ledgers])
        for it, values in zip(its, ledgers.values()):
            check(payloads(it), values)
        assert len(client._idle_reads) == 1         # the one connection, back for reuse
        sock = client._idle_reads[0]
        its = client.read_ranges([(lid, 1, ENTRIES - 1, 3) for lid in ledgers])  # with a step
        for it, values in zip(its, ledgers.values()):
            check(payloads(it), values, first=1, step=3)
        assert client._idle_reads == [sock]


def test_a_range_read_before_the_ones_sent_ahead_of_it_holds_theirs(cluster):
    with BookKeeper(cluster.metadata_uri) as bk:
        ledgers = small_ledgers(bk, 12, write_quorum=3)
        client = fresh_client(bk, cluster.bookie_ids[1])
        its = client.read_ranges([(lid, 0, ENTRIES - 1, 1) for lid in ledgers])
        got = {}
        for k in reversed(range(len(its))):         # the last first: all the others held
            got[k] = payloads(its[k])
        for k, values in enumerate(ledgers.values()):
            check(got[k], values)
        assert len(client._idle_reads) == 1


def test_ranges_closed_or_dropped_early_leave_the_others_whole(cluster):
    with BookKeeper(cluster.metadata_uri) as bk:
        ledgers = small_ledgers(bk, 6, write_quorum=3)
        values = list(ledgers.values())
        client = fresh_client(bk, cluster.bookie_ids[2])
        its = client.read_ranges([(lid, 0, ENTRIES - 1, 1) for lid in ledgers])
        first = next(its[0])
        assert bytes(first[1]).endswith(values[0][0])
        its[0].close()                  # half read: the rest of its answer is dropped
        its[1] = None                   # never read
        its[3].close()                  # closed before it was read
        for k in (2, 4, 5):
            check(payloads(its[k]), values[k])
        assert len(client._idle_reads) == 1
        # every range closed unread: the connection is closed, not kept with answers on it
        its = client.read_ranges([(lid, 0, ENTRIES - 1, 1) for lid in ledgers])
        assert client._idle_reads == []
        for it in its:
            it.close()
        assert client._idle_reads == []
        check(payloads(client.read_ranges([(next(iter(ledgers)), 0, 7, 1)])[0]), values[0])


def test_each_range_has_its_own_error(cluster):
    with BookKeeper(cluster.metadata_uri) as bk:
        ledgers = small_ledgers(bk, 2, write_quorum=3)
        (a, va), (b, vb) = ledgers.items()
        client = fresh_client(bk, cluster.bookie_ids[0])
        its = client.read_ranges([(a, 0, 7, 1), (10 ** 12, 0, 7, 1), (b, 0, 20, 1), (a, 2, 5, 1)])
        check(payloads(its[0]), va)
        with pytest.raises((NoSuchLedgerError, NoSuchEntryError)):
            payloads(its[1])
        got = []
        with pytest.raises(NoSuchEntryError):      # what it holds, then the end of the ledger
            for pair in its[2]:
                got.append((pair[0], bytes(pair[1])))
        check(got, vb)
        check(payloads(its[3]), va, first=2)
        assert len(client._idle_reads) == 1


def test_a_stalled_bookie_times_out_the_ranges_behind_it_and_its_connection_is_dropped(cluster):
    with BookKeeper(cluster.metadata_uri) as bk:
        ledgers = small_ledgers(bk, 3, write_quorum=3)
        ids = list(ledgers)
        client = fresh_client(bk, cluster.bookie_ids[1])
        cluster.set_faults(1, [{"op": "read_range", "action": "delay", "delay_ms": 2500,
                                "ledger_id": ids[0]}])
        try:
            its = client.read_ranges([(lid, 0, 7, 1) for lid in ids], timeout=0.8)
            t0 = time.monotonic()
            with pytest.raises(OperationTimeoutError):
                payloads(its[1])             # waits behind the stalled first range
            assert time.monotonic() - t0 < 2.0
            for it in (its[0], its[2]):     # the connection is broken for every range on it
                with pytest.raises((OperationTimeoutError, BookieUnavailableError)):
                    payloads(it)
            assert client._idle_reads == []
        finally:
            cluster.clear_faults(1)
        time.sleep(2.0)                     # (the stalled answer ends on the closed socket)
        check(payloads(client.read_ranges([(ids[2], 0, 7, 1)])[0]), ledgers[ids[2]])


def test_a_batch_reads_striped_ledgers_and_falls_over_a_bookie_killed_after_it_was_sent(cluster):
    with BookKeeper(cluster.metadata_uri, read_timeout=3, read_range_timeout=3) as bk:
        ledgers = small_ledgers(bk, 40, write_quorum=2)      # striped: every bookie a share
        handles = {lid: bk.open_ledger(lid, password=PW, recovery=False) for lid in ledgers}
        for bookie in cluster.bookie_ids:
            fresh_client(bk, bookie)
        batch = RangeBatch()
        reads = {lid: rh.read(0, ENTRIES - 1, batch) for lid, rh in handles.items()}
        batch.send()
        for lid, entries in reads.items():
            assert [e.data for e in entries] == ledgers[lid]
        # one connection per bookie carried the whole batch
        assert [len(bk.ctx.pool.get(b)._idle_reads) for b in cluster.bookie_ids] == [1, 1, 1]
        batch = RangeBatch()                # iterated before it was sent: a clear error,
        entries = handles[lid].read(0, ENTRIES - 1, batch)     # no bookie taken for failing
        with pytest.raises(BadRequestError, match="batch.send"):
            list(entries)
        assert not [b for b in cluster.bookie_ids if bk.ctx.health.is_suspect(b)]

        batch = RangeBatch()
        reads = {lid: rh.read(0, ENTRIES - 1, batch) for lid, rh in handles.items()}
        batch.send()
        cluster.kill(1)
        try:
            for lid, entries in reads.items():
                assert [e.data for e in entries] == ledgers[lid]
        finally:
            cluster.start(1)
        for rh in handles.values():
            rh.close()


def test_ranges_held_for_a_later_read_hold_their_entries_not_frame_buffers(cluster):
    """Chunks read for ranges not yet iterated are copied out of the client's frame pool
    (whose buffers are at least 1 MiB each): 99 held ranges of 8 x 100 bytes once pinned
    99 MiB."""
    with BookKeeper(cluster.metadata_uri) as bk:
        ids = []
        for _ in range(100):
            lh = bk.create_ledger(3, 3, 3, password=PW)
            lh.append_many([b"x" * 100 for _ in range(ENTRIES)])
            lh.close()
            ids.append(lh.ledger_id)
        client = fresh_client(bk, cluster.bookie_ids[0])
        its = client.read_ranges([(lid, 0, ENTRIES - 1, 1) for lid in ids])
        assert len(payloads(its[-1])) == ENTRIES       # the last first: 99 ranges held
        held = [body for q in pipeline_of(its[0]).held.values() for _, _, entries in q
                for _, body in entries]
        assert len(held) == 99 * ENTRIES
        entry_bytes = sum(len(b) for b in held)
        pinned = sum(len(b.obj) for b in {id(b.obj): b for b in held}.values())
        assert pinned < 4 * entry_bytes


def test_a_failed_pipeline_closes_its_connection_at_once(cluster):
    """No socket kept open by the pipeline's reader file, nor by a reference cycle through
    a stored exception's traceback (the bookie would go on answering into it)."""
    with BookKeeper(cluster.metadata_uri) as bk:
        ids = list(small_ledgers(bk, 20, write_quorum=3))
        client = fresh_client(bk, cluster.bookie_ids[0])
        cluster.set_faults(0, [{"op": "read_range", "action": "delay", "delay_ms": 1500,
                                "ledger_id": ids[0]}])
        gc.disable()
        try:
            its = client.read_ranges([(lid, 0, ENTRIES - 1, 1) for lid in ids], timeout=0.5)
            raw = pipeline_of(its[0]).sock
            errs = []
            for it in its:
                with pytest.raises((OperationTimeoutError, BookieUnavailableError)) as exc:
                    payloads(it)
                errs.append(exc.value)
            assert raw.fileno() == -1                   # closed while its ranges live
            assert len({id(e) for e in errs}) == len(errs)      # each its own exception
        finally:
            gc.enable()
            cluster.clear_faults(0)
        time.sleep(1.5)


def test_a_slow_reader_of_one_range_fails_only_that_range(cluster):
    """A range whose own deadline passed between frames (its reader was busy elsewhere)
    times out alone: the connection is sound and the other ranges are read from it."""
    with BookKeeper(cluster.metadata_uri) as bk:
        ledgers = small_ledgers(bk, 4, write_quorum=3)
        client = fresh_client(bk, cluster.bookie_ids[2])
        its = client.read_ranges([(lid, 0, ENTRIES - 1, 1) for lid in ledgers], timeout=1.0,
                                 max_bytes=60)         # several chunks a range
        next(its[0])                    # its 1 s starts
        time.sleep(1.2)
        with pytest.raises(OperationTimeoutError):
            payloads(its[0])
        for it, values in list(zip(its, ledgers.values()))[1:]:
            check(payloads(it), values)
        assert len(client._idle_reads) == 1


def test_closing_a_range_never_waits_for_another_threads_read(cluster):
    with BookKeeper(cluster.metadata_uri) as bk:
        ledgers = small_ledgers(bk, 4, write_quorum=3)
        ids, values = list(ledgers), list(ledgers.values())
        client = fresh_client(bk, cluster.bookie_ids[1])
        cluster.set_faults(1, [{"op": "read_range", "action": "delay", "delay_ms": 2000,
                                "ledger_id": ids[0]}])
        try:
            its = client.read_ranges([(lid, 0, ENTRIES - 1, 1) for lid in ids], timeout=10)
            got = {}
            reader = threading.Thread(target=lambda: got.update(first=payloads(its[0])))
            reader.start()
            time.sleep(0.3)             # the reader waits on the stalled bookie
            t0 = time.monotonic()
            its[3].close()
            assert time.monotonic() - t0 < 0.5
            reader.join()
            check(got["first"], values[0])
            for k in (1, 2):
                check(payloads(its[k]), values[k])
        finally:
            cluster.clear_faults(1)


def test_short_ledgers_in_a_batch_are_streamed_not_read_entry_by_entry(cluster, monkeypatch):
    """A fragment of fewer than 2E entries alone is read entry by entry (a few single reads
    cost less than a stream from each bookie); in a batch its ranges share the batch's sends
    instead (a single read is a gRPC call each, ~1 ms of client CPU: 2026-11-28)."""
    from bkspark.client.bookie_client import BookieClient
    single = []
    real_read = BookieClient.read
    monkeypatch.setattr(BookieClient, "read",
                        lambda self, *a, **kw: single.append(a) or real_read(self, *a, **kw))
    with BookKeeper(cluster.metadata_uri) as bk:
        for qw in (2, 3):                       # striped, and every bookie every entry
            ledgers = {}
            for i in range(12):
                lh = bk.create_ledger(3, qw, qw, password=PW)
                ledgers[lh.ledger_id] = [b"S%d-%d-%d" % (qw, i, j) for j in range(3)]
                lh.append_many(ledgers[lh.ledger_id])
                lh.close()
            handles = {lid: bk.open_ledger(lid, password=PW, recovery=False) for lid in ledgers}
            batch = RangeBatch()
            reads = {lid: rh.read(0, 2, batch) for lid, rh in handles.items()}
            batch.send()
            for lid, entries in reads.items():
                assert [e.data for e in entries] == ledgers[lid]
            assert single == []
            lid = next(iter(ledgers))
            assert [e.data for e in handles[lid].read(0, 2)] == ledgers[lid]
            assert len(single) == 3                 # alone: entry by entry, as before
            single.clear()
            for rh in handles.values():
                rh.close()
