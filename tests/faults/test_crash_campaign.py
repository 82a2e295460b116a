"""Bookie processes SIGKILLed at random points under load (journal group commits, write-cache
flushes every 100 ms, journal/entry-log rolls, GC + compaction every 0.5 s); after each
restart every acknowledged entry is there and byte-identical, and fences hold."""
import os

from bkspark.testing.crash import format_crash, run_crash_campaign

KILLS = int(os.environ.get("BKSPARK_CRASH_KILLS", "40"))


def test_crash_campaign(tmp_path, faults_seed):
    r = run_crash_campaign(faults_seed, KILLS, str(tmp_path), keep=True, max_seconds=55)
    print(format_crash(r))
    assert not r["violations"], format_crash(r)
    assert r["kills"] >= min(KILLS, 15), format_crash(r)
    assert r["entries_verified"] > 0 and r["checkpoints"] > 0, format_crash(r)
