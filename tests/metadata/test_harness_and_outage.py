"""The test harness itself, and ZooKeeper outages seen through the store."""
from __future__ import annotations

import os
import socket
import time

import pytest
from kazoo import exceptions as kex

from bkspark.errors import MetadataConnectionError, NodeExistsError
from metadata import open_store
from metadata import testing as mt
from metadata.testing import ZooKeeperServer, ZooKeeperUnavailable, skip_or_fail



def test_missing_jars_are_reported(tmp_path):
    with pytest.raises(ZooKeeperUnavailable, match="apt-get install -y zookeeper"):
        mt.zookeeper_classpath(str(tmp_path))


def test_missing_java_is_reported():
    server = ZooKeeperServer(java="/nonexistent/java")
    with pytest.raises((ZooKeeperUnavailable, OSError)):
        server.start()
    server.stop()


@pytest.fixture
def own_zookeeper(zookeeper):  # depends on the shared one only to skip/fail consistently
    server = ZooKeeperServer()
    try:
        server.start()
    except ZooKeeperUnavailable as e:
        skip_or_fail(str(e))
    yield server
    server.stop()


def test_zookeeper_ensemble_serves_through_the_loss_of_its_leader(zookeeper):
    """The ensemble helper: three servers on loopback, clients name all three; the store
    keeps working, CAS included, when the leader is killed."""
    ensemble = mt.ZooKeeperEnsemble(3)
    try:
        ensemble.start()
    except ZooKeeperUnavailable as e:
        skip_or_fail(str(e))
    try:
        assert sorted(s.mode() for s in ensemble.servers) == ["follower", "follower", "leader"]
        with open_store(ensemble.uri("/ens"), session_timeout=10) as store:
            store.create("/n", b"0")
            ensemble.leader().stop()
            store.set("/n", b"1", version=0)
            store.sync("/n")
            assert store.get("/n") == (b"1", 1)
            assert sum(s.running for s in ensemble.servers) == 2
    finally:
        ensemble.stop()


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_server_stop_kills_process_and_cleans_up(own_zookeeper):
    server = own_zookeeper
    assert server.running and _port_open(server.port)
    pid, directory = server.proc.pid, server.dir
    server.stop()
    assert not server.running
    assert not _port_open(server.port)
    assert not os.path.exists(directory)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_operations_during_outage_are_bounded_and_recover(own_zookeeper):
    server = own_zookeeper
    store = open_store(server.uri("/outage"), session_timeout=2.0)
    try:
        store.create("/x", b"1")
        store.create("/eph", b"", ephemeral=True)
        server.stop(cleanup=False)
        for op in (lambda: store.get("/x"), lambda: store.set("/x", b"2"),
                   lambda: store.create("/y", b"")):
            start = time.monotonic()
            with pytest.raises(MetadataConnectionError):
                op()
            assert time.monotonic() - start < 8
        server.start()  # same port, same data
        deadline = time.monotonic() + 20
        ambiguous = False
        while True:
            try:
                store.create("/after", b"")
                break
            except NodeExistsError:
                # an earlier attempt's outcome was unknown and it did land: the documented
                # way to resolve a MetadataConnectionError is to re-read
                assert ambiguous, "/after existed before any attempt to create it"
                break
            except MetadataConnectionError:
                ambiguous = True
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert store.exists("/after") == 0
        # a write that failed with MetadataConnectionError has an unknown outcome: kazoo may
        # still deliver it after reconnecting (a CAS would still be checked then)
        assert store.get("/x") in ((b"1", 0), (b"2", 1))
    finally:
        store.close()


def test_a_write_refused_late_by_an_expiry_still_gets_the_new_session(zk_uri):
    """A write queued while the server was away is refused with SessionExpired only as its
    own wait ends (close to the session timeout); it was not applied, so it must still get
    the next session's time to go through rather than failing at once (seen in CI: a create
    issued while a restarted ZooKeeper was expiring the session failed with
    SessionExpiredError)."""
    store = open_store(zk_uri, session_timeout=2.0)
    try:
        started = time.monotonic()
        calls = []

        def queued_through_an_outage():
            calls.append(time.monotonic() - started)
            if len(calls) == 1:
                time.sleep(1.8)  # the request's wait before the expiry refused it
                raise kex.SessionExpiredError()
            if time.monotonic() - started < 2.4:  # no new session yet
                raise kex.SessionExpiredError()
            return "applied"

        assert store._write(queued_through_an_outage, what="create /late") == "applied"
        assert len(calls) > 2
    finally:
        store.close()



def test_test_zookeeper_purges_its_old_snapshots(own_zookeeper):
    """A ZooKeeper of the harness (local clusters, benchmarks) must not keep every snapshot
    and transaction log: a long run's data directory would grow without bound. The server
    itself must run the purge task (a standalone ZooKeeperServerMain ignores the settings)."""
    with open(os.path.join(own_zookeeper.dir, "zoo.cfg")) as f:
        cfg = dict(line.strip().split("=", 1) for line in f if "=" in line)
    assert int(cfg["autopurge.purgeInterval"]) >= 1
    assert int(cfg["autopurge.snapRetainCount"]) >= 3
    with open(own_zookeeper.log_path, errors="replace") as f:
        log = f.read()
    assert "Purge task started" in log, log[-2000:]
