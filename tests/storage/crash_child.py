"""Child process for test_storage_crash: adds/fences/deletes in a loop, printing what was acked.

Usage: crash_child.py <dir> <run> <seed>
Prints "R" once open, then one line per acknowledged operation:
  "A <ledger> <first> <last>"  entries first..last of ledger acked (bodies from body_for())
  "F <ledger>"                 fence acked
  "d <ledger>" / "D <ledger>"  delete started / acked
"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bkspark.bookie.storage import Storage, StorageConfig  # noqa: E402


def body_for(ledger: int, entry: int) -> bytes:
    n = (ledger * 7919 + entry * 104729) % 3000
    return (f"{ledger}:{entry}:".encode() * (n // 6 + 1))[:n + 8]


def config(d: str) -> StorageConfig:
    return StorageConfig(journal_dir=os.path.join(d, "journal"), ledger_dirs=[os.path.join(d, "l0"), os.path.join(d, "l1")],
                         write_cache_bytes=512 << 10, journal_max_size_mb=1, journal_max_backups=1,
                         entry_log_max_size=256 << 10, journal_max_group_wait_ms=0.5,
                         checkpoint_interval_s=0.2, compaction_threshold=0.6,
                         compaction_max_bytes_per_pass=256 << 10)


def main():
    d, run, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rnd = random.Random(seed)
    s = Storage(config(d))
    out = sys.stdout
    out.write("R\n")
    out.flush()
    ledgers = [run * 10 + k for k in range(4)]
    nxt = {lid: 0 for lid in ledgers}
    fence_at = rnd.randint(5, 60)
    step = 0
    while True:
        step += 1
        lid = rnd.choice(ledgers)
        n = rnd.randint(1, 40)
        first = nxt[lid]
        st = s.add_entries([(lid, first + i, b"key%d" % lid, False, body_for(lid, first + i)) for i in range(n)])
        ok = [i for i, x in enumerate(st) if x == 0]
        if ok:
            assert ok == list(range(len(ok))), st
            out.write(f"A {lid} {first} {first + len(ok) - 1}\n")
            nxt[lid] = first + len(ok)
        out.flush()
        if step == fence_at:
            assert s.fence(ledgers[3], b"key%d" % ledgers[3]) == 0
            out.write(f"F {ledgers[3]}\n")
            out.flush()
        if run > 0 and step % 25 == 0:
            victim = (run - 1) * 10 + rnd.randint(0, 3)
            out.write(f"d {victim}\n")
            out.flush()
            s.delete_ledger(victim)
            out.write(f"D {victim}\n")
            out.flush()
        if step % 40 == 0:
            s.compact()


if __name__ == "__main__":
    main()
