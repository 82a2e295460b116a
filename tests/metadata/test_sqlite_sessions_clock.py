"""The embedded SQLite store judges sessions by elapsed time on the judge's own monotonic
clock, never by comparing wall clocks (issue 47, "liveness by elapsed time").

Processes with a wrong wall clock run under libfaketime (:mod:`bkspark.testing.clockskew`);
their monotonic clock is not faked. They wait with ``threading.Event().wait``: ``time.sleep``
fails there (see that module). The parent checks the database with plain ``sqlite3`` reads
where it must not take part in judging.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from bkspark.testing.clockskew import libfaketime, run_skewed, skewed_env
from metadata import open_store
from metadata import testing as mt
from metadata.sqlite_store import SessionLiveness

TIMEOUT = 2.0  # session timeout of every store in these tests


@pytest.fixture
def faketime():
    if libfaketime() is None:
        mt.skip_or_fail("libfaketime is not installed (apt-get install faketime)")


@pytest.fixture
def db(tmp_path):
    """Path and URI of a fresh store file (created by a store opened and closed here)."""
    path = str(tmp_path / "meta.db")
    open_store(f"sqlite://{path}", create=True).close()
    return path, f"sqlite://{path}"




def node_exists(path: str, node: str) -> bool:
    """Read the file directly: no store, so no judging and no reaping."""
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT 1 FROM nodes WHERE path=?", (node,)).fetchone() is not None


def session_exists(path: str, sid: str) -> bool:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT 1 FROM sessions WHERE id=?", (sid,)).fetchone() is not None


def node_data(path: str, node: str) -> bytes | None:
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT data FROM nodes WHERE path=?", (node,)).fetchone()
    return None if row is None else bytes(row[0])


def start_child(code: str, *args: str, offset: str | None = None) -> subprocess.Popen:
    """A Python child running ``code`` (its wall clock ``offset`` off if given), with a pipe
    on stdin and stdout; the repository stays importable."""
    from bkspark.testing.faults.common import REPO_ROOT
    env = skewed_env(offset) if offset else dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def read_line(proc: subprocess.Popen, expected: str) -> list[str]:
    """The next line of the child's stdout, split; it must start with ``expected``."""
    words = proc.stdout.readline().split()
    assert words[:1] == [expected], f"child said {words!r} (exit code {proc.poll()})"
    return words


def stop_child(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)


# A process that owns an ephemeral node and keeps its session beating until killed.
OWNER = """
import sys, threading, time
from metadata import open_store
uri, node, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = open_store(uri, session_timeout=timeout)
store.create(node, b"owner", ephemeral=True)
print("ready", store.session_id, time.time(), flush=True)
threading.Event().wait()
"""


# ---- a wrong wall clock neither kills live sessions nor keeps dead ones ------------------

CLIENT_WRITING_AND_READING = """
import sys, threading, time
from metadata import open_store
uri, watched, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = open_store(uri, session_timeout=2.0)
store.create("/client/counter", b"0", makepath=True)
missing = operations = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    store.set("/client/counter", str(operations).encode())
    if store.exists(watched) is None:
        missing += 1
    store.children("/bookies")
    operations += 1
    threading.Event().wait(0.02)
store.close()
print("wall", time.time(), "operations", operations, "missing", missing, flush=True)
"""


@pytest.mark.slow
def test_client_with_a_fast_wall_clock_expires_no_other_session(db, faketime):
    """Found in issue 47: a client whose wall clock was an hour fast expired every other
    session as it opened the store, and all bookie registrations vanished."""
    path, uri = db
    bookie = open_store(uri, session_timeout=TIMEOUT)
    try:
        bookie.create("/bookies/b1", b"", ephemeral=True)
        session = bookie.session_id
        started = time.time()
        client = run_skewed("+1h", CLIENT_WRITING_AND_READING, uri, "/bookies/b1",
                            str(3.5 * TIMEOUT), timeout=120)
        assert client.returncode == 0, client.stderr
        words = client.stdout.split()
        client_wall, operations, missing = (float(words[1]), int(words[3]), int(words[5]))
        assert client_wall - started > 3500, "the client's clock was not skewed"
        assert operations > 20
        assert missing == 0, f"the bookie's node was missing in {missing} of {operations} reads"
        assert bookie.exists("/bookies/b1") is not None
        assert bookie.session_id == session
    finally:
        bookie.close()


@pytest.mark.slow
@pytest.mark.parametrize("offset", ["-1h", "+1h"])
def test_skewed_owner_keeps_its_node_while_alive_and_loses_it_one_timeout_after_a_kill(
        db, faketime, offset):
    """An owner whose wall clock is an hour slow looked dead to everyone at once (its
    heartbeats were an hour old); one an hour fast looked alive to everyone for an hour after
    it died (as a judge an hour slow saw every dead session). Now: alive while it beats, dead
    about one timeout after it stops."""
    path, uri = db
    judge = open_store(uri, session_timeout=TIMEOUT)
    owner = start_child(OWNER, uri, "/bookies/owner", str(TIMEOUT), offset=offset)
    try:
        _, owner_session, owner_wall = read_line(owner, "ready")
        assert abs(float(owner_wall) - time.time()) > 3500, "the owner's clock was not skewed"
        alive_until = time.monotonic() + 3 * TIMEOUT
        while time.monotonic() < alive_until:
            assert judge.exists("/bookies/owner") is not None, \
                "the live owner's ephemeral node was reaped"
            time.sleep(0.1)
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
        killed = time.monotonic()
        mt.wait_for(lambda: judge.exists("/bookies/owner") is None, TIMEOUT + 5,
                    what="the killed owner's ephemeral node to vanish")
        assert time.monotonic() - killed <= TIMEOUT + 5
        assert not session_exists(path, owner_session)
    finally:
        stop_child(owner)
        judge.close()


# ---- a judge that was paused reaps no live session ---------------------------------------

JUDGE_LOOPING = """
import sys, time
from metadata import open_store
uri, watched = sys.argv[1], sys.argv[2]
store = open_store(uri, session_timeout=2.0)
store.create("/judge/progress", b"0", makepath=True)
print("ready", flush=True)
done = 0
while True:
    store.set("/judge/progress", str(done).encode())
    store.exists(watched)
    done += 1
    time.sleep(0.02)
"""


@contextlib.contextmanager
def live_owner_and_judge(uri: str, judge_code: str, judge_ready: str):
    """A live owner of ``/bookies/live`` and a judge process (``judge_code``, ready once it
    printed ``judge_ready``); yields (the owner's session, the judge); both stopped after
    (the judge resumed first, should it be paused)."""
    live = start_child(OWNER, uri, "/bookies/live", str(TIMEOUT))
    judge = None
    try:
        _, live_session, _ = read_line(live, "ready")
        judge = start_child(judge_code, uri, "/bookies/live")
        read_line(judge, judge_ready)
        yield live_session, judge
    finally:
        if judge is not None:
            judge.send_signal(signal.SIGCONT)
            stop_child(judge)
        stop_child(live)


@pytest.mark.slow
def test_judge_paused_longer_than_the_timeout_reaps_no_live_session_on_waking(db):
    path, uri = db
    with live_owner_and_judge(uri, JUDGE_LOOPING, "ready") as (live_session, judge):
        time.sleep(1.0)  # the judge has seen the live session beat
        judge.send_signal(signal.SIGSTOP)
        time.sleep(3 * TIMEOUT)
        progress = int(node_data(path, "/judge/progress"))
        judge.send_signal(signal.SIGCONT)
        mt.wait_for(lambda: int(node_data(path, "/judge/progress")) >= progress + 20, 30,
                    what="the resumed judge to write")
        time.sleep(1.0)
        assert judge.poll() is None, "the judge failed"
        assert node_exists(path, "/bookies/live"), "the resumed judge reaped a live session"
        assert session_exists(path, live_session)


JUDGE_HOLDING_THE_WRITE_LOCK = """
import sys
from metadata import open_store
uri, watched = sys.argv[1], sys.argv[2]
store = open_store(uri, session_timeout=2.0)
store.create("/judge/progress", b"0", makepath=True)
with store._write():
    print("holding", flush=True)
    sys.stdin.readline()
store.set("/judge/progress", b"1")
print("after", "present" if store.exists(watched) is not None else "missing", flush=True)
"""


@pytest.mark.slow
def test_judge_paused_inside_a_write_transaction_reaps_no_live_session_after_it(db):
    """Nobody can beat while the judge holds the write lock: a judge stopped inside a write
    transaction must not count that time as the others' silence (its next write usually
    takes the lock before their blocked heartbeats do)."""
    path, uri = db
    with live_owner_and_judge(uri, JUDGE_HOLDING_THE_WRITE_LOCK, "holding") as (live_session,
                                                                              judge):
        judge.send_signal(signal.SIGSTOP)
        time.sleep(3 * TIMEOUT)
        judge.send_signal(signal.SIGCONT)
        judge.stdin.write("\n")
        judge.stdin.flush()
        assert read_line(judge, "after") == ["after", "present"], \
            "the judge reaped a session its own write lock had kept from beating"
        assert session_exists(path, live_session)


# ---- opening, compatibility, cost ----------------------------------------------------------

def test_new_store_gives_a_silent_session_a_full_timeout_before_reaping_it(db):
    """A store that has just opened has seen nothing: an owner that died before it opened
    (its heartbeat an hour old by anyone's clock) is reaped only after one full timeout."""
    path, uri = db
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO sessions VALUES ('crashed', ?, ?, 1, 'elsewhere')",
                     (time.time() - 3600, TIMEOUT))
        conn.execute("INSERT INTO nodes VALUES ('/crashed', '/', x'', 0, 'crashed', 0)")
    opened = time.monotonic()
    judge = open_store(uri, session_timeout=TIMEOUT)
    try:
        assert judge.exists("/crashed") is not None
        mt.wait_for(lambda: judge.exists("/crashed") is None, TIMEOUT + 5,
                    what="the crashed owner's node to vanish")
        assert time.monotonic() - opened >= TIMEOUT
        assert not session_exists(path, "crashed")
    finally:
        judge.close()


def test_heartbeat_value_changes_on_every_beat_and_still_reads_as_wall_clock_time(db):
    """Older versions judge ``heartbeat + timeout`` against their wall clock: the value stays
    the beat's wall-clock time (when the clock does not go back)."""
    path, uri = db
    store = open_store(uri, session_timeout=0.6)
    try:
        values = []
        with sqlite3.connect(path) as conn:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                (value,) = conn.execute("SELECT heartbeat FROM sessions WHERE id=?",
                                        (store.session_id,)).fetchone()
                if not values or value != values[-1]:
                    values.append(value)
                    assert abs(value - time.time()) < 1.0
                time.sleep(0.02)
        assert len(values) >= 5
        assert values == sorted(values)
    finally:
        store.close()


class CountingLiveness(SessionLiveness):
    def __init__(self):
        super().__init__()
        self.reads = 0

    def observe(self, sessions, read_started, read_finished):
        self.reads += 1
        return super().observe(sessions, read_started, read_finished)


def test_reads_and_writes_do_not_each_read_the_sessions_table(db):
    path, uri = db
    other = open_store(uri, session_timeout=10.0)
    store = open_store(uri, session_timeout=10.0)
    try:
        store._liveness = CountingLiveness()
        store.create("/n", b"")
        started = time.monotonic()
        operations = 0
        while time.monotonic() - started < 2.0:
            store.set("/n", b"x")
            store.get("/n")
            operations += 2
        elapsed = time.monotonic() - started
        assert operations > 100
        # every 0.5 s at most (the other session's timeout / 4 is longer), plus the first one
        assert store._liveness.reads <= elapsed / 0.5 + 3
    finally:
        store.close()
        other.close()


# ---- the bookkeeping alone -----------------------------------------------------------------

def test_liveness_unseen_session_is_alive_and_gets_a_full_timeout():
    judge = SessionLiveness()
    assert judge.observe([("a", 5.0, 2.0)], 100.0, 100.1) == []
    assert judge.observe([("a", 5.0, 2.0)], 102.0, 102.1) == []   # 1.9 s unchanged
    assert judge.observe([("a", 5.0, 2.0)], 102.2, 102.3) == ["a"]  # 2.1 s unchanged


def test_liveness_silence_counts_from_the_end_of_the_first_read_to_the_start_of_the_last():
    judge = SessionLiveness()
    judge.observe([("a", 5.0, 2.0)], 100.0, 101.0)  # a slow read: seen by 101 at the latest
    assert judge.observe([("a", 5.0, 2.0)], 102.9, 110.0) == []  # a slow read again
    assert judge.observe([("a", 5.0, 2.0)], 103.1, 103.2) == ["a"]


def test_liveness_changed_value_is_alive_again_even_after_the_judge_was_paused():
    judge = SessionLiveness()
    judge.observe([("a", 5.0, 2.0), ("b", 7.0, 2.0)], 100.0, 100.0)
    # the judge slept for an hour; "a" kept beating, "b" did not
    assert judge.observe([("a", 9.0, 2.0), ("b", 7.0, 2.0)], 3700.0, 3700.0) == ["b"]
    assert judge.observe([("a", 9.0, 2.0)], 3701.0, 3701.0) == []
    assert judge.observe([("a", 9.0, 2.0)], 3702.5, 3702.5) == ["a"]


def test_liveness_remembers_only_the_sessions_of_the_last_read():
    judge = SessionLiveness()
    judge.observe([("a", 5.0, 2.0), ("b", 7.0, 1.0)], 100.0, 100.0)
    assert judge.smallest_timeout == 1.0
    judge.observe([("a", 5.0, 2.0)], 101.0, 101.0)
    assert judge.smallest_timeout == 2.0
    # "b" comes back with the same value: it is new to the judge again
    assert judge.observe([("a", 5.0, 2.0), ("b", 7.0, 1.0)], 103.0, 103.0) == ["a"]
    assert judge.observe([("b", 7.0, 1.0)], 103.5, 103.5) == []
    assert judge.observe([], 200.0, 200.0) == []
    assert judge.smallest_timeout == float("inf")


def test_liveness_write_lock_held_longer_than_a_beat_interval_restarts_the_silence():
    judge = SessionLiveness()
    judge.observe([("short", 5.0, 3.0), ("long", 7.0, 30.0)], 100.0, 100.0)
    judge.restart_after_lock_held(0.9, 100.9)   # under a third of the smallest timeout
    judge.restart_after_lock_held(5.0, 105.0)   # longer than short's beat interval only
    assert judge.observe([("short", 5.0, 3.0), ("long", 7.0, 30.0)], 107.5, 107.5) == []
    assert judge.observe([("short", 5.0, 3.0), ("long", 7.0, 30.0)], 108.1, 108.1) == ["short"]
    assert judge.observe([("long", 7.0, 30.0)], 130.1, 130.1) == ["long"]
