"""A bookie process: storage engine + gRPC service + registration + housekeeping.

Lifecycle: open storage (journal replay) -> validate cookies -> serve gRPC -> register
``/available/<bookie-id>`` (or ``/available/readonly/<bookie-id>``) as an ephemeral record
-> background threads for disk usage (read-only switch), garbage collection and the admin
HTTP endpoint. SIGTERM stops gracefully: stop accepting, let in-flight adds finish their
journal sync, checkpoint, unregister. ``kill -9`` loses nothing acknowledged (journal).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
import weakref

import grpc

from bkspark import errors, private
from bkspark.auth import roles
from bkspark.auth.certs import server_tls_context
from bkspark.auth.guard import Guard
from bkspark.bookie import cookie as cookies
from bkspark.bookie import mounts
from bkspark.bookie import threads
from bkspark.bookie.config import BookieConfig
from bkspark.bookie.data_port import DataPortServer
from bkspark.bookie.http_admin import AdminHttpServer
from bkspark.bookie.metrics import BookieMetrics
from bkspark.bookie.service import BookieService, add_to_server
from bkspark.bookie.storage import Storage, StorageConfig
from bkspark.heap import freeze_startup_heap
from metadata import ledgers as ledger_store
from metadata import open_store, registry

log = logging.getLogger("bkspark.bookie")


class BookieState:
    """Mode of the bookie as seen by the service and the admin endpoint."""

    def __init__(self, config: BookieConfig) -> None:
        self.bookie_id = config.bookie_id
        self._dirs = list(config.journal_dirs or [config.journal_dir]) + list(config.ledger_dirs)
        self.manual_read_only = False
        self.disk_read_only = False
        self.disk_errors: list = []     # the storage's failed directories (Storage.disk_errors)
        self.running = False
        self.registered_as: str | None = None

    @property
    def read_only(self) -> bool:
        return self.manual_read_only or self.disk_read_only or bool(self.disk_errors)

    def disk_space(self) -> tuple[int, int]:
        """(total, free) bytes over the distinct filesystems of the bookie's directories."""
        seen, total, free = set(), 0, 0
        for directory in self._dirs:
            st = os.statvfs(directory)
            if st.f_fsid in seen:
                continue
            seen.add(st.f_fsid)
            total += st.f_blocks * st.f_frsize
            free += st.f_bavail * st.f_frsize
        return total, free

    def disk_usage(self) -> float:
        total, free = self.disk_space()
        return 1.0 - free / total if total else 0.0


PROBE_BYTES = 4 << 20


def _probe_writable(directory: str) -> str | None:
    """Why ``directory`` cannot take a write now (a file of :data:`PROBE_BYTES` written, synced
    and removed), or None. A full directory's storage is reopened only after this succeeds:
    a thin-provisioned device can be out of space while its file system shows room."""
    path = os.path.join(directory, ".bkspark-space-probe")
    try:
        fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        try:
            block = b"\0" * (1 << 20)
            for i in range(PROBE_BYTES // len(block)):
                os.pwrite(fd, block, i * len(block))
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(path)
    except OSError as exc:
        return f"{directory}: {exc.strerror}"
    return None


def storage_config(config: BookieConfig) -> StorageConfig:
    return StorageConfig(
        journal_dir=config.journal_dir, journal_dirs=list(config.journal_dirs), ledger_dirs=list(config.ledger_dirs),
        write_cache_bytes=config.write_cache_mb << 20,
        journal_max_group_wait_ms=config.journal_max_group_wait_ms,
        journal_buffered_writes_threshold=config.journal_buffered_writes_threshold_kb << 10,
        journal_max_size_mb=config.journal_max_size_mb, journal_max_backups=config.journal_max_backups,
        journal_sync=config.journal_sync, entry_log_max_size=config.entry_log_max_size_mb << 20,
        compaction_threshold=config.compaction_threshold,
        compaction_rate_bytes_per_s=int(config.compaction_rate_mb_per_s * (1 << 20)),
        checkpoint_interval_s=config.checkpoint_interval_s,
        entry_log_page_cache=config.entry_log_page_cache,
        index_cache_bytes=config.index_cache_mb << 20, ledger_cache_entries=config.ledger_cache_entries,
        index_memtable_bytes=config.index_memtable_mb << 20)


class BookieServer:
    """Runs one bookie until :meth:`stop` (or SIGTERM/SIGINT via :meth:`run`)."""

    def __init__(self, config: BookieConfig) -> None:
        self.config = config.finalize()
        self.state = BookieState(self.config)
        self.store = None
        self.storage = None
        self.service = None
        self.grpc_server = None
        self.data_server = None
        self.http = None
        self.metrics = None
        self.autorecovery = None
        self._stop_requested = threading.Event()
        self._stop = threading.Event()
        self._register_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._usage_warned = False
        self._reopen_delay = 0.0        # a full directory's storage reopen: its backoff
        self._reopen_at = 0.0
        self._reopen_failed = False     # ... left the storage closed (retried)

    # ---- start / stop -----------------------------------------------------------------

    def start(self) -> None:
        cfg = self.config
        for directory in [*(cfg.journal_dirs or [cfg.journal_dir]), *cfg.ledger_dirs]:
            private.make_dir(directory)
        for directory, mount in mounts.online_discard_dirs(
                [*(cfg.journal_dirs or [cfg.journal_dir]), *cfg.ledger_dirs]):
            log.warning("%s", mounts.discard_warning(directory, mount))
        self.store = open_store(cfg.metadata_uri, session_timeout=cfg.metadata_session_timeout_s,
                                create=True)    # the first bookie of a cluster creates its store
        registry.ensure_layout(self.store)
        cookies.validate_or_create(self.store, cfg)
        self.storage = Storage(storage_config(cfg))
        self.service = BookieService(self.storage, cfg, self.state)
        if cfg.check_new_ledgers:
            self.service.ledger_master_key = self._ledger_master_key
        self.metrics = BookieMetrics(
            self.storage, weakref.ref(self.service),
            [("journal", d) for d in (cfg.journal_dirs or [cfg.journal_dir])]
            + [("ledger", d) for d in cfg.ledger_dirs],
            disk_errors=lambda: self.state.disk_errors)
        self.service.metrics = self.metrics
        self.guard = Guard.from_settings(cfg.auth_token_public_key_file, cfg.tls_client_ca_file)
        self.metrics.watch_guard(self.guard)
        if not self.guard.enabled:
            log.warning("authentication is off: any process that reaches %s may read and write "
                        "every ledger (docs/security.md)", cfg.listen_address)
        self.grpc_server = grpc.server(
            _thread_pool(cfg.grpc_workers),
            maximum_concurrent_rpcs=cfg.grpc_max_concurrent_rpcs,
            interceptors=[self.guard.grpc_interceptor(roles.GRPC_METHODS)],
            options=[("grpc.max_receive_message_length", cfg.max_message_bytes),
                     ("grpc.max_send_message_length", cfg.max_message_bytes),
                     ("grpc.so_reuseport", 0)])
        add_to_server(self.service, self.grpc_server)
        address = f"{cfg.listen_address}:{cfg.port}"
        data_tls = http_tls = None
        if cfg.tls_cert_file:
            client_ca = None
            with open(cfg.tls_key_file, "rb") as k, open(cfg.tls_cert_file, "rb") as c:
                key, cert = k.read(), c.read()
            if cfg.tls_client_ca_file:
                with open(cfg.tls_client_ca_file, "rb") as f:
                    client_ca = f.read()
            creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                                require_client_auth=client_ca is not None)
            bound = self.grpc_server.add_secure_port(address, creds)
            data_tls = server_tls_context(cfg.tls_cert_file, cfg.tls_key_file,
                                          cfg.tls_client_ca_file,
                                          require_client_certificate=True)
            http_tls = server_tls_context(cfg.tls_cert_file, cfg.tls_key_file,   # or tokens
                                          cfg.tls_client_ca_file)
        else:
            bound = self.grpc_server.add_insecure_port(address)
        if not bound:
            raise errors.BKError(f"cannot listen on {address}")
        if cfg.data_port >= 0:
            try:
                self.data_server = DataPortServer(
                    self.service, cfg.listen_address, cfg.data_port,
                    max_frame_bytes=cfg.max_message_bytes, guard=self.guard,
                    ssl_context=data_tls, send_timeout=cfg.data_port_send_timeout_s).start()
            except OSError as exc:
                raise errors.BKError(f"cannot listen on data port {cfg.listen_address}:"
                                     f"{cfg.data_port}: {exc}") from None
            self.service.data_port = self.data_server.port
        self.grpc_server.start()
        if cfg.http_port >= 0:
            self.http = AdminHttpServer(self, cfg.listen_address, cfg.http_port, self.guard,
                                        http_tls)
            self.http.start()
        self.state.running = True
        self._update_disk_state()
        self._register()
        self.store.on_session_lost(self._on_session_lost)
        self._spawn(self._disk_loop, "bookie-disk-monitor")
        self._spawn(self._gc_loop, "bookie-gc")
        if cfg.autorecovery:        # auditor + replication worker in this process
            from bkspark.recovery.service import AutoRecovery, AutoRecoveryConfig
            self.autorecovery = AutoRecovery(
                cfg.metadata_uri, AutoRecoveryConfig(
                    session_timeout=cfg.metadata_session_timeout_s,
                    replication_rate_mb_per_s=cfg.autorecovery_rate_mb_per_s,
                    client=cfg.client_settings()),
                identifier=f"{cfg.bookie_id}:{os.getpid()}").start()
        log.info("bookie started id=%s address=%s data_port=%s http=%s journal=%s ledgers=%s",
                 cfg.bookie_id, address, self.service.data_port or None,
                 self.http.port if self.http else None,
                 ",".join(cfg.journal_dirs or [cfg.journal_dir]), ",".join(cfg.ledger_dirs))

    def _spawn(self, target, name: str) -> None:
        thread = threads.thread(target, name)
        thread.start()
        self._threads.append(thread)

    def stop(self, grace: float = 5.0) -> None:
        """Graceful shutdown: unregister, stop accepting, finish in-flight adds, checkpoint."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.state.running = False
        log.info("bookie stopping id=%s", self.config.bookie_id)
        if self.autorecovery is not None:
            self.autorecovery.stop()
        self._unregister()
        if self.data_server is not None:
            self.data_server.stop()
        if self.grpc_server is not None:
            self.grpc_server.stop(grace).wait()
        if self.service is not None:
            self.service.stop()
        if self.http is not None:
            self.http.stop()
        if self.storage is not None:
            self.storage.close()
        if self.store is not None:
            self.store.close()
        log.info("bookie stopped id=%s", self.config.bookie_id)

    def run(self) -> None:
        """Start, then block until SIGTERM/SIGINT, then stop gracefully."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop_requested.set())
        self.start()
        freeze_startup_heap()       # no 10-ms full collections of the start-up heap under load
        try:
            while not self._stop_requested.wait(0.5):
                pass
        finally:
            self.stop()

    # ---- registration and read-only mode ----------------------------------------------

    def _register(self) -> None:
        """(Re-)register under available/ or available/readonly/ according to the mode."""
        with self._register_lock:
            if self._stop.is_set():
                return
            want = "readonly" if self.state.read_only else "available"
            if self.state.registered_as == want:
                return
            info = {"address": f"{self.config.advertised_address}:{self.config.port}",
                    "rack": self.config.rack, "http_port": self.http.port if self.http else -1,
                    "pid": os.getpid(),
                    "tls": bool(self.config.tls_cert_file),
                    "auth": ("certificate" if self.config.tls_client_ca_file else
                             "token" if self.config.auth_token_public_key_file else "none")}  # clients tell TLS from plaintext
            deadline = time.monotonic() + 3 * self.config.metadata_session_timeout_s + 10
            while True:
                try:
                    registry.register_bookie(self.store, self.config.bookie_id, info,
                                             readonly=self.state.read_only)
                    break
                except errors.NodeExistsError:
                    # a previous incarnation's ephemeral record: wait for its session to expire
                    if time.monotonic() > deadline:
                        raise errors.BKError(
                            f"bookie {self.config.bookie_id} is still registered by another "
                            "process; is it already running?") from None
                    time.sleep(0.2)
            if self.state.registered_as is not None:
                try:
                    registry.unregister_bookie(self.store, self.config.bookie_id,
                                               readonly=self.state.registered_as == "readonly")
                except errors.NoNodeError:
                    pass
            self.state.registered_as = want
            log.info("bookie registered id=%s mode=%s", self.config.bookie_id, want)

    def _unregister(self) -> None:
        with self._register_lock:
            if self.state.registered_as is None:
                return
            try:
                registry.unregister_bookie(self.store, self.config.bookie_id,
                                           readonly=self.state.registered_as == "readonly")
            except errors.BKError:
                pass
            self.state.registered_as = None

    def _ledger_master_key(self, ledger_id: int) -> bytes | None:
        """The master key the metadata holds for ``ledger_id`` (read after a sync, so a
        ledger created just before is seen), or None if it lists no such ledger.
        :raises BKError: the store cannot answer, or the record is corrupt."""
        try:
            md, _ = ledger_store.read_ledger(self.store, ledger_id, settle=True)
        except errors.NoSuchLedgerError:
            return None
        return md.keys.master_key

    def _on_session_lost(self, *_args) -> None:
        log.warning("metadata session lost; re-registering id=%s", self.config.bookie_id)
        with self._register_lock:
            self.state.registered_as = None
        threads.thread(self._register_quietly, "bookie-register").start()

    def _register_quietly(self) -> None:
        try:
            self._register()
        except errors.BKError as exc:
            log.error("re-registration failed: %s", exc)

    def set_manual_read_only(self, value: bool) -> None:
        self.state.manual_read_only = value
        self._register()

    def _update_disk_state(self) -> None:
        usage = self.state.disk_usage()
        self._update_disk_errors(usage)
        if usage >= self.config.disk_usage_warn_threshold and not self._usage_warned:
            log.warning("disk usage %.3f above the warning threshold %.3f (read-only at %.3f)",
                        usage, self.config.disk_usage_warn_threshold,
                        self.config.disk_usage_threshold)
        self._usage_warned = usage >= self.config.disk_usage_warn_threshold
        if not self.state.disk_read_only and usage >= self.config.disk_usage_threshold:
            log.warning("disk usage %.3f above threshold %.3f: going read-only",
                        usage, self.config.disk_usage_threshold)
            self.state.disk_read_only = True
        elif self.state.disk_read_only and usage < self.config.disk_usage_lwm:
            log.info("disk usage %.3f below %.3f: writable again", usage, self.config.disk_usage_lwm)
            self.state.disk_read_only = False
        if self.metrics is not None:
            self.metrics.read_only.set(1 if self.state.read_only else 0)

    def _update_disk_errors(self, usage: float) -> None:
        """Read-only while a directory's writes have failed (the engine's sticky errors,
        ``bookie_native/README.md`` "Disk errors"). A full one (ENOSPC) is made writable again
        once usage is below ``disk_usage_lwm``: the storage is reopened, which replays the
        journal into fresh entry logs (what the failed writes lost is written again). A failed
        one (EIO...) stays until the bookie is restarted by its operator, after the disk is
        replaced or checked; clients meanwhile write to other bookies (ensemble change). The
        bookie stays read-only until the reopened storage's first checkpoint succeeds; a
        reopen whose writes fail again (a thin-provisioned device still out of space while the
        file system shows room) is retried after a delay that doubles, up to 64 checks."""
        # (a reopen that failed left the storage closed: its errors are the ones last seen)
        found = self.state.disk_errors if self._reopen_failed else self.storage.disk_errors()
        if found and found != self.state.disk_errors:
            for e in found:
                log.error("%s directory %s: a write failed (%s): %s", e.kind, e.path,
                          e.message, "full: read-only until space is freed" if e.full else
                          "read-only until the bookie is restarted (check or replace the disk)")
        self.state.disk_errors = found
        if not found:
            self._reopen_delay = 0.0
            return
        if (not all(e.full for e in found) or usage >= self.config.disk_usage_lwm
                or time.monotonic() < self._reopen_at):
            return
        interval = self.config.disk_check_interval_s
        self._reopen_delay = min(64 * interval, max(2 * interval, 2 * self._reopen_delay))
        self._reopen_at = time.monotonic() + self._reopen_delay
        refused = [why for e in found if (why := _probe_writable(e.path))]
        if refused:                     # (closing the storage now would only stop its reads)
            log.info("not reopening the storage yet (retried in %.1f s): %s",
                     self._reopen_delay, "; ".join(refused))
            return
        if self._stop.is_set():
            return
        log.info("disk usage %.3f below %.3f: reopening the storage (journal replay) to become "
                 "writable again", usage, self.config.disk_usage_lwm)
        checkpointed = False
        try:
            self._reopen_failed = True
            self.storage.reopen()
            self._reopen_failed = False
            self.storage.checkpoint()   # writable only once what the replay wrote is durable
            checkpointed = True
        except errors.BKError as exc:
            log.error("reopening the storage failed (retried in %.1f s): %s",
                      self._reopen_delay, exc)
        if self._reopen_failed:
            return
        self.state.disk_errors = self.storage.disk_errors() or ([] if checkpointed else found)
        if not self.state.disk_errors:
            log.info("storage reopened; the directories take writes again")

    def _disk_loop(self) -> None:
        while not self._stop.wait(self.config.disk_check_interval_s):
            try:
                self._update_disk_state()
                self._register()
            except Exception as exc:  # noqa: BLE001 - keep monitoring
                log.error("disk monitor: %s", exc)

    # ---- garbage collection --------------------------------------------------------

    def garbage_collect(self) -> list[int]:
        """Delete local ledgers whose metadata no longer exists; never one that does.

        The candidates are the local ledgers the metadata store does not list (one listing
        per directory of its hierarchy: a pass costs the same few requests whatever the
        number of ledgers held); each is deleted only on an explicit NoSuchLedger answer to
        a read of its own record; any metadata error skips it (an unreachable store must not
        look like a deleted ledger) or, for the listing, the whole pass.
        """
        deleted = []
        try:
            candidates = ledger_store.unlisted_ledgers(self.store, self.storage.ledgers())
        except errors.BKError as exc:
            log.warning("gc: cannot list the ledgers of the metadata store: %s", exc)
            candidates = []
        for ledger_id in candidates:
            try:
                ledger_store.read_ledger(self.store, ledger_id)
            except errors.NoSuchLedgerError:
                self.storage.delete_ledger(ledger_id)
                self.service.lac.forget(ledger_id)
                deleted.append(ledger_id)
            except errors.BKError as exc:
                log.warning("gc: skipping ledger %d: %s", ledger_id, exc)
        if deleted:
            log.info("gc deleted ledgers %s", deleted)
        self.storage.compact()
        return deleted

    def _gc_loop(self) -> None:
        while not self._stop.wait(self.config.gc_interval_s):
            try:
                self.garbage_collect()
            except Exception as exc:  # noqa: BLE001 - keep collecting
                if not self._stop.is_set():     # stopping aborts a compaction pass: not an error
                    log.error("gc failed: %s", exc)


def _thread_pool(workers: int):
    return threads.pool(workers, "bookie-grpc")
