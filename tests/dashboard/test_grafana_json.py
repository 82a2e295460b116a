"""examples/grafana-dashboard.json names only metrics that bkspark exports (the bookie's,
the client's once enabled, autorecovery's), so its panels are never silently empty."""
import json
import os
import re

from prometheus_client import generate_latest

from bkspark.bookie.metrics import BookieMetrics
from bkspark.client.metrics import ClientMetrics

GRAFANA = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "grafana-dashboard.json")
#: exported at scrape time by collectors that need a running process (names checked by text)
SCRAPE_TIME = {
    "bookie_storage_cache_bytes": "bkspark/bookie/metrics.py",      # Storage.stats()
    "bookie_storage_journal_sync_ns_sum": "bookie_native/module.c",
    "bookie_storage_journal_sync_count": "bookie_native/module.c",
    "bookie_dir_free_bytes": "bkspark/bookie/metrics.py",
    "bookie_dir_total_bytes": "bkspark/bookie/metrics.py",
    "autorecovery_under_replicated_ledgers": "bkspark/recovery/http.py",
    "autorecovery_copy_rate_bytes": "bkspark/recovery/http.py",
    "autorecovery_rate_limit_bytes": "bkspark/recovery/http.py",
    "autorecovery_lost_bookie_seconds": "bkspark/recovery/http.py",
}
REPO = os.path.join(os.path.dirname(__file__), "..", "..")


class _Storage:
    class config:
        write_cache_bytes = 1 << 20

    @staticmethod
    def stats():
        return {}


def test_every_panel_queries_an_exported_metric():
    exported = generate_latest(BookieMetrics(_Storage(), lambda: None).registry).decode()
    exported += generate_latest(ClientMetrics().registry).decode()
    names = set(re.findall(r"^# TYPE (\S+)", exported, re.M))
    samples = set(re.findall(r"^([a-z_]+)[{ ]", exported, re.M))
    doc = json.load(open(GRAFANA))
    queried = {m for p in doc["panels"] for t in p["targets"]
               for m in re.findall(r"\b((?:bookie|bookkeeper_client|autorecovery)_[a-z_]+)", t["expr"])}
    assert queried, "no panel queries a bkspark metric"
    for metric in sorted(queried):
        if metric in SCRAPE_TIME:
            source = open(os.path.join(REPO, SCRAPE_TIME[metric])).read()
            stem = metric.removeprefix("bookie_storage_")
            assert stem in source or metric in source, f"{metric} not exported by {SCRAPE_TIME[metric]}"
            continue
        base = re.sub(r"_(bucket|sum|count|total)$", "", metric)
        assert {metric, base} & (samples | names), f"panel queries {metric}, which nothing exports"
