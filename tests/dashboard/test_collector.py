"""The dashboard's sampling arithmetic (pure logic): metric parsing, rates' inputs, histogram
quantiles between two scrapes, bounded histories."""
import math

import pytest

from bkspark.dashboard.collector import History, buckets, histogram_quantile, parse_metrics, total

TEXT = """# TYPE bookie_adds counter
bookie_adds_total{status="EOK"} 90.0
bookie_adds_total{status="EFENCED"} 3.0
# TYPE bookie_add_batch_seconds histogram
bookie_add_batch_seconds_bucket{le="0.001"} 10.0
bookie_add_batch_seconds_bucket{le="0.01"} 50.0
bookie_add_batch_seconds_bucket{le="+Inf"} 60.0
bookie_add_batch_seconds_count 60.0
bookie_add_batch_seconds_sum 0.5
"""


def test_totals_filter_by_labels_and_sum_the_rest():
    samples = parse_metrics(TEXT)
    assert total(samples, "bookie_adds_total") == 93.0
    assert total(samples, "bookie_adds_total", status="EOK") == 90.0
    assert total(samples, "bookie_missing_total") is None


def test_a_quantile_comes_from_the_observations_between_two_scrapes():
    now = buckets(parse_metrics(TEXT), "bookie_add_batch_seconds")
    assert now == [(0.001, 10.0), (0.01, 50.0), (math.inf, 60.0)]
    # all 60 observations: the median (rank 30) lies halfway through the second bucket
    assert histogram_quantile(0.5, now, None) == pytest.approx(0.0055)
    # since a scrape that had seen the first 10 (all fast): the 50 new ones' median is slower
    before = [(0.001, 10.0), (0.01, 10.0), (math.inf, 10.0)]
    assert histogram_quantile(0.5, now, before) == pytest.approx(0.001 + 0.009 * 25 / 40)
    # the 99th percentile falls in +Inf: the last finite bound answers
    assert histogram_quantile(0.99, now, before) == 0.01
    assert histogram_quantile(0.5, now, now) is None          # nothing observed in between


def test_a_history_keeps_its_window_and_forgets_series_that_stop():
    history = History(seconds=10, interval=1)
    for t in range(100):
        history.add("a", float(t), float(t))
    history.add("b", 5.0, 1.0)
    history.add("c", 99.0, float("nan"))                      # no figure: no point
    assert len(history.since(0)["a"]) == history.maxlen == 11
    history.prune(now=99.0)
    assert history.names() == ["a"]
    assert history.since(97.0) == {"a": [[98.0, 98.0], [99.0, 99.0]]}


@pytest.mark.parametrize("command", ["dashboard", "autorecovery"])
def test_a_daemon_without_a_metadata_service_says_how_to_name_one(command, tmp_path, monkeypatch,
                                                                   capsys):
    from bkspark.cli.main import main
    monkeypatch.setenv("HOME", str(tmp_path))                 # no running local cluster
    monkeypatch.delenv("BKSPARK_METADATA_URI", raising=False)
    assert main([command]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bkspark {command}: no metadata service") and "--metadata URI" in err


def test_ledger_states_are_counted_a_bounded_chunk_per_step(tmp_path, monkeypatch):
    from bkspark.dashboard import collector as col
    from metadata import ledgers, open_store
    from metadata.ledger_metadata import LedgerMetadata
    monkeypatch.setattr(col, "LEDGER_CHUNK", 4)
    with open_store(f"sqlite://{tmp_path}/m.db", create=True) as store:
        ids = [ledgers.create_ledger(store, LedgerMetadata.new(["a:1", "b:1"], 2, 2)).ledger_id
               for _ in range(10)]
        for lid in ids[:3]:
            md, version = ledgers.read_ledger(store, lid)
            ledgers.write_ledger(store, md.with_closed(-1, 0), version)
        c = col.Collector(store, interval=1.0, slow_interval=0.0)
        census = c.census
        assert census.step() is False                   # (no log) the first 4 ledgers
        assert census.step() is False                   # 8 of 10 read: no count yet
        assert census.ledger_states is None
        assert census.view()["census"]["progress"]["ledgers_read"] == 8
        ledgers.delete_ledger(store, ids[-1])           # gone before its turn: not counted
        assert census.step() is True
        states = c.overview()["ledger_states"]
        assert states["counts"] == {"CLOSED": 3, "OPEN": 6} and states["ledgers"] == 10
        assert c.history.since(0)["cluster/ledgers/OPEN"] == [[states["at"], 6.0]]


def test_a_bookie_directory_shows_whether_its_writes_failed():
    """bookie_dir_state (0 writable, 1 full, 2 failed: the engine's sticky disk errors) is
    shown per directory beside its usage."""
    from bkspark.dashboard.collector import Collector
    text = "".join(
        f'bookie_dir_bytes{{dir="/d/{d}",kind="{k}"}} 10.0\n'
        f'bookie_dir_free_bytes{{dir="/d/{d}",kind="{k}"}} 30.0\n'
        f'bookie_dir_total_bytes{{dir="/d/{d}",kind="{k}"}} 40.0\n'
        f'bookie_dir_state{{dir="/d/{d}",kind="{k}"}} {s}\n'
        for d, k, s in (("j", "journal", "0.0"), ("l0", "ledger", "1.0"), ("l1", "ledger", "2.0")))
    doc: dict = {}
    Collector(None)._figures("b1", doc, 0.0, parse_metrics(text))
    assert [(d["dir"], d["state"], d["usage"]) for d in doc["dirs"]] == [
        ("/d/j", "writable", 0.25), ("/d/l0", "full", 0.25), ("/d/l1", "failed", 0.25)]
