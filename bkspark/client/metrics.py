"""Prometheus metrics of a client, when the application asks for them
(:meth:`bkspark.client.BookKeeper.enable_metrics`); a client that did not ask counts nothing.

* ``bookkeeper_client_adds`` / ``_add_bytes`` -- entries (and their bytes) acknowledged by
  Qa bookies; ``bookkeeper_client_add_seconds`` -- from an entry's send to its Qa-th
  acknowledgement (resent entries: from the resend);
* ``bookkeeper_client_read_entries`` -- entries read (digest-checked) by read handles;
* ``bookkeeper_client_ensemble_changes`` -- bookies replaced under writing handles;
* ``bookkeeper_client_recoveries`` -- ledger recoveries run by this client, by outcome
  (``closed``: the ledger is closed, by this recovery or another; ``failed``).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class ClientMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.adds = Counter("bookkeeper_client_adds", "Entries acknowledged by Qa bookies", registry=r)
        self.add_bytes = Counter("bookkeeper_client_add_bytes", "Bytes of the entries acknowledged",
                                 registry=r)
        self.add_latency = Histogram(
            "bookkeeper_client_add_seconds", "From an entry's send to its Qa-th acknowledgement",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0),
            registry=r)
        self.read_entries = Counter("bookkeeper_client_read_entries", "Entries read", registry=r)
        self.ensemble_changes = Counter("bookkeeper_client_ensemble_changes",
                                        "Bookies replaced under writing handles", registry=r)
        self.recoveries = Counter("bookkeeper_client_recoveries",
                                  "Ledger recoveries run, by outcome", ["outcome"], registry=r)

    def added(self, seconds: float, nbytes: int) -> None:
        self.adds.inc()
        self.add_bytes.inc(nbytes)
        self.add_latency.observe(seconds)
