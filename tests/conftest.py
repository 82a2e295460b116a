"""Shared pytest fixtures for bkspark (modelled on kazoo's test harness).

Metadata stores:

* ``zookeeper`` (session): one real ZooKeeper server (:class:`metadata.testing.ZooKeeperServer`)
  for the whole test session. When it cannot start the test is skipped — or fails when the
  environment sets ``BKSPARK_REQUIRE_ALL=1`` (CI does).
* ``zk_uri``: ``zk://127.0.0.1:<port>/test-<random>`` — a fresh chroot per test.
* ``sqlite_uri``: ``sqlite:///<tmp_path>/meta.db`` — a fresh database per test.
* ``store_uri``: parametrised over ``"sqlite"`` and ``"zk"`` (test ids ``[sqlite]``/``[zk]``).
* ``store``: an open store on ``store_uri`` (closed after the test).
* ``store_factory``: ``store_factory(uri=None, **open_store_kwargs)`` opens more stores on
  the same URI (another "process" view of the metadata); all closed after the test.

Helpers (import them from :mod:`metadata.testing`, not from this conftest — several
``conftest`` modules exist): ``skip_or_fail(reason)`` skips, or fails under
``BKSPARK_REQUIRE_ALL=1``; ``expire_session(store)``, ``drop_connection(store)``.
"""
from __future__ import annotations

import shutil
import tempfile

import pytest

from metadata import open_store
from metadata.testing import (  # noqa: F401 - re-exported for other test packages
    ZooKeeperServer,
    ZooKeeperUnavailable,
    require_all,
    skip_or_fail,
    unique_root,
)


def _temp_disk_usage() -> tuple[str, float]:
    """The temporary directory the tests' bookies write to, and the fraction of its disk in
    use (as a bookie computes it: used / (used + available))."""
    where = tempfile.gettempdir()
    total, used, free = shutil.disk_usage(where)
    return where, used / max(1, used + free)


def pytest_report_header(config):
    where, usage = _temp_disk_usage()
    return f"bkspark: disk of {where} {usage:.1%} used (test bookies go read-only at 95%)"


def pytest_sessionstart(session):
    """Refuse to start on a disk the bookies would refuse: every cluster of the run would be
    read-only ("need 3 writable bookies, only 0 available") and hundreds of tests would fail
    for one reason that this message names."""
    where, usage = _temp_disk_usage()
    if usage >= 0.94:
        pytest.exit(f"the disk of {where} is {usage:.1%} used: test bookies go read-only at "
                    "95% (disk_usage_threshold), so the run cannot pass. Free space first "
                    "(old runs: /tmp/pytest-of-$USER).", returncode=3)


@pytest.fixture(scope="session")
def zookeeper():
    """A running :class:`ZooKeeperServer` shared by the whole test session."""
    server = ZooKeeperServer(tick_time=500, max_session_timeout=60000)
    try:
        server.start()
    except ZooKeeperUnavailable as e:
        skip_or_fail(f"cannot start ZooKeeper: {e}")
    yield server
    server.stop()


@pytest.fixture
def zk_uri(zookeeper) -> str:
    """URI of a fresh, empty chroot on the session's ZooKeeper."""
    if not zookeeper.running:  # a test killed it: bring it back on the same port
        try:
            zookeeper.start()
        except ZooKeeperUnavailable as e:
            skip_or_fail(f"cannot restart ZooKeeper: {e}")
    return zookeeper.uri(unique_root())


@pytest.fixture
def sqlite_uri(tmp_path) -> str:
    """URI of a fresh SQLite metadata database in the test's tmp_path."""
    return f"sqlite://{tmp_path}/meta.db"


@pytest.fixture(params=["sqlite", "zk"])
def store_uri(request) -> str:
    """Metadata URI, once per store implementation."""
    return request.getfixturevalue(f"{request.param}_uri")


@pytest.fixture
def store_factory(store_uri):
    """Open extra stores (default: on ``store_uri``); all are closed after the test."""
    opened = []

    def make(uri: str | None = None, **kwargs):
        s = open_store(uri or store_uri, **{"create": True, **kwargs})
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


@pytest.fixture
def store(store_factory):
    """An open metadata store on ``store_uri`` (both implementations)."""
    return store_factory()
