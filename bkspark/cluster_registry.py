"""Where a client finds the metadata service when it is not told, and the local clusters'
records that make that possible.

Resolution (:func:`default_metadata_uri`, used by ``BookKeeper()``, the shell, autorecovery
and the Spark connector): an explicit URI wins; else ``$BKSPARK_METADATA_URI``; else the
metadata URI of this user's *default* local cluster, if it is running; else none (the
caller raises an error naming these three ways).

A local cluster's records live with its data (:class:`ClusterDir`): ``<data_dir>/cluster.json``
(metadata URI, pid, bookie ids; kept across stops, so a restart finds the store it used) and
``<data_dir>/cluster.lock``, which the running cluster holds with ``flock`` -- one cluster per
data directory, and "running" means "the lock is held", so a cluster killed with SIGKILL is
seen as stopped at once (the kernel drops the lock with the process).

The user's default is a pointer, ``$BKSPARK_HOME/default-cluster.json`` (``~/.bkspark``),
naming one data directory. A cluster takes the pointer only while no other running cluster
holds it, and removes it only if it still names its own directory -- a second cluster never
takes it silently, and stopping one never unpublishes another (see :func:`claim_default`).
The pointer is read and changed under ``$BKSPARK_HOME/default-cluster.lock``.

Credentials: a local cluster's bookies authenticate their peers (:mod:`bkspark.auth.local`).
So that a client on this machine works with no options, a cluster records where its
credentials are under ``$BKSPARK_HOME/clusters/<instance id>.json`` (the metadata store's
instance id, so any spelling of its URI finds them); :func:`local_credentials` reads them. The
record holds file names only; the files are the cluster owner's (0600).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os

from bkspark import private

ENV_URI = "BKSPARK_METADATA_URI"
POINTER_FILE = "default-cluster.json"


def bkspark_home() -> str:
    return os.environ.get("BKSPARK_HOME") or os.path.join(os.path.expanduser("~"), ".bkspark")


def _write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with private.open_file(tmp) as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


class ClusterBusyError(Exception):
    """Another process runs a local cluster on this data directory."""


class ClusterDir:
    """The records of the local cluster that keeps its data in ``data_dir``."""

    def __init__(self, data_dir: str):
        self.data_dir = os.path.abspath(data_dir)
        self.record_path = os.path.join(self.data_dir, "cluster.json")
        self.lock_path = os.path.join(self.data_dir, "cluster.lock")
        self._lock_fd: int | None = None

    def record(self) -> dict:
        """What the last cluster on this directory recorded ({} if none)."""
        return _read_json(self.record_path) or {}

    def running(self) -> bool:
        """Whether a process holds this directory's lock (a cluster runs on it)."""
        if self._lock_fd is not None:
            return True
        try:
            fd = os.open(self.lock_path, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def running_uri(self) -> str | None:
        return self.record().get("metadata_uri") if self.running() else None

    def acquire(self) -> None:
        """Take the directory for this process; ClusterBusyError if a cluster runs on it.

        A reader checking :meth:`running` holds a shared lock for a moment, so a busy lock is
        retried briefly before it counts as another cluster."""
        import time
        private.make_dir(self.data_dir)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, private.FILE_MODE)
        deadline = time.monotonic() + 1.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    pid = self.record().get("pid", "?")
                    raise ClusterBusyError(
                        f"a local cluster already runs on {self.data_dir} (pid {pid}): stop it "
                        "first, or give this one another --data-dir") from None
                time.sleep(0.05)
        self._lock_fd = fd

    def publish(self, metadata_uri: str, bookies: list[str]) -> None:
        _write_json(self.record_path, {"metadata_uri": metadata_uri, "pid": os.getpid(),
                                       "bookies": bookies})

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)         # drops the flock
            self._lock_fd = None


@contextlib.contextmanager
def _pointer_locked():
    home = bkspark_home()
    private.make_dir(home)
    fd = os.open(os.path.join(home, "default-cluster.lock"), os.O_RDWR | os.O_CREAT,
                 private.FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield os.path.join(home, POINTER_FILE)
    finally:
        os.close(fd)


def default_cluster() -> ClusterDir | None:
    """The data directory the user's default points at, if a cluster runs on it."""
    doc = _read_json(os.path.join(bkspark_home(), POINTER_FILE)) or {}
    if not doc.get("data_dir"):
        return None
    cluster = ClusterDir(doc["data_dir"])
    return cluster if cluster.running() else None


def claim_default(cluster: ClusterDir) -> ClusterDir | None:
    """Make ``cluster`` (running in this process) the user's default unless another running
    cluster is; returns that other cluster (the pointer then stays as it is)."""
    with _pointer_locked() as path:
        other = default_cluster()
        if other is not None and other.data_dir != cluster.data_dir:
            return other
        _write_json(path, {"data_dir": cluster.data_dir})
        return None


def release_default(cluster: ClusterDir) -> None:
    """Remove the pointer if it names ``cluster``'s directory (and no other's)."""
    with _pointer_locked() as path:
        doc = _read_json(path) or {}
        if doc.get("data_dir") == cluster.data_dir:
            with contextlib.suppress(OSError):
                os.unlink(path)


def running_cluster_uri() -> str | None:
    """Metadata URI of the user's default local cluster, if it runs."""
    cluster = default_cluster()
    return cluster.running_uri() if cluster is not None else None


def default_metadata_uri(explicit: str | None = None) -> str | None:
    """``explicit``, else ``$BKSPARK_METADATA_URI``, else the running default local cluster's."""
    for uri in (explicit, os.environ.get(ENV_URI)):
        if uri and uri.strip():
            return uri.strip()
    return running_cluster_uri()


NO_METADATA_SERVICE = ("no metadata service: pass a URI ('zk://host:2181/ledgers' or "
                       f"'sqlite:///abs/path.db'), set {ENV_URI}, or start `bkspark localcluster`")


def _credentials_record(instance_id: str, home: str | None = None) -> str:
    import hashlib
    return os.path.join(home or bkspark_home(), "clusters",
                        hashlib.sha256(instance_id.encode()).hexdigest()[:32] + ".json")


def store_identity(uri: str) -> str:
    """What names one metadata store whatever the URI's spelling: the database file's real
    path, or ZooKeeper's servers and root (its settings aside)."""
    from metadata.uri import SqliteUri, parse_uri
    parsed = parse_uri(uri)
    if isinstance(parsed, SqliteUri):
        return "sqlite:" + os.path.realpath(parsed.path)
    return "zk:" + ",".join(f"{h}:{p}" for h, p in sorted(parsed.hosts)) + parsed.root


def publish_credentials(instance_id: str, data_dir: str, tls: bool, metadata_uri: str,
                        home: str | None = None) -> None:
    """Record that the cluster of ``instance_id`` (its store at ``metadata_uri``) keeps its
    credentials in ``data_dir`` (``tls``: its bookies serve TLS, verified with its CA), for
    the clients of ``home`` (default: :func:`bkspark_home`)."""
    path = _credentials_record(instance_id, home)
    folder = private.make_dir(os.path.dirname(path))
    for name in os.listdir(folder):         # records of clusters whose data is gone
        doc = _read_json(os.path.join(folder, name)) or {}
        if name.endswith(".json") and not os.path.isdir(doc.get("data_dir") or "/nonexistent"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
    _write_json(path, {"data_dir": os.path.abspath(data_dir), "tls": bool(tls),
                       "instance_id": instance_id, "store": store_identity(metadata_uri)})


def _local_cluster(store):
    """The credentials of the local cluster whose metadata ``store`` is, and its record; None
    when it is none of this user's local clusters. Both the store's instance id and the store
    itself (:func:`store_identity`) must be the recorded ones: a store elsewhere that copies a
    cluster's instance id learns nothing."""
    from bkspark.auth.local import ClusterCredentials
    from metadata.registry import read_instance_id
    instance = read_instance_id(store)
    if not instance:
        return None
    doc = _read_json(_credentials_record(instance)) or {}
    try:
        same = (doc.get("instance_id") == instance and doc.get("data_dir")
                and doc.get("store") == store_identity(store.uri))
    except ValueError:
        return None
    return (ClusterCredentials(doc["data_dir"]), doc) if same else None


def local_credentials(store, role: str = "client") -> dict:
    """ClientConfig fields that present ``role``'s credentials of the local cluster whose
    metadata ``store`` is ({} when it is none of this user's local clusters)."""
    found = _local_cluster(store)
    if found is None:
        return {}
    creds, doc = found
    if not os.path.exists(creds.token_file(role)):
        return {}
    return creds.client_settings(role, tls=bool(doc.get("tls")))


def local_token_public_key(store) -> str:
    """The token public key file of the local cluster whose metadata ``store`` is ("" when
    none): what an endpoint of that cluster (a standalone autorecovery) verifies with."""
    found = _local_cluster(store)
    return found[0].public_key_file if found is not None else ""
