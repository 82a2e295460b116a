"""The five defects the user-level campaign exists to find, each one a patch that reverts its
fix (issue 45): a campaign that does not report the defect with its fix reverted proves
nothing.

    python -m bkspark.testing.userfaults.reverts 3 --into /tmp/rev3
    PYTHONPATH=/tmp/rev3 python -m bkspark.testing.userfaults --seed 1 --store sqlite ...

``--into`` makes a copy of the working tree (``git worktree add --detach`` at HEAD, the
built extension copied in) and applies the patch there; the campaign run from that copy
(its subprocesses put the copy first on their PYTHONPATH) then runs the defective code.
Each patch is a list of exact replacements: when the code it reverts changes, applying it
fails, naming the file (``tests/faults/test_user_campaign.py`` applies each one in memory).

1. ``stream-skip`` -- the source re-derives a planned batch from a fresh LAC read that
   answers -1 when no bookie answers (the batch is cut, the next one starts past it).
2. ``superseded-write-acked`` -- an overwrite does not fence the live writer of the tail.
3. ``log-names-deleted-ledger`` / ``batch-not-exactly-once`` -- a lost answer is settled by
   whether the ledgers are listed (a truncation in between re-appends them); the Spark job's
   commit record (which also keeps a commit from being applied twice) is left out.
4. ``batch-not-exactly-once`` -- an expired writer id is taken for a new one.
5. ``stream-skip`` -- another Spark query under the same queryId commits its batch 0 as
   "already applied".
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys

from bkspark.testing.faults.common import REPO_ROOT

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
         "for lid, first, last, entry in self._available(logs, name, s, e, planned=True):",
         "for lid, first, last, entry in self._available(logs, name, s, e, planned=False):")],
    2: [("bkspark/log/store.py",
         """            self._seal_open_tail(edit, sealed)
            old = seg.read_segments(""",
         """            old = seg.read_segments(""")],
    3: [("bkspark/log/segments.py",
         """            outcome = change_outcome(head, version, *in_doubt)""",
         """            outcome = APPLIED if version == in_doubt[1] + 1 and \\
                head.stamp == in_doubt[0] else NOT_APPLIED"""),
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
}


def patched(root: str, fix: int) -> dict[str, str]:
    """The files fix ``fix``'s revert changes, as patched texts (path -> text).

    :raises ValueError: a replacement no longer matches (the fix's code changed)."""
    out: dict[str, str] = {}
    for path, old, new in PATCHES[fix]:
        if path not in out:
            with open(os.path.join(root, path)) as f:
                out[path] = f.read()
        if out[path].count(old) != 1:
            raise ValueError(f"revert {fix}: {path} no longer holds the code it reverts "
                             f"({old.strip().splitlines()[0][:60]!r}); update PATCHES")
        out[path] = out[path].replace(old, new)
    return out


def make_copy(fix: int, into: str) -> str:
    """A worktree of HEAD at ``into`` with fix ``fix`` reverted and the extension copied."""
    if os.path.exists(into):
        subprocess.run(["git", "-C", REPO_ROOT, "worktree", "remove", "--force", into],
                       capture_output=True)
        shutil.rmtree(into, ignore_errors=True)
    subprocess.run(["git", "-C", REPO_ROOT, "worktree", "add", "--detach", into, "HEAD"],
                   check=True, capture_output=True)
    for so in glob.glob(os.path.join(REPO_ROOT, "bkspark", "_native*.so")):
        shutil.copy2(so, os.path.join(into, "bkspark"))
    for path, text in patched(into, fix).items():
        with open(os.path.join(into, path), "w") as f:
            f.write(text)
    return into


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bkspark.testing.userfaults.reverts",
                                description="a copy of the tree with one fix of issue 45 reverted")
    p.add_argument("fix", type=int, choices=sorted(PATCHES))
    p.add_argument("--into", required=True)
    a = p.parse_args(argv)
    print(make_copy(a.fix, a.into))
    return 0


if __name__ == "__main__":
    sys.exit(main())
