"""Which of a bookie's directories sit on a filesystem mounted with online discard.

With online discard (``-o discard`` on ext4 or XFS) a filesystem sends the disk a discard
for every extent it frees, as it frees it. A bookie frees space all the time: each journal
past ``journal_max_backups`` and each entry log compaction empties is removed. The discards
queue in front of the journal's ``fdatasync`` calls, and the adds wait. Measured on a
virtio disk under ext4 (2026-12-07, ``python bench/fs_delete_stall.py``), removing a 1 GiB
file held a concurrent 4 KiB ``fdatasync`` for up to 37-39 ms with ``discard`` and 6.5-8.1 ms
without.

The usual advice for databases holds here too: mount without ``discard``, and trim on a
schedule (``fstrim``, e.g. systemd's ``fstrim.timer``). btrfs's ``discard=async`` queues its
discards and sends them in the background, so it is not reported; nor is f2fs.

Not seen: ext4 whose superblock makes ``discard`` a default (``tune2fs -o discard``: mountinfo
leaves out options equal to the defaults; /proc/fs/ext4/<device>/options lists them), and a
container's overlay root, whose upper directory's disk is what frees the blocks.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Mount:
    device: str
    point: str
    fstype: str
    options: tuple[str, ...]        # the mount's own, then its filesystem's (super options)
    dev: tuple[int, int] = (-1, -1)  # its device's major:minor

    @property
    def online_discard(self) -> bool:
        """Discards sent as space is freed (``discard``, ``discard=sync``, JFS's
        ``discard=<minlen>``), not queued (btrfs ``discard=async``; f2fs, whose discard
        thread sends them in the background)."""
        if self.fstype == "f2fs":
            return False
        return any(o == "discard" or (o.startswith("discard=") and o != "discard=async")
                   for o in self.options)


_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a /proc/self/mountinfo text (proc(5)), in its order (later lines mount
    over earlier ones); malformed lines are skipped. Lines end at "\\n" and fields at " "
    only: the kernel escapes those (and tab and backslash) in names, and writes any other
    character -- a form feed, an ideographic space -- as it is; an empty source is two
    spaces."""
    mounts = []
    for line in text.split("\n"):
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            major, minor = (int(x) for x in fields[2].split(":"))
            fstype, source, super_options = fields[sep + 1:sep + 4]
        except ValueError:
            continue
        mounts.append(Mount(_unescape(source), _unescape(fields[4]), fstype,
                            tuple(fields[5].split(",")) + tuple(super_options.split(",")),
                            (major, minor)))
    return mounts


def _under(path: str, point: str) -> bool:
    point = point.rstrip("/") or "/"
    return path == point or path.startswith(point if point == "/" else point + "/")


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount ``path`` lies on. Its device decides (a mount hidden by a later one over a
    parent directory has another device than the path); among the mounts of that device (bind
    mounts share one filesystem, and its options) the one whose point holds the path, else
    the last. A device no mount lists (a btrfs subvolume's own) falls back to the longest
    mount point holding the path."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
        same = [m for m in mounts if m.dev == (os.major(st.st_dev), os.minor(st.st_dev))]
    except OSError:
        same = []
    if same:
        holding = [m for m in same if _under(real, m.point)]
        return (holding or same)[-1]
    best = None
    for m in mounts:
        longer = best is None or len(m.point.rstrip("/")) >= len(best.point.rstrip("/"))
        if _under(real, m.point) and longer:
            best = m
    return best


def online_discard_dirs(dirs, mountinfo_text: str | None = None) -> list[tuple[str, Mount]]:
    """``(directory, its mount)`` for each of ``dirs`` on a filesystem mounted with online
    discard; empty where /proc/self/mountinfo cannot be read (not Linux). Undecodable bytes in
    it (a mount point's name) are kept as ``os`` keeps them in paths."""
    if mountinfo_text is None:
        try:
            with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
                mountinfo_text = f.read()
        except (OSError, ValueError):
            return []
    mounts = parse_mountinfo(mountinfo_text)
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
