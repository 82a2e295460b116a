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


#: the suites that need more than Python (docs/development.md, "Tests"), and how a test is
#: known to be in one; `make test` ends by saying how many tests of each ran
SUITES = (
    ("ZooKeeper", lambda item: "zookeeper" in item.fixturenames
     or ("store_uri" in item.fixturenames and "[zk" in item.nodeid)),
    ("Spark", lambda item: "spark" in item.fixturenames
     or item.get_closest_marker("spark") is not None),
    ("multi-host", lambda item: item.path.name in ("test_multihost.py",
                                                   "test_network_bookie.py")),
    ("browser", lambda item: item.path.name == "test_dashboard_browser.py"),
    ("fuzz", lambda item: item.path.parent.name == "fuzz"),
)
_suite_of: dict[str, list[str]] = {}        # test id -> the suites it is in
_outcome: dict[str, str] = {}               # test id -> passed / failed / skipped


def pytest_collection_finish(session):
    for item in session.items:              # (after -k and -m deselected theirs)
        _suite_of[item.nodeid] = [name for name, is_in in SUITES if is_in(item)]


def pytest_runtest_logreport(report):
    if report.failed:
        _outcome[report.nodeid] = "failed"
    elif report.skipped and _outcome.get(report.nodeid) != "failed":
        _outcome[report.nodeid] = "skipped"
    elif report.when == "call" and report.passed:
        _outcome.setdefault(report.nodeid, "passed")


def suite_counts(suite_of: dict, outcome: dict) -> dict[str, dict[str, int]]:
    """``{suite: {outcome: tests}}`` ("other": the tests of no suite; outcome "not run": the
    test was collected but never reported)."""
    counts: dict[str, dict[str, int]] = {name: {} for name, _ in SUITES}
    counts["other"] = {}
    for test, suites in suite_of.items():
        for suite in suites or ["other"]:
            result = outcome.get(test, "not run")
            counts[suite][result] = counts[suite].get(result, 0) + 1
    return counts


def pytest_terminal_summary(terminalreporter):
    counts = suite_counts(_suite_of, _outcome)
    if terminalreporter.config.option.collectonly or not any(counts.values()):
        return
    parts, skipped = [], []
    for suite, by in counts.items():
        if not by:
            continue
        parts.append(f"{suite} " + ", ".join(f"{n} {o}" for o, n in sorted(by.items())))
        if by.get("skipped") and suite != "other":
            skipped.append(suite)
    terminalreporter.write_line("bkspark suites: " + "; ".join(parts))
    if skipped:
        terminalreporter.write_line(f"bkspark suites with skipped tests: {', '.join(skipped)} "
                                    "(the reasons: pytest -ra; their system packages: make "
                                    "install)", red=True)


@pytest.fixture(scope="session")
def bkspark_wheel(tmp_path_factory) -> str:
    """The wheel ``make wheel`` builds from this checkout (built once a run)."""
    import glob
    import os
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(["make", "wheel", f"WHEEL_DIR={out}", f"PYTHON={sys.executable}"],
                           cwd=repo, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (path,) = glob.glob(str(out / "bkspark-*.whl"))
    return path


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
