"""Copies of the working tree with one fix reverted: a campaign that does not report the defect
with its fix reverted proves nothing (``bkspark.testing.userfaults.reverts``,
``bkspark.testing.diskfaults.reverts`` hold the patches).

A patch is a list of exact replacements ``(path, old, new)``: when the code it reverts changes,
applying it fails, naming the file (each campaign's tests apply every patch in memory).
:func:`make_copy` makes ``git worktree add --detach`` of HEAD, applies the patch there and
builds the extension in it when the patch changes ``bookie_native/`` (else copies the built
one); a campaign run from that copy (``PYTHONPATH=<copy>``; its subprocesses put the copy first
on their path) runs the defective code.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys

from bkspark.testing.faults.common import REPO_ROOT

Patch = list[tuple[str, str, str]]


def patched(patches: dict[int, Patch], root: str, fix: int) -> dict[str, str]:
    """The files fix ``fix``'s revert changes, as patched texts (path -> text).

    :raises ValueError: a replacement no longer matches (the fix's code changed)."""
    out: dict[str, str] = {}
    for path, old, new in patches[fix]:
        if path not in out:
            with open(os.path.join(root, path)) as f:
                out[path] = f.read()
        if out[path].count(old) != 1:
            raise ValueError(f"revert {fix}: {path} no longer holds the code it reverts "
                             f"({old.strip().splitlines()[0][:60]!r}); update the patch")
        out[path] = out[path].replace(old, new)
    return out


def make_copy(patches: dict[int, Patch], fix: int, into: str) -> str:
    """A worktree of HEAD at ``into`` with fix ``fix`` reverted and the extension in place."""
    if os.path.exists(into):
        subprocess.run(["git", "-C", REPO_ROOT, "worktree", "remove", "--force", into],
                       capture_output=True)
        shutil.rmtree(into, ignore_errors=True)
    subprocess.run(["git", "-C", REPO_ROOT, "worktree", "add", "--detach", into, "HEAD"],
                   check=True, capture_output=True)
    changed = patched(patches, into, fix)
    for path, text in changed.items():
        with open(os.path.join(into, path), "w") as f:
            f.write(text)
    if any(p.startswith("bookie_native/") for p in changed):
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=into,
                       check=True, capture_output=True)
    else:
        for so in glob.glob(os.path.join(REPO_ROOT, "bkspark", "_native*.so")):
            shutil.copy2(so, os.path.join(into, "bkspark"))
    return into


def main(patches: dict[int, Patch], prog: str, issue: str, argv=None) -> int:
    """``prog FIX --into DIR``: print the copy made by :func:`make_copy`."""
    p = argparse.ArgumentParser(prog=prog,
                                description=f"a copy of the tree with one fix of {issue} reverted")
    p.add_argument("fix", type=int, choices=sorted(patches))
    p.add_argument("--into", required=True)
    a = p.parse_args(argv)
    print(make_copy(patches, a.fix, a.into))
    return 0
