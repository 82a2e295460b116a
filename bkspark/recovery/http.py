"""Autorecovery seen from outside: Prometheus metrics and BookKeeper's autorecovery routes.

``bkspark autorecovery --http-port N`` serves them; a bookie's admin endpoint serves the
routes too (and the metrics of the autorecovery it runs with ``--autorecovery``)::

    GET  /heartbeat                                           "OK"
    GET  /metrics                                             Prometheus text (below)
    GET  /api/v1/autorecovery/status                          {"enabled": bool}
    PUT  /api/v1/autorecovery/status?enabled=true|false       switch autorecovery cluster-wide
    GET  /api/v1/autorecovery/list_under_replicated_ledger    [ledger ids]; with
         ?printmissingreplica=true                            {ledger id: [missing bookies]}
    GET  /api/v1/autorecovery/who_is_auditor                  {"Auditor": id or null}
    PUT  /api/v1/autorecovery/trigger_audit                   ask the auditor for a full audit
    GET  /api/v1/autorecovery/process                         what this process's autorecovery
                                                              is doing (copy figures, checks)

The routes other than ``process`` read and write the cluster's metadata (any process
answers for the cluster); the metrics are this process's (``autorecovery_*``):
``under_replicated_ledgers`` (the cluster's records, read at scrape time), ``entries_copied``,
``bytes_copied``, ``fragments_copied``, ``ledgers_replicated``, ``replication_failures``
(counters since start), ``copy_rate_bytes`` (over the last :data:`RATE_WINDOW` s),
``rate_limit_bytes`` (0: unlimited), ``is_auditor``, and on the auditor
``lost_bookie_seconds{bookie}`` (since the bookie was found missing),
``placement_violations`` (ledgers the last placement check found) and
``check_age_seconds{check}`` (bookies / entries / placement: since each last ran);
``retention_refused_by_skew`` (retention passes refused), ``offloaded_ledgers``,
``offloaded_bytes``, ``offload_failures`` and ``offload_dropped_ledgers`` (offloaded ledgers
whose bookies' copy was dropped; :mod:`bkspark.log.offload`), and
``bkspark_clock_skew_seconds``
(this host's clock minus the metadata store's, :mod:`metadata.clock`).
"""
from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from bkspark.errors import BKError
from bkspark.httpd import HttpEndpoint, JsonHandler

from .urm import UnderReplicationManager

PREFIX = "/api/v1/autorecovery"
#: seconds over which the copy rate is measured
RATE_WINDOW = 10.0

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def answer(handler: JsonHandler, method: str, store, autorecovery=None) -> None:
    """Answer the autorecovery route of ``handler``'s request (module docstring) from
    ``store``; ``autorecovery``: this process's :class:`~.service.AutoRecovery`, if any."""
    path, query = handler.route
    name = path[len(PREFIX):].lstrip("/")
    urm = UnderReplicationManager(store, "http")
    try:
        if name == "status" and method == "GET":
            handler.json(200, {"enabled": urm.is_enabled()})
        elif name == "status" and method == "PUT":
            value = query.get("enabled", "").lower()
            if value not in _TRUE + _FALSE:
                handler.json(400, {"error": "give ?enabled=true or ?enabled=false"})
                return
            urm.enable() if value in _TRUE else urm.disable()
            handler.json(200, {"enabled": urm.is_enabled()})
        elif name == "list_under_replicated_ledger" and method == "GET":
            ids = urm.list()
            if query.get("printmissingreplica", "").lower() in _TRUE:
                doc = {}
                for lid in ids:
                    record = urm.get(lid)
                    if record is not None:
                        doc[str(lid)] = record[0].get("missing", [])
                handler.json(200, doc)
            else:
                handler.json(200, ids)
        elif name == "who_is_auditor" and method == "GET":
            handler.json(200, {"Auditor": urm.auditor()})
        elif name == "trigger_audit" and method in ("PUT", "POST"):
            version = urm.request_audit(by="http")
            handler.json(200, {"requested": version, "auditor": urm.auditor()})
        elif name == "process" and method == "GET":
            if autorecovery is None:
                handler.json(404, {"error": "no autorecovery runs in this process"})
            else:
                handler.json(200, autorecovery.describe())
        else:
            handler.not_found(path)
    except BKError as exc:
        handler.json(503, {"error": f"metadata store: {exc}"})


class AutoRecoveryCollector:
    """The ``autorecovery_*`` metrics of one :class:`~.service.AutoRecovery`, read when
    scraped."""

    def __init__(self, autorecovery) -> None:
        self.ar = autorecovery

    def collect(self):
        ar, now = self.ar, time.monotonic()
        if ar.store is not None:
            try:
                n = len(UnderReplicationManager(ar.store).list())
            except BKError:
                n = None
            if n is not None:
                yield GaugeMetricFamily("autorecovery_under_replicated_ledgers",
                                        "Ledgers with an under-replication record", value=n)
        worker = ar.worker
        if worker is not None:
            s = worker.stats
            for name, value, text in (
                    ("entries_copied", s.entries, "Entries copied to replacement bookies"),
                    ("bytes_copied", s.bytes, "Bytes of entries copied"),
                    ("fragments_copied", s.fragments, "Fragment members replaced"),
                    ("ledgers_replicated", worker.ledgers_replicated,
                     "Ledgers fully re-replicated (their record removed)"),
                    ("replication_failures", worker.failures,
                     "Ledger passes that failed or left the ledger under-replicated")):
                yield CounterMetricFamily(f"autorecovery_{name}", text, value=value)
            yield GaugeMetricFamily("autorecovery_copy_rate_bytes",
                                    f"Bytes/s copied over the last {RATE_WINDOW:g} s",
                                    value=s.rate(RATE_WINDOW))
            yield GaugeMetricFamily("autorecovery_rate_limit_bytes",
                                    "The copy rate limit in bytes/s (0: unlimited)",
                                    value=worker.throttle.bytes_per_s or 0)
        yield GaugeMetricFamily("autorecovery_is_auditor", "1 while this process is the auditor",
                                value=1 if ar.is_auditor else 0)
        if ar.store is not None:
            try:
                skew = ar.store.clock.skew_ms()
            except BKError:
                skew = None
            if skew is not None:
                yield GaugeMetricFamily("bkspark_clock_skew_seconds",
                                        "This host's wall clock minus the metadata store's",
                                        value=skew / 1000)
        if ar.retention is not None:
            yield CounterMetricFamily("autorecovery_retention_refused_by_skew",
                                      "Retention passes refused: this host's clock is off the "
                                      "store's by more than the tolerance",
                                      value=ar.retention.refused_by_skew)
            yield CounterMetricFamily("autorecovery_offloaded_ledgers",
                                      "Ledgers this process offloaded to Parquet",
                                      value=ar.retention.offloaded_ledgers)
            yield CounterMetricFamily("autorecovery_offloaded_bytes",
                                      "Bytes of the Parquet files this process offloaded",
                                      value=ar.retention.offloaded_bytes)
            yield CounterMetricFamily("autorecovery_offload_failures",
                                      "Offload passes of a log that failed (retried at the "
                                      "next pass)", value=ar.retention.offload_failures)
            yield CounterMetricFamily("autorecovery_offload_dropped_ledgers",
                                      "Offloaded ledgers whose bookies' copy this process "
                                      "dropped (their files are the only copy)",
                                      value=ar.retention.dropped_ledgers)
        auditor = ar.auditor
        if auditor is not None and ar.is_auditor:
            lost = GaugeMetricFamily("autorecovery_lost_bookie_seconds",
                                     "Seconds since the auditor found the bookie missing",
                                     labels=["bookie"])
            for bookie, since in dict(auditor.first_missing).items():
                lost.add_metric([bookie], now - since)
            yield lost
            yield GaugeMetricFamily("autorecovery_placement_violations",
                                    "Ledgers the last placement check found not adhering",
                                    value=auditor.placement_violation_count)
            age = GaugeMetricFamily("autorecovery_check_age_seconds",
                                    "Seconds since each periodic check last ran",
                                    labels=["check"])
            wall = time.time() * 1000
            for check, at in dict(auditor.last_checks).items():
                age.add_metric([check], (wall - at) / 1000)
            yield age


def metrics_registry(autorecovery) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(AutoRecoveryCollector(autorecovery))
    return registry


class AutoRecoveryHttp(HttpEndpoint):
    """The endpoint of a standalone ``bkspark autorecovery`` (module docstring)."""

    def __init__(self, autorecovery, host: str, port: int, guard, ssl_context=None) -> None:
        super().__init__(_handler_for(autorecovery), host, port, "autorecovery-http", guard,
                         ssl_context)


def _handler_for(ar):
    class Handler(JsonHandler):
        def _any(self, method: str) -> None:
            path, _ = self.route
            if method == "GET" and path == "/heartbeat":
                self.send(200, b"OK\n", "text/plain")
            elif method == "GET" and path == "/metrics":
                self.send(200, generate_latest(ar.metrics), CONTENT_TYPE_LATEST)
            elif path.startswith(PREFIX):
                answer(self, method, ar.store, ar)
            else:
                self.not_found(path)

        def do_GET(self):  # noqa: N802 - http.server API
            self._any("GET")

        def do_PUT(self):  # noqa: N802
            self._any("PUT")

        def do_POST(self):  # noqa: N802
            self._any("POST")

    return Handler
