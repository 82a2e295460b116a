"""``BookKeeper``: the client entry point (create, open, recover, delete, list ledgers)."""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

from bkspark import errors
from bkspark.auth.credentials import Credentials
from bkspark.client_settings import ClientConfig, client_config_from
from bkspark.errors import BadRequestError, NotEnoughBookiesError, UnauthorizedError
from metadata import ledgers as _ledgers
from metadata import open_store
from metadata import registry as _registry
from metadata.ledger_metadata import LedgerMetadata, LedgerState

from . import placement, quorum
from .bookie_client import BookieClientPool
from .context import BookieHealth, ClientContext, Scheduler
from .digest import normalize_digest_type
from .ledger_handle import LedgerHandle
from .read_handle import ReadHandle
from .recovery import LedgerRecovery

log = logging.getLogger("bkspark.client")

#: how a client is given the CA file of TLS bookies, in each of its front ends
TLS_HOWTO = ("set tls_ca_file (Spark: option client.tlsCaFile; bkspark shell and bkspark "
             "autorecovery: --tls-ca-file)")


class BookKeeper:
    """A BookKeeper client.

    ``BookKeeper("sqlite:///tmp/meta.db")`` or ``BookKeeper("zk://host:2181/ledgers")``, or
    ``BookKeeper(store=existing_store)`` (the store is then not closed by :meth:`close`).
    ``BookKeeper()`` uses ``$BKSPARK_METADATA_URI``, else the running local cluster
    (:func:`bkspark.cluster_registry.default_metadata_uri`). Keyword arguments override :class:`ClientConfig` fields. Thread-safe; use as a context
    manager.
    """

    def __init__(self, metadata_uri: str | None = None, *, store=None, role: str = "client",
                 **config):
        if metadata_uri is not None and store is not None:
            raise BadRequestError("BookKeeper takes a metadata_uri or a store, not both")
        if store is None:
            from bkspark.cluster_registry import (
                NO_METADATA_SERVICE,
                default_metadata_uri,
            )
            metadata_uri = default_metadata_uri(metadata_uri)
            if metadata_uri is None:
                raise BadRequestError(NO_METADATA_SERVICE)
        self.conf = client_config_from(config, what="BookKeeper option")
        self._own_store = store is None
        self.store = store if store is not None else open_store(metadata_uri)
        try:
            #: what this client presents to bookies (gRPC, data port, HTTP): bkspark.auth
            self.credentials = credentials = self._credentials(role)
        except BaseException:
            if self._own_store:
                self.store.close()
            raise
        self._health = BookieHealth(self.conf.suspect_seconds)
        self._pool = BookieClientPool(self._resolve_address, self._health.suspect,
                                      credentials,
                                      linger=self.conf.add_linger,
                                      max_linger=self.conf.add_max_linger,
                                      note_for=self._transport_note,
                                      max_backlog=2 * self.conf.max_bookie_backlog_bytes,
                                      backlog_wait=self.conf.add_timeout)
        self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="bk-client")
        self._scheduler = Scheduler()
        self._writers: weakref.WeakSet = weakref.WeakSet()
        self._bookie_cache = (0.0, {})
        self._mismatch_logged: set = set()
        self._closed = False
        self._backlogged: dict[str, float] = {}
        self._probing: set[str] = set()
        #: what this client's handles, their recovery and the replicator share
        self.ctx = ClientContext(self.conf, self.store, self._pool, self._health,
                                 self._scheduler, self._executor, self._writable_bookies,
                                 self._writers.add, self._writers.discard)
        self._ticker_stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_loop, daemon=True, name="bk-ticker")
        self._ticker.start()

    def _credentials(self, role: str) -> Credentials:
        """What this client presents to bookies: its configured credentials; with none, the
        local cluster's for ``role`` (``client``, ``autorecovery``, ``admin``), found through
        the cluster's records (:func:`bkspark.cluster_registry.local_credentials`)."""
        conf = self.conf
        if not (conf.auth_token or conf.auth_token_file or conf.tls_cert_file):
            from bkspark.cluster_registry import local_credentials
            found = local_credentials(self.store, role)
            if found:
                self.conf = conf = dataclasses.replace(
                    conf, **{k: v for k, v in found.items() if not getattr(conf, k)})
        return Credentials.from_config(conf)

    # ---- bookies -------------------------------------------------------------------------
    def _listed_bookies(self, fresh: bool = True) -> dict:
        """The registered writable bookies, ``{id: registration}`` (reused for
        ``bookie_cache_seconds`` unless ``fresh``)."""
        ts, cached = self._bookie_cache
        if fresh or time.monotonic() - ts > self.conf.bookie_cache_seconds:
            cached = _registry.list_bookies(self.store)
            self._bookie_cache = (time.monotonic(), cached)
        return cached

    def _writable_bookies(self, fresh: bool = True) -> dict:
        """The writable bookies this client can talk to (see :meth:`_transport_mismatch`);
        :class:`BadRequestError` naming TLS if there are some but none it can talk to."""
        bookies = self._listed_bookies(fresh)
        why = {b: w for b, info in bookies.items() if (w := self._transport_mismatch(info))}
        if not why:
            return bookies
        if len(why) == len(bookies):
            first = min(why)
            raise BadRequestError(f"this client can use none of the {len(why)} writable bookies: "
                                  f"bookie {first}: {why[first]}")
        if set(why) != self._mismatch_logged:
            self._mismatch_logged = set(why)
            log.warning("bookies %s are left out of new ensembles: %s", sorted(why),
                        next(iter(why.values())))
        return {b: info for b, info in bookies.items() if b not in why}

    def _readonly_note(self) -> str:
        """What to add to "not enough writable bookies": the bookies registered read-only,
        and why a bookie is (nothing if there are none, or if the registry cannot say)."""
        try:
            readonly = sorted(_registry.list_bookies(self.store, readonly=True))
        except errors.BKError:
            return ""
        if not readonly:
            return ""
        return (f"; {len(readonly)} more registered read-only: {readonly} (a bookie goes "
                "read-only when a disk is full -- over disk_usage_threshold -- or failing, or "
                "by an operator; GET /api/v1/bookie/state on its admin port says why)")

    def _transport_mismatch(self, registration) -> str:
        """Why this client cannot talk to a bookie registered with ``registration``: it
        serves TLS and the client has no ``tls_ca_file``, or the reverse ("" if it can, or if
        the registration does not say)."""
        tls = registration.get("tls") if isinstance(registration, dict) else None
        if tls is None or bool(tls) == bool(self.conf.tls_ca_file):
            return ""
        if tls:
            return ("it accepts TLS connections only and this client has no tls_ca_file: "
                    + TLS_HOWTO)
        return ("it does not serve TLS and this client, given tls_ca_file "
                f"{self.conf.tls_ca_file}, connects with TLS only")

    def _transport_note(self, bookie_id: str) -> str:
        """:meth:`_transport_mismatch` of ``bookie_id``, read when its connection is made and
        added to its transport errors; "" when its registration cannot be read."""
        try:
            info = self._listed_bookies(fresh=False).get(bookie_id)
            if info is None:
                info = _registry.list_bookies(self.store, readonly=True).get(bookie_id)
        except errors.BKError:
            return ""
        return self._transport_mismatch(info)

    def _resolve_address(self, bookie_id: str) -> str:
        info = self._bookie_cache[1].get(bookie_id)
        addr = info.get("address") if isinstance(info, dict) else None
        if not addr:
            try:
                addr = _registry.bookie_address(self.store, bookie_id)
            except errors.BKError:
                addr = None
        return addr or bookie_id

    # ---- writers' timeouts ------------------------------------------------------------------
    def _tick_loop(self):
        period = max(0.05, min(0.5, self.conf.add_timeout / 4))
        while not self._ticker_stop.wait(period):
            now = time.monotonic()
            for bc in self._pool.clients():     # a bookie that stopped taking adds
                self._probe_if_stalled(bc)
                if bc.backlog > self.conf.max_bookie_backlog_bytes:
                    since = self._backlogged.setdefault(bc.bookie_id, now)
                    if now - since > self.conf.add_timeout:
                        del self._backlogged[bc.bookie_id]
                        self._health.suspect(bc.bookie_id)
                        bc.break_stream(f"{bc.backlog} bytes of adds unsent for "
                                        f"{self.conf.add_timeout}s", backlogged=True)
                else:
                    self._backlogged.pop(bc.bookie_id, None)
            for lh in list(self._writers):
                try:
                    lh._tick(now)
                except Exception:  # noqa: BLE001
                    log.exception("add timeout check failed")

    def _probe_if_stalled(self, bc) -> None:
        """An add stream owing answers for ``stall_probe_after`` whose connection is stuck in
        TCP back-off while its bookie answers a new connection (a partition that healed: lost
        packets are retried seconds apart) is broken, so its adds go out again (to a
        replacement, by the usual failure handling) instead of waiting for the back-off or
        the add timeout. A bookie still cut off, or hung, is left to the add timeout. One
        probe per bookie at a time, on the client's executor."""
        after = self.conf.stall_probe_after
        if not after or bc.stalled_for() < after or bc.bookie_id in self._probing:
            return
        self._probing.add(bc.bookie_id)

        def probe():
            try:
                stalled = bc.stalled_for()
                if stalled >= after and bc.stuck_in_backoff(min(1.0, after / 2)) \
                        and bc.stalled_for() >= stalled:
                    bc.break_stream(f"no answer for {stalled:.1f}s while a new connection "
                                    "is answered (this one is stuck in TCP back-off)")
            finally:
                self._probing.discard(bc.bookie_id)

        try:
            self._executor.submit(probe)
        except RuntimeError:        # shutting down
            self._probing.discard(bc.bookie_id)

    # ---- ledgers -----------------------------------------------------------------------------
    def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                      digest: str = "crc32c", password: bytes = b"",
                      custom_metadata: dict | None = None) -> LedgerHandle:
        """Create an OPEN ledger on ``ensemble_size`` writable bookies; return its write
        handle. :raises BadRequestError: unless E >= Qw >= Qa >= 1.
        :raises NotEnoughBookiesError: fewer than E writable bookies."""
        quorum.validate_quorums(ensemble_size, write_quorum, ack_quorum)
        digest = normalize_digest_type(digest)
        password = _as_bytes(password, "password")
        custom = {}
        for k, v in (custom_metadata or {}).items():
            custom[str(k)] = v.encode() if isinstance(v, str) else _as_bytes(v, f"custom {k}")
        self._check_open()
        try:
            ensemble = placement.choose_ensemble(self._writable_bookies(), ensemble_size)
        except NotEnoughBookiesError as exc:
            raise NotEnoughBookiesError(f"{exc}{self._readonly_note()}") from None
        md = LedgerMetadata.new(ensemble, write_quorum, ack_quorum, password=password,
                                digest_type=digest, custom_metadata=custom)
        md = _ledgers.create_ledger(self.store, md)
        log.info("created ledger %d on %s (E=%d Qw=%d Qa=%d)", md.ledger_id, ensemble,
                 ensemble_size, write_quorum, ack_quorum)
        return LedgerHandle(self.ctx, md, _ledgers.CREATED_VERSION, md.keys.derive(password))

    def create_ledger_async(self, *args, **kwargs) -> Future:
        return self._executor.submit(self.create_ledger, *args, **kwargs)

    def open_ledger(self, ledger_id: int, password: bytes = b"",
                    recovery: bool = True, read_lac: bool = True) -> ReadHandle:
        """Open a ledger for reading.

        ``recovery=True`` (default) fences and recovers an OPEN ledger and closes it (see
        :mod:`bkspark.client.recovery`); the handle then sees the final end. ``recovery=False``
        neither fences nor closes: for tailing a ledger still being written. Its LAC is read
        from the bookies of the last ensemble (any answer will do, the highest counts); when
        none answers the open fails -- a handle never pretends the LAC is -1 (a caller would
        take that for "nothing written" and skip acknowledged entries). ``read_lac=False``
        (with ``recovery=False``) skips that read: for a reader of a range it knows to be
        confirmed already (planned from an earlier LAC read), read with ``read_unconfirmed``.

        :raises NoSuchLedgerError: no such ledger. :raises UnauthorizedError: wrong password.
        :raises BookieUnavailableError: ``recovery=False`` on a ledger not CLOSED and no
            bookie of its last ensemble answered the LAC read (the message names them).
        :raises LedgerRecoveryError: recovery could not decide the end, or a write-back found
            no bookie to replace a failed one (the ledger stays IN_RECOVERY; retry later).
        """
        self._check_open()
        password = _as_bytes(password, "password")
        md, version = self.ctx.read_metadata(ledger_id)
        keys = md.keys.derive(password)
        if keys is None:
            raise UnauthorizedError(
                f"wrong password for ledger {ledger_id}: the password does not match the one "
                "the ledger was created with")
        return self._open(md, version, keys, recovery, read_lac)

    def open_ledgers(self, ledger_ids, password: bytes = b"") -> list[ReadHandle | None]:
        """Open many ledgers for reading ranges already known to be confirmed (planned from
        an earlier LAC read): as ``open_ledger(id, password, recovery=False,
        read_lac=False)`` each, their metadata read in one pipelined round. One handle per
        id, None for a ledger that is gone (deleted since the caller planned).

        :raises UnauthorizedError: wrong password for one of them (named).
        """
        self._check_open()
        password = _as_bytes(password, "password")
        out: list[ReadHandle | None] = []
        for lid, found in zip(ledger_ids, _ledgers.read_ledgers(self.store, ledger_ids)):
            if found is None:
                out.append(None)
                continue
            md, version = found
            keys = md.keys.derive(password)
            if keys is None:
                raise UnauthorizedError(
                    f"wrong password for ledger {lid}: the password does not match the one "
                    "the ledger was created with")
            out.append(ReadHandle(self.ctx, md, version, keys))
        return out

    def open_ledger_without_password(self, ledger_id: int, recovery: bool = True,
                                     read_lac: bool = True) -> ReadHandle:
        """:meth:`open_ledger` with the keys the ledger's metadata stores instead of its
        password (:mod:`metadata.ledger_keys`): for autorecovery and an admin's tools, whose
        credentials the bookies check. Entries are verified as with the password."""
        self._check_open()
        md, version = self.ctx.read_metadata(ledger_id)
        return self._open(md, version, md.keys.stored_keys(), recovery, read_lac)

    def _open(self, md, version: int, keys, recovery: bool, read_lac: bool) -> ReadHandle:
        if recovery and md.state is not LedgerState.CLOSED:
            md, version = LedgerRecovery(self.ctx, md.ledger_id, keys).run(md, version)
            return ReadHandle(self.ctx, md, version, keys)
        rh = ReadHandle(self.ctx, md, version, keys)
        if md.state is not LedgerState.CLOSED and read_lac:
            rh.try_read_last_add_confirmed()
        return rh

    def open_ledger_async(self, ledger_id: int, password: bytes = b"",
                          recovery: bool = True) -> Future:
        return self._executor.submit(self.open_ledger, ledger_id, password, recovery)

    def recover_ledger(self, ledger_id: int, password: bytes = b"") -> ReadHandle:
        """Alias of ``open_ledger(ledger_id, password, recovery=True)``."""
        return self.open_ledger(ledger_id, password, recovery=True)

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger's metadata (bookies garbage-collect its entries)."""
        self._check_open()
        _ledgers.delete_ledger(self.store, ledger_id)

    def delete_ledgers(self, ledger_ids) -> None:
        """Delete many ledgers' metadata, in batches of one metadata transaction each
        (bookies garbage-collect the entries); those already gone are skipped."""
        self._check_open()
        _ledgers.delete_ledgers(self.store, ledger_ids)

    def list_ledgers(self) -> list[int]:
        return sorted(_ledgers.list_ledgers(self.store))

    def ledger_metadata(self, ledger_id: int):
        return self.ctx.read_metadata(ledger_id)[0]

    def enable_metrics(self, registry=None):
        """Keep Prometheus metrics of this client (:mod:`bkspark.client.metrics`: adds and
        their latency, reads, ensemble changes, recoveries) in ``registry`` (a
        ``prometheus_client.CollectorRegistry``; default a new one), which is returned: serve
        it with ``prometheus_client.start_http_server(port, registry=...)`` or the
        application's own endpoint. Idempotent: a second call returns the first registry."""
        from .metrics import ClientMetrics
        if self.ctx.metrics is None:
            self.ctx.metrics = ClientMetrics(registry)
        return self.ctx.metrics.registry

    def trace_adds(self, every: int = 16, capacity: int = 200_000):
        """Stamp one entry in ``every`` of the adds of this client at each stage of its way
        (:mod:`bkspark.client.add_trace`), until :meth:`stop_tracing_adds`; returns the
        :class:`~bkspark.client.add_trace.AddTracer` whose ``done`` holds the finished
        traces (at most ``capacity``, the newest) and ``gc_pauses`` the collector's passes."""
        from .add_trace import AddTracer
        self.stop_tracing_adds()
        tracer = AddTracer(every, capacity)
        self.ctx.add_trace = tracer
        self.ctx.pool.set_trace(tracer)
        return tracer

    def stop_tracing_adds(self) -> None:
        """No more stamps (the tracer's traces stay readable)."""
        tracer, self.ctx.add_trace = self.ctx.add_trace, None
        self.ctx.pool.set_trace(None)
        if tracer is not None:
            tracer.close()

    # ---- lifecycle -------------------------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise errors.BKError("BookKeeper client is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lh in list(self._writers):      # nobody will ever ack their pending adds
            lh._abort(errors.BKError("the BookKeeper client was closed"))
        self._ticker_stop.set()
        self.stop_tracing_adds()
        self._scheduler.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._pool.close()
        if self._own_store:
            self.store.close()

    def __enter__(self) -> "BookKeeper":
        return self

    def __exit__(self, *exc):
        self.close()


def _as_bytes(v, what: str) -> bytes:
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise BadRequestError(f"{what} must be bytes, got {type(v).__name__}")
