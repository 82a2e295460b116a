"""The embedded SQLite store when another process holds its write lock (e.g. a process
stopped with SIGSTOP in the middle of a write transaction)."""
from __future__ import annotations

import multiprocessing
import sqlite3
import time

import pytest

from bkspark.errors import MetadataConnectionError
from metadata import open_store
from metadata import sqlite_store
from metadata import testing as mt

SPAWN = multiprocessing.get_context("spawn")


def test_reads_never_wait_for_a_stuck_writer(tmp_path, monkeypatch):
    """Found by the fault runner: with a dead session to reap, every read tried to take the
    write lock first, so a bookie paused inside a write transaction stalled all readers
    (including the process that was to resume it) for the busy timeout."""
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT", 3.0)
    uri = f"sqlite:///{tmp_path}/meta.db"
    store = open_store(uri, session_timeout=5.0, create=True)
    try:
        store.create("/x", b"1")
        proc = SPAWN.Process(target=mt.ephemeral_then_die_worker, args=(uri, "/dead", 2.0))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0
        holder = sqlite3.connect(str(tmp_path / "meta.db"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")             # a stuck writer holds the write lock
        try:
            time.sleep(2.5)     # the crashed process's 2 s session dies; nobody can reap it
            assert store.get("/x") == (b"1", 0)       # the read does not wait for the lock
            assert store.exists("/dead") is not None  # not reaped while the lock is held
            with pytest.raises(MetadataConnectionError, match="locked"):
                store.set("/x", b"2")                 # writers do wait, then say why
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.exists("/dead") is None          # the next read reaps the dead session
        store.set("/x", b"2")
        assert store.get("/x") == (b"2", 1)
    finally:
        store.close()
