"""Child process for test_storage_journal_dirs: a store with two journal directories; each call
adds entries of several ledgers at once (a batch spans both journals), printing what was acked.

Usage: jdirs_child.py <dir> <run> <seed>
Prints "R" once open, then one line per acknowledged operation:
  "A <ledger> <first> <last>"  entries first..last of ledger acked (bodies from body_for())
  "F <ledger>"                 fence acked
  "L <ledger> <n>"             explicit LAC b"lac<n>" acked
"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bkspark.bookie.storage import Storage, StorageConfig  # noqa: E402
from crash_child import body_for  # noqa: E402,F401  (the same bodies; this script's dir is sys.path[0])


def config(d: str) -> StorageConfig:
    return StorageConfig(journal_dirs=[os.path.join(d, "j0"), os.path.join(d, "j1")],
                         ledger_dirs=[os.path.join(d, "l0"), os.path.join(d, "l1")],
                         write_cache_bytes=512 << 10, journal_max_size_mb=1, journal_max_backups=1,
                         entry_log_max_size=256 << 10, journal_max_group_wait_ms=0.5,
                         checkpoint_interval_s=0.2)


def main():
    d, run, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rnd = random.Random(seed)
    s = Storage(config(d))
    out = sys.stdout
    out.write("R\n")
    out.flush()
    ledgers = [run * 10 + k for k in range(6)]  # three of each journal
    nxt = {lid: 0 for lid in ledgers}
    fence_at = rnd.randint(5, 40)
    step = 0
    while True:
        step += 1
        batch, want = [], []
        for lid in rnd.sample(ledgers[:5], rnd.randint(1, 4)):
            n = rnd.randint(1, 10)
            first = nxt[lid]
            batch += [(lid, first + i, b"key%d" % lid, False, body_for(lid, first + i)) for i in range(n)]
            want.append((lid, first, n))
        st = s.add_entries(batch)
        assert all(x == 0 for x in st), st
        for lid, first, n in want:
            out.write(f"A {lid} {first} {first + n - 1}\n")
            nxt[lid] = first + n
        out.flush()
        if step == fence_at:
            assert s.add_entries([(ledgers[5], 0, b"k5", False, body_for(ledgers[5], 0))]) == [0]
            out.write(f"A {ledgers[5]} 0 0\n")
            assert s.fence(ledgers[5], b"k5") == 0
            out.write(f"F {ledgers[5]}\n")
            out.flush()
        if step % 7 == 0:
            lid = rnd.choice([x for x in ledgers[:5] if nxt[x] > 0])
            s.set_explicit_lac(lid, b"lac%d" % step)
            out.write(f"L {lid} {step}\n")
            out.flush()


if __name__ == "__main__":
    main()
