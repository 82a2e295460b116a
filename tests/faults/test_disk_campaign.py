"""Bounded disk-fault campaign (bkspark.testing.diskfaults, issue 46): the storage engine under
injected I/O errors (EIO and ENOSPC on every kind of call, short writes, failed writebacks that
lose their pages), power losses and kills, then the independent checker. A failure prints the
seed and the command that replays it."""
import os

from bkspark.testing.diskfaults.campaign import format_report, run_campaign
from bkspark.testing.diskfaults.worker import OPS, schedule

RUNS = int(os.environ.get("BKSPARK_DISKFAULTS_RUNS", "45"))


def test_each_fix_can_still_be_reverted():
    """The campaign is shown to find issue 46's defect with its fix reverted
    (bkspark.testing.diskfaults.reverts): its patch must still apply to the code."""
    from bkspark.testing import reverts
    from bkspark.testing.diskfaults.reverts import PATCHES
    from bkspark.testing.faults.common import REPO_ROOT
    for fix in PATCHES:
        assert reverts.patched(PATCHES, REPO_ROOT, fix)


def test_schedule_is_a_function_of_the_seed_and_covers_every_call():
    assert schedule(5) == schedule(5) and schedule(5) != schedule(6)
    ops = {r["op"] for s in range(200) for r in schedule(s)["rules"]}
    assert ops == set(OPS)
    assert {schedule(s)["end"] for s in range(50)} == {"power-loss", "kill", "close"}


def test_disk_campaign(faults_seed, tmp_path):
    r = run_campaign(faults_seed, RUNS, workdir=str(tmp_path))
    text = format_report(r)
    print(text)
    assert not r["violations"], text
    assert r["runs"] == RUNS and r["entries_checked"] > 50_000, text
    kinds = {k.split(":")[0] for k in r["faults"]}
    assert {"sync_range", "sync", "write"} <= kinds, text
    assert r["endings"].get("power-loss") and r["endings"].get("kill"), text
