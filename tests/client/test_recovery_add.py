"""RecoveryAdds, the one RECOVERY_ADD sender of recovery and the replicator (pure logic:
bookies stood in for by objects that answer when told).

A write-back reaches every bookie of the write set, even when Qa acks come back before the
last bookie's send. Before that fix, the Qa-th ack finished the write-back, which dropped its
payload, and the loop's remaining sends found nothing to send: with Qw=3, Qa=2 the third
bookie never got the entry (seen in CI as test_recovery_after_writer_crash_with_a_long_unconfirmed_tail[3]).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from bkspark import errors
from bkspark.client.recovery_add import RecoveryAdds
from bkspark.proto import bookie_pb2 as pb


class _InstantBookie:
    """Acknowledges each add inside the call that sends it."""

    def __init__(self, name, sinks, got):
        self.name, self.sinks, self.got = name, sinks, got

    def send_adds(self, elems):                     # the add stream: acks through the sink
        self.got.append(self.name)
        self.sinks[7].on_add_responses(self.name, [(5, errors.EOK)])

    def add(self, ledger_id, entry_id, body, master_key, *, flags, timeout):   # unary adds
        self.got.append(self.name)
        f = Future()
        f.set_result(pb.AddResponse(status=errors.EOK, ledger_id=ledger_id, entry_id=entry_id))
        return f


def _adds(got, stream: bool) -> RecoveryAdds:
    sinks = {}
    clients = {b: _InstantBookie(b, sinks, got) for b in ("b0", "b1", "b2")}
    if not stream:
        sinks[7] = object()         # a write handle of this client owns the ledger's acks
    pool = SimpleNamespace(sinks=sinks, get=clients.__getitem__,
                           register=sinks.__setitem__, unregister=lambda lid, s: sinks.pop(lid))
    adds = RecoveryAdds(SimpleNamespace(pool=pool, scheduler=None), 7, b"k" * 20,
                        timeout=5.0, retry_delay=0.01)
    assert adds.streamed is stream
    return adds


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "unary"])
def test_write_back_reaches_the_whole_write_set_after_fast_qa_acks(stream):
    got = []
    wb = _adds(got, stream).add(5, b"body", ["b0", "b1", "b2"], 2)
    assert wb.wait()
    assert wb.ok and got == ["b0", "b1", "b2"]


class _QuietBookie:
    """Takes adds over the stream and answers only when the test says so."""

    def __init__(self, name, sent):
        self.name, self.sent = name, sent

    def send_adds(self, elems):
        self.sent.append((self.name, len(elems)))


def _quiet(timeout=5.0, batch=1):
    sent = []
    sinks = {}
    clients = {b: _QuietBookie(b, sent) for b in ("b0", "b1", "b2")}
    pool = SimpleNamespace(sinks=sinks, get=clients.__getitem__,
                           register=sinks.__setitem__, unregister=lambda lid, s: sinks.pop(lid))
    scheduler = SimpleNamespace(schedule=lambda delay, fn: threading.Timer(delay, fn).start())
    adds = RecoveryAdds(SimpleNamespace(pool=pool, scheduler=scheduler), 7, b"k" * 20,
                        timeout=timeout, retry_delay=0.01, batch=batch)
    return adds, sent


def test_batched_entries_are_sent_when_the_batch_fills_or_on_flush():
    adds, sent = _quiet(batch=3)
    for x in range(4):
        adds.add(x, b"body", ["b0"], 1)
    assert sent == [("b0", 3)]
    adds.flush()
    assert sent == [("b0", 3), ("b0", 1)]


def test_a_busy_bookie_gets_the_entry_again_and_its_ack_counts():
    adds, sent = _quiet()
    wb = adds.add(3, b"body", ["b0", "b1"], 2)
    adds.on_add_responses("b0", [(3, errors.EOK)])
    adds.on_add_responses("b1", [(3, errors.ETOOMANYREQUESTS)])
    deadline = time.monotonic() + 5
    while sent.count(("b1", 1)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent.count(("b1", 1)) == 2 and not wb.done
    adds.on_add_responses("b1", [(3, errors.EOK)])
    assert wb.wait() and wb.acks == 2


def test_a_fenced_answer_is_fatal_and_ends_the_write_back_once_qa_is_out_of_reach():
    adds, _ = _quiet()
    wb = adds.add(3, b"body", ["b0", "b1"], 2)
    adds.on_add_responses("b0", [(3, errors.EFENCED)])
    assert wb.done and not wb.wait()
    assert wb.fatal.startswith("b0: ") and "b0" in wb.failures()


def test_bookies_that_never_answer_fail_at_the_timeout():
    adds, _ = _quiet(timeout=0.2)
    wb = adds.add(3, b"body", ["b0", "b1"], 1)
    assert not wb.wait()
    assert all("no answer within 0.2s" in note for note in wb.notes())


def test_a_failed_bookie_fails_every_entry_waiting_for_it():
    adds, _ = _quiet()
    wbs = [adds.add(x, b"body", ["b0"], 1) for x in range(3)]
    adds.on_bookie_failed("b0", "stream ended")
    assert all(wb.done and not wb.ok for wb in wbs)


def test_finished_entries_leave_the_sink_so_a_long_copy_holds_only_what_is_unacknowledged():
    adds, _ = _quiet(batch=64)
    for x in range(10_000):
        adds.add(x, b"body", ["b0"], 1)
        if x % 64 == 63:
            adds.on_add_responses("b0", [(e, errors.EOK) for e in range(x - 63, x + 1)])
    assert len(adds._entries) == 10_000 % 64
    adds.close()
    assert 7 not in adds.ctx.pool.sinks
