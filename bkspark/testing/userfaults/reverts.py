"""The defects the user-level campaign exists to find, each one a patch that reverts its
fix (issues 45 and 47): a campaign that does not report the defect with its fix reverted proves
nothing.

    python -m bkspark.testing.userfaults.reverts 3 --into /tmp/rev3
    PYTHONPATH=/tmp/rev3 python -m bkspark.testing.userfaults --seed 1 --store sqlite ...

``--into`` makes a copy of the working tree with the patch applied
(:func:`bkspark.testing.reverts.make_copy`); the campaign run from that copy runs the defective
code. ``tests/faults/test_user_campaign.py`` applies each patch in memory.

1. ``stream-skip`` -- the source re-derives a planned batch from a fresh LAC read that
   answers -1 when no bookie answers (the batch is cut, the next one starts past it).
2. ``superseded-write-acked`` -- an overwrite does not fence the live writer of the tail.
3. ``log-names-deleted-ledger`` / ``batch-not-exactly-once`` -- a lost answer is settled by
   whether the ledgers are listed (a truncation in between re-appends them); the Spark job's
   commit record (which also keeps a commit from being applied twice) is left out.
4. ``batch-not-exactly-once`` -- an expired writer id is taken for a new one.
5. ``stream-skip`` -- another Spark query under the same queryId commits its batch 0 as
   "already applied".
6. ``retention-too-early`` (issue 47) -- retention judges ages by the enforcing host's wall
   clock and acts whatever that clock says (the ``clock_skew`` fault runs it 8 days fast).
"""
from __future__ import annotations

import sys

from bkspark.testing import reverts

PATCHES: dict[int, list[tuple[str, str, str]]] = {
    1: [("bkspark/client/api.py",
         """        if md.state is not LedgerState.CLOSED and read_lac:
            rh.try_read_last_add_confirmed()""",
         """        if md.state is not LedgerState.CLOSED and read_lac:
            try:
                rh.try_read_last_add_confirmed()
            except errors.BKError as exc:
                log.info("ledger %d: LAC unknown at open: %s", ledger_id, exc)"""),
        ("bkspark/spark/stream.py",
         "self._available(logs, name, s, e, planned=True))",
         "self._available(logs, name, s, e, planned=False))")],
    2: [("bkspark/log/store.py",
         """            self._seal_open_tail(edit, sealed)
            old = seg.read_segments(""",
         """            old = seg.read_segments(""")],
    3: [("bkspark/log/segments.py",
         """    outcomes = {change_outcome(heads[n][0], heads[n][1], *in_doubt[n]) for n in heads}""",
         """    outcomes = {APPLIED if heads[n][1] == in_doubt[n][1] + 1 and
                heads[n][0].stamp == in_doubt[n][0] else NOT_APPLIED for n in heads}"""),
        ("bkspark/log/segments.py",
         """        return int(index[0]) < head.first""",
         """        return False"""),
        ("bkspark/spark/writer.py",
         """                kw["mark"] = pending.commit_mark(self.job)""",
         """                pass""")],
    4: [("bkspark/log/segments.py",
         """            if self._filter_holds(writer_id):""",
         """            if False:""")],
    5: [("bkspark/spark/writer.py",
         """        if done >= 0 and committed_for and spark_query and committed_for != spark_query:""",
         """        if False:""")],
    6: [("bkspark/log/retention.py",
         """    now = logs.store.clock.now_ms() if now_ms is None else now_ms""",
         """    now = int(time.time() * 1000) if now_ms is None else now_ms"""),
        ("bkspark/log/retention.py",
         """        now_ms = logs.store.clock.check_skew(f"retention of log {name}")""",
         """        pass"""),
        ("bkspark/log/retention.py",
         """import logging
import math
import re
""",
         """import logging
import math
import re
import time
"""),
        ("bkspark/recovery/retention.py",
         """            self.logs.store.clock.check_skew("retention pass")
            names = self.logs.list_logs()
""",
         """            names = self.logs.list_logs()
"""),
        ("bkspark/recovery/retention.py",
         """                now = self.logs.store.clock.check_skew("retention pass")
""",
         """                now = int(time.time() * 1000)
""")],
}


def patched(root: str, fix: int) -> dict[str, str]:
    """The files fix ``fix``'s revert changes, as patched texts (:func:`bkspark.testing.reverts.patched`)."""
    return reverts.patched(PATCHES, root, fix)


def main(argv=None) -> int:
    return reverts.main(PATCHES, "python -m bkspark.testing.userfaults.reverts", "issues 45, 47",
                        argv)


if __name__ == "__main__":
    sys.exit(main())
