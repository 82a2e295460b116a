"""Bounded user-level fault runs (bkspark.testing.userfaults) over both metadata stores.

A run: 5 real bookies, LogWriter appenders, tailing readers, the writer-keys workload, a real
Spark batch driver and a real Spark streaming query (local[2,4], one session per driver
process), retention and truncation, and a seeded schedule of every fault kind; then the
independent checker. Each run asserts no violation, that work really happened (rows checked,
jobs, micro-batches) and that every fault kind of its schedule was applied. A failure prints
the seed and the command that replays its schedule.

The two runs share the streaming query's faults (STREAM_KINDS): each restarts the query's
driver -- a new JVM and a first micro-batch, 1.5-3 minutes on two busy vCPUs (2026-11-28) --
and all of them in one bounded run did not fit. Every kind is still applied in every CI run
(test_the_two_runs_apply_every_kind); the campaign's CLI applies all of them in each run.
"""
import os

import pytest

from bkspark.testing.userfaults import FAULT_KINDS, make_schedule
from bkspark.testing.userfaults.runner import SCENARIO_GRACE_S
from bkspark.testing.userfaults.cli import run_line
from metadata.testing import skip_or_fail

RUN_SECONDS = float(os.environ.get("BKSPARK_USERFAULTS_RUN_SECONDS", "75"))
#: the streaming query's faults, by the store of the run that applies them
STREAM_KINDS = {"sqlite": ("stream_replan_paused", "stream_driver_kill"),
                "zk": ("stream_lost_checkpoint", "stream_reset_checkpoint")}


def kinds_of(store: str) -> tuple:
    shared = {k for kinds in STREAM_KINDS.values() for k in kinds}
    return tuple(k for k in FAULT_KINDS if k not in shared or k in STREAM_KINDS[store])


def test_the_two_runs_apply_every_kind():
    assert set(kinds_of("sqlite")) | set(kinds_of("zk")) == set(FAULT_KINDS)
    for store in STREAM_KINDS:
        kinds = {f.kind for f in make_schedule(11, RUN_SECONDS, kinds=kinds_of(store))}
        assert kinds == set(kinds_of(store)), store


def test_each_fix_can_still_be_reverted():
    """The campaign is shown to find each of issue 45's defects with its fix reverted
    (bkspark.testing.userfaults.reverts): every revert patch must still apply to the code."""
    from bkspark.testing.faults.common import REPO_ROOT
    from bkspark.testing.userfaults.reverts import PATCHES, patched
    for fix in PATCHES:
        changed = patched(REPO_ROOT, fix)
        assert changed and all(text for text in changed.values())


def test_schedule_is_a_function_of_the_seed():
    a = [f.to_json() for f in make_schedule(11, RUN_SECONDS)]
    assert a == [f.to_json() for f in make_schedule(11, RUN_SECONDS)]
    assert a != [f.to_json() for f in make_schedule(12, RUN_SECONDS)]
    assert {f["kind"] for f in a} == set(FAULT_KINDS)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "zk"])
# the runner's own bound: the run's seconds, then up to SCENARIO_GRACE_S for scenarios in flight
# (a one-off Spark query of the reset-checkpoint scenario takes 40-70 s on 2 busy cores), plus
# the cluster's start and the checker: above pytest.ini's 300 s (a CI run of 98a847e timed out
# at 300 s with part b of that scenario still running)
@pytest.mark.timeout(RUN_SECONDS + SCENARIO_GRACE_S + 240)
def test_user_campaign(store, tmp_path, request, faults_seed):
    import shutil
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        skip_or_fail("no Java: the user-level campaign runs Spark")
    from bkspark.testing.userfaults.runner import UserFaultRun
    zk = request.getfixturevalue("zookeeper") if store == "zk" else None
    seed = faults_seed + (1 if store == "zk" else 0)
    kinds = kinds_of(store)
    result = UserFaultRun(seed, RUN_SECONDS, store, str(tmp_path), zookeeper=zk,
                          kinds=kinds).run()
    print(run_line(result), result["faults"], result["rows_checked"], result["stream"])
    replay = (f"replay: python -m bkspark.testing.userfaults --seed {seed} --runs 1 "
              f"--store {store} --run-seconds {RUN_SECONDS} --kinds {','.join(kinds)} --keep")
    assert not result["violations"], \
        f"{result['violations_by_kind']}\n{result['violations'][:10]}\n{replay}"
    rows = result["rows_checked"]
    assert rows.get("appends", 0) > 1000, f"{rows}\n{replay}"
    assert rows.get("reader", 0) > 200, f"{rows}\n{replay}"
    assert rows.get("job-rows", 0) > 1000, f"{rows}\n{replay}"     # Spark jobs + 1,100 keys
    assert rows.get("stream-rows", 0) > 100, f"{rows}\n{replay}"
    missing = [k for k in kinds if not result["faults"].get(k)]
    assert not missing, f"fault kinds never applied: {missing}\n{result['fault_errors']}\n{replay}"
