"""Randomized protocol runs (in-process bookies, seeded): a writer under injected add
failures and ensemble changes, a recoverer racing it with flaky reads. Invariants:

* every entry acknowledged to the writer is <= the closed end and reads back intact
  (no truncation, AllAckedEntriesAreReadable);
* entries are acknowledged in order (NoOutOfOrderEntries);
* a recovery that cannot decide raises LedgerRecoveryError and leaves the ledger not CLOSED;
  once faults clear it completes.
"""
from __future__ import annotations

import random
import threading
import time

import pytest

from bkspark import errors
from bkspark.bookie.faults import ANY_ENTRY, FaultRule
from bkspark.client import BookKeeper
from metadata.ledger_metadata import LedgerState


def payload(i: int) -> bytes:
    return b"entry-%06d-" % i + bytes([i % 251]) * (i % 37)


@pytest.mark.parametrize("mem_cluster", [6], indirect=True)
@pytest.mark.parametrize("seed", range(int(__import__("os").environ.get("BK_RANDOM_SEEDS", "6"))))
def test_random_faults_never_lose_acknowledged_entries(mem_cluster, seed):
    rng = random.Random(seed)
    qw = rng.choice([2, 3])
    qa = rng.choice(range(1, qw + 1)) if seed % 2 else 2
    with BookKeeper(mem_cluster.metadata_uri, add_timeout=1, read_timeout=1,
                    speculative_read_timeout=0.2, recovery_negative_grace=0.2) as wbk, \
            BookKeeper(mem_cluster.metadata_uri, read_timeout=1,
                       speculative_read_timeout=0.2, recovery_negative_grace=0.2) as rbk:
        lh = wbk.create_ledger(3, qw, qa, password=b"r")
        lid = lh.ledger_id
        acked: list[int] = []
        order_ok = [True]
        lock = threading.Lock()

        def on_done(f):
            if f.exception() is None:
                with lock:
                    if acked and f.result() != acked[-1] + 1:
                        order_ok[0] = False
                    acked.append(f.result())

        n_total = rng.randint(300, 1500)
        recover_at = rng.randint(50, n_total)
        fault_at = sorted(rng.sample(range(recover_at), min(4, recover_at)))
        rh = None
        for i in range(n_total):
            if i in fault_at:
                b = rng.choice(mem_cluster.bookies)
                kind = rng.choice(["fail", "drop", "delay"])
                b.service.faults.set_rules([FaultRule(
                    op="add", action=kind, delay_ms=rng.randint(1, 50), error=errors.EIO,
                    ledger_id=lid, entry_id=ANY_ENTRY, probability=rng.choice([0.05, 0.5, 1.0]),
                    remaining=rng.randint(1, 20))])
            if i == recover_at:
                for b in mem_cluster.bookies:       # flaky reads during recovery
                    if rng.random() < 0.3:
                        b.service.faults.set_rules([FaultRule(
                            op="read", action="fail", error=rng.choice([errors.EIO, 506]),
                            ledger_id=lid, entry_id=ANY_ENTRY, probability=0.3)])
                try:
                    rh = rbk.open_ledger(lid, password=b"r")
                except errors.LedgerRecoveryError:
                    md = rbk.ledger_metadata(lid)
                    assert md.state is not LedgerState.CLOSED
                for b in mem_cluster.bookies:
                    b.service.faults.set_rules([])
            try:
                lh.append_async(payload(i)).add_done_callback(on_done)
            except errors.BKError:
                break
            if rng.random() < 0.01:
                time.sleep(0.01)
        for b in mem_cluster.bookies:
            b.service.faults.set_rules([])
        # writer settles (all its pending adds complete or fail)
        deadline = time.monotonic() + 60
        while lh._pending and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not lh._pending
        if rh is None:
            rh = rbk.open_ledger(lid, password=b"r")
        md = rbk.ledger_metadata(lid)
        assert md.state is LedgerState.CLOSED
        last = md.last_entry_id
        assert order_ok[0]
        assert acked == list(range(len(acked)))
        if acked:
            assert acked[-1] <= last, "an acknowledged entry is beyond the closed end"
        rh = rbk.open_ledger(lid, password=b"r")
        got = [(e.entry_id, e.data) for e in rh.read(0, last)] if last >= 0 else []
        assert got == [(i, payload(i)) for i in range(last + 1)]
        # the old writer never succeeds past the end
        with pytest.raises(errors.BKError):
            lh.append(b"after")
