"""Autorecovery end to end with real processes (issue 8 item 6).

4 bookies, closed and open ledgers at E=3 Qw=2 Qa=2, two `bkspark autorecovery` processes.
A bookie is killed while a writer keeps writing; the elected auditor is killed before it
could publish anything and the other process takes over; in the end every acknowledged
entry is again on the Qw live bookies of its write quorum (ListEntries, entry by entry),
nothing references the dead bookie, open ledgers were fenced only after the grace period,
and every entry reads back unchanged.
"""
from __future__ import annotations

import threading
import time

import pytest

from bkspark.client import BookKeeper
from bkspark.errors import BKError
from bkspark.recovery.urm import UnderReplicationManager
from bkspark.testing.cluster import BookieCluster
from metadata import ledgers as ledger_store
from metadata import registry
from metadata.ledger_metadata import LedgerState
from metadata.testing import unique_root

from .helpers import (PW, AutoRecoveryProcess, read_back, replication_problems, wait_until,
                      write_ledger)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(params=["sqlite", "zk"])
def uri(request, tmp_path):
    if request.param == "zk":
        return request.getfixturevalue("zookeeper").uri(unique_root())
    return f"sqlite://{tmp_path}/meta.db"


class Writer(threading.Thread):
    """Keeps appending to one ledger; remembers every acknowledged payload."""

    def __init__(self, bk):
        super().__init__(daemon=True)
        self.lh = bk.create_ledger(3, 2, 2, password=PW)
        self.acked: list[bytes] = []
        self.error = None
        self.halt = threading.Event()

    def run(self):
        i = 0
        try:
            while not self.halt.is_set():
                payload = b"w%06d" % i + b"." * 500
                self.lh.append(payload, timeout=60)
                self.acked.append(payload)
                i += 1
                time.sleep(0.01)
        except BKError as exc:  # pragma: no cover - reported by the test
            self.error = exc


def test_autorecovery_restores_every_ledger(uri, tmp_path):
    with BookieCluster(uri, num_bookies=4, data_dir=tmp_path / "data") as cluster, \
            BookKeeper(uri, add_timeout=5, read_timeout=5) as bk:
        urm = UnderReplicationManager(bk.store)
        urm.set_lost_bookie_recovery_delay(2)
        ars = [AutoRecoveryProcess(uri, f"ar{i}", tmp_path) for i in range(2)]
        try:
            auditor = wait_until(urm.auditor, 30, what="an elected auditor")
            assert auditor in ("ar0", "ar1")

            ledgers = {}
            for _ in range(10):
                lh, payloads = write_ledger(bk, 40)
                ledgers[lh.ledger_id] = payloads
            # open ledgers whose writer went away (never closed)
            with BookKeeper(uri) as gone:
                for _ in range(3):
                    lh, payloads = write_ledger(gone, 25, close=False)
                    ledgers[lh.ledger_id] = payloads
            open_ids = [lid for lid in ledgers
                        if bk.ledger_metadata(lid).state is not LedgerState.CLOSED]
            assert len(open_ids) == 3
            empty = bk.create_ledger(3, 2, 2, password=PW)
            empty.close()
            ledgers[empty.ledger_id] = []

            writer = Writer(bk)
            writer.start()
            wait_until(lambda: len(writer.acked) >= 20, 30, what="writer progress")

            victim = writer.lh.metadata.last_ensemble()[0]
            open_on_victim = [lid for lid in open_ids
                              if victim in bk.ledger_metadata(lid).all_bookies()]
            cluster.kill(cluster.bookie_ids.index(victim))
            wait_until(lambda: victim not in registry.list_bookies(bk.store), 30,
                       what="the dead bookie's registration to vanish")

            # kill the auditor before the lost-bookie delay ran out: the other process must
            # be elected and do the whole job
            auditor = urm.auditor()
            victim_ar = next(a for a in ars if a.ident == auditor)
            victim_ar.kill()
            survivor = next(a for a in ars if a is not victim_ar)
            wait_until(lambda: urm.auditor() == survivor.ident, 30,
                       what="a new auditor to be elected")

            def done():
                if urm.list():
                    return False
                for lid in ledger_store.list_ledgers(bk.store):
                    if victim in bk.ledger_metadata(lid).all_bookies():
                        return False
                return True

            wait_until(done, 120, interval=0.5, what="autorecovery to finish: records left "
                       f"{urm.list()}\n{survivor.log_tail()}")
            assert writer.is_alive() and writer.error is None
            n_before = len(writer.acked)
            wait_until(lambda: len(writer.acked) > n_before + 10, 30,
                       what="the writer to keep writing")
            writer.halt.set()
            writer.join(60)
            assert writer.error is None, writer.error
            writer.lh.close()
            ledgers[writer.lh.ledger_id] = list(writer.acked)

            for lid, payloads in ledgers.items():
                problems = replication_problems(bk, lid, len(payloads))
                assert not problems, problems[:10]
                read_back(bk, lid, payloads)
            for lid in open_ids:
                md = bk.ledger_metadata(lid)
                if lid in open_on_victim:
                    # fenced + recovered by the worker after the grace period
                    assert md.state is LedgerState.CLOSED
                if md.state is LedgerState.CLOSED:      # closed at its last entry: no truncation
                    assert md.last_entry_id == len(ledgers[lid]) - 1
            assert writer.lh.metadata.state is LedgerState.CLOSED
            assert survivor.alive
        finally:
            for a in ars:
                a.stop()
