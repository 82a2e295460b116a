"""Data, metadata and credentials bkspark creates are private to the user that runs it
(issue 48): directories are created 0700 and files 0600 (less the umask), so another local
user reads no entry, journal, index, embedded metadata store or cluster record. Directories
that exist already keep their mode (an operator's choice); their contents created by bkspark
are private all the same. The storage engine applies the same rule in C (``DATA_DIR_MODE``,
``DATA_FILE_MODE`` in ``bookie_native/engine_int.h``).
"""
from __future__ import annotations

import os

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_dir(path: str) -> str:
    """Create ``path`` (and missing parents) if absent; the directory itself 0700."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    return path


def open_file(path: str, mode: str = "w"):
    """``open(path, mode)``, the file being 0600 -- one it creates, and one that existed (it
    is about to hold what this process writes)."""
    def opener(p, flags):
        fd = os.open(p, flags, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
        except OSError:
            pass                    # not ours to change (the owner's choice stays)
        return fd
    return open(path, mode, opener=opener)


def restrict_umask() -> None:
    """For a daemon (a bookie): everything the process creates from now on -- its own files,
    the index's (RocksDB), the logs -- is private, whatever the umask it inherited."""
    os.umask(0o077)


def create_file(path: str) -> bool:
    """Create ``path`` empty and private (0600) unless it exists; whether it was created."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
        return True
    except FileExistsError:
        return False
