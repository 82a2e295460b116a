"""What the dashboard shows, sampled from the cluster on one thread.

Every ``interval`` seconds: the bookie registry and each bookie's ``/metrics`` (its admin
endpoint); every ``slow_interval`` seconds: logs (:meth:`LogStore.stats`, cursor lags), Spark
write jobs with pending ledgers (:func:`bkspark.spark.pending.reclaim`, a dry run), the
under-replicated ledgers, the auditor, the autorecovery processes (each standalone one
publishes its HTTP endpoint, whose ``/metrics`` are scraped; bookies hosting autorecovery
export its figures with their own) and their copy rate, and :data:`LEDGER_SCAN_CHUNK` ledgers'
metadata towards a count of ledgers by state. Nothing is written to the cluster.

Derived figures: a rate is the difference of a counter between two scrapes over their
interval; a latency quantile comes from the difference of a histogram's buckets between two
scrapes (the interval's own distribution, interpolated within its bucket, as Prometheus's
``histogram_quantile`` does). A bookie is ``down`` when its endpoint does not answer (at the
next sample after it died, not a session timeout later), ``read-only`` or ``writable`` as
registered.

Bounded: each series keeps the points of the last ``history_s`` (a deque of
``history_s / interval`` points); a series with no point in that window is dropped; at most
:data:`MAX_LOGS` logs and :data:`MAX_UNDER_REPLICATED` under-replication records are read
per sample.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque

from prometheus_client.parser import text_string_to_metric_families

from bkspark.auth.credentials import Credentials
from bkspark.errors import BKError

log = logging.getLogger("bkspark.dashboard")

#: logs sampled at most (the first ones by name)
MAX_LOGS = 100
#: under-replication records read at most (the count is always exact)
MAX_UNDER_REPLICATED = 200
#: Spark write jobs with pending ledgers listed at most
MAX_PENDING_JOBS = 100
#: published autorecovery processes scraped at most (the first ones by identifier)
MAX_AUTORECOVERY = 20
#: ledgers whose metadata one sample reads to count their states (a full count takes
#: ledgers / this many samples: the cost of a sample does not grow with the cluster)
LEDGER_SCAN_CHUNK = 500
#: seconds a scrape of a bookie's (or an autorecovery process's) /metrics may take
SCRAPE_TIMEOUT = 2.0


def parse_metrics(text: str) -> dict[str, list[tuple[dict, float]]]:
    """``{sample name: [(labels, value), ...]}`` of a Prometheus text exposition."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def total(samples, name: str, **labels) -> float | None:
    """Sum of the samples of ``name`` whose labels include ``labels`` (None: no sample)."""
    values = [v for lab, v in samples.get(name, ()) if all(lab.get(k) == x for k, x in labels.items())]
    return sum(values) if values else None


def buckets(samples, name: str, **labels) -> list[tuple[float, float]]:
    """``[(le, cumulative count), ...]`` of histogram ``name`` (its ``_bucket`` samples),
    summed over the other labels, by bound."""
    acc: dict[float, float] = {}
    for lab, v in samples.get(name + "_bucket", ()):
        if all(lab.get(k) == x for k, x in labels.items()):
            le = float(lab["le"])
            acc[le] = acc.get(le, 0.0) + v
    return sorted(acc.items())


def histogram_quantile(q: float, now: list[tuple[float, float]],
                       before: list[tuple[float, float]] | None) -> float | None:
    """The ``q`` quantile of the observations between two scrapes of a histogram (None: no
    observation in between). Linear within the bucket; the +Inf bucket answers its lower
    bound."""
    prev = dict(before or ())
    counts = [(le, c - prev.get(le, 0.0)) for le, c in now]
    if not counts or counts[-1][1] <= 0:
        return None
    rank = q * counts[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, c in counts:
        if c >= rank:
            if math.isinf(le):
                return lower_le
            if c == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (c - lower_count)
        lower_le, lower_count = le, c
    return lower_le


class History:
    """Time series of the last ``seconds``, each a bounded deque of ``(t, value)``."""

    def __init__(self, seconds: float, interval: float):
        self.seconds = seconds
        self.maxlen = max(2, int(seconds / max(interval, 0.1)) + 1)
        self._lock = threading.Lock()
        self._series: dict[str, deque] = {}

    def add(self, name: str, t: float, value: float | None) -> None:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        with self._lock:
            series = self._series.get(name)
            if series is None:
                series = self._series[name] = deque(maxlen=self.maxlen)
            series.append((t, value))

    def prune(self, now: float) -> None:
        """Drop the series without a point in the window (a bookie, log or cursor gone)."""
        with self._lock:
            for name in [n for n, s in self._series.items() if not s or s[-1][0] < now - self.seconds]:
                del self._series[name]

    def since(self, t: float) -> dict[str, list]:
        """``{name: [[t, value], ...]}`` of the points after ``t``."""
        with self._lock:
            return {name: [[p, v] for p, v in s if p > t] for name, s in self._series.items()}

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._series)


#: the values of a bookie's ``bookie_dir_state`` gauge
DIR_STATES = {0: "writable", 1: "full", 2: "failed"}


class Collector:
    """Samples the cluster of metadata store ``store`` (and a client ``bk`` for logs; None:
    no logs) into :attr:`history` and :meth:`overview` (module docstring)."""

    def __init__(self, store, bk=None, *, interval: float = 2.0, slow_interval: float = 10.0,
                 history_s: float = 3600.0):
        self.store = store
        self.bk = bk
        self.interval = interval
        self.slow_interval = slow_interval
        self.history = History(history_s, interval)
        self._lock = threading.Lock()
        self._bookies: dict[str, dict] = {}         # bookie id -> latest state and figures
        self._previous: dict[str, tuple[float, dict]] = {}    # bookie id -> (t, samples)
        self._cluster: dict = {"logs": [], "pending_jobs": [], "ledger_states": None,
                               "under_replicated": [],
                               "under_replicated_count": 0,
                               "auditor": None, "autorecovery": [], "errors": {}}
        self._last_slow = 0.0
        self._scan: list[int] = []                  # ledgers of the state count under way
        self._scan_counts: dict[str, int] = {}
        self._ledger_states: dict | None = None     # the last complete count
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0

    # ---- running ---------------------------------------------------------------------------
    def start(self) -> "Collector":
        self._thread = threading.Thread(target=self._run, name="bkspark-dashboard-collector",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a bad sample must not end the dashboard
                log.exception("dashboard sample failed")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    # ---- sampling --------------------------------------------------------------------------
    def sample(self) -> None:
        """One sample: bookies always; logs, under-replication and the auditor every
        ``slow_interval``."""
        now = time.time()
        self._sample_bookies(now)
        if now - self._last_slow >= self.slow_interval:
            self._last_slow = now
            self._sample_cluster(now)
        self.history.prune(now)
        self.samples += 1

    def _registered(self) -> dict[str, tuple[str, dict]]:
        from metadata import registry
        out = {b: ("writable", info) for b, info in registry.list_bookies(self.store).items()}
        out.update({b: ("read-only", info)
                    for b, info in registry.list_bookies(self.store, readonly=True).items()})
        return out

    def _sample_bookies(self, now: float) -> None:
        registered = self._registered()
        with self._lock:
            known = set(self._bookies) | set(registered)
        for bookie in sorted(known):
            state, info = registered.get(bookie, ("down", None))
            with self._lock:
                doc = self._bookies.setdefault(bookie, {"bookie_id": bookie})
            if info is not None:
                doc["address"] = info.get("address", bookie)
                doc["http_port"] = info.get("http_port")
                doc["rack"] = info.get("rack", "")
                doc["tls"] = bool(info.get("tls"))
            samples = self._scrape(doc.get("address", bookie).rsplit(":", 1)[0],
                                   doc.get("http_port"), doc.get("tls", False))
            if samples is None:
                state = "down"
                self._previous.pop(bookie, None)
            else:
                self._figures(bookie, doc, now, samples)
            doc["state"] = state
            doc["seen_ms"] = int(now * 1000) if samples is not None else doc.get("seen_ms")
            self.history.add(f"bookie/{bookie}/up", now, 0.0 if state == "down" else 1.0)

    def _scrape(self, host: str, http_port, tls: bool) -> dict | None:
        """The parsed ``/metrics`` of ``host:http_port`` (HTTPS if ``tls``; asked with the
        client's credentials); None when it does not answer or refuses (or has no endpoint:
        port None or -1)."""
        if http_port in (None, -1):
            return None
        creds = self.credentials
        try:
            status, raw, _ = creds.http_request(creds.url(host, http_port, "/metrics", tls),
                                                timeout=SCRAPE_TIMEOUT)
            return parse_metrics(raw.decode("utf-8", "replace")) if status == 200 else None
        except (OSError, ValueError):
            return None

    @property
    def credentials(self) -> Credentials:
        """What the dashboard presents to bookies: its client's (an admin's, as
        ``bkspark dashboard`` makes it), else nothing."""
        return self.bk.credentials if self.bk is not None else Credentials()

    def _figures(self, bookie: str, doc: dict, now: float, samples: dict) -> None:
        prev_t, prev = self._previous.get(bookie, (None, None))
        self._previous[bookie] = (now, samples)
        add = self.history.add
        key = f"bookie/{bookie}"
        doc["read_only"] = bool(total(samples, "bookie_read_only") or 0)
        # a bookie hosting autorecovery (--autorecovery) exports its copy rate too
        doc["copy_rate"] = total(samples, "autorecovery_copy_rate_bytes")
        cache = total(samples, "bookie_storage_cache_bytes")
        capacity = total(samples, "bookie_write_cache_capacity_bytes")
        if cache is not None and capacity:
            doc["write_cache_fill"] = cache / capacity
            add(f"{key}/write_cache_fill", now, cache / capacity)
        dirs = []
        free_by = {tuple(sorted(lab.items())): v for lab, v in samples.get("bookie_dir_free_bytes", ())}
        size_by = {tuple(sorted(lab.items())): v for lab, v in samples.get("bookie_dir_total_bytes", ())}
        # a directory's writes: 0 writable, 1 full, 2 failed (bookie_native/README.md "Disk errors")
        state_by = {tuple(sorted(lab.items())): v for lab, v in samples.get("bookie_dir_state", ())}
        for lab, used in samples.get("bookie_dir_bytes", ()):
            k = tuple(sorted(lab.items()))
            size, free = size_by.get(k), free_by.get(k)
            usage = 1.0 - free / size if size and free is not None else None
            state = DIR_STATES.get(int(state_by.get(k) or 0), "failed")
            dirs.append({"kind": lab.get("kind"), "dir": lab.get("dir"), "bytes": used,
                         "free": free, "total": size, "usage": usage, "state": state})
            add(f"{key}/disk_usage/{lab.get('kind')}:{lab.get('dir')}", now, usage)
        doc["dirs"] = dirs
        if prev is None:
            return
        dt = max(now - prev_t, 1e-3)

        def rate(name, **labels):
            a, b = total(samples, name, **labels), total(prev, name, **labels)
            return None if a is None or b is None else max(0.0, a - b) / dt
        figures = {
            "adds_per_s": rate("bookie_adds_total", status="EOK"),
            "reads_per_s": rate("bookie_read_entries_total"),
            "add_bytes_per_s": rate("bookie_add_bytes_total"),
            "read_bytes_per_s": rate("bookie_read_bytes_total"),
            "errors_per_s": rate("bookie_rpc_errors_total"),
        }
        for q in (0.5, 0.99):
            tag = f"p{int(q * 100)}"
            figures[f"add_{tag}_ms"] = _ms(histogram_quantile(
                q, buckets(samples, "bookie_add_batch_seconds"), buckets(prev, "bookie_add_batch_seconds")))
            figures[f"read_{tag}_ms"] = _ms(histogram_quantile(
                q, buckets(samples, "bookie_read_seconds"), buckets(prev, "bookie_read_seconds")))
        syncs = rate("bookie_storage_journal_sync_count")
        sync_ns = rate("bookie_storage_journal_sync_ns_sum")
        figures["journal_sync_ms"] = sync_ns / syncs / 1e6 if syncs and sync_ns is not None else None
        doc.update(figures)
        for name, value in figures.items():
            add(f"{key}/{name}", now, value)

    def _sample_cluster(self, now: float) -> None:
        errors: dict[str, str] = {}
        logs: list[dict] = []
        if self.bk is not None:
            from bkspark.log import LogStore
            store = LogStore(self.bk)
            try:
                names = store.list_logs()[:MAX_LOGS]
            except BKError as exc:
                names, errors["logs"] = [], str(exc)
            for name in names:
                try:
                    doc = {"log": name, **store.stats(name)}
                    doc["cursors"] = {c: {"position": list(pos), "lag": lag}
                                      for c, (pos, lag) in store.cursor_lags(name).items()}
                except BKError as exc:
                    logs.append({"log": name, "error": str(exc)})
                    continue
                logs.append(doc)
                self.history.add(f"log/{name}/entries", now, doc["entries"])
                self.history.add(f"log/{name}/bytes", now, doc["bytes"])
                for cursor, c in doc["cursors"].items():
                    self.history.add(f"log/{name}/lag/{cursor}", now, c["lag"])
        pending_jobs: list[dict] = []
        if self.bk is not None:
            from bkspark.log import LogStore
            from bkspark.spark import pending
            try:
                pending_jobs = [j.to_dict() for j in
                                pending.reclaim(LogStore(self.bk), dry_run=True)[:MAX_PENDING_JOBS]]
            except BKError as exc:
                errors["pending_jobs"] = str(exc)
        from bkspark.recovery.urm import UnderReplicationManager
        urm = UnderReplicationManager(self.store)
        under, count, auditor = [], 0, None
        try:
            ids = urm.list()
            count = len(ids)
            for lid in ids[:MAX_UNDER_REPLICATED]:
                got = urm.get(lid)
                if got is not None:
                    under.append({"ledger_id": lid, "missing": got[0].get("missing", []),
                                  "ctime_ms": got[0].get("ctime_ms"),
                                  "locked_by": urm.lock_holder(lid)})
            auditor = urm.auditor()
        except BKError as exc:
            errors["under_replicated"] = str(exc)
        try:
            processes = self._sample_autorecovery(urm.endpoints())
        except BKError as exc:
            processes, errors["autorecovery"] = [], str(exc)
        self.history.add("cluster/under_replicated", now, float(count))
        try:
            self._count_ledger_states(now)
        except BKError as exc:
            errors["ledger_states"] = str(exc)
        with self._lock:
            copy_rate = [b["copy_rate"] for b in [*self._bookies.values(), *processes]
                         if b.get("copy_rate") is not None]
        if copy_rate:
            self.history.add("cluster/copy_rate", now, float(sum(copy_rate)))
        with self._lock:
            self._cluster = {"logs": logs, "pending_jobs": pending_jobs,
                             "ledger_states": self._ledger_states, "under_replicated": under,
                             "under_replicated_count": count, "auditor": auditor,
                             "autorecovery": processes, "errors": errors}

    def _sample_autorecovery(self, endpoints: dict[str, dict]) -> list[dict]:
        """The published autorecovery processes (at most :data:`MAX_AUTORECOVERY`), each with
        the figures of its ``/metrics`` -- or ``up: False`` when it does not answer."""
        out = []
        for ident, info in sorted(endpoints.items())[:MAX_AUTORECOVERY]:
            host, port = info.get("host", ""), info.get("http_port")
            samples = self._scrape(host, port, info.get("scheme") == "https")
            doc = {"id": ident, "address": f"{host}:{port}", "up": samples is not None}
            if samples is not None:
                doc.update({
                    "is_auditor": bool(total(samples, "autorecovery_is_auditor") or 0),
                    "copy_rate": total(samples, "autorecovery_copy_rate_bytes"),
                    "ledgers_replicated": total(samples, "autorecovery_ledgers_replicated_total"),
                    "failures": total(samples, "autorecovery_replication_failures_total"),
                    "bytes_copied": total(samples, "autorecovery_bytes_copied_total"),
                    "clock_skew": total(samples, "bkspark_clock_skew_seconds")})
                skew = doc["clock_skew"]
                doc["clock_skew_alarm"] = skew is not None and \
                    abs(skew) > self.store.clock.tolerance_s
            out.append(doc)
        return out

    def _count_ledger_states(self, now: float) -> None:
        """Read the next :data:`LEDGER_SCAN_CHUNK` ledgers' metadata of the count under way;
        once every ledger of the list it started from is read, publish the count (by state,
        with the time it completed) and start the next one."""
        from metadata import ledgers as ledger_store
        from metadata.layout import ledger_path
        from metadata.ledger_metadata import LedgerMetadata
        if not self._scan:
            self._scan = sorted(ledger_store.list_ledgers(self.store), reverse=True)
            self._scan_counts = {}
        chunk = [self._scan.pop() for _ in range(min(LEDGER_SCAN_CHUNK, len(self._scan)))]
        for item in self.store.get_many([ledger_path(lid) for lid in chunk]):
            if item is None:
                continue                        # deleted since the list was read
            try:
                state = LedgerMetadata.deserialize(item[0]).state.value
            except BKError:
                state = "unreadable"
            self._scan_counts[state] = self._scan_counts.get(state, 0) + 1
        if not self._scan:
            self._ledger_states = {"counts": dict(self._scan_counts), "at": now}
            for state, n in self._scan_counts.items():
                self.history.add(f"cluster/ledgers/{state}", now, float(n))

    # ---- what the page asks for --------------------------------------------------------------
    def overview(self) -> dict:
        with self._lock:
            bookies = [dict(d) for _, d in sorted(self._bookies.items())]
            cluster = dict(self._cluster)
        counts = {s: sum(1 for b in bookies if b.get("state") == s)
                  for s in ("writable", "read-only", "down")}
        return {"time": time.time(), "samples": self.samples, "bookies": bookies,
                "bookie_states": counts, **cluster}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0
