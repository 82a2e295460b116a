"""Embedded metadata store on one SQLite file, safe for many processes of one machine.

Design:

* WAL journal, ``synchronous=FULL`` (a committed write survives a crash of the machine),
  and every write in a ``BEGIN IMMEDIATE`` transaction, retried while another connection
  holds the write lock for up to ``BUSY_TIMEOUT``, so concurrent writers from any number of
  processes serialise on the database lock and a compare-and-set is checked and applied
  atomically.
* ``nodes`` holds the tree (path, parent, data, version, ephemeral owner, sequence
  counter for sequential children). ``/`` always exists.
* ``sessions`` holds one row per open store: its timeout and a heartbeat value that a
  daemon thread changes every ``session_timeout / 3`` in a write transaction, to
  ``max(previous + 0.001, time.time())``. The value grows on every beat; no process compares
  it with its own clock (older bkspark versions, which judge ``heartbeat + timeout`` against
  their wall clock, read it as a wall-clock time and work as before).
* Liveness by elapsed time: each store judges the other sessions on its own monotonic clock
  (:class:`SessionLiveness`). A session is dead when this store has seen the same heartbeat
  value for longer than the session's timeout, counted from the end of the read that first
  showed the value to the start of a read that still shows it: the session certainly did
  not beat for that long, whatever any process's wall clock says, and a store that was
  itself paused (SIGSTOP) sees the live sessions' new values on waking and reaps none of
  them. A store that has just opened has seen nothing: every session gets a full timeout from
  its first sighting (as ZooKeeper gives after a leader change). A changed value makes a
  session alive again. While this store holds the write lock nobody can beat, so when one of
  its write transactions held the lock for longer than a session's beat interval
  (timeout / 3) -- say the process was paused inside it -- that session's silence is counted
  again from the end of the transaction. Time a writer of another process holds the lock is
  not seen and counts as silence, as before.
* Reaping: a dead session's row and ephemeral nodes are deleted together, durably, in a
  write transaction whose own read of the sessions table finds it dead (a session that beat
  before that transaction took the lock is spared). Each store reads the sessions table
  (O(sessions)) at most every ``min(0.5 s, smallest timeout / 4)`` when it writes or reads,
  and on each of its own heartbeats; a write reaps the dead sessions it finds, a read that
  found some reaps them only if the write lock is free at once (a read never waits for a
  writer). A process that crashed, or was paused for longer than its timeout, therefore loses
  its ephemeral nodes between 2/3 and 1 timeout after it stopped, plus up to two reading
  intervals of the store that notices, provided some other store is open on the file.
  ``close()`` deletes its own session at once. A store whose own session row disappeared
  starts a new session and calls its ``on_session_lost`` callbacks (like a ZooKeeper client
  after expiry).
* Watches are served by one polling thread per store (every 0.25 s).
* Ids come from a counter row incremented inside a write transaction.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sqlite3
import threading
import time
import uuid
from typing import Callable

from bkspark import private
from bkspark.errors import (
    BadRequestError,
    BadVersionError,
    MetadataConnectionError,
    MetadataError,
    MetadataFormatError,
    NoMetadataStoreError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)

from .store import (
    MetadataStore,
    Transaction,
    parent_of,
    validate_data,
    validate_path,
    validate_version,
)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
POLL_INTERVAL = 0.25
BUSY_TIMEOUT = 60.0
MAX_IDLE_CONNECTIONS = 4
LOCK_ATTEMPT_WAIT = 0.05  # one attempt to take the write lock waits this long at most
SESSIONS_READ_INTERVAL = 0.5  # at most; a quarter of the smallest session timeout if shorter

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    path TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    data BLOB NOT NULL,
    version INTEGER NOT NULL,
    owner TEXT,
    seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS nodes_parent ON nodes (parent);
CREATE INDEX IF NOT EXISTS nodes_owner ON nodes (owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    heartbeat REAL NOT NULL,
    timeout REAL NOT NULL,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class _Watch:
    __slots__ = ("kind", "path", "callback", "last", "active", "fresh")

    def __init__(self, kind, path, callback, last):
        self.kind, self.path, self.callback, self.last = kind, path, callback, last
        self.active = True
        self.fresh = True  # compare once more on the next tick (a change may have raced)


class SessionLiveness:
    """Which other sessions one store (the judge) finds dead, from what it has seen of their
    heartbeats: the pure bookkeeping, with no database and no clock of its own.

    The judge reads the ``sessions`` rows ``(id, heartbeat value, timeout)`` now and then and
    passes them to :meth:`observe` with the judge's monotonic time just before and just after
    that read. For each session it remembers the last value seen and when it was first seen
    (the end of that read, the latest moment the value can have been written). A session is
    dead when a read that started more than its timeout after that still shows the same
    value: it did not beat for that long. Values change on every beat, so a changed value
    makes the session alive again, however long the judge itself was away; a session not
    seen before is alive and its silence starts now. Only the sessions of the last read are
    remembered.
    """

    def __init__(self) -> None:
        # session id -> (heartbeat value, monotonic time first seen, timeout)
        self._seen: dict[str, tuple[float, float, float]] = {}
        self._smallest_timeout = math.inf

    @property
    def smallest_timeout(self) -> float:
        """The smallest timeout among the sessions of the last read (inf if none)."""
        return self._smallest_timeout

    def observe(self, sessions, read_started: float, read_finished: float) -> list[str]:
        """Record one read of the sessions (iterable of ``(id, heartbeat, timeout)``), done
        between the monotonic times ``read_started`` and ``read_finished``; return the ids of
        the sessions now dead, in the order given."""
        seen: dict[str, tuple[float, float, float]] = {}
        dead = []
        for sid, value, timeout in sessions:
            before = self._seen.get(sid)
            if before is None or before[0] != value:
                seen[sid] = (value, read_finished, timeout)
            else:
                seen[sid] = (value, before[1], timeout)
                if read_started - before[1] > timeout:
                    dead.append(sid)
        self._seen = seen
        self._smallest_timeout = min((t for _, _, t in seen.values()), default=math.inf)
        return dead

    def restart_after_lock_held(self, held_for: float, now: float) -> None:
        """The judge held the database's write lock for ``held_for`` seconds, until ``now``:
        nobody could beat meanwhile. Every session whose beat interval (a third of its
        timeout) is shorter counts its silence from ``now`` again."""
        if held_for <= self._smallest_timeout / 3:
            return
        for sid, (value, since, timeout) in list(self._seen.items()):
            if held_for > timeout / 3:
                self._seen[sid] = (value, max(since, now), timeout)


class SqliteStore(MetadataStore):
    """See the module docstring. Open through :func:`metadata.open_store`."""

    def __init__(self, path: str, uri: str | None = None, *, session_timeout: float = 10.0,
                 connect_timeout: float = 10.0, create: bool = False):
        if session_timeout <= 0:
            raise BadRequestError(f"session_timeout must be > 0, got {session_timeout!r}")
        self.path = path
        self.uri = uri or f"sqlite://{path}"
        self.session_timeout = float(session_timeout)
        self.connect_timeout = float(connect_timeout)
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._idle: list[sqlite3.Connection] = []
        self._closed = False
        self._stop = threading.Event()
        self._lost_callbacks: list[Callable[[], None]] = []
        self._watches: list[_Watch] = []
        self._poll_thread: threading.Thread | None = None
        self._session: str = ""
        self._liveness = SessionLiveness()
        self._liveness_lock = threading.Lock()  # guards the four fields below
        self._next_sessions_read = 0.0          # monotonic time the next read is due
        self._dead_found: list[str] = []        # dead in the last read, not reaped since
        self._write_lock_held_since: dict[object, float] = {}  # our write transactions
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            raise NoMetadataStoreError(
                f"no metadata store at {path}: directory {parent} does not exist. Check the URI "
                "(sqlite:///abs/path.db); `bkspark localcluster --data-dir DIR` creates its "
                "store as DIR/metadata.db")
        if create:
            private.create_file(path)       # (a new store is private: 0600, bkspark.private)
        if not create and not os.path.exists(path):
            raise NoMetadataStoreError(
                f"no metadata store at {path}: the file does not exist. Check the URI; a store "
                "is created by `bkspark localcluster` (DIR/metadata.db) or by the first bookie "
                "started with this URI")
        try:
            self._init_schema()
            self._session = self._insert_session()
        except BaseException:
            self._close_connections()
            raise
        self._hb_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"bkspark-sqlite-heartbeat-{self._session[:8]}",
            daemon=True)
        self._hb_thread.start()

    # ---- connections and transactions ----------------------------------------------

    def _open_connection(self) -> sqlite3.Connection:
        with self._errors():
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None,
                                   check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT * 1000)}")
                conn.execute("PRAGMA synchronous=FULL")
            except BaseException:
                conn.close()
                raise
        return conn

    @contextlib.contextmanager
    def _conn(self):
        """Borrow a connection from the pool (one per concurrently running operation)."""
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")
        if os.getpid() != self._pid:
            raise MetadataError(
                f"metadata store {self.uri} was opened in another process (fork); "
                "open a new store in this process")
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._open_connection()
        try:
            yield conn
        finally:
            try:
                ok = not conn.in_transaction  # clean state: reusable even after an error
            except sqlite3.Error:
                ok = False
            with self._lock:
                keep = ok and not self._closed and len(self._idle) < MAX_IDLE_CONNECTIONS
                if keep:
                    self._idle.append(conn)
            if not keep:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

    @contextlib.contextmanager
    def _errors(self):
        """Map sqlite3 errors to the metadata error hierarchy."""
        try:
            yield
        except sqlite3.OperationalError as e:
            msg = str(e)
            if "locked" in msg or "busy" in msg:
                raise MetadataConnectionError(
                    f"sqlite metadata store {self.path} stayed locked for more than "
                    f"{BUSY_TIMEOUT:.0f}s: {msg}") from e
            if "unable to open" in msg:
                raise MetadataConnectionError(
                    f"cannot open sqlite metadata store {self.path}: {msg}") from e
            raise MetadataError(f"sqlite metadata store {self.path}: {msg}") from e
        except sqlite3.DatabaseError as e:
            msg = str(e)
            if "not a database" in msg or "malformed" in msg or "corrupt" in msg:
                raise MetadataFormatError(
                    f"{self.path} is not a valid bkspark sqlite metadata store: {msg}") from e
            raise MetadataError(f"sqlite metadata store {self.path}: {msg}") from e

    @contextlib.contextmanager
    def _write(self, reap: bool = True, bump: bool = True, wait: bool = True,
               read_sessions: bool = False):
        """A ``BEGIN IMMEDIATE`` transaction, committed on success, rolled back on error.
        ``reap``: first delete the sessions found dead, reading the sessions table if
        ``read_sessions``, if a read is due or if the last read found dead sessions. ``bump``:
        the transaction changes nodes, so advance the change counter that the watch poller
        looks at. ``wait=False``: if another connection holds the write lock right now, raise
        MetadataConnectionError at once instead of waiting up to ``BUSY_TIMEOUT``."""
        with self._conn() as conn, self._errors():
            attempt_started = self._begin_immediate(conn, wait)
            token = object()
            with self._liveness_lock:
                self._write_lock_held_since[token] = attempt_started
            try:
                try:
                    reaped = (self._reap(conn, attempt_started, read_sessions)
                              if reap else 0)
                    yield conn
                    if bump or reaped:
                        conn.execute("UPDATE counters SET value=value+1 WHERE name='changes'")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
                else:
                    conn.execute("COMMIT")
            finally:
                released = time.monotonic()
                with self._liveness_lock:
                    since = self._write_lock_held_since.pop(token)
                    self._liveness.restart_after_lock_held(released - since, released)

    @staticmethod
    def _begin_immediate(conn, wait: bool) -> float:
        """Take the write lock (``BEGIN IMMEDIATE``), retrying while another connection holds
        it for up to ``BUSY_TIMEOUT`` (not at all if not ``wait``). Each attempt waits at most
        ``LOCK_ATTEMPT_WAIT`` (in SQLite's busy handler). Return the monotonic time just
        before the attempt that took the lock: no later than the moment it was taken, and at
        most ``LOCK_ATTEMPT_WAIT`` earlier unless this thread was paused."""
        deadline = time.monotonic() + (BUSY_TIMEOUT if wait else 0.0)
        try:
            while True:
                left = max(0.0, deadline - time.monotonic())
                conn.execute(f"PRAGMA busy_timeout={int(min(left, LOCK_ATTEMPT_WAIT) * 1000)}")
                attempt_started = time.monotonic()
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return attempt_started
                except sqlite3.OperationalError as e:
                    if not _is_lock_conflict(e) or time.monotonic() >= deadline:
                        raise
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT * 1000)}")

    @contextlib.contextmanager
    def _read(self):
        """A consistent read snapshot (deferred transaction), after reaping the sessions
        found dead if the write lock is free. A read never waits for a writer (WAL): a process
        stopped in the middle of a write transaction (SIGSTOP) blocks writers until it
        resumes, never readers; dead sessions are then reaped by a later operation."""
        with self._conn() as conn, self._errors():
            if self._dead_sessions(conn, in_write=False):
                try:
                    with self._write(wait=False):
                        pass
                except MetadataConnectionError:
                    pass
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def _init_schema(self):
        deadline = time.monotonic() + max(self.connect_timeout, 1.0)
        with self._conn() as conn, self._errors():
            while True:  # switching to WAL needs a moment without other writers
                try:
                    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            if str(mode).lower() != "wal":
                raise MetadataError(f"sqlite metadata store {self.path}: cannot enable WAL "
                                    f"(journal_mode is {mode})")
        with self._write(reap=False) as c:
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            row = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                c.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                c.execute("INSERT OR IGNORE INTO nodes VALUES ('/', '', x'', 0, NULL, 0)")
                c.execute("INSERT OR IGNORE INTO counters VALUES ('ids', 0)")
                c.execute("INSERT OR IGNORE INTO counters VALUES ('changes', 0)")
            elif row[0] != str(SCHEMA_VERSION):
                raise MetadataFormatError(
                    f"sqlite metadata store {self.path} has schema version {row[0]!r}; "
                    f"this bkspark supports {SCHEMA_VERSION}")

    # ---- sessions ----------------------------------------------------------------------

    def _insert_session(self) -> str:
        sid = uuid.uuid4().hex
        with self._write(bump=False) as c:
            c.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)",
                      (sid, time.time(), self.session_timeout, os.getpid(), socket.gethostname()))
        return sid

    def _dead_sessions(self, conn, read_started: float | None = None, *, in_write: bool,
                       read_now: bool = False) -> list[str]:
        """The other sessions this store finds dead (see :class:`SessionLiveness`).

        Reads the sessions table if ``read_now``, if a read is due (they are at most
        ``SESSIONS_READ_INTERVAL`` apart, or a quarter of the smallest timeout), or, in a
        write transaction, if the last read found dead sessions (the verdict that deletes
        is always drawn from the transaction's own rows). Otherwise a write finds none and a
        read gets the last verdict. ``read_started``: a monotonic time no later than the
        snapshot read (default: just before the query)."""
        with self._liveness_lock:
            due = (read_now or time.monotonic() >= self._next_sessions_read
                   or (in_write and bool(self._dead_found)))
            if not due:
                return [] if in_write else list(self._dead_found)
        if read_started is None:
            read_started = time.monotonic()
        rows = conn.execute("SELECT id, heartbeat, timeout FROM sessions WHERE id != ?",
                            (self._session,)).fetchall()
        read_finished = time.monotonic()
        with self._liveness_lock:
            # a write transaction of ours that has not finished yet may have been paused
            for since in self._write_lock_held_since.values():
                self._liveness.restart_after_lock_held(read_finished - since, read_finished)
            dead = self._liveness.observe(rows, read_started, read_finished)
            self._dead_found = dead
            self._next_sessions_read = read_finished + min(
                SESSIONS_READ_INTERVAL, self._liveness.smallest_timeout / 4)
        return list(dead)

    def _reap(self, conn, read_started: float, read_sessions: bool) -> int:
        """In a write transaction: delete the sessions found dead and their ephemeral nodes;
        return the number of nodes deleted."""
        dead = self._dead_sessions(conn, read_started, in_write=True, read_now=read_sessions)
        deleted = 0
        for sid in dead:
            deleted += _delete_session(conn, sid)
            log.info("sqlite metadata store %s: expired session %s (heartbeat unchanged for "
                     "longer than its timeout)", self.path, sid)
        if dead:
            with self._liveness_lock:
                self._dead_found = [sid for sid in self._dead_found if sid not in dead]
        return deleted

    def _heartbeat_once(self) -> None:
        """Change our heartbeat value (reading the sessions table and reaping the dead
        ones); start a new session if ours is gone."""
        sid = self._session
        with self._write(bump=False, read_sessions=True) as c:
            alive = c.execute("UPDATE sessions SET heartbeat=max(heartbeat + 0.001, ?) "
                              "WHERE id=?", (time.time(), sid)).rowcount
        if not alive:
            self._session_lost(sid)

    def _heartbeat_loop(self):
        interval = self.session_timeout / 3.0
        while not self._stop.wait(interval):
            try:
                self._heartbeat_once()
            except Exception as e:  # keep heart-beating through transient errors
                if self._closed:
                    return
                log.warning("sqlite metadata store %s: heartbeat failed: %s", self.path, e)

    def _session_lost(self, old_sid: str) -> None:
        with self._lock:
            if self._closed or self._session != old_sid:
                return
            log.warning("sqlite metadata store %s: session %s expired; starting a new one",
                        self.path, old_sid)
            self._session = self._insert_session()
            callbacks = list(self._lost_callbacks)
        for cb in callbacks:
            threading.Thread(target=_safe_call, args=(cb,), daemon=True,
                             name="bkspark-session-lost").start()

    @property
    def session_id(self) -> str:
        return self._session

    def on_session_lost(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._lost_callbacks.append(callback)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._stop.set()
        if os.getpid() == self._pid:
            try:
                with self._write(reap=False) as c:
                    _delete_session(c, self._session)
            except MetadataError as e:
                log.warning("sqlite metadata store %s: closing session: %s", self.path, e)
        with self._lock:
            self._closed = True
        for t in (self._hb_thread, self._poll_thread):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=2.0)
        self._close_connections()

    def _close_connections(self):
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            with contextlib.suppress(sqlite3.Error):
                c.close()

    # ---- basic operations ----------------------------------------------------------------

    def create(self, path: str, data: bytes = b"", ephemeral: bool = False,
               sequential: bool = False, makepath: bool = True) -> str:
        path = validate_path(path)
        data = validate_data(data)
        sid = self._session
        try:
            with self._write() as c:
                return self._create(c, path, data, bool(ephemeral), bool(sequential),
                                    bool(makepath), sid)
        except SessionExpiredError:
            self._session_lost(sid)
            raise

    def _create(self, c, path, data, ephemeral, sequential, makepath, sid) -> str:
        if path == "/" and not sequential:
            raise NodeExistsError(f"node already exists: {path}")
        if ephemeral:
            if c.execute("SELECT 1 FROM sessions WHERE id=?", (sid,)).fetchone() is None:
                raise SessionExpiredError(
                    f"session {sid} of {self.uri} expired; ephemeral {path} not created")
        parent = parent_of(path)
        prow = c.execute("SELECT owner, seq FROM nodes WHERE path=?", (parent,)).fetchone()
        if prow is None:
            if not makepath:
                raise NoNodeError(f"parent node does not exist: {parent} (creating {path})")
            self._make_parents(c, parent)
            prow = (None, 0)
        if prow[0] is not None:
            raise BadRequestError(f"ephemeral node {parent} cannot have children ({path})")
        if sequential:
            seq = prow[1]
            c.execute("UPDATE nodes SET seq=seq+1 WHERE path=?", (parent,))
            path = f"{path}{seq:010d}"
        if c.execute("SELECT 1 FROM nodes WHERE path=?", (path,)).fetchone() is not None:
            raise NodeExistsError(f"node already exists: {path}")
        c.execute("INSERT INTO nodes VALUES (?, ?, ?, 0, ?, 0)",
                  (path, parent, data, sid if ephemeral else None))
        return path

    def _make_parents(self, c, path):
        missing = []
        while path != "/":
            row = c.execute("SELECT owner FROM nodes WHERE path=?", (path,)).fetchone()
            if row is not None:
                if row[0] is not None:
                    raise BadRequestError(f"ephemeral node {path} cannot have children")
                break
            missing.append(path)
            path = parent_of(path)
        for p in reversed(missing):
            c.execute("INSERT INTO nodes VALUES (?, ?, x'', 0, NULL, 0)", (p, parent_of(p)))

    def get(self, path: str) -> tuple[bytes, int]:
        path = validate_path(path)
        with self._read() as c:
            row = c.execute("SELECT data, version FROM nodes WHERE path=?", (path,)).fetchone()
        if row is None:
            raise NoNodeError(f"no such node: {path}")
        return bytes(row[0]), row[1]

    def get_many(self, paths: list[str]) -> list[tuple[bytes, int] | None]:
        """All in one read transaction."""
        paths = [validate_path(p) for p in paths]
        out: list[tuple[bytes, int] | None] = []
        with self._read() as c:
            for path in paths:
                row = c.execute("SELECT data, version FROM nodes WHERE path=?", (path,)).fetchone()
                out.append(None if row is None else (bytes(row[0]), row[1]))
        return out

    def exists(self, path: str) -> int | None:
        path = validate_path(path)
        with self._read() as c:
            row = c.execute("SELECT version FROM nodes WHERE path=?", (path,)).fetchone()
        return None if row is None else row[0]

    def set(self, path: str, data: bytes, version: int = -1) -> int:
        path, data, version = validate_path(path), validate_data(data), validate_version(version)
        with self._write() as c:
            return self._set(c, path, data, version)

    @staticmethod
    def _set(c, path, data, version) -> int:
        row = c.execute("SELECT version FROM nodes WHERE path=?", (path,)).fetchone()
        if row is None:
            raise NoNodeError(f"no such node: {path}")
        if version != -1 and row[0] != version:
            raise BadVersionError(f"version conflict on {path}: expected {version}, is {row[0]}")
        c.execute("UPDATE nodes SET data=?, version=version+1 WHERE path=?", (data, path))
        return row[0] + 1

    def delete(self, path: str, version: int = -1) -> None:
        path, version = validate_path(path), validate_version(version)
        with self._write() as c:
            self._delete(c, path, version)

    @staticmethod
    def _delete(c, path, version) -> None:
        if path == "/":
            raise BadRequestError("the root node cannot be deleted")
        row = c.execute("SELECT version FROM nodes WHERE path=?", (path,)).fetchone()
        if row is None:
            raise NoNodeError(f"no such node: {path}")
        if version != -1 and row[0] != version:
            raise BadVersionError(f"version conflict on {path}: expected {version}, is {row[0]}")
        if c.execute("SELECT 1 FROM nodes WHERE parent=? LIMIT 1", (path,)).fetchone():
            raise NotEmptyError(f"node has children: {path}")
        c.execute("DELETE FROM nodes WHERE path=?", (path,))

    @staticmethod
    def _check(c, path, version) -> None:
        row = c.execute("SELECT version FROM nodes WHERE path=?", (path,)).fetchone()
        if row is None:
            raise NoNodeError(f"no such node: {path}")
        if version != -1 and row[0] != version:
            raise BadVersionError(f"version conflict on {path}: expected {version}, is {row[0]}")

    def sync(self, path: str = "/") -> None:
        """Nothing to wait for: every read of the one database file sees every committed
        write. The path is still checked, as ZooKeeper's ``sync`` would."""
        validate_path(path)
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")

    def children(self, path: str) -> list[str]:
        path = validate_path(path)
        with self._read() as c:
            names = self._children(c, path)
        if names is None:
            raise NoNodeError(f"no such node: {path}")
        return names

    @staticmethod
    def _children(c, path) -> list[str] | None:
        if c.execute("SELECT 1 FROM nodes WHERE path=?", (path,)).fetchone() is None:
            return None
        cut = 1 if path == "/" else len(path) + 1
        return sorted(r[0][cut:] for r in c.execute(
            "SELECT path FROM nodes WHERE parent=?", (path,)) if r[0] != "/")

    def transaction(self) -> Transaction:
        return Transaction(self._commit)

    def _commit(self, ops) -> list:
        sid = self._session
        results = []
        try:
            with self._write() as c:
                for op in ops:
                    kind = op[0]
                    if kind == "create":
                        results.append(self._create(c, *op[1:], sid))
                    elif kind == "set":
                        results.append(self._set(c, *op[1:]))
                    elif kind == "delete":
                        results.append(self._delete(c, *op[1:]))
                    elif kind == "check":
                        results.append(self._check(c, *op[1:]))
                    else:  # pragma: no cover
                        raise BadRequestError(f"unknown transaction op {kind!r}")
        except SessionExpiredError:
            self._session_lost(sid)
            raise
        return results

    def generate_id(self) -> int:
        with self._write(bump=False) as c:
            return c.execute(
                "UPDATE counters SET value=value+1 WHERE name='ids' RETURNING value").fetchone()[0]

    # ---- watches ------------------------------------------------------------------------

    def _snapshot(self, kind, path):
        with self._read() as c:
            if kind == "children":
                return tuple(self._children(c, path) or ())
            row = c.execute("SELECT data, version FROM nodes WHERE path=?", (path,)).fetchone()
            return (None, None) if row is None else (bytes(row[0]), row[1])

    def _deliver(self, w: _Watch, value):
        if w.kind == "children":
            w.callback(list(value))
        else:
            w.callback(*value)

    def _add_watch(self, kind, path, callback) -> Callable[[], None]:
        path = validate_path(path)
        if not callable(callback):
            raise BadRequestError("watch callback must be callable")
        w = _Watch(kind, path, callback, self._snapshot(kind, path))
        self._deliver(w, w.last)
        with self._lock:
            self._watches.append(w)
            if self._poll_thread is None:
                self._poll_thread = threading.Thread(
                    target=self._poll_loop, daemon=True, name="bkspark-sqlite-watch")
                self._poll_thread.start()

        def cancel():
            w.active = False
            with self._lock:
                if w in self._watches:
                    self._watches.remove(w)
        return cancel

    def watch_children(self, path, callback):
        return self._add_watch("children", path, callback)

    def watch_data(self, path, callback):
        return self._add_watch("data", path, callback)

    def _change_count(self) -> int:
        with self._read() as c:
            return c.execute("SELECT value FROM counters WHERE name='changes'").fetchone()[0]

    def _poll_loop(self):
        seen_changes = None
        while not self._stop.wait(POLL_INTERVAL):
            try:
                # one cheap query per tick; the watches are only re-read after a change
                changes = self._change_count()
            except Exception as e:
                if self._closed:
                    return
                log.warning("sqlite watch poll failed: %s", e)
                continue
            with self._lock:
                watches = list(self._watches)
                fresh = [w for w in watches if w.fresh]
                for w in fresh:
                    w.fresh = False
            if changes == seen_changes and not fresh:
                continue
            to_check = watches if changes != seen_changes else fresh
            seen_changes = changes
            for w in to_check:
                if not w.active or self._stop.is_set():
                    continue
                try:
                    value = self._snapshot(w.kind, w.path)
                except Exception as e:
                    if self._closed:
                        return
                    log.warning("sqlite watch on %s failed: %s", w.path, e)
                    seen_changes = None  # retry every watch next tick
                    continue
                if value != w.last and w.active:
                    w.last = value
                    _safe_call(self._deliver, w, value)

    def probe_time_ms(self) -> int:
        """The modification time the kernel stamps on a write of the store's clock file
        (``<db>-clock``): the machine's clock, whatever this process believes the time is.
        The file gets the database file's permissions and owner, as SQLite gives its ``-wal``
        and ``-shm`` files: whoever may write the store may probe its time."""
        path = self.path + "-clock"
        try:
            db = os.stat(self.path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, db.st_mode & 0o666)
            try:
                st = os.fstat(fd)
                if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (db.st_uid, db.st_gid):
                    os.fchown(fd, db.st_uid, db.st_gid)
                if st.st_mode & 0o666 != db.st_mode & 0o666 and st.st_uid == os.geteuid():
                    os.fchmod(fd, db.st_mode & 0o666)
                os.pwrite(fd, b"\0", 0)
                return os.fstat(fd).st_mtime_ns // 1_000_000
            finally:
                os.close(fd)
        except OSError as e:
            raise MetadataConnectionError(
                f"sqlite metadata store {self.path}: cannot write its clock file {path} "
                f"(the store's time): {e}") from e

    # ---- test hooks (used by metadata.testing) ----------------------------------------

    def _expire_session_now(self) -> None:
        """Kill our session as a reaper would, then let the store notice."""
        sid = self._session
        with self._write(reap=False) as c:
            _delete_session(c, sid)
        self._heartbeat_once()

    def _drop_connection(self) -> None:
        """Close every idle SQLite connection; the next operations open new ones."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _delete_session(conn, sid: str) -> int:
    # Ephemeral nodes never have children, so deleting them cannot orphan anything.
    deleted = conn.execute("DELETE FROM nodes WHERE owner=?", (sid,)).rowcount
    conn.execute("DELETE FROM sessions WHERE id=?", (sid,))
    return deleted


def _is_lock_conflict(error: sqlite3.OperationalError) -> bool:
    msg = str(error)
    return "locked" in msg or "busy" in msg


def _safe_call(fn, *args):
    try:
        fn(*args)
    except Exception:
        log.exception("metadata callback %r failed", fn)
