"""`bkspark localcluster` as users run it: started, stopped with Ctrl-C and started again on
its own data the next day; a second cluster beside it; the URI every entry point finds.

Each test runs the real command (a subprocess with real bookie processes) in a private
``BKSPARK_HOME`` so that the user's default cluster of one test is not another's.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from bkspark.client import BookKeeper
from bkspark.cluster_registry import default_metadata_uri, running_cluster_uri
from bkspark.errors import BadRequestError

pytestmark = [pytest.mark.integration]
PW = b"pw"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private $BKSPARK_HOME, no $BKSPARK_METADATA_URI, and a working directory of its own."""
    monkeypatch.setenv("BKSPARK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("BKSPARK_METADATA_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


class Running:
    """A `bkspark localcluster` subprocess, up (its banner printed) until :meth:`stop`."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bkspark.cli.main", "localcluster", "--bookies", "1", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.banner: list[str] = []
        for line in self.proc.stdout:
            self.banner.append(line.rstrip("\n"))
            if line.startswith("press Ctrl-C"):
                break
        else:
            self.proc.wait(60)
            raise AssertionError(f"localcluster exited {self.proc.returncode}:\n"
                                 + "\n".join(self.banner) + self.proc.stderr.read())
        (self.uri,) = [line.split("URI: ")[1] for line in self.banner if "metadata service URI" in line]

    def text(self) -> str:
        return "\n".join(self.banner)

    def bookie_ids(self) -> list[str]:
        return [line.split()[1] for line in self.banner if line.startswith("  bookie ")]

    def stop(self, sig: int = signal.SIGINT) -> None:
        os.kill(self.proc.pid, sig)
        self.proc.wait(60)
        assert sig == signal.SIGKILL or self.proc.returncode == 0, self.proc.stderr.read()


def refused(*args: str) -> str:
    """Run a localcluster that must fail to start; its stderr."""
    r = subprocess.run([sys.executable, "-m", "bkspark.cli.main", "localcluster", "--bookies",
                        "1", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    return r.stderr


def test_a_restart_on_the_same_data_reuses_the_bookies_and_keeps_the_data(home):
    first = Running()                                    # default ./bkspark-data
    ids = first.bookie_ids()
    assert "find this cluster" in first.text()
    with BookKeeper() as bk:                             # the default cluster, no URI
        assert bk.store is not None
        lh = bk.create_ledger(1, 1, 1, password=PW)
        for i in range(5):
            lh.append(b"day-one-%d" % i)
        lh.close()
    first.stop()
    assert running_cluster_uri() is None                 # stopped: clients no longer find it

    second = Running()                                   # the next day, the same command
    try:
        assert second.bookie_ids() == ids and second.uri == first.uri
        with BookKeeper() as bk:
            rh = bk.open_ledger(lh.ledger_id, password=PW)
            assert [e.data for e in rh.read(0, rh.last_add_confirmed)] == \
                [b"day-one-%d" % i for i in range(5)]
    finally:
        second.stop()


def test_a_taken_port_and_a_cookie_mismatch_say_what_to_do_first(home):
    first = Running("--data-dir", "d")
    first.stop()
    identity_path = home / "d" / "bookie-0" / "identity.json"
    identity = json.loads(identity_path.read_text())

    with socket.socket() as squatter:                    # another process took the bookie's port
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", identity["port"]))
        squatter.listen()
        err = refused("--data-dir", "d")
    first_line = err.splitlines()[0]
    assert f"port {identity['port']} is taken by another process" in first_line, err
    assert "identity.json" in first_line and "move the data directory away" in first_line

    # the directory's identity no longer matches its disks (here: the port was edited)
    identity_path.write_text(json.dumps(dict(identity, port=identity["port"] + 1)))
    err = refused("--data-dir", "d")
    first_line = err.splitlines()[0]
    assert "does not match this bookie" in first_line, err
    assert f"--port {identity['port']}" in first_line and "refusing to start" in first_line
    assert "last lines of" in err                        # the log follows the headline


def test_one_registry_per_cluster_and_a_default_that_is_not_stolen(home):
    first = Running("--data-dir", "a")
    try:
        assert "refusing" not in first.text()
        err = refused("--data-dir", "a")                  # one cluster per data directory
        assert "already runs on" in err and str(home / "a") in err

        second = Running("--data-dir", "b")
        assert second.uri != first.uri
        assert f"the local cluster in {home / 'a'} is running and stays the default" in second.text()
        assert running_cluster_uri() == first.uri
        second.stop()
        assert running_cluster_uri() == first.uri          # stopping b did not unpublish a
        assert json.loads((home / "b" / "cluster.json").read_text())["metadata_uri"] == second.uri
    finally:
        first.stop(signal.SIGKILL)                          # gone without any clean-up
    # its bookies run on (their own sessions); the registry sees the cluster process is gone
    try:
        assert running_cluster_uri() is None
        third = Running("--data-dir", "c")                  # and the default is free again
        try:
            assert running_cluster_uri() == third.uri
        finally:
            third.stop()
    finally:
        _kill_bookies(home / "a")


def _bookie_pids(data_dir) -> list[int]:
    # "--" ends pgrep's options: the pattern itself starts with "--" (without it pgrep
    # refused the pattern as an option, found nothing, and the bookies were left running)
    found = subprocess.run(["pgrep", "-f", "--", f"--journal-dir {data_dir}/"],
                           capture_output=True, text=True)
    assert found.returncode in (0, 1), found.stderr
    return [int(pid) for pid in found.stdout.split()]


def _kill_bookies(data_dir) -> None:
    for pid in _bookie_pids(data_dir):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _bookie_pids(data_dir):
        assert time.monotonic() < deadline, f"bookies of {data_dir} still running"
        time.sleep(0.1)


def test_every_entry_point_honours_BKSPARK_METADATA_URI(home, monkeypatch):
    assert default_metadata_uri() is None
    with pytest.raises(BadRequestError, match="BKSPARK_METADATA_URI"):
        BookKeeper()
    uri = f"sqlite:///{home / 'elsewhere.db'}"
    monkeypatch.setenv("BKSPARK_METADATA_URI", uri)
    assert default_metadata_uri() == uri and default_metadata_uri("zk://h:2181/x") == "zk://h:2181/x"
    from bkspark.spark.datasource import _default_uri
    from bkspark.spark.options import parse_options
    assert parse_options({"log": "l"}, default_uri=_default_uri).metadata_uri == uri
    from metadata import open_store
    open_store(uri, create=True).close()                 # an empty cluster's store
    from bkspark.log import LogStore
    with BookKeeper() as bk:
        LogStore(bk).create("found-by-the-variable")
    with BookKeeper(uri) as bk:
        assert LogStore(bk).list_logs() == ["found-by-the-variable"]
    r = subprocess.run([sys.executable, "-m", "bkspark.cli.main", "shell", "listbookies", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stderr


def test_the_local_cluster_applies_log_retention_policies(home):
    from bkspark.log import LogStore
    from bkspark.log.retention import RetentionPolicy
    cluster = Running("--retention-interval", "0.5")
    try:
        with BookKeeper() as bk:
            logs = LogStore(bk, password=PW, ensemble_size=1, write_quorum=1, ack_quorum=1)
            ids = []
            for i in range(4):
                lh = bk.create_ledger(1, 1, 1, password=PW)
                lh.append(b"x" * 100)
                lh.close()
                logs.append_ledgers("kept-small", [lh.ledger_id])
                ids.append(lh.ledger_id)
            logs.set_retention("kept-small", RetentionPolicy(bytes=200))
            deadline = time.monotonic() + 30
            while logs.get("kept-small")[0].ledger_ids() != ids[2:]:
                assert time.monotonic() < deadline, "localcluster did not apply the policy"
                time.sleep(0.2)
            assert not set(ids[:2]) & set(bk.list_ledgers())
    finally:
        cluster.stop()
