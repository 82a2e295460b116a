"""Child process for test_storage_clock_step: a store whose wall clock the test steps.

Usage: clock_step_child.py <dir>
  Opens a store with a checkpoint every 0.25 s, then adds an entry every 50 ms and prints after
  each "STAT <monotonic s> <wall s> <checkpoints> <mark id> <mark pos>" until the end of stdin,
  which closes the store.  (No time.sleep: under libfaketime it fails,
  bkspark/testing/clockskew.py.)
"""
import os
import select
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bkspark.bookie.storage import Storage, StorageConfig  # noqa: E402

CHECKPOINT_INTERVAL_S = 0.25


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(d: str) -> None:
    s = Storage(StorageConfig(journal_dir=os.path.join(d, "j"), ledger_dirs=[os.path.join(d, "l")],
                              journal_max_size_mb=16, checkpoint_interval_s=CHECKPOINT_INTERVAL_S))
    entry = 0
    while True:
        assert s.add_entries([(1, entry, b"k", False, b"x" * 100)]) == [0]
        entry += 1
        mark = s.last_log_mark()
        out(f"STAT {time.monotonic():.3f} {time.time():.3f} {s.stats()['checkpoints']} {mark[0]} {mark[1]}")
        if select.select([0], [], [], 0.05)[0] and not os.read(0, 4096):
            break
    s._store.close(checkpoint=False)


if __name__ == "__main__":
    main(sys.argv[1])
