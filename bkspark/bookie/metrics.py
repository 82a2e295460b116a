"""Prometheus metrics of one bookie (served on the admin endpoint's /metrics)."""
from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from bkspark import errors


class BookieMetrics:
    """Counters for adds/reads/bytes, add latency, and the storage engine's own figures."""

    def __init__(self, storage, service_ref, directories=(), disk_errors=None) -> None:
        """``directories``: ``(kind, path)`` of the bookie's journal and ledger directories,
        whose use, free space and state are exported at scrape time; ``disk_errors``: a
        callable answering the failed ones (``Storage.disk_errors`` as the bookie last saw
        them; default: the storage's own)."""
        self.registry = CollectorRegistry()
        self.adds = Counter("bookie_adds", "Entries added, by status", ["status"], registry=self.registry)
        self.add_bytes = Counter("bookie_add_bytes", "Bytes of entries added", registry=self.registry)
        self.reads = Counter("bookie_read_entries", "Entries read", registry=self.registry)
        self.read_bytes = Counter("bookie_read_bytes", "Bytes of entries read", registry=self.registry)
        self.add_latency = Histogram(
            "bookie_add_batch_seconds", "Time to store a batch of adds durably",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry)
        self.write_lacs = Counter(
            "bookie_write_lac_requests",
            "WriteLac requests (explicit LACs of idle writers), by status", ["status"],
            registry=self.registry)
        self.read_latency = Histogram(
            "bookie_read_seconds", "Time to read: one entry (op=read), one chunk of a range "
            "read (op=range)", ["op"],
            buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry)
        # (a labelled child looked up per read cost ~4% of a bookie serving small ranges)
        self._read_latency_of = {op: self.read_latency.labels(op=op) for op in ("read", "range")}
        self.rpc_errors = Counter(
            "bookie_rpc_errors", "Answers other than EOK, by RPC and status (adds: per entry)",
            ["rpc", "status"], registry=self.registry)
        self.read_only = Gauge("bookie_read_only", "1 when the bookie is read-only", registry=self.registry)
        capacity = getattr(getattr(storage, "config", None), "write_cache_bytes", None)
        if capacity:
            Gauge("bookie_write_cache_capacity_bytes", "Size of the write cache (its fill: "
                  "bookie_storage_cache_bytes)", registry=self.registry).set(capacity)
        self.registry.register(_StorageCollector(storage, service_ref))
        self.registry.register(_DirectoryCollector(list(directories),
                                                   disk_errors or (lambda: storage.disk_errors())))

    def watch_guard(self, guard) -> None:
        """Export the refusals of the bookie's :class:`~bkspark.auth.guard.Guard`."""
        self.registry.register(_RefusalCollector(guard))

    def record_adds(self, accepted, statuses, nbytes: int, seconds: float) -> None:
        """Count a stored batch: ``nbytes`` is the size of all accepted entries."""
        failed = [s for s in statuses if s != errors.EOK]
        ok_bytes = (sum(len(a[4]) for a, s in zip(accepted, statuses) if s == errors.EOK)
                    if failed else nbytes)
        self.record_batch(len(statuses) - len(failed), ok_bytes, failed, seconds)

    def record_batch(self, ok: int, ok_bytes: int, failed, seconds: float) -> None:
        """Count a stored batch: ``ok`` entries of ``ok_bytes`` stored, ``failed`` the statuses
        of the others."""
        for status in set(failed):
            name = errors.status_name(status)
            self.adds.labels(status=name).inc(failed.count(status))
            self.rpc_errors.labels(rpc="Add", status=name).inc(failed.count(status))
        self.adds.labels(status="EOK").inc(ok)
        self.add_bytes.inc(ok_bytes)
        self.add_latency.observe(seconds)

    def record_write_lac(self, status: int) -> None:
        self.write_lacs.labels(status=errors.status_name(status)).inc()

    def record_read(self, nbytes: int, entries: int = 1, seconds: float | None = None,
                    op: str = "read") -> None:
        self.reads.inc(entries)
        self.read_bytes.inc(nbytes)
        if seconds is not None:
            child = self._read_latency_of.get(op) or self.read_latency.labels(op=op)
            child.observe(seconds)

    def record_error(self, rpc: str, status: int) -> None:
        """An answer of ``rpc`` other than EOK."""
        self.rpc_errors.labels(rpc=rpc, status=errors.status_name(status)).inc()


class _RefusalCollector:
    """``bookie_auth_refused_total``: requests and connections the bookie refused for their
    credentials or role since it started (:mod:`bkspark.auth.guard`)."""

    def __init__(self, guard) -> None:
        self._guard = guard

    def collect(self):
        family = CounterMetricFamily("bookie_auth_refused", "Requests refused for their "
                                     "credentials or role (EUA / 401 / 403)")
        family.add_metric([], float(self._guard.refused))
        yield family


class _StorageCollector:
    """Exports Storage.stats() (journal syncs, sync latency, cache bytes) at scrape time."""

    def __init__(self, storage, service_ref) -> None:
        self._storage = storage
        self._service_ref = service_ref

    def collect(self):
        try:
            stats = self._storage.stats()
        except Exception:  # noqa: BLE001 - a closed storage must not break /metrics
            stats = {}
        for key, value in sorted(stats.items()):
            if not isinstance(value, (int, float)):
                continue
            name = "bookie_storage_" + key
            if key.endswith(("_total", "syncs", "adds", "bytes_written")) or key in ("adds", "bytes"):
                family = CounterMetricFamily(name, f"storage {key}")
            else:
                family = GaugeMetricFamily(name, f"storage {key}")
            family.add_metric([], float(value))
            yield family
        service = self._service_ref()
        if service is not None:
            gauge = GaugeMetricFamily("bookie_inflight_add_bytes", "Bytes of adds waiting for the journal")
            gauge.add_metric([], float(service.inflight_bytes))
            yield gauge


class _DirectoryCollector:
    """Per journal / ledger directory, at scrape time: bytes of the bookie's files in it, its
    filesystem's size and free space (what turns a bookie read-only: ``disk_usage_threshold``),
    and its state: 0 writable, 1 full (a write failed with ENOSPC), 2 failed (a write failed
    otherwise) -- ``Storage.disk_errors``."""

    def __init__(self, directories: list[tuple[str, str]], disk_errors) -> None:
        self._directories = directories
        self._disk_errors = disk_errors

    def collect(self):
        state = GaugeMetricFamily("bookie_dir_state", "0 writable, 1 full (a write failed: no "
                                  "space), 2 failed (a write failed): read-only", labels=["kind", "dir"])
        try:
            failed = {(e.kind, e.path): e for e in self._disk_errors()}
        except Exception:  # noqa: BLE001 - a closed storage must not break /metrics
            failed = {}
        for kind, path in self._directories:
            e = failed.get((kind, path))
            state.add_metric([kind, path], 0.0 if e is None else 1.0 if e.full else 2.0)
        yield state
        used = GaugeMetricFamily("bookie_dir_bytes", "Bytes of the bookie's files in a directory",
                                 labels=["kind", "dir"])
        free = GaugeMetricFamily("bookie_dir_free_bytes",
                                 "Free bytes of the filesystem holding a directory",
                                 labels=["kind", "dir"])
        total = GaugeMetricFamily("bookie_dir_total_bytes",
                                  "Size of the filesystem holding a directory",
                                  labels=["kind", "dir"])
        for kind, path in self._directories:
            try:
                st = os.statvfs(path)
                nbytes = _tree_bytes(path)
            except OSError:             # (a directory gone or unreadable: left out)
                continue
            used.add_metric([kind, path], float(nbytes))
            free.add_metric([kind, path], float(st.f_bavail * st.f_frsize))
            total.add_metric([kind, path], float(st.f_blocks * st.f_frsize))
        yield used
        yield free
        yield total


def _tree_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (a bookie directory: tens of files)."""
    total = 0
    with os.scandir(path) as it:
        for entry in it:
            try:
                if entry.is_dir(follow_symlinks=False):
                    total += _tree_bytes(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:             # removed meanwhile (a rolled journal, a compacted log)
                continue
    return total
