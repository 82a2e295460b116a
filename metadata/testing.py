"""Test harness for code that uses the metadata layer (modelled on ``kazoo.testing``).

* :class:`ZooKeeperServer` runs a real standalone ZooKeeper from the jars of Debian's
  ``zookeeper`` package on a free port of any local address (loopback by default) in a
  temporary directory, optionally through a launcher (``ip netns exec <host>``: a server on
  a test host of its own, see :mod:`bkspark.testing.netns`).
* :class:`ZooKeeperEnsemble` runs a quorum of such servers (3 by default).
* :func:`expire_session` and :func:`drop_connection` inject session faults into an open store
  (ZooKeeper or SQLite).
* The ``*_worker`` functions are multiprocessing targets used by the contract suite (they
  live here so that ``spawn``-started processes can import them).

Typical use (pytest fixtures in ``tests/conftest.py`` wrap this)::

    server = ZooKeeperServer(); server.start()
    store = open_store(server.uri("/test-1"))
    ...
    server.stop()
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid

from bkspark.errors import BadVersionError, NodeExistsError
from bkspark.ports import free_port

JAVA_DIR = os.environ.get("BKSPARK_ZK_JAVA_DIR", "/usr/share/java")
ZK_JARS = (
    "zookeeper", "zookeeper-jute", "slf4j-api", "slf4j-simple", "netty-handler", "netty-common",
    "netty-buffer", "netty-transport", "netty-codec", "netty-resolver",
    "netty-transport-native-unix-common", "commons-cli", "metrics-core", "snappy-java",
    "jackson-databind", "jackson-core", "jackson-annotations",
)


class ZooKeeperUnavailable(RuntimeError):
    """ZooKeeper cannot be started here (no java, missing jars, or it failed to start)."""


def zookeeper_classpath(java_dir: str = JAVA_DIR) -> str:
    """Classpath of the installed ZooKeeper. :raises ZooKeeperUnavailable: jars missing."""
    jars = [os.path.join(java_dir, f"{name}.jar") for name in ZK_JARS]
    missing = [j for j in jars if not os.path.exists(j)]
    if missing:
        raise ZooKeeperUnavailable(
            f"ZooKeeper jars missing: {', '.join(missing)} (install Debian's package: "
            "apt-get install -y zookeeper)")
    return ":".join(jars)


def _die_with_parent():  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM the server if the test process dies without stopping it."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class ZooKeeperServer:
    """A ZooKeeper server process for tests: standalone, or one member of an ensemble.

    :param host: the address it listens on for clients (and, in an ensemble, for its peers).
    :param launcher: argv prefix the server is started through (e.g. ``ip netns exec ns``).
    :param tick_time: ms; sessions can be as short as 2 ticks (min session timeout).
    :param quorum: ``(my_id, {id: (host, client_port, peer_port, election_port)})`` for a
        member of an ensemble (see :class:`ZooKeeperEnsemble`).
    """

    def __init__(self, port: int | None = None, tick_time: int = 500,
                 max_session_timeout: int = 60000, java: str | None = None,
                 start_timeout: float = 30.0, host: str = "127.0.0.1",
                 launcher: list[str] | None = None, quorum: tuple | None = None,
                 tls: tuple[str, str] | None = None, sasl_users: dict[str, str] | None = None):
        self.port = port
        #: ``{user: password}``: clients may authenticate with SASL DIGEST-MD5 as these users
        #: (ZooKeeper's SASLAuthenticationProvider, its DigestLoginModule in a JAAS file)
        self.sasl_users = dict(sasl_users or {})
        #: ``(PEM of the server's key and certificate, PEM of the CA its clients' certificates
        #: are signed by)``: also serve TLS on :attr:`secure_port` (client certificates needed)
        self.tls = tls
        self.secure_port: int | None = None
        self.host = host
        self.launcher = list(launcher or [])
        self.quorum = quorum
        self.tick_time = tick_time
        self.max_session_timeout = max_session_timeout
        self.java = java or shutil.which("java")
        self.start_timeout = start_timeout
        self.dir: str | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def uri(self, root: str = "/") -> str:
        """``zk://<host>:<port><root>``."""
        return f"zk://{self.address}{root}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> "ZooKeeperServer":
        if self.running:
            return self
        if not self.java:
            raise ZooKeeperUnavailable("java not found on PATH (ZooKeeper needs Java 17)")
        classpath = zookeeper_classpath()
        if self.port is None:
            self.port = free_port(self.host)
        if self.dir is None:  # else: a restart after stop(cleanup=False) keeps the data
            self.dir = tempfile.mkdtemp(prefix="bkspark-zk-")
        data_dir = os.path.join(self.dir, "data")
        os.makedirs(data_dir, exist_ok=True)
        cfg = os.path.join(self.dir, "zoo.cfg")
        with open(cfg, "w") as f:
            f.write(f"tickTime={self.tick_time}\n"
                    f"dataDir={data_dir}\n"
                    f"clientPort={self.port}\n"
                    f"clientPortAddress={self.host}\n"
                    "admin.enableServer=false\n"
                    f"maxSessionTimeout={self.max_session_timeout}\n"
                    "maxClientCnxns=0\n"
                    # keep the 3 newest snapshots and their logs, purged hourly (ZooKeeper
                    # keeps every one by default: a long run's data dir grew by ~1 GB an hour
                    # under bench/endurance.py)
                    "autopurge.snapRetainCount=3\n"
                    "autopurge.purgeInterval=1\n"
                    "4lw.commands.whitelist=ruok,stat,srvr,cons\n")
            if self.tls is not None:
                if self.secure_port is None:
                    self.secure_port = free_port(self.host)
                key_cert, ca = self.tls
                f.write(f"secureClientPort={self.secure_port}\n"
                        f"secureClientPortAddress={self.host}\n"
                        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
                        f"ssl.keyStore.location={key_cert}\nssl.keyStore.type=PEM\n"
                        f"ssl.trustStore.location={ca}\nssl.trustStore.type=PEM\n"
                        "ssl.clientAuth=need\n")
            if self.sasl_users:
                f.write("authProvider.1="
                        "org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n")
            if self.quorum is not None:
                my_id, members = self.quorum
                f.write("initLimit=10\nsyncLimit=4\n")
                for sid, (h, _cport, peer, election) in sorted(members.items()):
                    f.write(f"server.{sid}={h}:{peer}:{election}\n")
                with open(os.path.join(data_dir, "myid"), "w") as idf:
                    idf.write(f"{my_id}\n")
        jaas = []
        if self.sasl_users:
            path = os.path.join(self.dir, "jaas.conf")
            with open(path, "w") as f:
                users = "".join(f'\n    user_{u}="{p}"' for u, p in self.sasl_users.items())
                f.write("Server {\n    org.apache.zookeeper.server.auth.DigestLoginModule "
                        f"required{users};\n}};\n")
            os.chmod(path, 0o600)
            jaas = [f"-Djava.security.auth.login.config={path}"]
        self.log_path = os.path.join(self.dir, "zookeeper.log")
        with open(self.log_path, "wb") as logf:
            self.proc = subprocess.Popen(
                [*self.launcher, self.java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-Dzookeeper.jmx.log4j.disable=true", *jaas,
                 "-cp", classpath,
                 # QuorumPeerMain also for a standalone server (no server.N lines): it starts
                 # the autopurge task first, which ZooKeeperServerMain never runs
                 "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg],
                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent)
        if self.quorum is not None:
            return self     # an ensemble member serves once a quorum is up: see the ensemble
        self.wait_serving()
        return self

    def wait_serving(self, timeout: float | None = None) -> None:
        """Wait until the server answers clients (standalone, or leader/follower)."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self._log_tail()
                self._cleanup()
                raise ZooKeeperUnavailable(f"ZooKeeper exited with {self.proc.returncode}:\n{tail}")
            if self.mode() in ("standalone", "leader", "follower"):
                return
            time.sleep(0.1)
        tail = self._log_tail()
        self.stop()
        raise ZooKeeperUnavailable(
            f"ZooKeeper did not serve on {self.address} within {self.start_timeout:g}s:\n{tail}")

    def mode(self) -> str | None:
        """``standalone``, ``leader`` or ``follower`` while serving clients, else None (the
        ``srvr`` four-letter word)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0) as s:
                s.sendall(b"srvr")
                reply = b""
                while chunk := s.recv(4096):
                    reply += chunk
        except OSError:
            return None
        for line in reply.decode(errors="replace").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def _log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, cleanup: bool = True) -> None:
        """Kill the server (by its pid) and remove its directory — unless ``cleanup`` is
        False: then :meth:`start` restarts it with its data (clients keep their sessions if
        they reconnect within their timeout; a server that lost its data refuses clients
        that saw newer transactions)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.kill(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        if cleanup:
            self._cleanup()

    def _cleanup(self):
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class ZooKeeperEnsemble:
    """A quorum of :class:`ZooKeeperServer` processes (``size`` servers, 3 by default).

    ``hosts``: one ``(address, launcher)`` per server (default: loopback, no launcher, free
    ports); servers on hosts of their own use ZooKeeper's usual ports 2181/2888/3888.
    ``uri(root)`` names every server, as clients of a real ensemble do.
    """

    def __init__(self, size: int = 3, hosts: list[tuple[str, list[str]]] | None = None,
                 tick_time: int = 500, max_session_timeout: int = 60000):
        hosts = hosts or [("127.0.0.1", [])] * size
        members = {}
        for sid, (host, launcher) in enumerate(hosts, start=1):
            ports = (2181, 2888, 3888) if launcher else (free_port(host), free_port(host),
                                                          free_port(host))
            members[sid] = (host, *ports)
        self.servers = [
            ZooKeeperServer(port=members[sid][1], host=host, launcher=launcher,
                            tick_time=tick_time, max_session_timeout=max_session_timeout,
                            quorum=(sid, members))
            for sid, (host, launcher) in enumerate(hosts, start=1)]

    @property
    def hosts_string(self) -> str:
        return ",".join(s.address for s in self.servers)

    def uri(self, root: str = "/") -> str:
        return f"zk://{self.hosts_string}{root}"

    def start(self) -> "ZooKeeperEnsemble":
        try:
            for server in self.servers:
                server.start()
            for server in self.servers:
                server.wait_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def leader(self) -> ZooKeeperServer | None:
        return next((s for s in self.servers if s.running and s.mode() == "leader"), None)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> "ZooKeeperEnsemble":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- skipping ------------------------------------------------------------------------

def require_all() -> bool:
    """True when optional infrastructure (ZooKeeper, Spark, ...) must not be skipped:
    the environment sets ``BKSPARK_REQUIRE_ALL=1`` (CI does)."""
    return os.environ.get("BKSPARK_REQUIRE_ALL", "") not in ("", "0", "false", "no")


def skip_or_fail(reason: str):
    """``pytest.skip(reason)``, or ``pytest.fail`` under ``BKSPARK_REQUIRE_ALL=1``."""
    import pytest
    if require_all():
        pytest.fail(f"{reason} (BKSPARK_REQUIRE_ALL is set, so this cannot be skipped)",
                    pytrace=False)
    pytest.skip(reason)


# ---- fault injection --------------------------------------------------------------------

def expire_session(store, timeout: float = 30.0) -> None:
    """Expire ``store``'s session as the server would, and wait until the store runs on a
    new session (its ephemerals are gone; ``on_session_lost`` callbacks have been started).

    ZooKeeper: kazoo's trick — a second client joins the same session (id + password) and
    closes it. SQLite: the session row and its ephemerals are deleted as a reaper would.
    """
    from .sqlite_store import SqliteStore
    old = store.session_id
    if isinstance(store, SqliteStore):
        store._expire_session_now()
    else:
        from kazoo.client import KazooClient
        client = KazooClient(hosts=store.address, client_id=store._client_id(),
                             timeout=store.session_timeout)
        client.start(timeout=timeout)
        client.stop()
        client.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.session_id not in ("", old) and _connected(store):
            return
        time.sleep(0.02)
    raise TimeoutError(f"store {store.uri} did not get a new session within {timeout}s")


def _connected(store) -> bool:
    client = getattr(store, "client", None)
    return client is None or client.connected


def drop_connection(store, timeout: float = 30.0) -> None:
    """Break the store's connection (not its session) and wait until it reconnected.

    ZooKeeper: kazoo's ``_CONNECTION_DROP`` hook (state SUSPENDED, then CONNECTED with the
    same session). SQLite: closes the calling thread's database connection.
    """
    from .sqlite_store import SqliteStore
    if isinstance(store, SqliteStore):
        store._drop_connection()
        return
    from kazoo.protocol.connection import _CONNECTION_DROP
    from kazoo.protocol.states import KazooState
    lost, back = threading.Event(), threading.Event()

    def listener(state):
        if state == KazooState.SUSPENDED:
            lost.set()
        elif state == KazooState.CONNECTED and lost.is_set():
            back.set()
            return True  # remove listener
        return False

    store.client.add_listener(listener)
    store.client._call(_CONNECTION_DROP, None)
    if not lost.wait(timeout) or not back.wait(timeout):
        store.client.remove_listener(listener)
        raise TimeoutError(f"store {store.uri} did not drop and regain its connection")


class LostAnswers:
    """What :func:`lost_answers` did: ``lost`` lists ``(op, path)`` of every write whose answer
    it took away (tests assert on it, so an injection that never matched cannot pass)."""

    def __init__(self, count: int):
        self.remaining = count
        self.lost: list[tuple[str, str]] = []


@contextlib.contextmanager
def lost_answers(store, match="", count: int = 1, applied: bool = True,
                 unreachable_after: bool = False):
    """Take away the answers of the next ``count`` writes of ``store`` whose path matches.

    ``match``: a path prefix, or a predicate ``(op, path) -> bool`` (``op`` is ``create``,
    ``set``, ``delete`` or ``transaction``; a transaction's path is its first operation's).
    With ``applied`` (default) the write really is applied and then the call raises
    :class:`MetadataConnectionError`, as when the connection breaks between a request and its
    answer; on ZooKeeper the store's connection is really dropped as well (the client
    reconnects on the same session). ``applied=False``: the write never reaches the store
    (a partition between the client and the store), with the same error.
    ``unreachable_after``: once an answer was lost, ``sync`` fails with the same error until
    the context ends (the store stays out of reach, so the outcome cannot be settled).
    """
    from bkspark.errors import MetadataConnectionError
    from kazoo.protocol.connection import _CONNECTION_DROP

    state = LostAnswers(count)
    lock = threading.Lock()
    matches = match if callable(match) else (lambda op, path: path.startswith(match))
    originals = {name: getattr(store, name)
                 for name in ("create", "set", "delete", "_commit", "sync")}

    def take(op: str, path: str) -> bool:
        with lock:
            if state.remaining <= 0 or not matches(op, path):
                return False
            state.remaining -= 1
            return True

    def give_back():
        with lock:
            state.remaining += 1

    def lose(op, path):
        client = getattr(store, "client", None)
        if applied and client is not None:
            client._call(_CONNECTION_DROP, None)
        return MetadataConnectionError(
            f"{op} {path}: connection lost before the answer arrived (injected; the write "
            f"was {'applied' if applied else 'not applied'})")

    def wrap(op: str, name: str, path_of):
        original = originals[name]

        def call(*args, **kwargs):
            path = path_of(*args, **kwargs)
            if not take(op, path):
                return original(*args, **kwargs)
            if applied:
                try:
                    original(*args, **kwargs)
                except BaseException:       # refused by the store itself: nothing to lose
                    give_back()
                    raise
            with lock:
                state.lost.append((op, path))
            raise lose(op, path)
        return call

    store.create = wrap("create", "create", lambda path, *a, **k: path)
    store.set = wrap("set", "set", lambda path, *a, **k: path)
    store.delete = wrap("delete", "delete", lambda path, *a, **k: path)
    store._commit = wrap("transaction", "_commit", lambda ops: ops[0][1] if ops else "/")

    def sync(path="/"):
        if unreachable_after and state.lost:
            raise MetadataConnectionError(f"sync {path}: store unreachable (injected)")
        return originals["sync"](path)
    store.sync = sync
    try:
        yield state
    finally:
        for name in originals:
            store.__dict__.pop(name, None)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02,
             what: str = "condition") -> None:
    """Poll ``predicate`` until it is true; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def unique_root(prefix: str = "test") -> str:
    return f"/{prefix}-{uuid.uuid4().hex[:12]}"


# ---- multiprocessing workers of the contract suite --------------------------------------

def cas_increment_worker(uri: str, path: str, n: int, start_event=None) -> int:
    """Increment the decimal counter at ``path`` ``n`` times by CAS, retrying conflicts.
    Returns the number of conflicts seen."""
    from . import open_store
    conflicts = 0
    with open_store(uri) as store:
        if start_event is not None:
            start_event.wait(60)
        for _ in range(n):
            while True:
                data, version = store.get(path)
                try:
                    store.set(path, str(int(data) + 1).encode(), version=version)
                    break
                except BadVersionError:
                    conflicts += 1
    return conflicts


def create_race_worker(uri: str, path: str, token: str, start_event=None) -> bool:
    """Try to create ``path`` holding ``token``; True if this process won."""
    from . import open_store
    with open_store(uri) as store:
        if start_event is not None:
            start_event.wait(60)
        try:
            store.create(path, token.encode())
            return True
        except NodeExistsError:
            return False


def generate_ids_worker(uri: str, n: int, start_event=None) -> list[int]:
    from . import open_store
    with open_store(uri) as store:
        if start_event is not None:
            start_event.wait(60)
        return [store.generate_id() for _ in range(n)]


def ephemeral_then_die_worker(uri: str, path: str, session_timeout: float) -> None:
    """Create an ephemeral node and exit without closing the store (a crashed owner)."""
    from . import open_store
    store = open_store(uri, session_timeout=session_timeout)
    store.create(path, b"x", ephemeral=True)
    os._exit(0)


__all__ = ["ZooKeeperServer", "ZooKeeperEnsemble", "ZooKeeperUnavailable", "expire_session",
           "drop_connection",
           "lost_answers",
           "zookeeper_classpath", "free_port", "unique_root", "require_all", "skip_or_fail"]


def open_and_create_worker(uri: str, index: int, start_event=None) -> str:
    """Open the store (possibly creating it) at the same moment as others; create a node."""
    from . import open_store
    if start_event is not None:
        start_event.wait(60)
    with open_store(uri, create=True) as store:
        return store.create(f"/opened/n{index}", b"")
