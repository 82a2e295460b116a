"""What the dashboard shows, sampled from the cluster on two threads.

The sampling thread, every ``interval`` seconds: the bookie registry and each bookie's
``/metrics`` (its admin endpoint); every ``slow_interval`` seconds: Spark write jobs with
pending ledgers (:func:`bkspark.spark.pending.reclaim`, a dry run), the under-replicated
ledgers, the auditor, the autorecovery processes (each standalone one publishes its HTTP
endpoint, whose ``/metrics`` are scraped; bookies hosting autorecovery export its figures
with their own) and their copy rate.

The census thread (:class:`Census`): passes over EVERY log and EVERY ledger, in pipelined
chunks -- :data:`LOG_CHUNK` logs' heads, tails and cursors in a few ``get_many`` rounds, then
:data:`LEDGER_CHUNK` ledgers' metadata at a time -- into one summary row per log (segments,
entries, bytes, entries added in the last one to two minutes and per second, open ledger and
its age, cursor lags) and totals (logs, ledgers by state, entries, bytes, entries/s). The logs table
ranks those rows (busiest, largest, most lagging, by name; :meth:`Census.rank`) and searches
them by name. A pass's cost grows with the number of logs and ledgers, not with their
lengths; its LAC reads take at most :data:`LAC_BUDGET_S`. Passes start at most every
``slow_interval`` and rest at least as long as the last one took. Nothing is written to the
cluster.

Derived figures: a rate is the difference of a counter between two scrapes over their
interval; a latency quantile comes from the difference of a histogram's buckets between two
scrapes (the interval's own distribution, interpolated within its bucket, as Prometheus's
``histogram_quantile`` does). A bookie is ``down`` when its endpoint does not answer (at the
next sample after it died, not a session timeout later), ``read-only`` or ``writable`` as
registered.

Bounded: each series keeps the points of the last ``history_s`` (a deque of
``history_s / interval`` points); a series with no point in that window is dropped; at most
:data:`MAX_UNDER_REPLICATED` under-replication records are read per sample. The census keeps
one row of a few numbers per log (~2 KB; at most :data:`MAX_CENSUS_LOGS` logs; a log deleted drops
out at the end of the next pass), and plots the cursor lags of the :data:`PLOTTED_LOGS` most
lagging logs only.
"""
from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections import deque

from prometheus_client.parser import text_string_to_metric_families

from bkspark.auth.credentials import Credentials
from bkspark.errors import BKError, NoNodeError

log = logging.getLogger("bkspark.dashboard")

#: logs whose heads, tails and cursors one census step reads (a few pipelined rounds)
LOG_CHUNK = 500
#: ledgers whose metadata one census step reads towards the count of ledgers by state
LEDGER_CHUNK = 2000
#: logs a census summarizes at most (the first by name; the count of logs stays exact)
MAX_CENSUS_LOGS = 20_000
#: rank() answers kept until the rows change (orders x searches of the open pages)
RANKED_KEPT = 32
#: cursors of one log whose lags a census computes (the first by name; the count stays exact)
MAX_CURSORS_READ = 100
#: cursors a log's row keeps (its most lagging ones)
CURSORS_KEPT = 5
#: LAC reads of open ledgers in flight at once (threads), and the seconds of one pass they
#: may take in all (beyond: a log keeps the LAC its open ledger had at the previous pass)
LAC_PARALLEL = 8
LAC_BUDGET_S = 20.0
#: the most lagging logs whose cursor lags are plotted
PLOTTED_LOGS = 10
#: rows a ranking answers at most; rows the overview carries; characters of a search
MAX_SHOWN = 500
OVERVIEW_LOGS = 100
MAX_QUERY = 200
#: the orders of the logs table (:meth:`Census.rank`)
SORTS = ("busiest", "largest", "lagging", "name")
#: a census rests, after a pass, at least this many times as long as the pass took
CENSUS_REST = 1.0
#: a log's rate covers one to two of these windows (:func:`_rate`)
RATE_WINDOW_S = 60.0
#: under-replication records read at most (the count is always exact)
MAX_UNDER_REPLICATED = 200
#: Spark write jobs with pending ledgers listed at most
MAX_PENDING_JOBS = 100
#: published autorecovery processes scraped at most (the first ones by identifier)
MAX_AUTORECOVERY = 20
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
    """Samples the cluster of metadata store ``store`` (and a client ``bk``, for pending Spark
    jobs and the LACs of logs' open ledgers; None: neither) into :attr:`history`,
    :meth:`overview` and :attr:`census` (module docstring). :meth:`start` runs the sampling
    and census threads; :meth:`sample` and ``census.run_pass()`` do the same work once, on
    the caller's thread."""

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
        self._cluster: dict = {"pending_jobs": [], "under_replicated": [],
                               "under_replicated_count": 0,
                               "auditor": None, "autorecovery": [], "errors": {}}
        self._last_slow = 0.0
        #: every log and ledger, in passes (:class:`Census`)
        self.census = Census(store, bk, self.history)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._census_thread: threading.Thread | None = None
        self.samples = 0

    # ---- running ---------------------------------------------------------------------------
    def start(self) -> "Collector":
        self._thread = threading.Thread(target=self._run, name="bkspark-dashboard-collector",
                                        daemon=True)
        self._thread.start()
        self._census_thread = threading.Thread(target=self._run_census,
                                               name="bkspark-dashboard-census", daemon=True)
        self._census_thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._census_thread):
            if thread is not None:
                thread.join(timeout=10)
        self.census.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a bad sample must not end the dashboard
                log.exception("dashboard sample failed")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def _run_census(self) -> None:
        """Census passes, one after another: a pass starts at most every ``slow_interval``
        and after a rest at least :data:`CENSUS_REST` times as long as the last one took (it
        shares the process with the sampling and the HTTP threads). A failed step is retried
        after ``slow_interval``."""
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if not self.census.run_pass(self._stop):
                    return
                took = time.monotonic() - started
                pause = max(self.slow_interval - took, CENSUS_REST * took)
            except Exception:  # noqa: BLE001 - a bad step must not end the census
                log.exception("dashboard census step failed")
                pause = max(self.slow_interval, 1.0)
            self._stop.wait(pause)

    # ---- sampling --------------------------------------------------------------------------
    def sample(self) -> None:
        """One sample: bookies always; pending Spark jobs, under-replication, the auditor and
        autorecovery every ``slow_interval`` (logs and ledger counts: :attr:`census`)."""
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
        with self._lock:
            copy_rate = [b["copy_rate"] for b in [*self._bookies.values(), *processes]
                         if b.get("copy_rate") is not None]
        if copy_rate:
            self.history.add("cluster/copy_rate", now, float(sum(copy_rate)))
        with self._lock:
            self._cluster = {"pending_jobs": pending_jobs, "under_replicated": under,
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

    # ---- what the page asks for --------------------------------------------------------------
    def overview(self) -> dict:
        """The latest sample: bookies, the census's totals (``log_totals``, ``ledger_states``,
        ``census``) and its :data:`OVERVIEW_LOGS` busiest logs (``logs``; the page asks
        :meth:`Census.rank` for its table), pending jobs, under-replication, autorecovery."""
        with self._lock:
            bookies = [dict(d) for _, d in sorted(self._bookies.items())]
            cluster = dict(self._cluster)
        counts = {s: sum(1 for b in bookies if b.get("state") == s)
                  for s in ("writable", "read-only", "down")}
        census = self.census.view()
        errors = {**cluster.pop("errors"), **census.pop("errors")}
        return {"time": time.time(), "samples": self.samples, "bookies": bookies,
                "bookie_states": counts, **cluster, **census,
                "logs": self.census.rank("busiest", "", OVERVIEW_LOGS)["logs"],
                "errors": errors}


# ---- the census of logs and ledgers ---------------------------------------------------------------

class _LogRead:
    """What one census step read of one format-2 log (its head, tail, cursors...)."""

    __slots__ = ("name", "head", "version", "seqs", "tail_start", "entries", "cursor_names",
                 "cursor_count", "positions", "mds", "lacs", "at")

    def __init__(self, name: str, head, version: int):
        self.name, self.head, self.version = name, head, version
        first, nxt = head.first, head.next
        self.tail_start = max(first, nxt - _segments().TAIL)
        self.seqs = sorted({first, *range(self.tail_start, nxt)}) if nxt > first else []
        self.entries: dict = {}             # seq -> LogLedger
        self.cursor_names: list[str] = []
        self.cursor_count = 0
        self.positions: dict = {}           # cursor -> Position
        self.mds: dict = {}                 # ledger id -> (LedgerMetadata, version) | None
        self.lacs: dict = {}                # ledger id -> LAC read from the bookies
        self.at: dict = {}                  # ledger id -> its listed entry | None

    @property
    def whole(self) -> bool:
        """Whether every segment of the list was read."""
        return self.head.next - self.head.first <= len(self.seqs)

    def listed(self) -> list:
        return [e for _, e in sorted(self.entries.items()) if e.listed]


def _segments():
    from bkspark.log import segments
    return segments


class Census:
    """Passes over every log and every ledger of the cluster of ``store`` (``bk``: a client,
    to read the LAC of open ledgers from their bookies; None: their entries stay unknown) into
    one summary row per log and totals (module docstring).

    :meth:`step` does one bounded piece of work -- :data:`LOG_CHUNK` logs (their heads, the
    first and last :data:`bkspark.log.segments.TAIL` segments, cursors, the metadata of open
    tail ledgers and cursors' ledgers, in a few pipelined ``get_many`` rounds, then the LACs of
    the open ledgers, :data:`LAC_PARALLEL` at once) or :data:`LEDGER_CHUNK` ledgers' metadata --
    and says whether a pass completed; :meth:`run_pass` steps until one does. Each log's row
    replaces the previous pass's as soon as its chunk is read; the totals and the count of
    ledgers by state are published when a pass completes, with when and how long it took.

    A row: ``log``, ``uid``, ``segments`` (of the list, unlisted ones included), ``entries``
    (offsets from the first listed entry to the end: closed ledgers from the list's stamps,
    open ones up to their LAC), ``bytes`` (closed ledgers), ``first_offset`` / ``end_offset``,
    ``added`` and ``rate`` (entries over the last one to two :data:`RATE_WINDOW_S`, and per
    second; :func:`_rate`), ``open_ledger``,
    ``open_lac``, ``open_age_s`` (since the open ledger was created), ``cursors`` (how many),
    ``lag`` (the most lagging cursor's, entries) and ``cursor_lags`` (the
    :data:`CURSORS_KEPT` most lagging), ``retention``, ``t`` (when read); ``entries`` is None
    when the list's stamps do not tell it (a long list written before the stamps).

    Failure semantics: a metadata error ends the step (raised; the next step resumes at the same
    chunk) and is shown in :meth:`view`'s ``errors`` until a pass completes; a log that cannot
    be summarized (a corrupt record) gets a row with ``error``; a log that changes between the
    reads of its head and its segments is read again, twice, then keeps its previous row
    (``stale``); a LAC that no bookie gave in time (or once the pass's :data:`LAC_BUDGET_S` is
    spent) is the one read at the previous pass for the same ledger (``entries_stale``), else
    left out (``entries_partial``: ``entries`` counts up to the open ledger)."""

    def __init__(self, store, bk=None, history: History | None = None):
        self.store = store
        self.bk = bk
        self.history = history
        self._lock = threading.Lock()
        self._rows: dict[str, dict] = {}        # the last complete pass's rows
        self._current: dict[str, dict] = {}     # rows of the pass under way
        self._changes = 0                       # bumped whenever the rows change
        self._ranked: dict[tuple, dict] = {}    # rank()'s answers since the last change
        self._names: list[str] | None = None    # logs of the pass under way
        self._pos = 0
        self._log_count = 0
        self._ledgers: list[int] | None = None  # ledgers of the pass under way not read yet
        self._ledger_total = 0
        self._counts: dict[str, int] = {}
        self._started = 0.0
        self._lac_deadline = 0.0
        self._lac = {"read": 0, "unread": 0}
        self._pool = None
        self.totals: dict | None = None         # the last complete pass's
        self.ledger_states: dict | None = None
        self.errors: dict[str, str] = {}
        self.passes = 0

    def close(self) -> None:
        """Stop the LAC readers (a read under way ends by the client's read timeout)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # ---- passes --------------------------------------------------------------------------------
    def run_pass(self, stop: threading.Event | None = None) -> bool:
        """Step until a pass completes (True) or ``stop`` is set (False)."""
        while stop is None or not stop.is_set():
            if self.step():
                return True
        return False

    def step(self) -> bool:
        """One chunk of the pass under way (a new pass starts if none is); True when this step
        completed the pass. :raises BKError: a metadata read failed (the step can be retried)."""
        try:
            done = self._step()
        except BKError as exc:
            with self._lock:
                self.errors["logs" if self._ledgers is None else "ledger_states"] = str(exc)
            raise
        return done

    def _step(self) -> bool:
        from metadata import ledgers as ledger_store
        if self._names is None:
            self._begin()
        if self._pos < len(self._names):
            chunk = self._names[self._pos:self._pos + LOG_CHUNK]
            rows = self._summarize(chunk)
            with self._lock:
                self._current.update(rows)
                self._changes += 1
                self._pos += len(chunk)
            return False
        if self._ledgers is None:
            self._ledgers = sorted(ledger_store.list_ledgers(self.store), reverse=True)
            self._ledger_total = len(self._ledgers)
        if self._ledgers:
            self._count_states(self._ledgers[-LEDGER_CHUNK:])
            del self._ledgers[-LEDGER_CHUNK:]
            if self._ledgers:
                return False
        self._finish()
        return True

    def _begin(self) -> None:
        from metadata.layout import LOGS, is_log_name
        try:
            names = sorted(n for n in self.store.children(LOGS) if is_log_name(n))
        except NoNodeError:
            names = []
        self._log_count = len(names)
        self._names = names[:MAX_CENSUS_LOGS]
        self._pos = 0
        with self._lock:
            self._current = {}
            self._changes += 1
        self._ledgers, self._counts = None, {}
        self._started = time.monotonic()
        self._lac_deadline = self._started + LAC_BUDGET_S
        self._lac = {"read": 0, "unread": 0}

    def _count_states(self, chunk: list[int]) -> None:
        from metadata.layout import ledger_path
        from metadata.ledger_metadata import LedgerMetadata
        counts = dict(self._counts)
        for item in self.store.get_many([ledger_path(lid) for lid in chunk]):
            if item is None:
                continue                        # deleted since the list was read
            try:
                state = LedgerMetadata.deserialize(item[0]).state.value
            except BKError:
                state = "unreadable"
            counts[state] = counts.get(state, 0) + 1
        self._counts = counts

    def _finish(self) -> None:
        now = time.time()
        took = time.monotonic() - self._started
        with self._lock:
            rows = self._current
        known = [r for r in rows.values() if "error" not in r]
        rates = [r["rate"] for r in known if r.get("rate") is not None]
        totals = {
            "logs": self._log_count, "summarized": len(rows),
            "segments": sum(r["segments"] for r in known),
            "entries": sum(r["entries"] for r in known if r.get("entries") is not None),
            "entries_unknown": sum(1 for r in known if r.get("entries") is None
                                   or r.get("entries_partial")),
            "bytes": sum(r["bytes"] for r in known if r.get("bytes") is not None),
            "bytes_unknown": sum(1 for r in known if r.get("bytes") is None),
            "entries_per_s": sum(rates) if rates else None,
            "open_ledgers": sum(1 for r in known if r.get("open_ledger") is not None),
            "cursors": sum(r["cursors"] for r in known),
            "errors": len(rows) - len(known),
            "ledgers": self._ledger_total,
            "lac_reads": self._lac["read"], "lac_unread": self._lac["unread"],
            "at": now, "took_s": took}
        states = {"counts": dict(self._counts), "at": now, "ledgers": self._ledger_total}
        with self._lock:
            self._rows, self._current = rows, {}
            self._changes += 1
            self.totals, self.ledger_states = totals, states
            self.errors = {}
            self.passes += 1
        self._names, self._ledgers = None, None
        if self.history is not None:
            for state, n in states["counts"].items():
                self.history.add(f"cluster/ledgers/{state}", now, float(n))
            self.history.add("cluster/log_entries_per_s", now, totals["entries_per_s"])
            lagging = heapq.nsmallest(PLOTTED_LOGS, (r for r in known if r.get("lag") is not None),
                                      key=_SORT_KEYS["lagging"])
            for r in lagging:
                for cursor, lag in r["cursor_lags"].items():
                    self.history.add(f"log/{r['log']}/lag/{cursor}", now, float(lag))

    # ---- what is shown ---------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """Every log's latest row: this pass's where read already, else the last pass's."""
        with self._lock:
            merged = dict(self._rows)
            merged.update(self._current)
        return list(merged.values())

    def rank(self, sort: str = "busiest", query: str = "", limit: int = OVERVIEW_LOGS) -> dict:
        """The first ``limit`` (1..:data:`MAX_SHOWN`) rows in the order ``sort`` (one of
        :data:`SORTS`) among the logs whose name holds ``query`` (case-insensitive; at most
        :data:`MAX_QUERY` characters; empty: every log), and how many match.

        * ``busiest``: most entries per second over the last minute or two (:func:`_rate`;
          logs read once only after); ``largest``: most bytes, then entries; ``lagging``: the
          most lagging cursor (entries), then -- logs without cursors -- the oldest open ledger; ``name``.

        :raises ValueError: an unknown order, a query too long, a limit out of bounds."""
        if sort not in SORTS:
            raise ValueError(f"sort is one of {', '.join(SORTS)}, got {sort[:40]!r}")
        if not isinstance(query, str) or len(query) > MAX_QUERY:
            raise ValueError(f"a search is at most {MAX_QUERY} characters")
        if not isinstance(limit, int) or not 1 <= limit <= MAX_SHOWN:
            raise ValueError(f"limit is 1..{MAX_SHOWN}")
        with self._lock:
            key = (self._changes, sort, query, limit)
            if key in self._ranked:             # (every open page asks every 2 s)
                return self._ranked[key]
        rows = self.rows()
        q = query.strip().lower()
        if q:
            rows = [r for r in rows if q in r["log"].lower()]
        answer = {"sort": sort, "query": query, "matched": len(rows),
                  "logs": heapq.nsmallest(limit, rows, key=_SORT_KEYS[sort])}
        with self._lock:
            if len(self._ranked) >= RANKED_KEPT or any(k[0] != key[0] for k in self._ranked):
                self._ranked.clear()
            self._ranked[key] = answer
        return answer

    def view(self) -> dict:
        """The totals of the last complete pass, the count of ledgers by state, the pass under
        way (``progress``) and errors."""
        with self._lock:
            progress = None if self._names is None else {
                "logs_read": self._pos, "logs": len(self._names),
                "ledgers_read": self._ledger_total - len(self._ledgers or ())
                if self._ledgers is not None else 0,
                "running_s": time.monotonic() - self._started}
            return {"log_totals": self.totals, "ledger_states": self.ledger_states,
                    "census": {"passes": self.passes, "progress": progress},
                    "errors": dict(self.errors)}

    # ---- one chunk of logs ---------------------------------------------------------------------
    def _summarize(self, names: list[str]) -> dict[str, dict]:
        """Rows of the logs ``names`` (those that exist), reading them together."""
        with self._lock:
            previous = {n: self._current.get(n) or self._rows.get(n) for n in names}
        rows: dict[str, dict] = {}
        todo = names
        for attempt in range(3):
            reads, raced = self._read_logs(todo, rows)
            if reads:
                self._read_details(reads)
                now_ms = self._store_ms()
                for r in reads:
                    try:
                        rows[r.name] = self._row(r, previous.get(r.name), now_ms)
                    except BKError as exc:
                        rows[r.name] = {"log": r.name, "error": str(exc), "t": time.time()}
            todo = raced
            if not todo:
                break
        for name in todo:           # changed under every read: the previous row stays
            prev = previous.get(name)
            rows[name] = dict(prev, stale=True) if prev else {
                "log": name, "error": "the log kept changing while it was read", "t": time.time()}
        return rows

    def _store_ms(self) -> int:
        try:
            return self.store.clock.now_ms()
        except BKError:
            return int(time.time() * 1000)

    def _read_logs(self, names: list[str], rows: dict) -> tuple[list[_LogRead], list[str]]:
        """Round 1 and 2: heads, then the segments they name and the cursors' names. Format-1
        logs get their rows here (:meth:`_legacy_row`); logs gone or being deleted none."""
        from metadata.layout import log_path
        from metadata.log_segments import FORMAT_VERSION, LogHead, format_version, segment_path
        seg = _segments()
        reads: list[_LogRead] = []
        for name, item in zip(names, self.store.get_many([log_path(n) for n in names])):
            if item is None:
                continue                                    # deleted since the listing
            try:
                if format_version(item[0]) != FORMAT_VERSION:
                    rows[name] = self._legacy_row(name)
                    continue
                head = LogHead.deserialize(item[0])
            except BKError as exc:
                rows[name] = {"log": name, "error": str(exc), "t": time.time()}
                continue
            if head.properties.get(seg.DELETED):
                continue
            reads.append(_LogRead(name, head, item[1]))
        paths = [segment_path(r.name, s) for r in reads for s in r.seqs]
        got = iter(self.store.get_many(paths))
        raced, kept = [], []
        for r in reads:
            items = [next(got) for _ in r.seqs]
            if any(i is None for i in items):
                raced.append(r.name)                        # truncated since its head was read
                continue
            try:
                r.entries = {s: seg.decode_segment(i[0], s) for s, i in zip(r.seqs, items)}
            except BKError as exc:
                rows[r.name] = {"log": r.name, "error": str(exc), "t": time.time()}
                continue
            try:
                cursors = sorted(self.store.children(f"{log_path(r.name)}/cursors"))
            except NoNodeError:
                cursors = []
            r.cursor_count, r.cursor_names = len(cursors), cursors[:MAX_CURSORS_READ]
            kept.append(r)
        return kept, raced

    def _read_details(self, reads: list[_LogRead]) -> None:
        """Rounds 3 to 6: cursor positions and the metadata of open tail ledgers; where a
        cursor's ledger is listed (ledger index, then its segment); the LACs of open ledgers."""
        import json
        from bkspark.log.position import Position
        from metadata.layout import ledger_path, log_path
        from metadata.log_segments import ledger_index_path, segment_path
        seg = _segments()
        paths: list[str] = []
        for r in reads:
            paths += [f"{log_path(r.name)}/cursors/{c}" for c in r.cursor_names]
            paths += [ledger_path(e.ledger_id) for e in r.listed() if not e.closed]
        got = iter(self.store.get_many(paths))
        for r in reads:
            for c in r.cursor_names:
                item = next(got)
                if item is None:
                    continue                                # deleted since listed
                try:
                    r.positions[c] = Position.from_json(json.loads(item[0].decode()))
                except (ValueError, UnicodeDecodeError, BKError):
                    continue                                # unreadable: counted, no lag
            for e in r.listed():
                if not e.closed:
                    item = next(got)
                    r.mds[e.ledger_id] = None if item is None else _ledger_md(e.ledger_id, item)
        # the segments that list the cursors' ledgers (those not read already)
        wanted: list[tuple[_LogRead, int]] = []
        for r in reads:
            by_id = {e.ledger_id: e for e in r.listed()}
            for pos in r.positions.values():
                if pos.ledger_id in by_id:
                    r.at[pos.ledger_id] = by_id[pos.ledger_id]
                elif pos.ledger_id >= 0 and pos.ledger_id not in r.at:
                    r.at[pos.ledger_id] = None
                    wanted.append((r, pos.ledger_id))
        index = self.store.get_many([ledger_index_path(r.name, lid) for r, lid in wanted])
        found: list[tuple[_LogRead, int, int]] = []
        for (r, lid), item in zip(wanted, index):
            try:
                seq = None if item is None else int(item[0])
            except ValueError:
                seq = None
            if seq is not None and r.head.first <= seq < r.head.next:
                found.append((r, lid, seq))
        for (r, lid, seq), item in zip(found, self.store.get_many(
                [segment_path(r.name, seq) for r, _, seq in found])):
            if item is None:
                continue
            try:
                entry = seg.decode_segment(item[0], seq)
            except BKError:
                continue
            if entry.ledger_id == lid and entry.listed:
                r.at[lid] = entry
        # the LACs of the open ledgers
        from metadata.ledger_metadata import LedgerState
        open_mds = {lid: got for r in reads for lid, got in r.mds.items()
                    if got is not None and got[0].state is not LedgerState.CLOSED}
        lacs = self._read_lacs(open_mds)
        for r in reads:
            r.lacs = {lid: lacs[lid] for lid in r.mds if lid in lacs}

    def _read_lacs(self, mds: dict) -> dict[int, int]:
        """The LAC of each open ledger ``mds`` names (``{id: (metadata, version)}``), asked
        of the bookies of its last ensemble with the keys its metadata stores,
        :data:`LAC_PARALLEL` at once, within what is left of the pass's :data:`LAC_BUDGET_S`;
        those not read are left out."""
        if self.bk is None or not mds:
            return {}
        remaining = self._lac_deadline - time.monotonic()
        if remaining <= 0:
            self._lac["unread"] += len(mds)
            return {}
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(LAC_PARALLEL, thread_name_prefix="bkspark-dashboard-lac")
        from concurrent.futures import wait
        futures = {self._pool.submit(_read_lac, self.bk, md, version): lid
                   for lid, (md, version) in mds.items()}
        done, late = wait(futures, timeout=remaining)
        for f in late:
            f.cancel()
        out = {}
        for f in done:
            try:
                out[futures[f]] = f.result()
            except (BKError, OSError) as exc:
                log.debug("dashboard: LAC of ledger %d unread: %s", futures[f], exc)
        self._lac["read"] += len(out)
        self._lac["unread"] += len(mds) - len(out)
        return out

    def _row(self, r: _LogRead, prev: dict | None, now_ms: int) -> dict:
        """A log's row from what was read of it (class docstring)."""
        from bkspark.log.store import cursor_lag, offset_span, stamped_bytes
        from metadata.ledger_metadata import LedgerState
        head = r.head
        listed = r.listed()
        first_e = self._first_listed(r, listed)
        tail = [e for e in listed if e.seq >= r.tail_start]
        stale = partial = False
        prev_open = prev.get("open_ledger") if prev and prev.get("uid") == head.uid else None

        unknown: set = set()

        def end_of(e) -> int:
            """The ledger's last readable entry; -1 (none counted) when it is not known."""
            nonlocal stale, partial
            if e.closed:
                return e.last_entry_id
            got = r.mds.get(e.ledger_id)
            if got is not None and got[0].state is LedgerState.CLOSED:
                return got[0].last_entry_id
            if e.ledger_id in r.lacs:
                return r.lacs[e.ledger_id]
            if e.ledger_id == prev_open and prev.get("open_lac") is not None:
                stale = True
                return prev["open_lac"]
            partial = True
            unknown.add(e.ledger_id)
            return -1

        # the figures of LogStore.stats, by its rules (offset_span, stamped_bytes)
        first_offset = end = entries = None
        span = offset_span(first_e, tail, end_of)
        if first_e is None:
            entries = 0
        elif span is not None:
            first_offset, end = span
            entries = end - first_offset
        elif r.whole:
            entries = sum(end_of(e) + 1 for e in listed)
        size = stamped_bytes(first_e, tail)
        if size is None and r.whole:
            size = sum(e.sealed_length() for e in listed)
        # the open ledger (the last one the list holds open), its LAC and age
        open_e = next((e for e in reversed(tail) if not e.closed), None)
        open_md = r.mds.get(open_e.ledger_id) if open_e is not None else None
        if open_md is not None and open_md[0].state is LedgerState.CLOSED:
            open_e = None                       # closed already: the list records it next
        open_lac = None if open_e is None else end_of(open_e)
        if open_e is not None and open_e.ledger_id in unknown:
            open_lac = None
        age = None
        if open_md is not None and open_e is not None and open_md[0].ctime_ms:
            age = max(0.0, (now_ms - open_md[0].ctime_ms) / 1000.0)
        # cursors (LogStore.cursor_lags' rule)
        lags: dict[str, int] = {}
        if span is not None and not partial:    # (an end not known: no lag either)
            lags = {cursor: cursor_lag(pos, r.at.get(pos.ledger_id), span)
                    for cursor, pos in r.positions.items()}
        kept = dict(sorted(lags.items(), key=lambda kv: (-kv[1], kv[0]))[:CURSORS_KEPT])
        t = time.time()
        row = {"log": r.name, "uid": head.uid, "segments": head.next - head.first,
               "entries": entries, "entries_partial": partial, "entries_stale": stale,
               "bytes": size, "first_offset": first_offset, "end_offset": end,
               "open_ledger": None if open_e is None else open_e.ledger_id,
               "open_lac": open_lac, "open_age_s": age,
               "cursors": r.cursor_count, "lag": max(lags.values()) if lags else None,
               "cursor_lags": kept,
               "retention": head.properties.get(_retention_property()),
               **_offload_summary(head.properties, first_offset, end,
                                  None if first_e is None else first_e.byte_offset),
               "t": t, "added": None, "rate": None}
        _rate(row, prev)
        return row

    def _first_listed(self, r: _LogRead, listed: list):
        """The first listed entry of the list (None: it lists nothing): segment ``first``,
        else the next listed one (read here, in chunks that double: unlisted segments are rare
        and only between the two ends)."""
        first = r.entries.get(r.head.first)
        if first is not None and first.listed:
            return first
        lo, step = r.head.first + 1, 1
        while lo < r.tail_start:
            hi = min(r.tail_start, lo + step)
            for e in _segments().read_segments(self.store, r.name, lo, hi, missing_ok=True):
                if e.listed:
                    return e
            lo, step = hi, min(step * 2, 256)
        return next((e for e in listed if e.seq >= r.tail_start), None)

    def _legacy_row(self, name: str) -> dict:
        """The row of a format-1 log (one record: read whole through :class:`LogStore`, which
        converts it on its first change)."""
        if self.bk is None:
            return {"log": name, "error": "a format-1 log: summarized only with a client",
                    "t": time.time()}
        from bkspark.log import LogStore
        logs = LogStore(self.bk)
        stats = logs.stats(name)
        lags = {c: lag for c, (_, lag) in logs.cursor_lags(name).items()}
        return {"log": name, "uid": None, "segments": stats["segments"],
                "entries": stats["entries"], "entries_partial": False, "entries_stale": False,
                "bytes": stats["bytes"], "first_offset": stats["first_offset"],
                "end_offset": stats["end_offset"], "open_ledger": None, "open_lac": None,
                "open_age_s": None, "cursors": len(lags),
                "lag": max(lags.values()) if lags else None,
                "cursor_lags": dict(sorted(lags.items(), key=lambda kv: -kv[1])[:CURSORS_KEPT]),
                "retention": stats["retention"],
                **{k: stats[k] for k in ("offload", "offloaded_entries", "offloaded_bytes",
                                         "offload_lag", "dropped_entries", "dropped_bytes")},
                "t": time.time(), "added": None, "rate": None}


def _offload_summary(properties: dict, first_offset, end_offset, first_byte_offset) -> dict:
    from bkspark.log.offload import summary
    return summary(properties, first_offset, end_offset, first_byte_offset)


def _retention_property() -> str:
    from bkspark.log.retention import PROPERTY
    return PROPERTY


def _ledger_md(ledger_id: int, item: tuple[bytes, int]):
    """``(metadata, version)`` of a stored ledger record; None if it is unreadable."""
    from metadata.ledger_metadata import LedgerMetadata
    try:
        md = LedgerMetadata.deserialize(item[0])
    except BKError:
        return None
    return (md, item[1]) if md.ledger_id == ledger_id else None


def _read_lac(bk, md, version: int) -> int:
    """The LAC of an open ledger, from the bookies of its last ensemble (any answer will do),
    with the keys its metadata stores (the dashboard's client is an admin)."""
    from bkspark.client.read_handle import ReadHandle
    handle = ReadHandle(bk.ctx, md, version, md.keys.stored_keys())
    try:
        return handle.try_read_last_add_confirmed()
    finally:
        handle.close()


def _rate(row: dict, prev: dict | None) -> None:
    """``added`` and ``rate`` of a row: entries since the row's oldest rate mark, and per second.

    A mark is an earlier pass's (monotonic time, end offset, entries); the row carries at most
    two (``rate_marks``), and the previous pass's row becomes a new mark once it is
    :data:`RATE_WINDOW_S` after the newest one. So the rate covers between one and two windows
    (from the first pass that read the log, until it has been read that long): a burst of
    writes ranks its log among the busiest for a minute, not for the one pass that saw it. A
    row whose entries were counted without an open ledger's LAC (``entries_partial``) or with
    an old one (``entries_stale``) is never a mark: it would count those entries as added for
    a whole window. The count is the end offset (it only grows) where the mark and the row
    both have one, else the entries (an empty log has no end offset yet); a log re-created
    (another uid) starts again."""
    now = row.setdefault("t_mono", time.monotonic())
    row["rate_marks"] = []
    if (not prev or prev.get("uid") != row["uid"] or "error" in prev
            or "t_mono" not in prev or now <= prev["t_mono"]):
        return
    marks = list(prev.get("rate_marks", ()))
    markable = not prev.get("entries_partial") and not prev.get("entries_stale")
    if markable and (not marks or prev["t_mono"] - marks[-1][0] >= RATE_WINDOW_S):
        marks = [*marks, (prev["t_mono"], prev.get("end_offset"), prev.get("entries"))][-2:]
    row["rate_marks"] = marks
    if not marks:
        return
    since, end_then, entries_then = marks[0]
    for count, then in ((row.get("end_offset"), end_then), (row.get("entries"), entries_then)):
        if count is not None and then is not None:
            row["added"] = max(0, count - then)
            row["rate"] = row["added"] / (now - since)
            return


def _none_last(value) -> tuple:
    return (value is None, -(value or 0))


#: ascending keys of the orders (heapq.nsmallest)
_SORT_KEYS = {
    "busiest": lambda r: (*_none_last(r.get("rate")), r["log"]),
    "largest": lambda r: (*_none_last(r.get("bytes")), *_none_last(r.get("entries")), r["log"]),
    "lagging": lambda r: (*_none_last(r.get("lag")), *_none_last(r.get("open_age_s")), r["log"]),
    "name": lambda r: (r["log"],),
}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0
