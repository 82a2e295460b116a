"""Autorecovery seen from outside, against real processes: a `bkspark autorecovery` with
``--http-port`` and real bookies (whose admin endpoints answer the same routes).

A bookie dies while the recovery delay is long: the metrics show the lost bookie and no
record is published; ``trigger_audit`` (HTTP) publishes at once and the worker repairs,
which the copy counters show; the status switch and the record listing work over HTTP;
bad requests get 400/404 naming the problem; the dashboard's collector finds the process by
the endpoint it published, and loses it once it is killed. ``bkspark shell triggeraudit`` is covered in
tests/cli/test_shell.py.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from bkspark.auth.credentials import Credentials
from bkspark.client import BookKeeper
from bkspark.dashboard.collector import Collector
from bkspark.ports import free_port
from bkspark.recovery.urm import UnderReplicationManager
from bkspark.testing.cluster import BookieCluster
from metadata import registry

from .helpers import AutoRecoveryProcess, read_back, replication_problems, wait_until, write_ledger

pytestmark = [pytest.mark.integration]


def http(port: int, path: str, method: str = "GET", credentials=None):
    """(status, JSON document or text) of one request (presenting ``credentials``)."""
    creds = credentials or Credentials()
    try:
        code, body, kind = creds.http_request(creds.url("127.0.0.1", port, path), method,
                                              {} if method in ("PUT", "POST") else None)
    except urllib.error.URLError as exc:        # not listening (yet)
        return 0, str(exc.reason)
    return code, (json.loads(body) if kind.startswith("application/json") else body.decode())


def metric(text: str, name: str, labels: str = "") -> float | None:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return None if m is None else float(m.group(1))


def test_metrics_and_routes_of_a_running_autorecovery(tmp_path):
    uri = f"sqlite://{tmp_path}/meta.db"
    port = free_port()
    with BookieCluster(uri, num_bookies=4, data_dir=tmp_path, session_timeout=3.0) as c, \
            BookKeeper(uri, add_timeout=5, read_timeout=5) as bk:
        lh, payloads = write_ledger(bk, 60, size=2000)
        ar = AutoRecoveryProcess(uri, "ar-http", tmp_path, lost_bookie_recovery_delay=3600,
                                 http_port=port, http_host="127.0.0.1", rate=0)
        admin = c.credentials("admin")

        def as_admin(port, path, method="GET"):
            return http(port, path, method, credentials=admin)
        try:
            wait_until(lambda: as_admin(port, "/api/v1/autorecovery/who_is_auditor")[1] ==
                       {"Auditor": "ar-http"}, 30, what="the process to be elected auditor")
            code, text = as_admin(port, "/metrics")
            assert code == 200 and metric(text, "autorecovery_is_auditor") == 1.0, text
            assert metric(text, "autorecovery_rate_limit_bytes") == 0.0      # --rate 0
            assert metric(text, "autorecovery_under_replicated_ledgers") == 0.0
            # a bookie of the ledger dies; the long delay holds publication back ...
            victim = lh.metadata.last_ensemble()[0]
            c.kill(c.bookie_ids.index(victim))
            wait_until(lambda: metric(as_admin(port, "/metrics")[1],
                                      "autorecovery_lost_bookie_seconds",
                                      f'{{bookie="{victim}"}}') is not None, 30,
                       what="the metrics to show the lost bookie")
            assert as_admin(port, "/api/v1/autorecovery/list_under_replicated_ledger") == (200, [])
            # ... until an audit is requested: published at once, then repaired
            code, doc = as_admin(port, "/api/v1/autorecovery/trigger_audit", "PUT")
            assert code == 200 and doc["auditor"] == "ar-http", doc
            wait_until(lambda: victim not in bk.ledger_metadata(lh.ledger_id).all_bookies(),
                       60, what="the requested audit's repair")
            assert not replication_problems(bk, lh.ledger_id, 60)
            read_back(bk, lh.ledger_id, payloads)
            wait_until(lambda: (metric(as_admin(port, "/metrics")[1],
                                       "autorecovery_ledgers_replicated_total") or 0) >= 1, 30,
                       what="the counters to catch up")
            text = as_admin(port, "/metrics")[1]
            assert metric(text, "autorecovery_entries_copied_total") == 40.0   # 2 of 3 entries
            assert metric(text, "autorecovery_bytes_copied_total") >= 40 * 2000
            assert metric(text, "autorecovery_fragments_copied_total") == 1.0
            assert metric(text, "autorecovery_check_age_seconds", '{check="placement"}') \
                is not None
            code, doc = as_admin(port, "/api/v1/autorecovery/process")
            assert code == 200 and doc["auditor"]["auditsRequested"] == 1, doc
            assert doc["worker"]["entriesCopied"] == 40 and doc["worker"]["rateLimit"] == \
                "unlimited"
            # the switch, and a record listed with its missing replicas
            assert as_admin(port, "/api/v1/autorecovery/status?enabled=false", "PUT") == \
                (200, {"enabled": False})
            assert as_admin(port, "/api/v1/autorecovery/status") == (200, {"enabled": False})
            urm = UnderReplicationManager(bk.store)
            urm.mark(lh.ledger_id, ["10.9.9.9:3181"], by="test")
            assert as_admin(port, "/api/v1/autorecovery/list_under_replicated_ledger") == \
                (200, [lh.ledger_id])
            assert as_admin(port, "/api/v1/autorecovery/list_under_replicated_ledger"
                              "?printmissingreplica=true") == \
                (200, {str(lh.ledger_id): ["10.9.9.9:3181"]})
            urm.delete_record(lh.ledger_id)
            assert as_admin(port, "/api/v1/autorecovery/status?enabled=true", "PUT")[1] == \
                {"enabled": True}
            # the endpoint takes the local cluster's tokens: nobody else acts through it
            assert http(port, "/api/v1/autorecovery/status?enabled=false", "PUT")[0] == 401
            assert http(port, "/api/v1/autorecovery/status?enabled=false", "PUT",
                        credentials=c.credentials("client"))[0] == 403
            # bad requests name the problem
            code, doc = as_admin(port, "/api/v1/autorecovery/status?enabled=maybe", "PUT")
            assert code == 400 and "enabled=true" in doc["error"]
            code, doc = as_admin(port, "/api/v1/autorecovery/nope")
            assert code == 404 and "/api/v1/autorecovery/nope" in doc["error"]
            # a bookie's admin endpoint answers the cluster's routes too
            alive = next(b for b in c.bookie_ids if b != victim)
            bookie_port = registry.list_bookies(bk.store)[alive]["http_port"]
            admin = c.credentials("admin")
            assert http(bookie_port, "/api/v1/autorecovery/who_is_auditor",
                        credentials=admin) == (200, {"Auditor": "ar-http"})
            code, doc = http(bookie_port, "/api/v1/autorecovery/process", credentials=admin)
            assert code == 404 and "no autorecovery runs in this process" in doc["error"]
            # the dashboard finds the process by the endpoint it published, with its figures
            collector = Collector(bk.store, bk, slow_interval=0)
            collector.sample()
            [found] = collector.overview()["autorecovery"]
            assert found["id"] == "ar-http" and found["up"] and found["is_auditor"], found
            assert found["address"] == f"127.0.0.1:{port}" and found["ledgers_replicated"] == 1
            # killed: shown as not answering while its record outlives it (a session timeout)
            ar.kill()
            collector.sample()
            assert [(p["id"], p["up"]) for p in collector.overview()["autorecovery"]] in \
                ([("ar-http", False)], [])
            wait_until(lambda: UnderReplicationManager(bk.store).endpoints() == {}, 30,
                       what="the killed process's endpoint record to expire")
            collector.sample()
            assert collector.overview()["autorecovery"] == []
        finally:
            ar.stop()


def test_an_autorecovery_whose_clock_is_off_refuses_retention_and_says_so(tmp_path):
    """Issue 47: an autorecovery on a host 8 days fast (libfaketime) is the retention enforcer;
    it removes nothing from a 1-hour log written now, and its skew is on its /metrics
    (``bkspark_clock_skew_seconds``, the refusals) and marked on the dashboard."""
    from bkspark.log import LogStore
    from bkspark.log.retention import RetentionPolicy
    from bkspark.testing.clockskew import skewed_env
    uri = f"sqlite://{tmp_path}/meta.db"
    port = free_port()
    with BookieCluster(uri, num_bookies=3, data_dir=tmp_path, session_timeout=3.0) as c, \
            BookKeeper(uri, add_timeout=5, read_timeout=5) as bk:
        logs = LogStore(bk, password=b"pw", ensemble_size=3, write_quorum=2, ack_quorum=2)
        logs.create("fresh")
        logs.set_retention("fresh", RetentionPolicy(ms=3600 * 1000))
        for i in range(3):
            with logs.open_writer("fresh") as w:
                w.append(b"r%d" % i)
        listed = [e.ledger_id for e in logs.get("fresh")[0].ledgers]
        admin = c.credentials("admin")
        ar = AutoRecoveryProcess(uri, "ar-skewed", tmp_path, env=skewed_env("+8d"),
                                 http_port=port, http_host="127.0.0.1", retention_interval=1)
        try:
            def refused():
                code, text = http(port, "/metrics", credentials=admin)
                return code == 200 and (metric(text, "autorecovery_retention_refused_by_skew_total")
                                        or 0) >= 2 and text
            text = wait_until(refused, 60, what="retention refused twice (skew)")
            assert abs(metric(text, "bkspark_clock_skew_seconds") - 8 * 86400) < 60, text
            collector = Collector(bk.store, bk, slow_interval=0)
            collector.sample()
            [found] = collector.overview()["autorecovery"]
            assert found["clock_skew_alarm"] and found["clock_skew"] > 8 * 86400 - 60, found
            assert "clock skew alarm" in ar.log_tail(200)
        finally:
            ar.stop()
        assert [e.ledger_id for e in logs.get("fresh")[0].ledgers] == listed


def test_an_autorecovery_offloads_a_log_and_counts_it_on_its_metrics(tmp_path):
    """Issue 52: the retention service of a real autorecovery process offloads a log whose
    policy says so; /metrics counts the ledgers and bytes, and failures (none here)."""
    import pyarrow.dataset as ds
    from bkspark.log import LogStore
    from bkspark.log.offload import OffloadPolicy
    uri = f"sqlite://{tmp_path}/meta.db"
    port = free_port()
    with BookieCluster(uri, num_bookies=3, data_dir=tmp_path, session_timeout=3.0) as c, \
            BookKeeper(uri, add_timeout=5, read_timeout=5) as bk:
        logs = LogStore(bk, password=b"pw", ensemble_size=3, write_quorum=2, ack_quorum=2)
        for i in range(3):
            with logs.open_writer("history") as w:
                w.append(b"r%d" % i)
        logs.set_offload("history", OffloadPolicy(str(tmp_path / "off"), after_ms=1))
        admin = c.credentials("admin")
        ar = AutoRecoveryProcess(uri, "ar-offload", tmp_path, http_port=port,
                                 http_host="127.0.0.1", retention_interval=1)
        try:
            def counted():
                code, text = http(port, "/metrics", credentials=admin)
                return code == 200 and (metric(text, "autorecovery_offloaded_ledgers_total")
                                        or 0) >= 3 and text
            text = wait_until(counted, 60, what="three ledgers offloaded")
            assert metric(text, "autorecovery_offloaded_bytes_total") > 0
            assert metric(text, "autorecovery_offload_failures_total") == 0
        finally:
            ar.stop()
        t = ds.dataset(str(tmp_path / "off" / "log=history"), format="parquet").to_table()
        assert sorted(t.column("value").to_pylist()) == [b"r0", b"r1", b"r2"]
