"""Issue 53, item 1: a client traces a sample of its adds stage by stage (off by default),
over the data port of real bookie processes and over gRPC (in-process bookies)."""
from __future__ import annotations

import gc

import pytest

from bkspark import errors
from bkspark.client import BookKeeper
from bkspark.client.add_trace import STAGES, AddTracer
from bkspark.testing.cluster import BookieCluster


def _check(tracer: AddTracer, ledger_id: int, entry_ids: list[int], bookie: bool) -> None:
    """``bookie``: the bookies stamp too (data port, one host: one monotonic clock)."""
    got = [t for t in tracer.done if t.ledger_id == ledger_id]
    assert [t.entry_id for t in got] == entry_ids
    for t in got:
        s = t.stamps()
        if not bookie:
            assert s.pop("bookie_received") is None and s.pop("bookie_stored") is None
        assert None not in s.values(), s
        # each stage after the one before (the last send may follow the first ack, which
        # may come from another bookie than the one that made the quorum)
        order = [s[k] for k in STAGES if k in s and k not in ("sent_last", "acked_first")]
        assert order == sorted(order), s
        assert s["sent_first"] <= s["sent_last"] and s["acked_first"] <= s["acked_quorum"], s
    assert not tracer._unsent                            # nothing held once completed


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
    d = tmp_path_factory.mktemp("trace")
    with BookieCluster(f"sqlite://{d}/meta.db", num_bookies=3, data_dir=d) as c:
        yield c


def test_a_sample_of_adds_is_stamped_at_every_stage_on_the_data_port(processes):
    with BookKeeper(processes.metadata_uri) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"pw")
        lh.append(b"untraced")                  # off by default: nothing stamped
        assert bk.ctx.add_trace is None
        tracer = bk.trace_adds(every=4)
        for i in range(1, 21):
            lh.append(b"x" * 100)
        lh.append_many([b"y"] * 12)             # one call: one future for 12 entries
        _check(tracer, lh.ledger_id, [4, 8, 12, 16, 20, 24, 28, 32], bookie=True)
        gc.collect()
        assert tracer.gc_pauses and all(end >= start for start, end, _ in tracer.gc_pauses)
        bk.stop_tracing_adds()
        lh.append(b"after")
        assert len(tracer.done) == 8 and gc.callbacks.count(tracer._on_gc) == 0
        lh.close()


def test_the_grpc_transport_is_stamped_too_and_a_failed_entry_is_forgotten(mem_cluster):
    with BookKeeper(mem_cluster.metadata_uri, add_timeout=5) as bk:
        tracer = bk.trace_adds(every=1, capacity=5)
        lh = bk.create_ledger(3, 3, 2, password=b"pw")
        for _ in range(8):
            lh.append(b"z")
        _check(tracer, lh.ledger_id, [3, 4, 5, 6, 7], bookie=False)   # the newest 5 kept
        # a handle that fails keeps no trace of its pending entries
        for b in bk.ledger_metadata(lh.ledger_id).last_ensemble()[:2]:
            mem_cluster.by_id(b).stop()
        pending = [lh.append_async(b"never acknowledged") for _ in range(3)]
        assert tracer._unsent and not any(f.done() for f in pending)
        with lh._lock:
            lh._fail_all(errors.BKError("failed on purpose"))
        lh._run_callbacks()
        assert not tracer._unsent and all(f.exception() for f in pending)


def test_a_bad_sampling_rate_is_refused():
    with pytest.raises(ValueError, match="N must be an int >= 1"):
        AddTracer(every=0)


def test_the_first_ack_is_the_earliest_read_even_when_handled_second():
    """Two ack threads: A reads its ack first, B second, but B takes the handle's lock first
    and is handled first; the quorum ack (A's) must not come before the first."""
    import threading

    from bkspark.client.add_trace import Trace

    tracer = AddTracer(every=1, capacity=4)
    t = Trace(7, 0, 1, 2, 3)
    read_a, b_done = threading.Event(), threading.Event()

    def ack_thread_a():
        tracer.ack_arrived()
        read_a.set()
        b_done.wait(10)
        tracer.acked(t, quorum=True)

    def ack_thread_b():
        read_a.wait(10)
        tracer.ack_arrived()
        tracer.acked(t, quorum=False)
        b_done.set()

    threads = [threading.Thread(target=ack_thread_a), threading.Thread(target=ack_thread_b)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert t.acked_first <= t.acked_quorum, (t.acked_first, t.acked_quorum)
    tracer.close()
