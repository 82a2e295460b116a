"""Bounded fault runs over both metadata stores, and the checker's own self-test.

A run: 5 bookies, 2 ledger-writer processes and 1 log-writer process, a seeded schedule of
every fault kind (bookie SIGKILL/restart, SIGSTOP pauses, injected delays/drops/failures,
writer SIGKILL, concurrent recovery, log takeover, metadata session expiry, disk-full),
then the invariant checker. A failure prints the seed that replays it.
"""
import os

import pytest

from bkspark.client import BookKeeper
from bkspark.testing.cluster import BookieCluster
from bkspark.testing.faults import (FAULT_KINDS, PASSWORD, Checker, FaultRun, make_record,
                                    make_schedule, run_line)
from metadata.ledgers import write_ledger

RUN_SECONDS = float(os.environ.get("BKSPARK_FAULTS_RUN_SECONDS", "18"))


def test_schedule_is_a_function_of_the_seed():
    a = [f.to_json() for f in make_schedule(11, 60, 5, 3)]
    assert a == [f.to_json() for f in make_schedule(11, 60, 5, 3)]
    assert a != [f.to_json() for f in make_schedule(12, 60, 5, 3)]
    assert {f["kind"] for f in a} == set(FAULT_KINDS)


@pytest.mark.parametrize("store", ["sqlite", "zk"])
def test_fault_run(store, tmp_path, request, faults_seed):
    zk = request.getfixturevalue("zookeeper") if store == "zk" else None
    seed = faults_seed + (1 if store == "zk" else 0)
    run = FaultRun(seed, RUN_SECONDS, store, str(tmp_path), zookeeper=zk)
    result = run.run()
    print(run_line(result), result["faults"])
    replay = f"replay: python -m bkspark.testing.faults --seed {seed} --runs 1 --store {store} " \
             f"--run-seconds {RUN_SECONDS}"
    assert not result["violations"], f"{result['violations'][:10]}\n{replay}"
    assert result["entries_acked"] > 200, replay
    assert result["ledgers_checked"] >= 4, replay
    assert result["log_ledgers"] >= 2 and result["log_entries_acked"] > 50, replay
    applied = set(result["faults"])
    assert applied >= set(FAULT_KINDS) - {"log_takeover", "recover_ledger"}, (applied, replay)


def _write_acks(path, lines):
    with open(path, "a") as f:
        for line in lines:
            f.write(" ".join(map(str, line)) + "\n")


def test_checker_catches_planted_violations(tmp_path):
    """Each invariant the checker guards fires on a planted violation, and only there."""
    uri = f"sqlite:///{tmp_path}/meta.db"
    work = tmp_path / "work"
    work.mkdir()
    with BookieCluster(uri, num_bookies=3, data_dir=tmp_path / "bk", session_timeout=1.0) as c, \
            BookKeeper(uri) as bk:
        ledgers = {}
        for name in ("clean", "past-end", "bad-record", "mismatch", "truncated", "end-moved"):
            lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
            lines = [("L", lh.ledger_id, 3, 2, 2)]
            for seq in range(10):
                data = make_record(7, seq, 40)
                if name == "bad-record" and seq == 4:
                    data = b"not a record" * 3
                eid = lh.append(data)
                acked_seq = 99 if (name == "mismatch" and seq == 3) else seq
                lines.append(("A", lh.ledger_id, eid, acked_seq))
            if name == "past-end":
                lines.append(("A", lh.ledger_id, 12, 12))      # an ack the ledger never kept
            if name == "truncated":                             # close at 4: entries 5..9 lost
                md, version = bk.ctx.read_metadata(lh.ledger_id)
                write_ledger(bk.store, md.with_closed(4, 0), version)
            else:
                lh.close()
            if name == "end-moved":
                lines.append(("C", lh.ledger_id, 7))            # writer recorded another end
            _write_acks(work / "worker-7.acks", lines)
            ledgers[name] = lh.ledger_id
        result = Checker(uri, str(work), c, say=lambda *a: None).check()
    found = {}
    for v in result["violations"]:
        found.setdefault(v.get("ledger"), set()).add(v["invariant"])
    assert ledgers["clean"] not in found, [v for v in result["violations"] if v.get("ledger") == ledgers["clean"]]
    assert "acked-entry-lost" in found[ledgers["past-end"]]
    assert "bad-record" in found[ledgers["bad-record"]]
    assert "ack-mismatch" in found[ledgers["mismatch"]]
    assert "acked-entry-lost" in found[ledgers["truncated"]]
    assert "end-moved" in found[ledgers["end-moved"]]
