"""AutoRecovery: the auditor (elected), a replication worker and the retention service
(elected: :mod:`.retention`) in one process.

``bkspark autorecovery`` runs it standalone; ``bkspark bookie --autorecovery`` runs it inside
the bookie process. It uses its own metadata session, so its election record and worker
locks vanish when the process dies. With an HTTP endpoint (``http_port`` >= 0) it publishes
where that answers (:meth:`UnderReplicationManager.publish_endpoint`, ephemeral, re-published
after a session expiry), which is how the dashboard finds it.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from bkspark.auth.certs import server_tls_context
from bkspark.auth.guard import Guard, check_listen
from bkspark.cluster_registry import local_token_public_key
from bkspark.errors import BadRequestError, BKError
from metadata import open_store
from metadata.layout import AUDITOR_ELECTION, UR_LEDGERS, UR_LOCKS

from .auditor import (DEFAULT_ENTRIES_CHECK_RATE, DEFAULT_PERIODIC_CHECK_INTERVAL, Auditor,
                      AuditorConfig)
from .election import LeaderElection
from .http import RATE_WINDOW, AutoRecoveryHttp, metrics_registry
from .throttle import DEFAULT_DAEMON_MB_PER_S
from .urm import UnderReplicationManager
from .worker import ReplicationWorker, WorkerConfig

log = logging.getLogger("bkspark.recovery")


@dataclass
class AutoRecoveryConfig:
    lost_bookie_recovery_delay: float = 30.0
    audit_interval: float = 10.0
    periodic_check_interval: float = DEFAULT_PERIODIC_CHECK_INTERVAL    # weekly (BookKeeper's)
    entries_check_rate: float = DEFAULT_ENTRIES_CHECK_RATE  # ledgers/s of that check (0: no limit)
    bookie_check_interval: float = 86400.0
    placement_check_interval: float = 86400.0
    open_ledger_grace: float = 30.0
    worker_threads: int = 2
    replication_rate_mb_per_s: float | None = DEFAULT_DAEMON_MB_PER_S   # the worker's copy
    replication_rate_entries_per_s: float | None = None                 # rate limits (None:
                                                                        # unlimited)
    retry_backoff: float = 5.0
    session_timeout: float = 10.0
    rpc_timeout: float = 10.0
    run_auditor: bool = True
    run_worker: bool = True
    http_port: int = -1                 # metrics and routes (.http) on this port (0: any
    http_host: str = "127.0.0.1"        # free one; -1: none -- a bookie serves its own)
    http_token_public_key_file: str = ""    # tokens the endpoint accepts (bkspark.auth)
    http_tls_cert_file: str = ""        # with http_tls_key_file: the endpoint speaks HTTPS
    http_tls_key_file: str = ""
    http_tls_client_ca_file: str = ""   # client certificates it accepts (their OU: a role)
    allow_insecure_network: bool = False    # serve http_host beyond loopback anyway
    retention_interval: float = 60.0    # seconds between retention passes (0: no retention
                                        # service in this process)
    client: dict = field(default_factory=dict)  # ClientConfig fields of its client (TLS
                                                # bookies: tls_ca_file); they override
                                                # rpc_timeout's add/read timeouts


class AutoRecovery:
    def __init__(self, metadata_uri: str, config: AutoRecoveryConfig | None = None,
                 identifier: str | None = None):
        self.metadata_uri = metadata_uri
        self.config = config or AutoRecoveryConfig()
        self.identifier = identifier or \
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.store = None
        self.bk = None
        self.auditor = None
        self.election = None
        self.worker = None
        self.retention = None
        self.http = None                # the HTTP endpoint, when config.http_port >= 0
        self.metrics = metrics_registry(self)
        self._stopped = threading.Event()

    def start(self) -> "AutoRecovery":
        from bkspark.client import BookKeeper
        c = self.config
        tls = None
        if c.http_port >= 0:        # refused before anything starts
            Guard.from_settings(c.http_token_public_key_file,       # (readable files)
                                c.http_tls_client_ca_file)
            if bool(c.http_tls_cert_file) != bool(c.http_tls_key_file):
                raise BadRequestError("autorecovery: give both --http-tls-cert-file and "
                                      "--http-tls-key-file, or neither")
            if c.http_tls_cert_file:
                tls = server_tls_context(c.http_tls_cert_file, c.http_tls_key_file,
                                         c.http_tls_client_ca_file)
            elif c.http_tls_client_ca_file:
                raise BadRequestError("autorecovery: --http-tls-client-ca-file needs "
                                      "--http-tls-cert-file and --http-tls-key-file (HTTPS)")
            check_listen("the autorecovery HTTP endpoint", c.http_host,
                         authenticated=bool(c.http_token_public_key_file
                                            or c.http_tls_client_ca_file),
                         tls=tls is not None, allow_insecure_network=c.allow_insecure_network,
                         authenticate="--http-token-public-key-file or "
                                      "--http-tls-client-ca-file",
                         encrypt="--http-tls-cert-file and --http-tls-key-file")
        self.store = open_store(self.metadata_uri, session_timeout=c.session_timeout)
        for path in (UR_LEDGERS, UR_LOCKS, AUDITOR_ELECTION):
            self.store.ensure_path(path)
        self.bk = BookKeeper(store=self.store, role="autorecovery",
                             **{"add_timeout": c.rpc_timeout,
                                                  "read_timeout": c.rpc_timeout, **c.client})
        if c.run_auditor:
            self.auditor = Auditor(self.bk, AuditorConfig(
                lost_bookie_recovery_delay=c.lost_bookie_recovery_delay,
                audit_interval=c.audit_interval,
                periodic_check_interval=c.periodic_check_interval,
                entries_check_rate=c.entries_check_rate,
                bookie_check_interval=c.bookie_check_interval,
                placement_check_interval=c.placement_check_interval), self.identifier)
            self.election = LeaderElection(self.store, self.identifier, self.auditor.run)
            self.election.start()
        if c.run_worker:
            self.worker = ReplicationWorker(self.bk, WorkerConfig(
                threads=c.worker_threads, open_ledger_grace=c.open_ledger_grace,
                retry_backoff=c.retry_backoff, rate_mb_per_s=c.replication_rate_mb_per_s,
                rate_entries_per_s=c.replication_rate_entries_per_s), self.identifier)
            self.worker.start()
        if c.http_port >= 0:
            # no key given: a local cluster's own (its tokens); else the endpoint is open to
            # reads only (bkspark.auth.guard: no admin where no one is authenticated)
            key = c.http_token_public_key_file or local_token_public_key(self.store)
            self.http = AutoRecoveryHttp(self, c.http_host, c.http_port,
                                         Guard.from_settings(key, c.http_tls_client_ca_file),
                                         tls).start()
            self._publish_endpoint()
            self.store.on_session_lost(self._publish_endpoint)
        if c.retention_interval > 0:
            from .retention import RetentionService
            self.retention = RetentionService(self.bk, self.identifier, c.retention_interval).start()
        log.info("autorecovery started id=%s metadata=%s auditor=%s worker=%s "
                 "(copy rate limit: %s) http=%s", self.identifier, self.metadata_uri,
                 c.run_auditor, c.run_worker,
                 self.worker.throttle.describe() if self.worker else "-",
                 self.http.port if self.http else None)
        return self

    def _publish_endpoint(self, *_args) -> None:
        """Announce where this process's HTTP endpoint answers; a failure is logged (the
        endpoint serves on: only the dashboard's discovery misses it)."""
        host = self.config.http_host
        if host in ("", "0.0.0.0", "::"):
            host = socket.getfqdn()
        try:
            UnderReplicationManager(self.store, self.identifier).publish_endpoint(
                self.identifier, {"host": host, "http_port": self.http.port,
                                  "scheme": self.http.scheme})
        except BKError as exc:
            log.warning("autorecovery %s: its HTTP endpoint is not published: %s",
                        self.identifier, exc)

    @property
    def is_auditor(self) -> bool:
        return bool(self.election and self.election.is_leader)

    def describe(self) -> dict:
        """What this process's autorecovery is doing (``GET /api/v1/autorecovery/process``)."""
        doc: dict = {"id": self.identifier, "isAuditor": self.is_auditor}
        w = self.worker
        if w is not None:
            s = w.stats
            doc["worker"] = {"threads": w.config.threads, "rateLimit": w.throttle.describe(),
                             "entriesCopied": s.entries, "bytesCopied": s.bytes,
                             "fragmentsCopied": s.fragments,
                             "ledgersReplicated": w.ledgers_replicated,
                             "failures": w.failures,
                             "copyRateBytesPerSecond": round(s.rate(RATE_WINDOW))}
        a = self.auditor
        if a is not None and self.is_auditor:
            now = time.monotonic()
            doc["auditor"] = {
                "lostBookies": {b: round(now - t, 1) for b, t in dict(a.first_missing).items()},
                "published": a.published, "auditsRequested": a.audits,
                "lastChecksMs": dict(a.last_checks),
                "placementViolations": a.placement_violation_count,
                "placementExamples": {str(k): v for k, v in
                                      list(dict(a.placement_violations).items())[:20]}}
        return doc

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.http is not None:
            self.http.stop()
        if self.election is not None:
            self.election.stop()
        if self.worker is not None:
            self.worker.stop()
        if self.retention is not None:
            self.retention.stop()
        if self.bk is not None:
            self.bk.close()
        if self.store is not None:
            self.store.close()
        log.info("autorecovery stopped id=%s", self.identifier)

    def run(self) -> None:
        """Start, block until SIGTERM/SIGINT, stop."""
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        self.start()
        try:
            while not stop.wait(0.5):
                pass
        finally:
            self.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
