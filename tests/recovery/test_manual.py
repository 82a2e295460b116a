"""Manual recovery (`bkspark shell recover`) and decommissioning (`bkspark shell
decommission`) against real bookie processes."""
from __future__ import annotations

import json
import threading
import time

import pytest

from bkspark.cli.main import main
from bkspark.client import BookKeeper, LedgerHandle
from bkspark.errors import NoNodeError
from bkspark.testing.cluster import BookieCluster
from metadata import ledgers as ledger_store
from metadata import registry
from metadata.ledger_metadata import LedgerMetadata, LedgerState

from .helpers import PW, read_back, replication_problems, wait_until, write_ledger

pytestmark = [pytest.mark.integration]


@pytest.fixture
def c(tmp_path):
    with BookieCluster(f"sqlite://{tmp_path}/meta.db", num_bookies=4, data_dir=tmp_path / "d",
                       session_timeout=3.0) as cluster:
        yield cluster


@pytest.fixture
def bk(c):
    with BookKeeper(c.metadata_uri, add_timeout=5, read_timeout=5) as client:
        yield client


def ledger_on(bk, ensemble, n, close=True):
    md = ledger_store.create_ledger(bk.store, LedgerMetadata.new(ensemble, 2, 2, password=PW))
    lh = LedgerHandle(bk.ctx, md, ledger_store.CREATED_VERSION, md.keys.derive(PW))
    payloads = [b"p%05d" % i * 50 for i in range(n)]
    for f in [lh.append_async(p) for p in payloads]:
        f.result()
    if close:
        lh.close()
    return md.ledger_id, payloads


def shell(capsys, *args):
    code = main(["shell", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_recover_dead_bookie_to_a_given_bookie(c, bk, capsys):
    a, b, v, target = c.bookie_ids
    ledgers = dict(ledger_on(bk, [a, b, v], 60) for _ in range(4))
    with BookKeeper(c.metadata_uri) as gone:        # an open ledger whose writer went away
        lid, payloads = ledger_on(gone, [v, a, b], 30, close=False)
    ledgers[lid] = payloads
    c.kill(c.bookie_ids.index(v))
    wait_until(lambda: v not in registry.list_bookies(bk.store), 30, what="unregistration")

    code, out, err = shell(capsys, "recover", v, "--to", "127.0.0.1:1", "--metadata",
                           c.metadata_uri)
    assert code == 1 and "not a registered writable bookie" in err

    code, out, err = shell(capsys, "recover", v, "--to", target, "--metadata", c.metadata_uri)
    assert code == 0, err
    assert "5/5 ledgers re-replicated" in out
    for lid, payloads in ledgers.items():
        md = bk.ledger_metadata(lid)
        assert v not in md.all_bookies() and target in md.all_bookies()
        assert md.state is LedgerState.CLOSED and md.last_entry_id == len(payloads) - 1
        assert not replication_problems(bk, lid, len(payloads))
        read_back(bk, lid, payloads)
    # nothing left: running it again is a no-op
    code, out, err = shell(capsys, "recover", v, "--json", "--metadata", c.metadata_uri)
    assert code == 0 and json.loads(out)["ledgers"] == []


def test_decommission_migrates_first_then_deletes_the_cookie(c, bk, capsys):
    ledgers = dict((lh.ledger_id, p) for lh, p in (write_ledger(bk, 40) for _ in range(6)))
    d = c.bookie_ids[3]
    with BookKeeper(c.metadata_uri) as gone:
        lid, payloads = ledger_on(gone, [d] + c.bookie_ids[:2], 20, close=False)
    ledgers[lid] = payloads
    # a live writer on the bookie: it must move on (read-only bookie), never be fenced
    md = ledger_store.create_ledger(bk.store, LedgerMetadata.new([d] + c.bookie_ids[1:3], 2, 2,
                                                                 password=PW))
    live = LedgerHandle(bk.ctx, md, ledger_store.CREATED_VERSION, md.keys.derive(PW))
    acked, errs, halt = [], [], threading.Event()

    def write():
        try:
            while not halt.is_set():
                p = b"live-%06d" % len(acked)
                live.append(p, timeout=60)
                acked.append(p)
                time.sleep(0.01)
        except Exception as exc:  # noqa: BLE001 - reported below
            errs.append(exc)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    wait_until(lambda: len(acked) > 20, 30, what="the live writer")
    on_d = [x for x in ledgers if d in bk.ledger_metadata(x).all_bookies()] + [md.ledger_id]

    code, out, err = shell(capsys, "decommission", d, "--json", "--open-ledger-grace", "2",
                           "--metadata", c.metadata_uri)
    assert code == 0, err
    doc = json.loads(out)
    assert sorted(doc["replicated"]) == sorted(on_d) and doc["failed"] == {}
    assert doc["cookie"].startswith("kept")           # still running (read-only)
    n = len(acked)
    wait_until(lambda: len(acked) > n + 10 or errs, 30, what="the writer to go on")
    halt.set()
    t.join(60)
    assert not errs, errs
    live.close()
    ledgers[md.ledger_id] = list(acked)
    assert d in registry.list_bookies(bk.store, readonly=True)
    assert d not in registry.list_bookies(bk.store)
    for x, p in ledgers.items():
        assert d not in bk.ledger_metadata(x).all_bookies()
        assert not replication_problems(bk, x, len(p))
        read_back(bk, x, p)
    assert bk.ledger_metadata(lid).state is LedgerState.CLOSED
    new = bk.create_ledger(3, 2, 2, password=PW)      # nothing new lands on it
    assert d not in new.metadata.all_bookies()
    new.close()

    c.stop(3)
    code, out, err = shell(capsys, "decommission", d, "--metadata", c.metadata_uri)
    assert code == 0, err
    assert "cookie deleted" in out
    with pytest.raises(NoNodeError):
        registry.read_cookie(bk.store, d)
