"""The defect the disk-fault campaign exists to find, as a patch that reverts its fix (issue 46;
:mod:`bkspark.testing.reverts`):

    python -m bkspark.testing.diskfaults.reverts 1 --into /tmp/rev-disk1
    PYTHONPATH=/tmp/rev-disk1 python -m bkspark.testing.diskfaults --seed 1 --runs 60

1. ``acked-entry-lost`` -- a failed entry-log writeback (``sync_file_range``) is ignored: the
   error, reported once, is consumed, the next fdatasync of the descriptor returns 0, and the
   LastLogMark moves past the lost pages.
"""
from __future__ import annotations

import sys

from bkspark.testing import reverts

PATCHES: dict[int, reverts.Patch] = {
    1: [("bookie_native/entrylog.c",
         """            errno != ENOSYS && errno != EINVAL)
            return -1;""",
         """            errno != ENOSYS && errno != EINVAL && 0)
            return -1;""")],
}


def main(argv=None) -> int:
    return reverts.main(PATCHES, "python -m bkspark.testing.diskfaults.reverts", "issue 46", argv)


if __name__ == "__main__":
    sys.exit(main())
