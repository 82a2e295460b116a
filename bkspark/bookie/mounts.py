"""Which of a bookie's directories sit on a filesystem mounted with online discard.

With online discard (``-o discard`` on ext4 or XFS) a filesystem sends the disk a discard
for every extent it frees, as it frees it. A bookie frees space all the time: each journal
past ``journal_max_backups`` and each entry log compaction empties is removed. The discards
queue in front of the journal's ``fdatasync`` calls, and the adds wait. Measured on a
virtio disk under ext4 (2026-12-07, ``python bench/fs_delete_stall.py``), removing a 1 GiB
file held a concurrent 4 KiB ``fdatasync`` for up to 37-39 ms with ``discard`` and 6.5-8.1 ms
without. In ``python bench/gc_stall.py`` the bookies' paced 64 KiB adds had a p99 of 5-6 ms
without ``discard`` and 27 ms with it, with the same code on the same machine.

The usual advice for databases holds here too: mount without ``discard``, and trim on a
schedule (``fstrim``, e.g. systemd's ``fstrim.timer``). btrfs's ``discard=async`` queues its
discards and sends them in the background, so it is not reported.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

MOUNTS = "/proc/self/mounts"


@dataclass(frozen=True)
class Mount:
    device: str
    point: str
    fstype: str
    options: tuple[str, ...]

    @property
    def online_discard(self) -> bool:
        """Discards sent as space is freed (``discard``, ``discard=sync``), not queued."""
        return any(o in ("discard", "discard=sync") for o in self.options)


def _unescape(field: str) -> str:
    """A /proc/mounts field with its octal escapes (``\\040`` for a space) decoded."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mounts(text: str) -> list[Mount]:
    """The mounts of a /proc/mounts text, in its order (later lines mount over earlier ones);
    malformed lines are skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mounts.append(Mount(_unescape(fields[0]), _unescape(fields[1]), fields[2],
                            tuple(fields[3].split(","))))
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount ``path`` (resolved) lies on: the longest mount point containing it, the
    last one mounted where several share it."""
    path = os.path.realpath(path)
    best = None
    for m in mounts:
        point = m.point.rstrip("/") or "/"
        inside = path == point or path.startswith(point if point == "/" else point + "/")
        if inside and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = m
    return best


def online_discard_dirs(dirs, mounts_text: str | None = None) -> list[tuple[str, Mount]]:
    """``(directory, its mount)`` for each of ``dirs`` on a filesystem mounted with online
    discard; empty where /proc/self/mounts cannot be read (not Linux)."""
    if mounts_text is None:
        try:
            with open(MOUNTS) as f:
                mounts_text = f.read()
        except OSError:
            return []
    mounts = parse_mounts(mounts_text)
    found = []
    for d in dirs:
        m = mount_of(d, mounts)
        if m is not None and m.online_discard:
            found.append((d, m))
    return found


def discard_warning(directory: str, mount: Mount) -> str:
    """The bookie's start-up warning for ``directory`` on ``mount``: the problem and the fix."""
    return (f"{directory} is on {mount.device} ({mount.fstype} at {mount.point}), mounted with "
            "online discard: each journal or entry log the bookie removes makes the disk "
            "discard its blocks in front of the journal's syncs, and adds wait (a 1 GiB removal "
            "held syncs 37-39 ms against 6-8 ms without, bkspark/bookie/mounts.py). Remount it "
            f"without discard (mount -o remount,nodiscard {mount.point}, and in /etc/fstab) and "
            "trim on a schedule instead (fstrim, e.g. systemd's fstrim.timer)")
