"""Run N bookie processes (and pick the embedded metadata store) on one machine.

Used by ``bkspark localcluster``, by the examples and by tests. Each bookie is a real
``python -m bkspark.bookie`` subprocess on a free loopback port with its own journal and
ledger directory under ``data_dir``; restarting bookie ``i`` reuses its directories and
port, so it comes back with the same identity (and cookie). ``placement`` puts bookies on
other addresses: each on a host of its own (a launcher such as ``ip netns exec <host>``,
see :mod:`bkspark.testing.netns`, with BookKeeper's usual ports there) or on another local
address.

A bookie's identity is its address and port, so they belong to its data directory:
``bookie-<i>/identity.json`` records them when the bookie is first started, and every later
start -- of this ``LocalCluster`` or of a new one on the same ``data_dir`` (``bkspark
localcluster`` run again the next day) -- reuses them; a recorded port that another process
holds is an error that says so, never a silent new identity (the cookie would refuse it).

The cluster's records (metadata URI, the lock that allows one cluster per data directory, the
user's default cluster that clients find without options) are :mod:`bkspark.cluster_registry`'s.
"""
from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import weakref

from bkspark import private
from bkspark.auth.credentials import Credentials
from bkspark.auth.guard import is_loopback
from bkspark.auth.local import ClusterCredentials
from bkspark.cluster_registry import (
    ClusterBusyError,
    ClusterDir,
    claim_default,
    publish_credentials,
    release_default,
)
from bkspark.errors import BKError
from bkspark.ports import free_port

def sqlite_write_locked(metadata_uri: str) -> bool:
    """Whether another process holds the write lock of an embedded store (False for others)."""
    if not metadata_uri.startswith("sqlite://"):
        return False
    import sqlite3
    conn = sqlite3.connect(metadata_uri[len("sqlite://"):], timeout=0.2, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


#: a bookie's ports on a host of its own (BookKeeper's defaults: bookie port, HTTP admin)
HOST_PORTS = (3181, 8000)


class BookieProcess:
    """One bookie subprocess with fixed directories, address and port.

    ``address``: where it listens and what it advertises (its id is ``address:port``);
    ``launcher``: argv prefix that starts it on a host of its own (then the ports are
    :data:`HOST_PORTS`, free on a fresh host), else free ports of ``address`` are chosen --
    once: they are recorded in the bookie's directory (:data:`IDENTITY_FILE`) and reused by
    every later start on that directory."""

    IDENTITY_FILE = "identity.json"

    def __init__(self, index: int, metadata_uri: str, data_dir: str, extra_args: list[str],
                 address: str = "127.0.0.1", launcher: list[str] | None = None,
                 listen_all: bool = False, retention_interval: float = 0.0,
                 security_args: list[str] = (), credentials=None):
        self.index = index
        self.security_args = list(security_args)     # its flags of bkspark.auth
        self.credentials = credentials  # what wait_ready presents (None: nothing)
        self.ever_ready = False
        self.address = address
        self.listen_address = "0.0.0.0" if listen_all else address
        self.launcher = list(launcher or [])
        self.dir = os.path.join(data_dir, f"bookie-{index}")
        self.identity_path = os.path.join(self.dir, self.IDENTITY_FILE)
        self.recorded = self._recorded_ports()
        self.port, self.http_port = self.recorded or self._ports()
        self.bookie_id = f"{address}:{self.port}"
        self.metadata_uri = metadata_uri
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(self.dir, "bookie.log")      # its log, rotated
        self.out_path = os.path.join(self.dir, "bookie.out")      # its stdout and stderr

    def _ports(self) -> tuple[int, int]:
        if self.launcher:
            return HOST_PORTS
        return free_port(self.address), free_port(self.address)

    def _recorded_ports(self) -> tuple[int, int] | None:
        """The ports this directory's bookie had: its identity file, else (a directory from
        before identity files) the port of the bookie id in its journal's cookie."""
        try:
            with open(self.identity_path) as f:
                doc = json.load(f)
            if doc.get("address") != self.address:
                raise BKError(
                    f"{self.dir} holds bookie {doc.get('address')}:{doc.get('port')}, not one on "
                    f"{self.address}: start the cluster with the placement it was made with, or "
                    "give it another data directory")
            return int(doc["port"]), int(doc["http_port"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BKError(f"bookie identity file {self.identity_path} is unreadable ({exc}): "
                          "restore it, or move the data directory away for a new cluster") from None
        try:
            with open(os.path.join(self.dir, "journal", "COOKIE")) as f:
                address, _, port = json.load(f)["bookie_id"].rpartition(":")
            if address == self.address:
                return int(port), (HOST_PORTS[1] if self.launcher else free_port(self.address))
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def _record_identity(self) -> None:
        private.make_dir(self.dir)
        tmp = self.identity_path + ".tmp"
        with private.open_file(tmp) as f:
            json.dump({"address": self.address, "port": self.port, "http_port": self.http_port}, f)
        os.replace(tmp, self.identity_path)

    def _port_taken(self, port: int) -> str | None:
        """Why ``port`` cannot be bound now (None if it can)."""
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((self.listen_address, port))
                return None
            except OSError as exc:
                return exc.strerror or str(exc)

    def _check_ports_free(self) -> None:
        """The bookie port is its identity: held by another process, say which and what to do
        (the bookie would only exit with "address already in use"). The admin HTTP port is
        not: a taken one is replaced."""
        if self.launcher:
            return
        why = self._port_taken(self.port)
        if why is not None:
            raise BKError(
                f"bookie {self.bookie_id} ({self.dir}) cannot start: its port {self.port} is "
                f"taken by another process ({why}). The port is part of the bookie's identity "
                f"(recorded in {self.identity_path}); stop whatever holds it (`ss -ltnp 'sport "
                f"= :{self.port}'` names it) and start again, or move the data directory away to "
                "start a new, empty cluster")
        if self._port_taken(self.http_port) is not None:
            self.http_port = free_port(self.address)

    def command(self) -> list[str]:
        return [*self.launcher, sys.executable, "-m", "bkspark.bookie",
                "--metadata", self.metadata_uri, "--listen-address", self.listen_address,
                "--port", str(self.port), "--http-port", str(self.http_port),
                "--journal-dir", os.path.join(self.dir, "journal"),
                "--ledger-dirs", os.path.join(self.dir, "ledgers"), *self.security_args,
                "--log-file", self.log_path, *self.extra_args]

    def new_ports(self) -> None:
        """Take fresh ports and an empty directory: for a bookie that never started (its
        ports were taken by another process between choosing and binding them)."""
        assert not self.ever_ready and not self.recorded and not self.alive
        shutil.rmtree(self.dir, ignore_errors=True)
        self.port, self.http_port = self._ports()
        self.bookie_id = f"{self.address}:{self.port}"

    def start(self) -> None:
        if self.recorded or self.ever_ready:
            self._check_ports_free()
        self._record_identity()
        out = private.open_file(self.out_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()

    def failure(self) -> str | None:
        """The error the bookie exited with (its last ``bkspark bookie: ...`` line), if any."""
        lines = [line for line in self.log_tail(200).splitlines()
                 if line.startswith("bkspark bookie: ")]
        return lines[-1][len("bkspark bookie: "):] if lines else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the bookie's log, then of its output (where a bookie
        that could not start says why)."""
        parts = []
        for path in (self.log_path, self.out_path):
            try:
                with open(path, "rb") as f:
                    f.seek(max(0, os.fstat(f.fileno()).st_size - (lines << 9)))
                    tail = f.read().splitlines()[-lines:]
            except OSError:
                continue
            if tail:
                parts.append(b"\n".join(tail).decode(errors="replace"))
        return "\n".join(parts)


_RUNNING: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()   # this process's clusters


class LocalCluster:
    """N bookies against ``metadata_uri`` (default: the store this data directory's cluster
    used last, else an embedded SQLite store in it), on loopback unless
    ``placement(i) -> (address, launcher)`` places bookie ``i`` elsewhere.

    ``extra_args`` are passed to every bookie (e.g. ``["--fault-injection"]``).
    ``listen_all``: bookies listen on ``0.0.0.0`` and advertise the address the bookie finds
    for its host (which must be the placement's address), as a deployment without
    ``--advertised-address`` does. ``publish``: become the user's default cluster (the one
    clients find without a URI) unless another running cluster is; :attr:`default_elsewhere`
    then names that one. While it runs, the cluster holds its data directory's lock: a second
    cluster on the same directory is refused.
    """

    def __init__(self, metadata_uri: str | None = None, num_bookies: int = 3,
                 data_dir: str = "./data", extra_args: list[str] | None = None,
                 start_timeout: float = 60.0, publish: bool = False, placement=None,
                 listen_all: bool = False, retention_interval: float = 0.0,
                 auth: bool = True):
        self.data_dir = os.path.abspath(data_dir)
        private.make_dir(self.data_dir)
        self.records = ClusterDir(self.data_dir)
        self.metadata_uri = (metadata_uri or self.records.record().get("metadata_uri")
                             or f"sqlite://{os.path.join(self.data_dir, 'metadata.db')}")
        self.extra_args = list(extra_args or [])
        self.start_timeout = start_timeout
        self.publish = publish
        self.default_elsewhere: ClusterDir | None = None
        self._is_default = False
        self.placement = placement or (lambda i: ("127.0.0.1", []))
        self.listen_all = listen_all
        self.retention_interval = retention_interval
        self.retention = None           # the RetentionService while the cluster runs
        self._retention_bk = None
        self.auth = ClusterCredentials(self.data_dir).ensure() if auth else None
        self.tls = auth and any(listen_all or not is_loopback(self.placement(i)[0])
                                for i in range(num_bookies))
        self.bookies = [self._bookie(i) for i in range(num_bookies)]

    def client_settings(self, role: str = "client") -> dict:
        """ClientConfig fields of ``role``'s credentials of this cluster ({}: no auth). A
        certificate given in ``extra_args`` (``--tls-cert-file``) is trusted as its own CA
        (self-signed, as :mod:`bkspark.testing.tls` makes them)."""
        settings = self.auth.client_settings(role, tls=self.tls) if self.auth else {}
        if "--tls-cert-file" in self.extra_args:
            settings["tls_ca_file"] = self.extra_args[self.extra_args.index("--tls-cert-file") + 1]
        return settings

    def credentials(self, role: str = "admin") -> Credentials:
        """``role``'s credentials of this cluster, for raw gRPC and HTTP requests to its
        bookies (tests, tools): :meth:`Credentials.channel`, :meth:`Credentials.http_json`."""
        from bkspark.client_settings import client_config_from
        return Credentials.from_config(client_config_from(self.client_settings(role)))

    @staticmethod
    def of_bookie(bookie_id: str) -> "LocalCluster | None":
        """The cluster running in this process that has ``bookie_id`` (None: none has)."""
        return next((c for c in list(_RUNNING) if bookie_id in c.bookie_ids), None)

    def _bookie(self, i: int) -> BookieProcess:
        address, launcher = self.placement(i)
        args = []
        if self.auth is not None:
            args = ["--auth-token-public-key-file", self.auth.public_key_file]
            if self.tls:            # beyond loopback: a token is never sent in clear
                key, cert = self.auth.bookie_certificate(i, address)
                args += ["--tls-cert-file", cert, "--tls-key-file", key]
        return BookieProcess(i, self.metadata_uri, self.data_dir, self.extra_args,
                             address=address, launcher=launcher, listen_all=self.listen_all,
                             security_args=args,
                             credentials=self.credentials("client") if self.auth else None)

    # ---- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> "LocalCluster":
        self.start_all()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()

    @property
    def bookie_ids(self) -> list[str]:
        return [b.bookie_id for b in self.bookies]

    def start_all(self) -> None:
        """Start every bookie and wait until each is ready; if one cannot start, the
        others are stopped again before the error propagates (no process is left behind)."""
        try:
            self.records.acquire()
        except ClusterBusyError as exc:
            raise BKError(str(exc)) from None
        try:
            self._publish_credentials()
            for bookie in self.bookies:
                bookie.start()
            for bookie in self.bookies:
                self.wait_ready(bookie.index)
        except BaseException:
            for bookie in self.bookies:
                bookie.signal(signal.SIGCONT)
                bookie.signal(signal.SIGKILL)
            for bookie in self.bookies:
                bookie.wait(10)
            self.records.release()
            raise
        self.records.publish(self.metadata_uri, self.bookie_ids)
        _RUNNING.add(self)
        if self.retention_interval > 0:
            self._start_retention()
        if self.publish:
            self.default_elsewhere = claim_default(self.records)
            self._is_default = self.default_elsewhere is None

    def _publish_credentials(self, home: str | None = None) -> None:
        """Let clients of this machine (of ``home``, default ``$BKSPARK_HOME``) find the
        cluster's credentials by its instance id (created here if this is the store's first
        start, as its first bookie would)."""
        if self.auth is None:
            return
        from metadata import open_store, registry
        store = open_store(self.metadata_uri, create=True)
        try:
            instance = registry.ensure_layout(store)
        finally:
            store.close()
        publish_credentials(instance, self.data_dir, self.tls, self.metadata_uri, home)

    def publish_credentials_to(self, home: str) -> None:
        """Also let the clients of another ``$BKSPARK_HOME`` find this cluster's credentials
        (processes given a home of their own, as test runners' Spark jobs)."""
        self._publish_credentials(home)

    def _start_retention(self) -> None:
        from bkspark.client import BookKeeper
        from bkspark.recovery.retention import RetentionService
        self._retention_bk = BookKeeper(self.metadata_uri, role="autorecovery")
        self.retention = RetentionService(self._retention_bk, f"localcluster:{os.getpid()}",
                                          self.retention_interval).start()

    def _stop_retention(self) -> None:
        if self.retention is not None:
            self.retention.stop()
            self.retention = None
        if self._retention_bk is not None:
            self._retention_bk.close()
            self._retention_bk = None

    def stop_all(self) -> None:
        _RUNNING.discard(self)
        self._stop_retention()
        for bookie in self.bookies:
            bookie.signal(signal.SIGCONT)
            bookie.signal(signal.SIGTERM)
        for bookie in self.bookies:
            bookie.wait(20)
        if self._is_default:
            release_default(self.records)
            self._is_default = False
        self.records.release()

    def add_bookie(self, wait: bool = True) -> int:
        bookie = self._bookie(len(self.bookies))
        self.bookies.append(bookie)
        bookie.start()
        if wait:
            self.wait_ready(bookie.index)
        return bookie.index

    def start(self, i: int, wait: bool = True) -> None:
        """(Re)start bookie ``i`` with its directories and port."""
        if self.bookies[i].alive:
            return
        self.bookies[i].start()
        if wait:
            self.wait_ready(i)

    def kill(self, i: int) -> None:
        """SIGKILL bookie ``i`` (no shutdown work at all)."""
        bookie = self.bookies[i]
        bookie.signal(signal.SIGCONT)
        bookie.signal(signal.SIGKILL)
        bookie.wait(10)

    def stop(self, i: int) -> None:
        """SIGTERM bookie ``i`` and wait for its graceful exit."""
        bookie = self.bookies[i]
        bookie.signal(signal.SIGTERM)
        bookie.wait(30)

    def restart(self, i: int, kill: bool = True) -> None:
        self.kill(i) if kill else self.stop(i)
        self.start(i)

    def pause(self, i: int, anywhere: bool = False) -> None:
        """SIGSTOP bookie ``i``; unless ``anywhere``, never inside a write transaction of the
        embedded store.

        A process stopped inside one holds every writer of the SQLite store until it resumes
        (docs/metadata.md): a limit of the embedded store, not the fault a test of
        the client means to inject. A bookie caught there (its heartbeat) is resumed and
        paused again a moment later. The fault runner pauses ``anywhere``."""
        bookie = self.bookies[i]
        if anywhere:
            bookie.signal(signal.SIGSTOP)
            return
        for _ in range(50):
            bookie.signal(signal.SIGSTOP)
            if not sqlite_write_locked(self.metadata_uri):
                return
            bookie.signal(signal.SIGCONT)
            time.sleep(0.02)
        raise BKError(f"could not pause bookie {i} outside a metadata write transaction")

    def resume(self, i: int) -> None:
        self.bookies[i].signal(signal.SIGCONT)

    def wait_registered(self, store, indices=None) -> None:
        """Wait until bookies ``indices`` (default: all) are listed in the registry ``store``
        holds (writable or read-only). A bookie paused past its metadata session timeout
        lost its registration; its own state says "registered" until its next heartbeat
        finds the session gone and registers it again, so only the registry can say.
        :raises BKError: one is still unlisted after ``start_timeout``."""
        from metadata import registry
        want = {self.bookies[i].bookie_id
                for i in (range(len(self.bookies)) if indices is None else indices)}
        deadline = time.monotonic() + self.start_timeout
        while True:
            listed = set(registry.list_bookies(store)) | set(
                registry.list_bookies(store, readonly=True))
            if want <= listed:
                return
            if time.monotonic() > deadline:
                raise BKError(f"bookies {sorted(want - listed)} did not register again in "
                              f"{self.start_timeout}s")
            time.sleep(0.1)

    def wait_ready(self, i: int) -> None:
        """Wait until bookie ``i`` serves and has registered itself in the metadata store."""
        bookie = self.bookies[i]
        deadline = time.monotonic() + self.start_timeout
        port_retries = 3
        while time.monotonic() < deadline:
            if not bookie.alive:
                tail = bookie.log_tail()
                if (not bookie.ever_ready and not bookie.recorded and port_retries
                        and "already in use" in tail):
                    port_retries -= 1       # a free port was taken before the bookie bound it
                    bookie.new_ports()
                    bookie.start()
                    continue
                headline = bookie.failure() or f"exited with {bookie.proc.returncode}"
                raise BKError(f"bookie {bookie.bookie_id} ({bookie.dir}) could not start: "
                              f"{headline}\n-- last lines of {bookie.log_path} and "
                              f"{bookie.out_path}:\n{tail}")
            if bookie_state(bookie.http_port, bookie.address,
                            bookie.credentials).get("registeredAs"):
                bookie.ever_ready = True
                return
            time.sleep(0.1)
        raise BKError(f"bookie {bookie.bookie_id} did not become ready in {self.start_timeout}s:\n"
                      + bookie.log_tail())


def bookie_state(http_port: int, address: str = "127.0.0.1", credentials=None) -> dict:
    """The bookie's /api/v1/bookie/state document, or {} if it does not answer (presenting
    ``credentials``: a :class:`~bkspark.auth.credentials.Credentials`)."""
    credentials = credentials or Credentials()
    try:
        status, doc = credentials.http_json(
            credentials.url(address, http_port, "/api/v1/bookie/state"), timeout=1)
    except (OSError, http.client.HTTPException):
        return {}   # not up yet, or another server holds the port (the bookie then exits)
    return doc if status == 200 and isinstance(doc, dict) else {}
