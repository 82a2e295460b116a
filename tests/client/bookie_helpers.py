"""Helpers of the client scenario tests against real bookie processes (BookieCluster)."""
from __future__ import annotations

import threading
import time

from bkspark.client import BookKeeper
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.testing.cluster import bookie_channel


def client(c, **kw):
    """A BookKeeper client of cluster ``c`` with short add/read timeouts (overridable)."""
    kw.setdefault("add_timeout", 3)
    kw.setdefault("read_timeout", 5)
    return BookKeeper(c.metadata_uri, **kw)


def idx(c, bookie_id) -> int:
    return c.bookie_ids.index(bookie_id)


def raw_read(bookie_id, lid, eid):
    """One bookie's own answer to a plain read (no client logic in between)."""
    with bookie_channel(bookie_id) as ch:
        return pb_grpc.BookieStub(ch).Read(pb.ReadRequest(ledger_id=lid, entry_id=eid),
                                           timeout=10)


def wait_until(cond, what, limit=60.0):
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def recover_concurrently(c, ledger_id: int, password: bytes, n: int = 2) -> list:
    """Recover ``ledger_id`` from ``n`` clients at once; each one's (last entry id, length,
    entries). Any client failing fails the test."""
    results, errs = [], []
    barrier = threading.Barrier(n)

    def recover():
        with client(c) as bk:
            barrier.wait()
            try:
                rh = bk.open_ledger(ledger_id, password=password)
                results.append((rh.metadata.last_entry_id, rh.length,
                                [e.data for e in rh.read(0, rh.last_add_confirmed)]))
            except Exception as exc:  # noqa: BLE001 - reported below
                errs.append(exc)
    threads = [threading.Thread(target=recover) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errs and len(results) == n, (errs, len(results))
    return results
