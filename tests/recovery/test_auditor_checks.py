"""The auditor's periodic checks on a real metadata store (the bookie and placement checks
read metadata only: bookie registrations carry rack labels, ledgers name their ensembles),
and its entries check against real bookies (``ListEntries``)."""
from __future__ import annotations

import time

import pytest

from bkspark.client import BookKeeper
from bkspark.recovery.auditor import PLACEMENT_REPORT, Auditor, AuditorConfig
from bkspark.recovery.urm import UnderReplicationManager
from metadata import ledgers as ledger_store
from metadata import open_store, registry
from metadata.ledger_metadata import LedgerMetadata


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite://{tmp_path}/meta.db", create=True)
    registry.ensure_layout(s)
    yield s
    s.close()


def _ledger(store, *ensembles):
    md = LedgerMetadata.new(ensembles[0], 2, 2, password=b"pw")
    for first, ens in ensembles[1:]:
        md = md.with_ensemble(first, ens)
    md = ledger_store.create_ledger(store, md)
    return md.ledger_id


def test_the_placement_check_reports_ledgers_not_spread_over_racks(store):
    for b, rack in (("a0:1", "/r/a"), ("a1:1", "/r/a"), ("b0:1", "/r/b"), ("c0:1", "/r/c")):
        registry.register_bookie(store, b, {"address": b, "rack": rack})
    good = _ledger(store, ["a0:1", "b0:1", "c0:1"])
    bad = _ledger(store, ["a0:1", "b0:1", "c0:1"], (10, ["a0:1", "a1:1", "c0:1"]))
    with BookKeeper(store=store) as bk:
        auditor = Auditor(bk)
        assert auditor.check_placement() == 1
        assert list(auditor.placement_violations) == [bad] and good not in \
            auditor.placement_violations
        why = auditor.placement_violations[bad]
        assert "fragment 10..open" in why and "1 fewer" in why, why
        assert "placement" in auditor.last_checks
        # reported, not re-replicated: the data is whole
        assert UnderReplicationManager(store).list() == []


def test_the_placement_check_names_a_bounded_number_of_ledgers(store):
    for b, rack in (("a0:1", "a"), ("a1:1", "a"), ("b0:1", "b")):
        registry.register_bookie(store, b, {"address": b, "rack": rack})
    for _ in range(PLACEMENT_REPORT + 5):
        _ledger(store, ["a0:1", "a1:1"])
    with BookKeeper(store=store) as bk:
        auditor = Auditor(bk)
        assert auditor.check_placement() == PLACEMENT_REPORT + 5
        assert len(auditor.placement_violations) == PLACEMENT_REPORT


def test_a_requested_audit_publishes_lost_bookies_without_the_delay(store):
    registry.register_bookie(store, "a:1", {"address": "a:1"})
    registry.register_bookie(store, "b:1", {"address": "b:1"})
    lid = _ledger(store, ["a:1", "b:1", "gone:1"])
    urm = UnderReplicationManager(store)
    assert urm.audit_request() is None
    first = urm.request_audit(by="test")
    assert urm.request_audit(by="test") > first and urm.audit_request() > first
    with BookKeeper(store=store) as bk:
        auditor = Auditor(bk)
        auditor.audit()
    assert urm.list() == [lid] and urm.get(lid)[0]["missing"] == ["gone:1"]
    assert auditor.audits == 1 and {"bookies", "entries", "placement"} <= set(auditor.last_checks)


def test_triggeraudit_without_an_auditor_says_so(store, tmp_path, capsys):
    from bkspark.cli.main import main
    assert main(["shell", "--metadata", f"sqlite://{tmp_path}/meta.db", "triggeraudit"]) == 1
    err = capsys.readouterr().err
    assert "no auditor is elected" in err and "bkspark autorecovery" in err, err
    assert UnderReplicationManager(store).audit_request() is not None    # still recorded


def test_the_periodic_bookie_check_finds_a_ledger_on_a_bookie_that_is_gone(store):
    """No registration changes: only the periodic scan can find a ledger that names a bookie
    which is not registered (e.g. written while no auditor ran)."""
    import threading

    from bkspark.recovery.auditor import AuditorConfig
    registry.register_bookie(store, "a:1", {"address": "a:1"})
    registry.register_bookie(store, "b:1", {"address": "b:1"})
    urm = UnderReplicationManager(store)
    stop = threading.Event()
    with BookKeeper(store=store) as bk:
        auditor = Auditor(bk, AuditorConfig(lost_bookie_recovery_delay=0, audit_interval=0.2,
                                            bookie_check_interval=0.5, tick=0.1,
                                            periodic_check_interval=0,
                                            placement_check_interval=0))
        t = threading.Thread(target=auditor.run, args=(lambda: not stop.is_set(),))
        t.start()
        try:
            while "bookies" not in auditor.last_checks:     # its first scan ran
                time.sleep(0.05)
            lid = _ledger(store, ["a:1", "b:1", "gone:1"])
            deadline = time.monotonic() + 30
            while lid not in urm.list():
                assert time.monotonic() < deadline, "the periodic scan never found it"
                time.sleep(0.1)
        finally:
            stop.set()
            t.join(10)
    assert urm.get(lid)[0]["missing"] == ["gone:1"]


def _run_auditor(bk, config, until, timeout=30.0):
    """Run an elected auditor's loop until ``until(auditor)`` holds (or fail after timeout)."""
    import threading
    auditor = Auditor(bk, config)
    stop = threading.Event()
    t = threading.Thread(target=auditor.run, args=(lambda: not stop.is_set(),))
    t.start()
    try:
        deadline = time.monotonic() + timeout
        while not until(auditor):
            assert time.monotonic() < deadline, "the auditor never got there"
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(10)
    return auditor


def test_an_audit_requested_while_no_auditor_ran_is_served_by_the_next_one(store):
    from bkspark.recovery.auditor import AuditorConfig
    registry.register_bookie(store, "a:1", {"address": "a:1"})
    lid = _ledger(store, ["a:1", "gone:1"])
    urm = UnderReplicationManager(store)
    config = AuditorConfig(lost_bookie_recovery_delay=3600, tick=0.05)
    with BookKeeper(store=store) as bk:
        # a first auditor comes and goes: the lost bookie waits out its (long) delay
        _run_auditor(bk, config, lambda a: "bookies" in a.last_checks)
        assert urm.list() == []
        version = urm.request_audit(by="test")          # no auditor runs now
        served = _run_auditor(bk, config, lambda a: a.audits == 1)
    assert urm.list() == [lid] and urm.auditor_checks()["auditRequestServed"] == version
    with BookKeeper(store=store) as bk:                 # served once, not again
        again = _run_auditor(bk, config, lambda a: "bookies" in a.last_checks)
        time.sleep(0.3)
    assert served.audits == 1 and again.audits == 0


def test_check_periods_go_on_across_auditor_failovers(store):
    """An auditor elected after another runs each check when its period has passed since the
    recorded run -- not a whole period after its own election -- so auditors that restart
    more often than a period still run every check."""
    from bkspark.recovery.auditor import AuditorConfig
    registry.register_bookie(store, "a:1", {"address": "a:1"})
    registry.register_bookie(store, "b:1", {"address": "b:1"})
    _ledger(store, ["a:1", "b:1"])
    urm = UnderReplicationManager(store)
    config = AuditorConfig(tick=0.05, periodic_check_interval=60, placement_check_interval=60)
    with BookKeeper(store=store) as bk:
        first = _run_auditor(bk, config, lambda a: "bookies" in a.last_checks)
        time.sleep(0.2)
        assert "entries" not in first.last_checks and "placement" not in first.last_checks
        since = urm.auditor_checks()["since"]
        # the periods began 61 s ago as far as the record tells: the next auditor is due at once
        urm.record_auditor_checks(since=since - 61_000)
        second = _run_auditor(bk, config, lambda a: {"entries", "placement"} <= set(a.last_checks))
        recorded = urm.auditor_checks()
        assert recorded["entries"] == second.last_checks["entries"]
        assert recorded["placement"] == second.last_checks["placement"]
        # just ran (recorded): a third auditor waits out the period
        third = _run_auditor(bk, config, lambda a: "bookies" in a.last_checks)
        time.sleep(0.3)
        assert "entries" not in third.last_checks and "placement" not in third.last_checks


# ---- the entries check (ListEntries) against real bookies --------------------------------

def test_the_entries_check_is_weekly_by_default_and_rate_limited():
    """BookKeeper's ``auditorPeriodicCheckInterval`` (a week), wherever the auditor is
    configured, and a finite rate limit unless told otherwise."""
    import argparse

    from bkspark.cli.autorecovery_cmd import add_arguments, config_from_args
    from bkspark.recovery.service import AutoRecoveryConfig
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    from_flags = config_from_args(parser.parse_args([]))
    for config in (AuditorConfig(), AutoRecoveryConfig(), from_flags):
        assert config.periodic_check_interval == 604800
        assert 0 < config.entries_check_rate < float("inf")
    assert config_from_args(parser.parse_args(["--entries-check-rate", "0"])
                            ).entries_check_rate == 0


def test_the_entries_check_publishes_the_ledgers_of_every_lost_bookie(store):
    """``lost``: every ledger using any of them is published (not only the first ledger's)."""
    for b in ("a:1", "b:1"):
        registry.register_bookie(store, b, {"address": b})
    on_x = _ledger(store, ["a:1", "x:1"])
    on_y = _ledger(store, ["b:1", "y:1"])
    healthy = _ledger(store, ["a:1", "b:1"])
    with BookKeeper(store=store) as bk:
        assert Auditor(bk).check_all_ledgers({"x:1", "y:1"}) == 2
    urm = UnderReplicationManager(store)
    assert urm.list() == [on_x, on_y] and healthy not in urm.list()
    assert urm.get(on_y)[0]["missing"] == ["y:1"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from bkspark.testing.cluster import BookieCluster
    d = tmp_path_factory.mktemp("auditor-cluster")
    with BookieCluster(f"sqlite://{d}/meta.db", num_bookies=3, data_dir=d,
                       session_timeout=3.0) as c:
        yield c


@pytest.fixture
def cluster_bk(cluster):
    with BookKeeper(cluster.metadata_uri, add_timeout=5, read_timeout=5) as client:
        yield client
        urm = UnderReplicationManager(client.store)
        for lid in urm.list():                  # the next test starts without records
            urm.delete_record(lid)


@pytest.mark.integration
def test_the_batched_entries_check_publishes_exactly_the_ledgers_lacking_entries(
        cluster, cluster_bk, monkeypatch):
    """Metadata read in batches, ListEntries of many ledgers in flight (both made small here
    so that a few ledgers cross their bounds): the ledgers a live bookie lacks entries of are
    published, the healthy ones are not; a registered bookie that does not answer is unknown
    -- it neither gets a ledger published nor vouches for the others -- and a ledger deleted
    between the listing and the read is skipped."""
    from bkspark.ports import free_port
    from bkspark.recovery import auditor as auditor_module

    from .helpers import write_ledger
    from .test_replicator import _manual_ledger
    bk = cluster_bk
    monkeypatch.setattr(auditor_module, "METADATA_BATCH", 3)
    monkeypatch.setattr(auditor_module, "LISTINGS_IN_FLIGHT", 7)
    r0, r1, r2 = cluster.bookie_ids
    silent = f"127.0.0.1:{free_port()}"         # registered, nothing listens there
    registry.register_bookie(bk.store, silent, {"address": silent})
    try:
        healthy = [write_ledger(bk, 4)[0].ledger_id for _ in range(7)]
        lacking_here, _ = _manual_ledger(bk, [r0, r1, r2], 9, skip={(4, r1)})
        silent_lacks_all, _ = _manual_ledger(bk, [r0, r1, silent], 9,
                                             skip={(e, silent) for e in range(9)})
        lacking_beside_silent, _ = _manual_ledger(
            bk, [r0, r1, silent], 9, skip={(e, silent) for e in range(9)} | {(0, r0)})
        deleted = write_ledger(bk, 2)[0].ledger_id
        listed = ledger_store.list_ledgers

        def listed_then_deleted(store):
            for lid in listed(store):
                if lid == deleted:
                    bk.delete_ledger(lid)
                yield lid
        monkeypatch.setattr(ledger_store, "list_ledgers", listed_then_deleted)

        auditor = Auditor(bk, AuditorConfig(entries_check_rate=0), "test-auditor")
        outstanding, most = 0, 0
        request, judge = auditor.replicator.request_listings, auditor.replicator.missing_entries

        def counted_request(lid, bookies):
            nonlocal outstanding, most
            answers = request(lid, bookies)
            outstanding += len(answers)
            most = max(most, outstanding)
            return answers

        def counted_judge(md, alive, only=None, answers=None):
            nonlocal outstanding
            outstanding -= len(answers)
            return judge(md, alive, only, answers=answers)
        auditor.replicator.request_listings = counted_request
        auditor.replicator.missing_entries = counted_judge

        assert auditor.check_all_ledgers() == 2
        urm = UnderReplicationManager(bk.store)
        assert urm.list() == sorted([lacking_here, lacking_beside_silent])
        assert not set(urm.list()) & {*healthy, silent_lacks_all}
        assert 3 < most <= 7, most      # more than one ledger's requests, never over the bound
        assert outstanding == 0 and "entries" in auditor.last_checks
    finally:
        registry.unregister_bookie(bk.store, silent)


@pytest.mark.integration
def test_the_entries_check_keeps_to_its_rate(cluster, cluster_bk):
    """N ledgers at R ledgers/s take about N/R seconds (less the throttle's burst); unlimited
    (0) takes far less."""
    from bkspark.recovery.throttle import BURST_S

    from .helpers import write_ledger
    bk = cluster_bk
    for _ in range(10):
        write_ledger(bk, 3)
    count = len(list(ledger_store.list_ledgers(bk.store)))
    rate = 8.0
    t = time.monotonic()
    Auditor(bk, AuditorConfig(entries_check_rate=rate)).check_all_ledgers()
    paced = time.monotonic() - t
    assert paced >= (count - 1) / rate - BURST_S - 0.05, (count, paced)
    t = time.monotonic()
    Auditor(bk, AuditorConfig(entries_check_rate=0)).check_all_ledgers()
    unlimited = time.monotonic() - t
    assert unlimited < paced / 2, (unlimited, paced)
