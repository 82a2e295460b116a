"""The fuzz targets (see the package docstring): ``setup(name)`` prepares what a target works
on -- an open storage engine, or a template store whose files the inputs replace -- and
returns the function libFuzzer calls with each input. Work directories live under one
temporary root per process (in /dev/shm when it exists), removed at exit; the add-taking
targets delete their ledgers every :data:`FORGET_EVERY` inputs, so a long run holds a
bounded amount of disk."""
from __future__ import annotations

import atexit
import glob
import io
import os
import shutil
import tempfile
from types import SimpleNamespace

from google.protobuf.message import DecodeError

from bkspark import errors
from bkspark.bookie.config import BookieConfig
from bkspark.bookie.data_port import DataConnection
from bkspark.bookie.server import BookieState
from bkspark.bookie.service import BookieService
from bkspark.bookie.storage import Storage, StorageConfig
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import wire

MAX_ADDS = 1000                 # a bookie's max_adds_per_message, small for speed
MAX_ENTRY_BYTES = 1 << 20
MAX_FRAME_BYTES = 4 << 20
FORGET_EVERY = 2000             # inputs between two deletions of every stored ledger
EXPECTED = (errors.BKError, wire.FrameError, DecodeError, OSError)
KEY = b"fuzz-master-key-0020"
# the add_batch target compares the C walk with protobuf and checks what was stored; "0"
# leaves the sanitizers alone to find defects (the test that shows they do)
CHECK_RESULTS = os.environ.get("BKSPARK_FUZZ_CHECK_RESULTS", "1") != "0"

_root: str | None = None


def _work_dir(name: str) -> str:
    global _root
    if _root is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        _root = tempfile.mkdtemp(prefix="bkspark-fuzz-", dir=base)
        atexit.register(shutil.rmtree, _root, True)
    path = os.path.join(_root, name)
    os.makedirs(path, exist_ok=True)
    return path


def storage_config(directory: str) -> StorageConfig:
    """A small engine: every bound low, so one input costs little and a run stays bounded."""
    return StorageConfig(journal_dir=os.path.join(directory, "journal"),
                         ledger_dirs=[os.path.join(directory, "ledgers")],
                         write_cache_bytes=1 << 20, journal_max_size_mb=4, journal_max_backups=1,
                         entry_log_max_size=4 << 20, index_cache_bytes=1 << 20,
                         index_memtable_bytes=1 << 20, ledger_cache_entries=64,
                         checkpoint_interval_s=3600, compaction_rate_bytes_per_s=0)


def _forget_all(storage: Storage) -> None:
    for lid in storage.ledgers():
        storage.delete_ledger(lid)
    storage.checkpoint()
    storage.compact()


def _read_everything(storage: Storage) -> None:
    """Every entry of every ledger, each read or refused with a named error."""
    for lid in storage.ledgers():
        try:
            storage.is_fenced(lid)
            storage.explicit_lac(lid)
            ranges = storage.list_entries(lid)          # [(first, last), ...]
        except EXPECTED:
            continue
        for first, last in ranges[:16]:
            for eid in range(first, min(last, first + 64) + 1):
                try:
                    storage.read_entry(lid, eid)
                except EXPECTED:
                    pass
        try:
            storage.read_entry(lid, -1)
        except EXPECTED:
            pass


# ---- add_batch -------------------------------------------------------------------------

def _forgetting(storage: Storage, one):
    """``one``, with every ledger of ``storage`` deleted each :data:`FORGET_EVERY` inputs."""
    count = [0]

    def run(data: bytes) -> None:
        count[0] += 1
        if count[0] % FORGET_EVERY == 0:
            _forget_all(storage)
        one(data)
    return run


def _add_batch():
    from bkspark import _native
    storage = Storage(storage_config(_work_dir("add_batch")))

    def one(data: bytes) -> None:
        try:
            n = _native.scan_add_batch(data, MAX_ADDS)
        except errors.BadRequestError:
            return
        if not CHECK_RESULTS:
            _native.answer_adds(data, MAX_ENTRY_BYTES, errors.EREADONLY, "read-only")
            storage.add_batch(data, MAX_ENTRY_BYTES)
            return
        adds = pb.AddBatch.FromString(data).adds    # what the walk takes, protobuf parses
        assert len(adds) == n, (len(adds), n)
        refused = pb.AddBatchResponse.FromString(
            _native.answer_adds(data, MAX_ENTRY_BYTES, errors.EREADONLY, "read-only"))
        assert len(refused.responses) == n
        try:
            raw = storage.add_batch(data, MAX_ENTRY_BYTES)[0]
        except errors.BadRequestError:
            return
        stored = pb.AddBatchResponse.FromString(raw)
        assert len(stored.responses) == n, (len(stored.responses), n)
        bodies: dict = {}                   # answers name their add by (ledger, entry)
        for add in adds:
            bodies.setdefault((add.ledger_id, add.entry_id), []).append(add.body)
        acked: dict = {}
        for r in stored.responses:
            if r.status == errors.EOK:
                acked[(r.ledger_id, r.entry_id)] = acked.get((r.ledger_id, r.entry_id), 0) + 1
        for key, times in acked.items():    # an acknowledged add reads back as sent, and
            got = storage.read_entry(*key)  # two acknowledged adds of an entry sent the same
            assert bodies[key].count(got) >= times, (key, times)     # bytes: never replaced
    return _forgetting(storage, one)


# ---- data_port -------------------------------------------------------------------------

class _Peer:
    """The socket of a data-port connection, for :class:`DataConnection`: answers are counted,
    not sent."""

    def __init__(self):
        self.sent = 0

    def settimeout(self, _t):
        pass

    def sendmsg(self, views):
        n = sum(len(v) for v in views)
        self.sent += n
        return n

    def sendall(self, data):
        self.sent += len(data)


def _data_port():
    directory = _work_dir("data_port")
    config = BookieConfig(metadata_uri=f"sqlite:///{directory}/meta.db",
                          journal_dir=os.path.join(directory, "journal"),
                          ledger_dirs=[os.path.join(directory, "ledgers")],
                          max_adds_per_message=MAX_ADDS)
    storage = Storage(storage_config(directory))
    service = BookieService(storage, config, BookieState(config))
    server = SimpleNamespace(service=service, max_frame_bytes=MAX_FRAME_BYTES, send_timeout=1.0)

    def one(data: bytes) -> None:
        try:
            DataConnection(server, _Peer(), io.BytesIO(data)).run()
        except EXPECTED:
            pass
    return _forgetting(storage, one)


# ---- journal / entry_log: files of a stopped bookie ------------------------------------

def make_template(directory: str, checkpoint: bool) -> None:
    """A small store: three ledgers (one fenced, one with an explicit LAC), entries of
    several sizes; closed with a checkpoint (entries in entry logs and the index) or
    without (the journal holds them all)."""
    storage = Storage(storage_config(directory))
    for lid in (1, 2, 3):
        key = KEY[:-1] + bytes([lid])
        storage.add_entries([(lid, e, key, False, _body(lid, e, size))
                             for e, size in enumerate((0, 1, 100, 3000))])
    storage.fence(2, KEY[:-1] + b"\x02")
    storage.set_explicit_lac(3, (3).to_bytes(8, "big") + (3).to_bytes(8, "big") + b"\0" * 4)
    storage.delete_ledger(1)
    storage.add_entries([(1, 0, KEY, False, _body(1, 0, 10))])
    if checkpoint:
        storage.checkpoint()
        storage.close()
    else:
        storage._store.close(checkpoint=False)


def _body(lid: int, eid: int, size: int) -> bytes:
    head = lid.to_bytes(8, "big") + eid.to_bytes(8, "big") + (eid - 1).to_bytes(8, "big", signed=True)
    return head + size.to_bytes(8, "big") + b"\0\0\0\0" + bytes([eid % 251]) * size


def _file_target(name: str, checkpoint: bool, pick_file):
    template = _work_dir(f"{name}-template")
    make_template(template, checkpoint)
    work = os.path.join(_work_dir(name), "store")

    def one(data: bytes) -> None:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(template, work)
        path, payload = pick_file(work, data)
        with open(path, "wb") as f:
            f.write(payload)
        try:
            storage = Storage(storage_config(work))
        except EXPECTED:
            return
        try:
            _read_everything(storage)
            try:
                storage.compact()
            except EXPECTED:
                pass
        finally:
            storage.close()
    return one


def journal_files(directory: str) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, "journal", "*.txn")))


def entry_log_files(directory: str) -> list[str]:
    """The entry logs and their per-log index files of a store, in a fixed order."""
    ledgers = os.path.join(directory, "ledgers")
    return sorted(glob.glob(os.path.join(ledgers, "*.log")) + glob.glob(os.path.join(ledgers, "*.idx")))


def _pick_journal(work: str, data: bytes):
    return journal_files(work)[0], data


def _pick_entry_log(work: str, data: bytes):
    """The first byte names the file (an entry log or a per-log index); the rest is its
    content."""
    files = entry_log_files(work)
    return files[(data[0] if data else 0) % len(files)], data[1:]


def setup(name: str):
    if name == "add_batch":
        return _add_batch()
    if name == "data_port":
        return _data_port()
    if name == "journal":
        return _file_target("journal", False, _pick_journal)
    if name == "entry_log":
        return _file_target("entry_log", True, _pick_entry_log)
    raise ValueError(f"unknown fuzz target {name!r}: one of add_batch, data_port, journal, "
                     "entry_log")


def make_seeds(out: str) -> None:
    """Write each target's seed corpus under ``out/TARGET`` (tests/fuzz/corpus holds them)."""
    def put(target: str, name: str, data: bytes) -> None:
        os.makedirs(os.path.join(out, target), exist_ok=True)
        with open(os.path.join(out, target, name), "wb") as f:
            f.write(data)

    def add(lid, eid, size, flags=0):
        return pb.AddRequest(ledger_id=lid, entry_id=eid, master_key=KEY, flags=flags,
                             body=_body(lid, eid, size))
    batches = {
        "one": pb.AddBatch(adds=[add(7, 0, 10)]),
        "three-ledgers": pb.AddBatch(adds=[add(7, 1, 0), add(8, 0, 100), add(9, 0, 1)]),
        "recovery": pb.AddBatch(adds=[add(7, 2, 50, pb.AddRequest.RECOVERY_ADD)]),
    }
    for name, batch in batches.items():
        put("add_batch", name, batch.SerializeToString())
    adds = wire.frame(wire.KIND_ADD_BATCH, [batches["three-ledgers"].SerializeToString()])
    reads = wire.frame(wire.KIND_READ_RANGE, [pb.ReadRangeRequest(
        ledger_id=8, first_entry_id=0, last_entry_id=3, max_bytes_per_message=4096)
        .SerializeToString()])
    put("data_port", "add-then-read", adds + reads)
    put("data_port", "striped-read", wire.frame(wire.KIND_READ_RANGE, [pb.ReadRangeRequest(
        ledger_id=7, first_entry_id=0, last_entry_id=9, step=2).SerializeToString()]))
    with tempfile.TemporaryDirectory() as tmp:
        make_template(os.path.join(tmp, "j"), checkpoint=False)
        for i, path in enumerate(journal_files(os.path.join(tmp, "j"))):
            with open(path, "rb") as f:
                data = f.read()
            put("journal", f"journal-{i}", data[:len(data.rstrip(b"\0")) + 64])
        make_template(os.path.join(tmp, "e"), checkpoint=True)
        for i, path in enumerate(entry_log_files(os.path.join(tmp, "e"))):
            with open(path, "rb") as f:
                put("entry_log", os.path.basename(path), bytes([i]) + f.read())
