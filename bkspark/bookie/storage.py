"""Thin Python wrapper of the bookie storage engine (the C extension ``bkspark._native``).

Everything on the hot path -- journal group commit, write cache, entry logs, index, reads,
checkpoints and compaction -- runs in C with the GIL released; this module only maps the
configuration and the exceptions.  File formats are documented in ``bookie_native/README.md``.

Guarantees (see tests/storage):

* ``add_entries`` returns only after every accepted entry's journal record is fdatasync'ed
  (group commit shared by all concurrent callers); a ``kill -9`` at any moment loses nothing
  acknowledged, nor any acknowledged fence.
* An entry the index says is present but whose bytes are unreadable or fail their CRC32C is a
  :class:`~bkspark.errors.BookieIOError`, never :class:`~bkspark.errors.NoSuchEntryError`.
"""
from __future__ import annotations

import errno as errno_
import logging
import threading
from dataclasses import dataclass, field

from bkspark import _native
from bkspark.errors import (
    EFENCED,
    EOK,
    EUA,
    BadRequestError,
    BookieIOError,
    NoSuchEntryError,
    NoSuchLedgerError,
)

__all__ = ["Storage", "StorageConfig", "DiskError", "EOK", "EFENCED", "EUA"]

log = logging.getLogger(__name__)

_native.set_exceptions(NoSuchLedgerError, NoSuchEntryError, BookieIOError, BadRequestError)


def journal_dir_list(journal_dir: str, journal_dirs, what: str = "StorageConfig") -> list[str]:
    """The journal directories of a configuration: ``journal_dirs``, or ``[journal_dir]`` when
    that is empty. ``journal_dir`` given beside ``journal_dirs`` must be ``journal_dirs[0]``.
    Raises ValueError naming the settings."""
    dirs = [str(d) for d in (journal_dirs or [])]
    if not dirs:
        return [str(journal_dir)] if journal_dir else []
    if journal_dir and str(journal_dir) != dirs[0]:
        raise ValueError(f"{what}: journal_dir {str(journal_dir)!r} conflicts with journal_dirs {dirs}: "
                         "give only journal_dirs, or make journal_dir its first directory")
    if len(set(dirs)) != len(dirs):
        raise ValueError(f"{what}: journal_dirs lists a directory twice: {dirs}")
    return dirs


@dataclass(frozen=True)
class DiskError:
    """A directory whose writes failed (:meth:`Storage.disk_errors`)."""
    kind: str           # "journal" or "ledger"
    path: str
    errno: int
    message: str

    @property
    def full(self) -> bool:
        """Out of space (writable again once space is freed and the storage reopened)."""
        return self.errno in (errno_.ENOSPC, errno_.EDQUOT)


@dataclass
class StorageConfig:
    journal_dir: str = ""               # one journal; or journal_dirs (below)
    ledger_dirs: list[str] = field(default_factory=list)
    write_cache_bytes: int = 64 << 20
    journal_max_group_wait_ms: float = 2.0
    journal_buffered_writes_threshold: int = 512 << 10
    journal_max_size_mb: int = 512
    journal_max_backups: int = 5
    journal_sync: bool = True  # False: benchmark-only mode, acknowledged adds may be lost
    entry_log_max_size: int = 1 << 30
    compaction_threshold: float = 0.5
    compaction_max_bytes_per_pass: int = 64 << 20
    compaction_rate_bytes_per_s: int = 16 << 20    # copying pace; 0 = unlimited
    checkpoint_interval_s: float = 10.0
    # False: entry-log pages leave the page cache once written back and flushed entries are read
    # with O_DIRECT (through the cache on a filesystem without it); see bookie_native/README.md
    entry_log_page_cache: bool = False
    # the on-disk index (RocksDB, in ledger_dirs[0]/index): its block cache, and how many ledgers not
    # being written stay in memory (bookie_native/README.md "The index"; memory = write cache +
    # index cache + two memtables + ~200 bytes per cached ledger); one memtable of the index,
    # whose write-ahead log RocksDB holds to four memtables on disk
    index_cache_bytes: int = 32 << 20
    ledger_cache_entries: int = 65536
    index_memtable_bytes: int = 16 << 20
    # several journals, one per directory (each its own disk): ledger L's records go to
    # journal_dirs[L % len(journal_dirs)]; empty = [journal_dir].  The number and order of the
    # directories of an existing store must not change (bookie_native/README.md).
    journal_dirs: list[str] = field(default_factory=list)
    # An entry, once stored, is never replaced: an add of a held entry with other bytes is
    # answered EBADREQ (the same bytes again are stored: idempotent). True lets the last add
    # win -- the engine supports it (its tests exercise the rewrite paths); a bookie never does.
    replace_entries: bool = False

    def __post_init__(self):
        journal_dir_list(self.journal_dir, self.journal_dirs)

    def journal_dir_list(self) -> list[str]:
        return journal_dir_list(self.journal_dir, self.journal_dirs)


class Storage:
    """Bookie ledger storage. Thread-safe; every method may be called from any thread."""

    def __init__(self, config: StorageConfig):
        if not config.ledger_dirs:
            raise ValueError("StorageConfig.ledger_dirs needs at least one directory")
        journal_dirs = config.journal_dir_list()
        if not journal_dirs:
            raise ValueError("StorageConfig needs journal_dir or journal_dirs")
        if not config.journal_sync:
            log.warning("bookie storage: journal_sync=False -- BENCHMARK-ONLY MODE, acknowledged "
                        "entries can be lost on a crash")
        self.config = config
        self._close_lock = threading.Lock()
        self._closed = False
        self._open()

    def _open(self) -> None:
        config = self.config
        self._store = _native.Store(
            config.journal_dir_list(),
            [str(d) for d in config.ledger_dirs],
            write_cache_bytes=int(config.write_cache_bytes),
            group_wait_us=int(config.journal_max_group_wait_ms * 1000),
            threshold=int(config.journal_buffered_writes_threshold),
            journal_max_size=int(config.journal_max_size_mb) << 20,
            max_backups=int(config.journal_max_backups),
            sync=bool(config.journal_sync),
            entry_log_max_size=int(config.entry_log_max_size),
            compaction_threshold=float(config.compaction_threshold),
            compaction_max_bytes=int(config.compaction_max_bytes_per_pass),
            compaction_rate=int(config.compaction_rate_bytes_per_s),
            checkpoint_interval_ms=max(1, int(config.checkpoint_interval_s * 1000)),
            page_cache=bool(config.entry_log_page_cache),
            index_cache_bytes=int(config.index_cache_bytes),
            ledger_cache_entries=int(config.ledger_cache_entries),
            index_memtable_bytes=int(config.index_memtable_bytes),
            replace_entries=bool(config.replace_entries),
        )
        converted = self._store.stats()["index_converted_entries"]
        if converted:
            log.warning("bookie storage: converted %s from format 1 (ledgers.state + .idx) to the RocksDB "
                        "index (%d entry locations); the conversion is done once", config.ledger_dirs[0], converted)
        s = self._store
        # direct bindings: no Python frame per call on the hot path
        self.add_entries = s.add_entries
        self.add_batch = s.add_batch
        self.is_fenced = s.is_fenced
        self.master_key = s.master_key
        self.has_ledger = s.has_ledger
        self.read_entry = s.read_entry
        self.read_last = s.read_last
        self.last_entry_id = s.last_entry_id
        self.explicit_lac = s.explicit_lac
        self.set_explicit_lac = s.set_explicit_lac
        self.list_entries = s.list_entries
        self.ledgers = s.ledgers
        self.delete_ledger = s.delete_ledger
        self.checkpoint = s.checkpoint
        self.compact = s.compact
        self.last_log_mark = s.last_log_mark

    # documented signatures (the instance attributes above shadow these for speed)
    def add_entries(self, entries):  # noqa: F811 - list of (ledger, entry, key, recovery, body)
        return self._store.add_entries(entries)

    def add_batch(self, payload, max_entry_bytes: int):  # noqa: F811
        """Store an encoded ``AddBatch`` message; return ``(AddBatchResponse body, {ledger:
        highest piggybacked LAC}, ok, ok_bytes, [statuses of refused stores])``. Invalid adds
        are answered EBADREQ; the stored ones are durable on return. Raises
        :class:`~bkspark.errors.BadRequestError` for bytes that are not an ``AddBatch``."""
        return self._store.add_batch(payload, max_entry_bytes)

    def fence(self, ledger_id: int, master_key: bytes) -> int:
        return self._store.fence(ledger_id, bytes(master_key))

    def delete_ledger(self, ledger_id: int) -> None:  # noqa: F811
        """Delete the ledger (idempotent). Returns once the delete is durable: its DELETE record
        fdatasync'ed -- or, when the ledger is already gone, the one a concurrent delete queued
        (that delete may still be waiting for it); a ``kill -9`` after the return never brings
        the ledger back."""
        self._store.delete_ledger(ledger_id)

    def has_ledger(self, ledger_id: int) -> bool:  # noqa: F811
        """Whether the ledger exists. False only once its delete is durable: finding no ledger
        while a DELETE record of its journal is not yet synced, it waits for that sync (as every
        "no such ledger" answer does: reads, ``list_entries``, ``is_fenced`` ...). Raises
        :class:`~bkspark.errors.BookieIOError` if the journal or the index failed."""
        return self._store.has_ledger(ledger_id)

    def ledgers(self) -> list[int]:  # noqa: F811
        """Every ledger id, ascending. Leaves a deleted ledger out only once its delete is
        durable: returns after the DELETE records queued before it finished listing are synced."""
        return self._store.ledgers()

    def read_range(self, ledger_id: int, first: int, last: int, max_bytes: int = 1 << 62,
                   step: int = 1):
        """``[(entry_id, bytes), ...]`` of first, first+step, ... <= last: up to max_bytes (at
        least one entry), stopping at the first absent entry (raising for ``first`` itself)."""
        return self._store.read_range(ledger_id, first, last, max_bytes, step)

    def read_range_into(self, ledger_id: int, first: int, last: int, max_bytes: int, buf,
                        step: int = 1):
        """:meth:`read_range` into the writable ``buf``, reused from call to call: the bodies
        are memoryviews of ``buf``, valid until it is written again; ``[]`` if the first
        entry does not fit ``buf`` (read it with :meth:`read_range`). Reading into memory the
        process already holds spares a page fault per 4 KiB of every entry served."""
        return self._store.read_range_into(ledger_id, first, last, max_bytes, buf, step)

    def force(self, ledger_id: int | None = None) -> None:
        self._store.force()

    def stats(self) -> dict:
        """Counters: adds, bytes, journal_syncs, journal_sync_ns_sum/count, cache_bytes, queue_depth ..."""
        st = self._store.stats()
        st["bytes"] = st["add_bytes"]
        st["queue_depth"] = st["sync_waiters"]
        return st

    def disk_errors(self) -> list[DiskError]:
        """The directories whose writes failed, each once, in the order journal then ledger
        directories (``bookie_native/README.md`` "Disk errors"): sticky until the storage is
        reopened. A failed ledger directory stops flushes, compaction and checkpoints (the
        journal keeps everything since the last checkpoint, and reopening replays it); a failed
        journal stops adds. ``ENOSPC`` / ``EDQUOT``: the directory is full, else it failed."""
        return [DiskError(*t) for t in self._store.disk_errors()]

    def reopen(self) -> None:
        """Close the engine without a checkpoint and open it again on the same directories --
        what a restart does, inside the process: the journal replays everything since the last
        checkpoint into fresh entry logs, so whatever a failed write lost is written again, and
        :meth:`disk_errors` starts empty (an error comes back if the disk still fails). Calls
        made meanwhile fail (BookieIOError: closed); the bookie is read-only while it runs.
        Raises BookieIOError when the engine cannot open (the storage then stays closed, and
        a later reopen tries again), or when :meth:`close` was called (never reopened then)."""
        with self._close_lock:
            if self._closed:
                raise BookieIOError("storage is closed (the bookie is stopping): not reopened")
            self._store.close(checkpoint=False)
            self._open()

    def close(self) -> None:
        with self._close_lock:
            self._closed = True
            self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
