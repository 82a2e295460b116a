"""One clock (issue 47): no host's wrong wall clock deletes fresh data, applies a commit twice
or reclaims a live job. Each test runs one real process under libfaketime
(bkspark.testing.clockskew) against the module's real cluster, on both metadata stores;
each failed on the code before the store's clock (metadata.clock) stamped and judged.
"""
from __future__ import annotations

import json
import time

import pytest

from bkspark.log.retention import RetentionPolicy
from bkspark.log.retention import enforce
from bkspark.testing.clockskew import run_skewed
from metadata import log_segments as ls
from metadata.layout import log_path

from .helpers import closed_ledger, read_all

WEEK_MS = 7 * 24 * 3600 * 1000

#: the skewed process's preamble: a client of the cluster (argv: uri, log name)
PRELUDE = """
import json, sys
from bkspark.client import BookKeeper
from bkspark.log import LogStore
uri, name = sys.argv[1], sys.argv[2]
bk = BookKeeper(uri)
logs = LogStore(bk, password=b"pw", ensemble_size=3, write_quorum=2, ack_quorum=2)
def out(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


def skewed(offset: str, code: str, uri: str, name: str) -> dict:
    """Run ``code`` (after PRELUDE) in a process whose clock is ``offset`` off; its result."""
    done = run_skewed(offset, PRELUDE + code + "\nbk.close()\n", uri, name, timeout=180)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"rc={done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


def _log_with_ledgers(bk, logs, name, n=3, policy=RetentionPolicy(ms=WEEK_MS)):
    logs.create(name)
    logs.set_retention(name, policy)
    for i in range(n):
        logs.append_ledgers(name, [closed_ledger(bk, [b"r%d" % i])])
    return [e.ledger_id for e in logs.get(name)[0].ledgers]


def test_the_store_clock_is_the_stores_whatever_the_hosts(cluster, bk, logs, log_name):
    got = skewed("+8d", "out(now=bk.store.clock.now_ms(), skew=bk.store.clock.skew_ms(),"
                        " wall=__import__('time').time() * 1000)", cluster.metadata_uri, log_name)
    true_ms = time.time() * 1000
    assert abs(got["now"] - true_ms) < 30_000, got          # the store's time, not the host's
    assert abs(got["skew"] - 8 * 24 * 3600 * 1000) < 30_000, got
    assert abs(bk.store.clock.skew_ms(fresh=True)) < 5_000


def test_a_fast_retention_enforcer_removes_nothing(cluster, bk, logs, log_name):
    """Finding 1: an enforcer 8 days fast removed every closed ledger but the last of a
    7-day log written seconds before. Now: judged on the store's clock its plan cuts
    nothing, and it refuses to act at all (its clock is off the store's)."""
    ids = _log_with_ledgers(bk, logs, log_name)
    got = skewed("+8d", """
from bkspark.errors import ClockSkewError
from bkspark.log.retention import enforce, plan
from bkspark.recovery.retention import RetentionService
cut = plan(logs, name, logs.retention(name))
try:
    enforce(logs, name)
    refused = False
except ClockSkewError as exc:
    refused = str(exc)
service = RetentionService(bk, "skewed", interval=3600)
removed = service.run_once()
out(planned=cut.before, refused=refused, removed=removed, refusals=service.refused_by_skew)
""", cluster.metadata_uri, log_name)
    assert got["planned"] is None, got
    assert got["refused"] and "clock" in got["refused"] and "NTP" in got["refused"], got
    assert got["removed"] == {} and got["refusals"] == 1, got
    assert [e.ledger_id for e in logs.get(log_name)[0].ledgers] == ids
    assert read_all(logs, log_name) == [b"r0", b"r1", b"r2"]


@pytest.mark.parametrize("offset", ["-400d", "+30d"], ids=["behind", "ahead"])
def test_a_skewed_writer_stamps_nothing_a_later_pass_misjudges(cluster, bk, logs, log_name,
                                                               offset):
    """Finding 2 (a writer 400 days behind: the next true-clock pass removed its fresh
    ledgers) and finding 5 (one ledger stamped in the future held time retention back until
    that date). A host whose clock disagrees with the store's may write entries (they are
    acknowledged and kept) but takes no stamp that retention or key expiry judges: closing
    its ledger in the list, committing a key, moving a cursor are refused with the fix named,
    and the next owner on a true clock records the ledger with the store's time."""
    logs.create(log_name)
    logs.set_retention(log_name, RetentionPolicy(ms=WEEK_MS))
    got = skewed(offset, """
from bkspark.errors import ClockSkewError
from bkspark.log import Position
refused = []
w = logs.open_writer(name)
for i in range(3):
    w.append(b"w%d" % i)
w.flush()
try:
    w.close()
except ClockSkewError as exc:
    refused.append("close: " + str(exc))
for what, act in (("key", lambda: logs.append_ledgers(name, [], writer_id="skewed-job",
                                                      sequence=0)),
                  ("cursor", lambda: logs.commit_cursor(name, "skewed-reader", Position(0, 0)))):
    try:
        act()
    except ClockSkewError as exc:
        refused.append(what + ": " + str(exc))
out(refused=refused)
""", cluster.metadata_uri, log_name)
    assert len(got["refused"]) == 3 and all("NTP" in r for r in got["refused"]), got
    head = ls.LogHead.deserialize(bk.store.get(log_path(log_name))[0])
    assert "skewed-job" not in head.writers
    assert "skewed-reader" not in logs.cursor_records(log_name)
    with logs.open_writer(log_name) as w:           # a true-clock owner: seals the tail
        w.append(b"next")
    true_ms = time.time() * 1000
    closed = [e.closed_ms for e in logs.get(log_name)[0].ledgers if e.closed]
    assert closed and all(abs(t - true_ms) < 120_000 for t in closed), closed
    assert not enforce(logs, log_name).removed      # a true-clock pass: nothing a week old
    assert read_all(logs, log_name) == [b"w0", b"w1", b"w2", b"next"]


def test_a_fast_committer_does_not_expire_a_live_key(cluster, bk, logs, log_name):
    """Finding 3: job7 commits; a commit by a host 8 days fast expired job7's key, and
    job7's retry was applied again (today: refused forever). Now that host's commit is
    refused before it changes anything, and key ages are the store's: job7's retry is
    recognised as applied and appends nothing."""
    logs.create(log_name)
    assert logs.append_ledgers(log_name, [closed_ledger(bk, [b"job7"])], writer_id="job7",
                               sequence=0)
    got = skewed("+8d", """
from bkspark.errors import ClockSkewError
try:
    logs.append_ledgers(name, [], writer_id="other", sequence=0)
    out(refused=False)
except ClockSkewError:
    out(refused=True)
""", cluster.metadata_uri, log_name)
    assert got["refused"]
    head = ls.LogHead.deserialize(bk.store.get(log_path(log_name))[0])
    assert "job7" in head.writers and head.expired["count"] == 0, head
    assert logs.append_ledgers(log_name, [closed_ledger(bk, [b"job7"])], writer_id="job7",
                               sequence=0) is False     # the retry: already applied
    assert logs.append_ledgers(log_name, [], writer_id="other", sequence=0)   # (true clock)
    assert read_all(logs, log_name) == [b"job7"]


def test_a_fast_reclaimer_leaves_a_live_job_alone(cluster, bk, logs, log_name):
    """Finding 5: a reclaimer 11 minutes fast reclaimed a live Spark job's ledgers. Now the
    job's silence is judged on the store's clock, and the skewed host refuses to reclaim."""
    from bkspark.spark import pending
    logs.create(log_name)
    key = "batch-" + log_name[-40:]
    alive = pending.begin_task(bk.store, key, log_name)
    lid = closed_ledger(bk, [b"task"])
    pending.register(bk.store, key, lid, {})
    pending.end_task(bk.store, key, alive, [lid])         # no task alive: judged by silence
    got = skewed("+660s", """
from bkspark.errors import ClockSkewError
from bkspark.spark import pending
verdicts = [j.verdict for j in pending.reclaim(logs, grace=600, log_name=name, dry_run=True)]
try:
    pending.reclaim(logs, grace=600, log_name=name)
    refused = False
except ClockSkewError:
    refused = True
out(verdicts=verdicts, refused=refused)
""", cluster.metadata_uri, log_name)
    assert got == {"verdicts": ["recent"], "refused": True}, got
    job = pending.status(bk.store, key, 600)
    assert job is not None and job.verdict == "recent" and job.ledgers == [lid]
    assert bk.ledger_metadata(lid) is not None


def test_a_zookeeper_whose_clock_is_off_gets_no_stamp_that_outlives_the_fix(tmp_path):
    """The store's clock can be the wrong one: a ZooKeeper server a day behind. Stamps
    taken from it would make fresh ledgers look a day old once its clock is fixed (a
    true-clock pass then removed them), so while every host disagrees with it the stamps are
    refused; once it is fixed the next owner records the ledger with the right time and
    nothing is removed."""
    from bkspark.client import BookKeeper
    from bkspark.errors import ClockSkewError
    from bkspark.log import LogStore
    from bkspark.testing.clockskew import skewed_env
    from bkspark.testing.cluster import BookieCluster
    from metadata.testing import ZooKeeperServer
    launcher = ["env"] + [f"{k}={v}" for k, v in skewed_env("-1d", base={}).items()]
    zk = ZooKeeperServer(launcher=launcher).start()
    uri = zk.uri("/one-clock")
    try:
        with BookieCluster(uri, num_bookies=3, data_dir=tmp_path), BookKeeper(uri) as bk:
            logs = LogStore(bk, password=b"pw", ensemble_size=3, write_quorum=2, ack_quorum=2)
            logs.create("fresh")
            logs.set_retention("fresh", RetentionPolicy(ms=12 * 3600 * 1000))
            w = logs.open_writer("fresh")
            w.append(b"r0")
            with pytest.raises(ClockSkewError, match="metadata store's servers"):
                w.close()
            assert abs(bk.store.clock.skew_ms() - 24 * 3600 * 1000) < 60_000
            zk.stop(cleanup=False)
            zk.launcher = []                    # the ZooKeeper host's clock is fixed
            zk.start()
            bk.store.clock.now_ms(fresh=True)
            with logs.open_writer("fresh") as w:
                w.append(b"r1")
            closed = [e.closed_ms for e in logs.get("fresh")[0].ledgers if e.closed]
            assert closed and all(abs(t - time.time() * 1000) < 120_000 for t in closed)
            assert not enforce(logs, "fresh").removed
            assert read_all(logs, "fresh") == [b"r0", b"r1"]
    finally:
        zk.stop()
