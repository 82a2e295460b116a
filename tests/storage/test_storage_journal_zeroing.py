"""Journal zeroing (engine.c "journal zeroing"): groups land in space written ahead with zeros,
and a journal killed with that zeroed tail replays exactly what was acknowledged."""
import os
import signal
import subprocess
import sys
import time

from bkspark.bookie.storage import Storage, StorageConfig

CHILD = r"""
import sys
from bkspark.bookie.storage import Storage, StorageConfig
d = sys.argv[1]
s = Storage(StorageConfig(journal_dir=d + "/journal", ledger_dirs=[d + "/ledgers"],
                          journal_max_size_mb=16, checkpoint_interval_s=3600))
import time
deadline = time.monotonic() + 30
while s.stats()["journal_zeroed_bytes"] < (4 << 20) and time.monotonic() < deadline:
    time.sleep(0.01)
body = bytes(1000)
for b in range(160):                       # 160 groups of 64 x 1000 B: ~10 MB, past the gap
    st = s.add_entries([(7, b * 64 + i, b"k", False, body + b"%d" % (b * 64 + i)) for i in range(64)])
    assert all(x == 0 for x in st), st
    print("A", b * 64 + 63, flush=True)
st = s.stats()
print("S", st["journal_syncs"], st["journal_groups_unzeroed"], st["journal_zeroed_bytes"],
      st["journal_pos"], flush=True)
time.sleep(60)
"""


def test_groups_land_in_zeroed_space_and_a_killed_journal_replays_every_ack(tmp_path):
    d = str(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    p = subprocess.Popen([sys.executable, "-c", CHILD, d], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
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
    syncs, unzeroed, zeroed, pos = stats
    assert last == 160 * 64 - 1
    assert zeroed >= 4 << 20
    assert unzeroed < syncs, "no group was written into zeroed space"
    jfiles = [f for f in os.listdir(os.path.join(d, "journal")) if f.endswith(".txn")]
    assert os.path.getsize(os.path.join(d, "journal", max(jfiles))) > pos   # zeros ahead of the end
    s = Storage(StorageConfig(journal_dir=os.path.join(d, "journal"),
                              ledger_dirs=[os.path.join(d, "ledgers")], journal_max_size_mb=16))
    try:
        st = s.stats()
        assert st["replayed_records"] >= last + 1
        assert st["replay_truncated_bytes"] == 0      # what follows the last group is zeros
        assert s.last_entry_id(7) == last
        for e in (0, 4095, 4096, last):
            assert s.read_entry(7, e) == bytes(1000) + b"%d" % e
    finally:
        s.close()
