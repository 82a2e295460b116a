"""A client's Prometheus metrics, once the application enables them: adds with their
latency, reads, ensemble changes and recoveries (in-process bookies over gRPC)."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from bkspark.client import BookKeeper


def _value(registry, name, **labels):
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("mem_cluster", [4], indirect=True)
def test_metrics_count_what_the_client_does(mem_cluster):
    with BookKeeper(mem_cluster.metadata_uri, add_timeout=5, read_timeout=5) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"pw")
        lh.append(b"before metrics")            # not counted: metrics were not asked for
        registry = CollectorRegistry()
        assert bk.enable_metrics(registry) is registry and bk.enable_metrics() is registry
        for i in range(10):
            lh.append(b"x" * 100)
        assert _value(registry, "bookkeeper_client_adds_total") == 10
        assert _value(registry, "bookkeeper_client_add_bytes_total") >= 1000
        assert _value(registry, "bookkeeper_client_add_seconds_count") == 10
        mem_cluster.by_id(bk.ledger_metadata(lh.ledger_id).last_ensemble()[0]).stop()
        lh.append(b"after a bookie died")
        assert _value(registry, "bookkeeper_client_ensemble_changes_total") == 1
        # a reader's open with recovery closes the ledger its writer left open
        rh = bk.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert _value(registry, "bookkeeper_client_recoveries_total", outcome="closed") == 1
        assert len(list(rh.read(0))) == 12
        assert _value(registry, "bookkeeper_client_read_entries_total") == 12
