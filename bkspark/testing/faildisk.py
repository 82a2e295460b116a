"""A real block device that fails writes, for tests of a bookie's disk errors (issue 46).

An ext4 file system without a journal on a loop device whose backing file is sparse on a small
tmpfs: the file system believes it has ``size_mb``, the tmpfs holds ``backing_mb`` (its
metadata blocks all written at creation, so that only data written to fresh blocks fails). Once the
tmpfs is full (:meth:`FailingDevice.starve` fills it), the loop device fails the writes of
blocks it never stored -- at writeback, after ``write()`` returned: the kernel marks the pages
clean, logs "potential data loss" and reports ``EIO`` once per open file (to
``sync_file_range`` or ``fdatasync``). :meth:`feed` gives the space back; :meth:`remount` drops
the page cache, so reads see what the device holds (what a restart would).

Needs root, ``losetup``, ``mkfs.ext4`` and loop devices (:func:`unavailable` says why not).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile


def unavailable() -> str | None:
    """Why a failing device cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (mount, losetup)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not os.path.exists("/dev/loop-control"):
        return "needs loop devices (/dev/loop-control)"
    return None


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


class FailingDevice:
    """``mountpoint``: the file system on the device (use a directory under it). A context
    manager: leaving it unmounts and detaches everything."""

    def __init__(self, size_mb: int = 64, backing_mb: int = 12):
        self.base = tempfile.mkdtemp(prefix="bkspark-faildisk-")
        self.backing = os.path.join(self.base, "backing")
        self.mountpoint = os.path.join(self.base, "fs")
        os.makedirs(self.backing)
        os.makedirs(self.mountpoint)
        self.loop = None
        self._mounted = []
        try:
            _run("mount", "-t", "tmpfs", "-o", f"size={backing_mb}m", "tmpfs", self.backing)
            self._mounted.append(self.backing)
            self.image = os.path.join(self.backing, "image")
            with open(self.image, "wb") as f:
                f.truncate(size_mb << 20)
            self.loop = _run("losetup", "--find", "--show", self.image)
            # every metadata block written now (no lazy init): later writes to it are rewrites
            # of stored blocks and succeed, so only data written to fresh blocks fails -- a
            # failed metadata write would lose data fdatasync had already confirmed, and the
            # tests' oracle would blame the engine for the device
            _run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-N", "1024", "-E",
                 "lazy_itable_init=0,lazy_journal_init=0,nodiscard", self.loop)
            self._mount()
        except BaseException:
            self.close()
            raise

    def _mount(self) -> None:
        _run("mount", self.loop, self.mountpoint)
        self._mounted.append(self.mountpoint)

    def starve(self, leave_bytes: int = 0) -> None:
        """Fill the tmpfs behind the device, leaving about ``leave_bytes``: the device's writes
        to blocks it never stored fail from then on."""
        st = os.statvfs(self.backing)
        free = st.f_bavail * st.f_frsize
        with open(os.path.join(self.backing, "filler"), "ab") as f:
            left = max(0, free - leave_bytes)
            chunk = b"\0" * (1 << 20)
            try:
                while left > 0:
                    n = f.write(chunk[:min(len(chunk), left)])
                    left -= n
                    f.flush()
            except OSError:
                pass                                    # (full: as wanted)

    def feed(self) -> None:
        """Give the tmpfs's space back: the device stores writes again."""
        try:
            os.unlink(os.path.join(self.backing, "filler"))
        except FileNotFoundError:
            pass

    def remount(self) -> None:
        """Unmount and mount the file system again (every file on it must be closed): its page
        cache is dropped, reads come from the device."""
        _run("umount", self.mountpoint)
        self._mounted.remove(self.mountpoint)
        self._mount()

    def close(self) -> None:
        for m in reversed(self._mounted):
            subprocess.run(["umount", "-l", m], capture_output=True)
        self._mounted = []
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
            self.loop = None
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
