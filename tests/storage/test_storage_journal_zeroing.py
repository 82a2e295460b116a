"""Journal zeroing (bookie_native/journal.c "journal zeroing"): groups land in space written ahead with zeros,
the journal rolls into a next file the zeroer prepared, and a journal killed with a zeroed
tail (and a prepared, unused next file) replays exactly what was acknowledged."""
import os
import signal
import subprocess
import sys
import time

from bkspark.bookie.storage import Storage, StorageConfig

CHILD = r"""
import os, sys, time
from bkspark.bookie.storage import Storage, StorageConfig
d, journal_mb, groups, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = Storage(StorageConfig(journal_dir=d + "/journal", ledger_dirs=[d + "/ledgers"],
                          journal_max_size_mb=journal_mb, checkpoint_interval_s=3600))
deadline = time.monotonic() + 30
while s.stats()["journal_zeroed_bytes"] < (1 << 20) and time.monotonic() < deadline:
    time.sleep(0.01)
body = bytes(size)
for b in range(groups):                    # groups of 64 entries
    st = s.stats()
    if st["journal_pos"] + 128 * (size + 100) >= journal_mb << 20:
        # about to roll: wait for the zeroer's next file, so the roll adopts it
        nxt = "%s/journal/%016x.txn" % (d, st["journal_id"] + 1)
        deadline = time.monotonic() + 30
        while not os.path.exists(nxt) and time.monotonic() < deadline:
            time.sleep(0.01)
    st = s.add_entries([(7, b * 64 + i, b"k", False, body + b"%d" % (b * 64 + i)) for i in range(64)])
    assert all(x == 0 for x in st), st
    print("A", b * 64 + 63, flush=True)
st = s.stats()
print("S", st["journal_syncs"], st["journal_groups_unzeroed"], st["journal_zeroed_bytes"],
      st["journal_pos"], st["journal_id"], st["journal_rolls_prepared"], st["journal_bytes"],
      flush=True)
time.sleep(60)
"""


def _run_killed(d: str, journal_mb: int, groups: int, size: int = 1000):
    """Run CHILD, SIGKILL it once it reported; (last acknowledged entry, its stats line)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    p = subprocess.Popen([sys.executable, "-c", CHILD, d, str(journal_mb), str(groups), str(size)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    last, stats = -1, None
    try:
        for line in p.stdout:
            f = line.split()
            if f[0] == b"A":
                last = int(f[1])
            elif f[0] == b"S":
                stats = [int(x) for x in f[1:]]
                break
    finally:
        p.send_signal(signal.SIGKILL)           # no close, no checkpoint: replay has it all
        err = p.communicate()[1]
    assert stats is not None, err.decode()[-3000:]
    return last, stats


def _check_replay(d: str, journal_mb: int, last: int, size: int = 1000) -> None:
    s = Storage(StorageConfig(journal_dir=os.path.join(d, "journal"),
                              ledger_dirs=[os.path.join(d, "ledgers")], journal_max_size_mb=journal_mb))
    try:
        st = s.stats()
        assert st["replayed_records"] >= last + 1
        assert st["replay_truncated_bytes"] == 0      # what follows the last group is zeros
        assert s.last_entry_id(7) == last
        for e in sorted({0, min(4095, last), min(4096, last), last // 2, last}):
            assert s.read_entry(7, e) == bytes(size) + b"%d" % e
    finally:
        s.close()


def test_groups_land_in_zeroed_space_and_a_killed_journal_replays_every_ack(tmp_path):
    d = str(tmp_path)
    last, (syncs, unzeroed, zeroed, pos, jid, _rolls, _jbytes) = _run_killed(d, 16, 160)  # ~10 MB
    assert last == 160 * 64 - 1
    assert zeroed >= 4 << 20
    assert unzeroed < syncs, "no group was written into zeroed space"
    current = os.path.join(d, "journal", "%016x.txn" % jid)
    assert os.path.getsize(current) > pos   # zeros ahead of the end
    _check_replay(d, 16, last)


def test_the_journal_rolls_into_the_file_the_zeroer_prepared(tmp_path):
    """2 MiB journals, ~10 MB written: every roll adopts the prepared next file (a swap of
    descriptors, no file creation under the journal's lock); the groups in those files, and
    the prepared file left unused at the kill, replay cleanly."""
    d = str(tmp_path)
    last, (syncs, unzeroed, _zeroed, _pos, jid, rolls, _jbytes) = _run_killed(d, 2, 160)
    assert last == 160 * 64 - 1
    assert jid >= 5, jid                     # rolled at least 4 times
    assert rolls == jid - 1, (rolls, jid)    # ... each into the prepared file
    assert unzeroed < syncs / 2
    names = sorted(f for f in os.listdir(os.path.join(d, "journal")) if f.endswith(".txn"))
    assert "%016x.txn" % (jid + 1) in names, names   # the next one, prepared and unused
    _check_replay(d, 2, last)
    # the unused prepared file is an empty journal: the reopened storage wrote past it
    names = sorted(f for f in os.listdir(os.path.join(d, "journal")) if f.endswith(".txn"))
    assert max(names) >= "%016x.txn" % (jid + 2), names


def test_big_groups_are_not_zeroed_ahead_but_still_roll_into_a_prepared_file(tmp_path):
    """Groups of 64 x 8 KB (~520 KB, over JZ_BULK): writing them twice would cost more than the
    block-map update of fallocate'd space, so the zeroer leaves the files alone (after the
    first groups, while the average group size climbs) -- and still prepares each next file."""
    d = str(tmp_path)
    last, (syncs, unzeroed, zeroed, _pos, jid, rolls, jbytes) = _run_killed(d, 2, 40, 8000)
    assert last == 40 * 64 - 1
    assert jid >= 5, jid
    assert rolls == jid - 1, (rolls, jid)
    assert zeroed < jbytes / 4, (zeroed, jbytes)      # small groups at first only
    assert unzeroed > syncs / 2, (unzeroed, syncs)
    _check_replay(d, 2, last, 8000)
