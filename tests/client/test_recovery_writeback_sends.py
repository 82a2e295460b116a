"""A recovery write-back reaches every bookie of the write set, even when Qa acks come back
before the last bookie's send (pure logic: bookies that answer at once, inside the send).

Before the fix, the Qa-th ack finished the write-back, which dropped its payload, and the
loop's remaining sends found nothing to send: with Qw=3, Qa=2 the third bookie never got the
entry (seen in CI as test_recovery_after_writer_crash_with_a_long_unconfirmed_tail[3]).
"""
from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from bkspark import errors
from bkspark.client import recovery
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


def _recovery(got):
    sinks = {}
    clients = {b: _InstantBookie(b, sinks, got) for b in ("b0", "b1", "b2")}
    pool = SimpleNamespace(sinks=sinks, get=clients.__getitem__,
                           register=sinks.__setitem__, unregister=lambda lid, s: sinks.pop(lid))
    ctx = SimpleNamespace(pool=pool, scheduler=None)
    return SimpleNamespace(ctx=ctx, ledger_id=7, master_key=b"k" * 20,
                           conf=SimpleNamespace(add_timeout=5.0, overload_retry_delay=0.01))


def test_streamed_write_back_reaches_the_whole_write_set_after_fast_qa_acks():
    got = []
    rec = _recovery(got)
    wbs = recovery._StreamWriteBacks(rec)
    assert wbs.registered
    wb = wbs.add(5, b"body", ["b0", "b1", "b2"], 2)
    wb.wait()
    assert wb.ok and got == ["b0", "b1", "b2"]


def test_unary_write_back_reaches_the_whole_write_set_after_fast_qa_acks():
    got = []
    wb = recovery._WriteBack(_recovery(got), 5, b"body", ["b0", "b1", "b2"], 2)
    wb.wait()
    assert wb.ok and got == ["b0", "b1", "b2"]
