"""Write jobs whose driver is gone: their ledgers are reclaimed, never those of a live job,
and a reclaimed job can never commit (issue 27, item 6).

The protocol tests drive :mod:`bkspark.spark.pending` directly against the real bookies of
the Spark suite's cluster; the last test kills a real Spark driver in the middle of a write.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bkspark.errors import NoSuchLedgerError
from bkspark.spark import pending
from metadata.update import GuardChangedError

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _task_ledger(logs, key, log_name, rows=3, close=True):
    """What a task does: alive record, ledger, registration, rows; then it ends."""
    alive = pending.begin_task(logs.store, key, log_name)
    lh = logs.bk.create_ledger(**logs.ledger_options)
    pending.register(logs.store, key, lh.ledger_id, {"partition": 0, "attempt": 0})
    for i in range(rows):
        lh.append(b"row-%d" % i)
    if close:
        lh.close()
        pending.end_task(logs.store, key, alive, [lh.ledger_id])
    return lh, alive


def _gone(logs, ledger_id) -> bool:
    try:
        logs.bk.ledger_metadata(ledger_id)
        return False
    except NoSuchLedgerError:
        return True


def test_a_live_job_is_never_reclaimed_and_an_abandoned_one_is(logs, log_name):
    key = f"batch-{log_name}"
    lh, alive = _task_ledger(logs, key, log_name, close=False)      # a task still writing
    (job,) = pending.reclaim(logs, grace=0, log_name=log_name)
    assert job.verdict == "alive" and job.alive_tasks == 1 and not _gone(logs, lh.ledger_id)
    lh.close()
    pending.end_task(logs.store, key, alive, [lh.ledger_id])            # the task ended ...
    (job,) = pending.reclaim(logs, grace=3600, log_name=log_name)
    assert job.verdict == "recent" and not _gone(logs, lh.ledger_id)  # ... a moment ago
    (job,) = pending.reclaim(logs, grace=0, log_name=log_name, dry_run=True)
    assert job.verdict == "abandoned" and not _gone(logs, lh.ledger_id)
    (job,) = pending.reclaim(logs, grace=0, log_name=log_name)
    assert job.verdict == "reclaimed" and job.deleted == [lh.ledger_id]
    assert _gone(logs, lh.ledger_id)
    assert pending.status(logs.store, key, 0).verdict == "tombstone"
    late = pending.begin_task(logs.store, key, log_name)           # a late task cannot join
    with pytest.raises(pending.JobReclaimedError, match="is reclaimed"):
        pending.register(logs.store, key, 123456789, {})
    pending.end_task(logs.store, key, late, [])


def test_a_reclaimed_job_cannot_commit(logs, log_name):
    """Reclaimed first: the driver's commit is refused. Commit begun first, then reclaimed
    (a driver silent past the grace in the middle of its commit): its guarded change of the
    log's list is refused, so the log never names the deleted ledger."""
    key = f"batch-{log_name}-a"
    lh, _ = _task_ledger(logs, key, log_name)
    pending.reclaim(logs, grace=0, log_name=log_name)
    with pytest.raises(pending.JobReclaimedError, match="reclaimed as abandoned"):
        pending.begin_commit(logs.store, key, [lh.ledger_id])

    key = f"batch-{log_name}-b"
    lh, _ = _task_ledger(logs, key, log_name)
    entry = logs.closed_ledger_entry(lh.ledger_id)          # what the commit is about to list
    guard = pending.begin_commit(logs.store, key, [lh.ledger_id])
    (job,) = [j for j in pending.reclaim(logs, grace=0, log_name=log_name) if j.key == key]
    assert job.verdict == "reclaimed" and _gone(logs, lh.ledger_id)
    with pytest.raises(GuardChangedError):
        logs.update(log_name, lambda edit: edit.append(entry), create=True, guard=guard)
    assert lh.ledger_id not in logs.get(log_name)[0].ledger_ids()


DRIVER = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    uri, log_name = sys.argv[1], sys.argv[2]
    spark = (SparkSession.builder.master("local[2]").appName("killed-driver")
             .config("spark.ui.enabled", "false").getOrCreate())
    df = spark.range(0, 200, 1, 2).selectExpr("CAST(id AS STRING) AS value")
    (df.write.format("bookkeeper").option("metadataServiceUri", uri)
       .option("_testFault", "hangTask:0").mode("append").save(log_name))
""")


def test_a_killed_driver_leaves_nothing_behind(spark, uri, logs, log_name, tmp_path, capsys):
    """A Spark driver SIGKILLed in the middle of a batch write (one task done, one writing):
    while its task lives nothing is reclaimed; once its session is gone, the OPEN ledger shows
    its real size, `gc-pending` reports the job abandoned and the next write to the log
    deletes both ledgers."""
    from bkspark.cli.main import main
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    output = open(tmp_path / "driver.log", "wb")
    proc = subprocess.Popen([sys.executable, str(script), uri, log_name], start_new_session=True,
                            stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        job = None
        while time.monotonic() < deadline:
            jobs = pending.reclaim(logs, grace=0, log_name=log_name, dry_run=True)
            job = jobs[0] if jobs else None
            if job is not None and len(job.ledgers) == 2 and job.alive_tasks == 1:
                break
            assert proc.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            time.sleep(0.5)
        assert job is not None and job.verdict == "alive", job
        (job,) = pending.reclaim(logs, grace=0, log_name=log_name)  # a live job is never taken
        assert job.verdict == "alive" and len(job.ledgers) == 2
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    states = {lid: logs.bk.ledger_metadata(lid).state.value for lid in job.ledgers}
    assert sorted(states.values()) == ["CLOSED", "OPEN"]
    (open_id,) = [lid for lid, s in states.items() if s == "OPEN"]

    deadline = time.monotonic() + 60                       # its metadata session expires
    while pending.status(logs.store, job.key, 0).alive_tasks and time.monotonic() < deadline:
        time.sleep(0.5)
    assert main(["shell", "listledgers", "--metadata", uri, "--json"]) == 0
    import json
    listed = {d["ledger_id"]: d for d in json.loads(capsys.readouterr().out)}
    assert listed[open_id]["state"] == "OPEN" and listed[open_id]["length"] > 0
    assert main(["shell", "gc-pending", "--metadata", uri, "--grace", "0", "--dry-run",
                 "--log", log_name, "--json"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "abandoned" and sorted(doc["ledgers"]) == sorted(job.ledgers)

    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    (df.write.format("bookkeeper").option("metadataServiceUri", uri)
       .option("reclaimAbandonedAfter", "0").mode("append").save(log_name))
    assert all(_gone(logs, lid) for lid in job.ledgers)
    assert pending.status(logs.store, job.key, 0).verdict == "tombstone"
    assert spark.read.format("bookkeeper").option("metadataServiceUri", uri).load(
        log_name).count() == 3


def test_a_sink_cleans_the_batches_it_committed_and_leaves_later_ones(logs, log_name,
                                                                       monkeypatch):
    """The sink's cleanup after committing batch 1: ledgers the log lists lose their
    registration, unlisted ones of batches <= 1 are deleted, batch 2's (running) are left.
    A registration removed meanwhile (a concurrent cleanup) fails the removal transaction,
    which then settles them one at a time."""
    key = f"sink-{log_name}"
    ledgers = {}
    for batch in (0, 1, 1, 2):
        lh = logs.bk.create_ledger(**logs.ledger_options)
        pending.register(logs.store, key, lh.ledger_id, {"batch": batch})
        lh.append(b"row")
        lh.close()
        ledgers.setdefault(batch, []).append(lh.ledger_id)
    committed, failed_attempt = ledgers[1]
    logs.append_ledgers(log_name, [ledgers[0][0], committed])
    proving, unregister = logs.delete_unreferenced, pending.unregister

    def concurrent_cleanup(name, ids):
        unregister(logs.store, key, committed)
        return proving(name, ids)
    monkeypatch.setattr(logs, "delete_unreferenced", concurrent_cleanup)
    one_at_a_time = []
    monkeypatch.setattr(pending, "unregister",
                        lambda store, k, lid: (one_at_a_time.append(lid),
                                               unregister(store, k, lid)))
    assert pending.clean(logs, key, log_name, upto_batch=1) == [failed_attempt]
    assert _gone(logs, failed_attempt) and not _gone(logs, committed)
    assert sorted(one_at_a_time) == sorted([ledgers[0][0], committed, failed_attempt])
    assert logs.store.children(pending.job_path(key)) == [str(ledgers[2][0])]
    monkeypatch.undo()
    assert pending.clean(logs, key, log_name) == ledgers[2]
    assert logs.store.children(pending.job_path(key)) == []
