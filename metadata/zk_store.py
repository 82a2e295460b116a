"""Metadata store on ZooKeeper through kazoo.

* The URI's root is a chroot, created (persistent, with parents) when the store opens.
* Operations map one-to-one onto ZooKeeper's; kazoo errors become bkspark's metadata errors.
  Reads are retried across a connection loss (within the session timeout); writes are not
  (a retried create/CAS could double-apply) and raise :class:`MetadataConnectionError`.
* Ids come from a compare-and-set counter in ``/idgen`` (64-bit, unlike ZooKeeper's 32-bit
  sequence numbers).
* After a session expiry kazoo opens a new session; the ``on_session_lost`` callbacks run once
  it is connected (so bookies can re-register), and watches are re-armed.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable

from kazoo import exceptions as kex
from kazoo.client import KazooClient
from kazoo.protocol.states import EventType, KazooState
from kazoo.retry import KazooRetry, RetryFailedError

from bkspark.errors import (
    BadRequestError,
    BadVersionError,
    MetadataConnectionError,
    MetadataError,
    MetadataFormatError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    UnauthorizedError,
)

from .layout import CLOCK, IDGEN
from .store import (
    MAX_TRANSACTION_BYTES,
    MetadataStore,
    Transaction,
    validate_data,
    validate_path,
    validate_version,
)
from .uri import ZkUri

log = logging.getLogger(__name__)

_ERRORS = (
    (kex.NodeExistsError, NodeExistsError),
    (kex.NoNodeError, NoNodeError),
    (kex.BadVersionError, BadVersionError),
    (kex.NotEmptyError, NotEmptyError),
    (kex.NoChildrenForEphemeralsError, BadRequestError),
    (kex.SessionExpiredError, SessionExpiredError),
    (kex.ConnectionClosedError, MetadataConnectionError),
    (kex.ConnectionLoss, MetadataConnectionError),
    (kex.OperationTimeoutError, MetadataConnectionError),
    (kex.BadArgumentsError, BadRequestError),
    (kex.NoAuthError, UnauthorizedError),
    (kex.AuthFailedError, UnauthorizedError),
)


_MESSAGES = {
    NodeExistsError: "node already exists",
    NoNodeError: "no such node",
    BadVersionError: "version conflict",
    NotEmptyError: "node has children",
    SessionExpiredError: "session expired",
    UnauthorizedError: "not authorized: ZooKeeper refused the credentials of the URI's "
                       "digest_file or sasl_file, or the record's ACL does not admit them",
}


def _map(e: Exception, what: str) -> Exception:
    for kcls, ours in _ERRORS:
        if isinstance(e, kcls):
            detail = _MESSAGES.get(ours) or type(e).__name__
            extra = str(e)
            return ours(f"{what}: {detail}" + (f" ({extra})" if extra else ""))
    return MetadataError(f"{what}: {type(e).__name__}: {e}")


def _stop_in_background(client: KazooClient) -> None:
    def stop():
        with contextlib.suppress(Exception):
            client.stop()
        with contextlib.suppress(Exception):
            client.close()
    threading.Thread(target=stop, daemon=True, name="bkspark-zk-abandon").start()


def _user_password(path: str, what: str) -> tuple[str, str]:
    """``(user, password)`` from a file holding ``user:password`` (never shown in errors)."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError as exc:
        raise MetadataError(f"cannot read ZooKeeper {what} file {path}: {exc.strerror}") \
            from None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise MetadataError(f"ZooKeeper {what} file {path} must hold user:password")
    return user, password


def zk_security(parsed: ZkUri) -> tuple[list | None, dict]:
    """``(ACL of created records, KazooClient keyword arguments)`` of the URI's settings:
    digest or SASL credentials make every record created the user's alone (ZooKeeper's
    CREATOR_ALL, as BookKeeper's ``zkEnableSecurity``), plus read for ``read_acl``."""
    from kazoo.security import ACL, Id, Permissions, make_digest_acl
    kwargs: dict = {}
    acl = None
    if parsed.setting("digest_file"):
        user, password = _user_password(parsed.setting("digest_file"), "digest")
        kwargs["auth_data"] = [("digest", f"{user}:{password}")]
        acl = [make_digest_acl(user, password, all=True)]
    elif parsed.setting("sasl_file"):
        user, password = _user_password(parsed.setting("sasl_file"), "SASL")
        kwargs["sasl_options"] = {"mechanism": "DIGEST-MD5", "username": user,
                                  "password": password}
        acl = [ACL(Permissions.ALL, Id("sasl", user))]
    if parsed.setting("read_acl"):
        scheme, sep, ident = parsed.setting("read_acl").partition(":")
        if not sep or not ident or acl is None:
            raise MetadataError("read_acl needs scheme:id and digest_file or sasl_file (a "
                                "record open to all needs no read ACL)")
        acl.append(ACL(Permissions.READ, Id(scheme, ident)))
    if parsed.setting("tls_ca_file"):
        kwargs.update(use_ssl=True, verify_certs=True, ca=parsed.setting("tls_ca_file"),
                      certfile=parsed.setting("tls_cert_file") or None,
                      keyfile=parsed.setting("tls_key_file") or None)
    return acl, kwargs


class ZkStore(MetadataStore):
    """See the module docstring. Open through :func:`metadata.open_store`."""

    max_transaction_bytes = MAX_TRANSACTION_BYTES       # (jute.maxbuffer)

    def __init__(self, parsed: ZkUri, uri: str, *, session_timeout: float = 10.0,
                 connect_timeout: float = 10.0):
        self.uri = uri
        self.parsed = parsed
        self.root = parsed.root
        self.address = parsed.hosts_string
        self.session_timeout = float(session_timeout)
        self.connect_timeout = float(connect_timeout)
        #: bound on one request's wait for an answer
        self.op_timeout = self.session_timeout
        self._closed = False
        self._lock = threading.RLock()
        self._lost_callbacks: list[Callable[[], None]] = []
        self._lost_pending = False
        self._rearm: list[Callable[[], None]] = []
        # ignore_expire=True: a request refused because the session just expired was never
        # applied, so a read is simply retried on the next session.
        self._read_retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=1.0,
                                      deadline=self.session_timeout, ignore_expire=True)
        #: the ACL of every record this store creates (None: ZooKeeper's open ACL)
        self.acl, security = zk_security(parsed)
        client = KazooClient(
            hosts=self.address, timeout=self.session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=2.0),
            command_retry=None, default_acl=self.acl, **security)
        try:
            event = client.start_async()
            event.wait(timeout=self.connect_timeout)
            connected = client.connected
        except Exception as e:
            _stop_in_background(client)
            raise MetadataConnectionError(
                f"cannot connect to ZooKeeper at {self.address} (from {uri}): {e}") from e
        if not connected:
            # kazoo's own stop() can block for a whole session timeout on a silent peer:
            # give up now and let the client wind down on a daemon thread.
            _stop_in_background(client)
            raise MetadataConnectionError(
                f"cannot reach ZooKeeper at {self.address} (from {uri}) within "
                f"{self.connect_timeout:g}s")
        try:
            if self.root != "/":
                client.ensure_path_async(self.root).get(timeout=self.connect_timeout)
                client.chroot = self.root  # from now on every path is inside the root
        except Exception as e:
            client.stop()
            client.close()
            raise _map(e, f"creating root {self.root} on ZooKeeper {self.address}") from e
        self.client = client
        client.add_listener(self._on_state)

    # ---- session -----------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        cid = self.client.client_id
        return f"{cid[0]:#x}" if cid else ""

    def _on_state(self, state):
        # Runs on kazoo's connection thread: never block or call ZooKeeper here.
        if state == KazooState.LOST:
            with self._lock:
                self._lost_pending = True
        elif state == KazooState.CONNECTED:
            with self._lock:
                fire, self._lost_pending = self._lost_pending, False
                callbacks = list(self._lost_callbacks) if fire else []
                rearm = list(self._rearm) if fire else []
            if fire and not self._closed:
                threading.Thread(target=self._after_new_session, args=(rearm, callbacks),
                                 daemon=True, name="bkspark-zk-session-lost").start()

    def _after_new_session(self, rearm, callbacks):
        for fn in rearm + callbacks:
            try:
                fn()
            except Exception:
                log.exception("after ZooKeeper session loss: %r failed", fn)

    def apply_acls(self) -> int:
        """Set :attr:`acl` on the root and every record under it (records created before
        the URI named credentials are open to anyone); returns how many records were set.
        Idempotent: run it again after a failure."""
        if self.acl is None:
            raise MetadataError("the URI names no credentials (digest_file or sasl_file): "
                                "there is no ACL to apply")
        done, todo = 0, ["/"]
        while todo:
            path = todo.pop()
            try:
                children = self.client.get_children(path)
                self.client.set_acls(path, self.acl)
            except kex.NoNodeError:
                continue                    # deleted meanwhile
            except Exception as e:  # noqa: BLE001 - kazoo's errors, mapped
                raise _map(e, f"setting the ACL of {path}") from e
            done += 1
            todo.extend(f"{path.rstrip('/')}/{c}" for c in children
                        if not (path == "/" and self.root == "/" and c == "zookeeper"))
        return done

    def on_session_lost(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._lost_callbacks.append(callback)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(Exception):
            self.client.stop()
        with contextlib.suppress(Exception):
            self.client.close()

    # ---- plumbing ----------------------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")

    def _sync(self, async_result):
        """Wait for a kazoo async result, at most ``op_timeout`` (kazoo's synchronous calls
        wait forever while the server is unreachable)."""
        try:
            return async_result.get(timeout=self.op_timeout)
        except self.client.handler.timeout_exception:
            raise kex.OperationTimeoutError(
                f"no answer from ZooKeeper {self.address} within {self.op_timeout:g}s "
                "(the outcome of a write is unknown)") from None

    def _read(self, fn, *args, what: str):
        self._check_open()
        try:
            return self._read_retry.copy()(fn, *args)
        except RetryFailedError as e:
            raise MetadataConnectionError(
                f"{what}: ZooKeeper {self.address} unreachable for {self.session_timeout:g}s") from e
        except kex.KazooException as e:
            raise _map(e, what) from e

    def _write(self, fn, *args, what: str, retry_expired: bool = True, **kwargs):
        """Run a write once. A write refused with SessionExpired was not applied (kazoo
        refuses requests between an expiry and the next session; the server rejects those
        of an expired session), so it is retried on the new session for up to a session
        timeout counted from the first refusal (a request queued while the server was away
        can be refused only as its own wait ends) — except ephemeral creates, which belong
        to the lost session. A connection loss while the request was in flight is
        ambiguous: MetadataConnectionError."""
        self._check_open()
        deadline = None
        while True:
            try:
                return fn(*args, **kwargs)
            except kex.SessionExpiredError as e:
                now = time.monotonic()
                deadline = now + self.session_timeout if deadline is None else deadline
                if not retry_expired or self._closed or now > deadline:
                    raise _map(e, what) from e
                time.sleep(0.05)
            except kex.KazooException as e:
                raise _map(e, what) from e

    # ---- operations --------------------------------------------------------------------

    def create(self, path: str, data: bytes = b"", ephemeral: bool = False,
               sequential: bool = False, makepath: bool = True) -> str:
        path, data = validate_path(path), validate_data(data)
        if path == "/" and not sequential:
            raise NodeExistsError("node already exists: /")
        return self._write(
            lambda: self._sync(self.client.create_async(
                path, data, ephemeral=bool(ephemeral), sequence=bool(sequential),
                makepath=bool(makepath))),
            what=f"create {path}", retry_expired=not ephemeral)

    def get(self, path: str) -> tuple[bytes, int]:
        path = validate_path(path)
        data, stat = self._read(lambda: self._sync(self.client.get_async(path)),
                                what=f"get {path}")
        return data, stat.version

    def get_many(self, paths: list[str], window: int = 512) -> list[tuple[bytes, int] | None]:
        """Pipelined: up to ``window`` reads in flight at once (one round trip per window)."""
        paths = [validate_path(p) for p in paths]
        out: list[tuple[bytes, int] | None] = []

        def batch(chunk):
            pending = [self.client.get_async(p) for p in chunk]
            got = []
            for p, result in zip(chunk, pending):
                try:
                    data, stat = self._sync(result)
                    got.append((data, stat.version))
                except kex.NoNodeError:
                    got.append(None)
            return got
        for i in range(0, len(paths), window):
            chunk = paths[i:i + window]
            out.extend(self._read(lambda chunk=chunk: batch(chunk), what=f"get of {len(chunk)} nodes "
                                  f"from {chunk[0]}"))
        return out

    def exists(self, path: str) -> int | None:
        path = validate_path(path)
        stat = self._read(lambda: self._sync(self.client.exists_async(path)),
                          what=f"exists {path}")
        return None if stat is None else stat.version

    def set(self, path: str, data: bytes, version: int = -1) -> int:
        path, data, version = validate_path(path), validate_data(data), validate_version(version)
        stat = self._write(lambda: self._sync(self.client.set_async(path, data, version)),
                           what=f"set {path} (expected version {version})")
        return stat.version

    def delete(self, path: str, version: int = -1) -> None:
        path, version = validate_path(path), validate_version(version)
        if path == "/":
            raise BadRequestError("the root node cannot be deleted")
        self._write(lambda: self._sync(self.client.delete_async(path, version)),
                    what=f"delete {path} (expected version {version})")

    def sync(self, path: str = "/") -> None:
        path = validate_path(path)
        self._read(lambda: self._sync(self.client.sync_async(path)), what=f"sync {path}")

    def children(self, path: str) -> list[str]:
        path = validate_path(path)
        names = self._read(lambda: self._sync(self.client.get_children_async(path)),
                           what=f"children of {path}")
        if path == "/" and self.root == "/":
            names = [n for n in names if n != "zookeeper"]  # ZooKeeper's own node
        return sorted(names)

    def transaction(self) -> Transaction:
        return Transaction(self._commit, self.max_transaction_bytes)

    def _commit(self, ops) -> list:
        """ZooKeeper multi. ``makepath`` parents that are missing are created inside the same
        multi (so nothing is left behind when it fails); if a concurrent client creates one
        of them first, the multi is rebuilt and retried."""
        self._check_open()
        has_ephemeral = any(op[0] == "create" and op[3] for op in ops)
        for _ in range(10):
            plan = self._plan(ops)  # [(op, auto_parent: bool)]

            def attempt(plan=plan):
                txn = self.client.transaction()
                for op, _auto in plan:
                    kind = op[0]
                    if kind == "create":
                        txn.create(op[1], op[2], ephemeral=op[3], sequence=op[4])
                    elif kind == "set":
                        txn.set_data(op[1], op[2], version=op[3])
                    elif kind == "delete":
                        txn.delete(op[1], version=op[2])
                    elif kind == "check":
                        txn.check(op[1], version=op[2])
                return self._sync(txn.commit_async())

            results = self._write(attempt, what="transaction", retry_expired=not has_ephemeral)
            failure = next(((op, auto, r) for (op, auto), r in zip(plan, results)
                            if isinstance(r, Exception) and not isinstance(
                                r, (kex.RolledBackError, kex.RuntimeInconsistency))), None)
            if failure is None and any(isinstance(r, Exception) for r in results):
                raise MetadataError(f"transaction failed: {results!r}")
            if failure is None:
                break
            op, auto, r = failure
            if auto and isinstance(r, kex.NodeExistsError):
                continue  # a parent appeared meanwhile: plan again
            raise _map(r, f"transaction {op[0]} {op[1]}") from r
        else:
            raise MetadataError("transaction: parents kept changing; gave up after 10 attempts")
        out = []
        for (op, auto), r in zip(plan, results):
            if auto:
                continue
            if op[0] == "create":
                out.append(self.client.unchroot(r))
            elif op[0] == "set":
                out.append(r.version)
            else:
                out.append(None)
        return out

    def _plan(self, ops):
        plan, created = [], set()
        for op in ops:
            if op[0] == "create" and op[5]:
                missing, parent = [], op[1].rsplit("/", 1)[0] or "/"
                while parent != "/" and parent not in created and self.exists(parent) is None:
                    missing.append(parent)
                    parent = parent.rsplit("/", 1)[0] or "/"
                for p in reversed(missing):
                    plan.append((("create", p, b"", False, False, False), True))
                    created.add(p)
            if op[0] == "create":
                created.add(op[1])
            plan.append((op, False))
        return plan

    def probe_time_ms(self) -> int:
        """The ``mtime`` the server stamps on an unconditional write of ``/clock`` (created on
        first use; removed and created again before its version could overflow)."""
        def probe():
            try:
                return self._sync(self.client.set_async(CLOCK, b""))
            except kex.NoNodeError:
                with contextlib.suppress(kex.NodeExistsError):
                    self._sync(self.client.create_async(CLOCK, b""))
                return self._sync(self.client.set_async(CLOCK, b""))
        stat = self._write(probe, what=f"write {CLOCK} (the store's time)")
        if stat.version >= 1 << 30:
            # (the record holds no data: only its version grows. The delete is conditional on
            # the version this probe wrote; whether it was applied or not -- an answer lost, a
            # later probe's write in between -- the next probe sets or creates it again)
            with contextlib.suppress(kex.KazooException, MetadataError):
                self.delete(CLOCK, version=stat.version)
        return int(stat.mtime)

    def generate_id(self) -> int:
        """CAS-increment the counter in ``/idgen`` (created on first use)."""
        while True:
            try:
                data, version = self.get(IDGEN)
            except NoNodeError:
                try:
                    self.create(IDGEN, b"1")
                    return 1
                except NodeExistsError:
                    continue
            try:
                current = int(data.decode("ascii")) if data else 0
            except (UnicodeDecodeError, ValueError):
                raise MetadataFormatError(f"corrupt id counter at {IDGEN}: {data[:40]!r}") from None
            try:
                self.set(IDGEN, str(current + 1).encode(), version=version)
                return current + 1
            except BadVersionError:
                continue

    # ---- watches -------------------------------------------------------------------------

    def watch_children(self, path, callback):
        path = validate_path(path)
        return self._watch(path, callback, children=True)

    def watch_data(self, path, callback):
        path = validate_path(path)
        return self._watch(path, callback, children=False)

    def _watch(self, path, callback, children: bool):
        """One-shot ZooKeeper watches, re-armed after every event and after a new session.
        Works on absent nodes (``[]`` / ``(None, None)``) and keeps watching them."""
        if not callable(callback):
            raise BadRequestError("watch callback must be callable")
        self._check_open()
        state = {"cancelled": False, "last": object()}
        lock = threading.Lock()

        def arm(event=None):
            if state["cancelled"] or self._closed:
                return
            if event is not None and event.type == EventType.NONE:
                return  # connection state event; session-level re-arm handles loss
            with lock:
                try:
                    value = self._read_watched(path, children, watcher)
                except MetadataError as e:
                    if not self._closed:
                        log.warning("watch on %s: %s", path, e)
                    return
                if value != state["last"] and not state["cancelled"]:
                    state["last"] = value
                    try:
                        if children:
                            callback(list(value))
                        else:
                            callback(*value)
                    except Exception:
                        log.exception("watch callback on %s failed", path)

        def watcher(event):
            # kazoo runs watchers on its callback thread, where synchronous calls are allowed
            arm(event)

        def cancel():
            state["cancelled"] = True
            with self._lock:
                if arm in self._rearm:
                    self._rearm.remove(arm)

        arm()
        with self._lock:
            self._rearm.append(arm)
        return cancel

    def _read_watched(self, path, children, watcher):
        c = self.client

        def read():
            if children:
                try:
                    names = self._sync(c.get_children_async(path, watch=watcher))
                except kex.NoNodeError:
                    if self._sync(c.exists_async(path, watch=watcher)) is not None:
                        return read()  # created meanwhile
                    return ()
                if path == "/" and self.root == "/":
                    names = [n for n in names if n != "zookeeper"]
                return tuple(sorted(names))
            try:
                data, stat = self._sync(c.get_async(path, watch=watcher))
                return (data, stat.version)
            except kex.NoNodeError:
                if self._sync(c.exists_async(path, watch=watcher)) is not None:
                    return read()
                return (None, None)

        return self._read(read, what=f"watch {path}")

    # ---- test hooks (used by metadata.testing) ---------------------------------------------

    def _client_id(self):
        return self.client.client_id
