"""Offload: a log's closed ledgers written as Parquet files that any engine reads.

A log's policy is its head property ``offload`` (:class:`OffloadPolicy`; none: nothing is
offloaded): closed ledgers closed more than ``after_ms`` ago, or lying wholly beyond the last
``beyond_bytes`` bytes of the log, are written as Parquet under ``location`` (a local path or
any URI :func:`pyarrow.fs.FileSystem.from_uri` opens), oldest first. The service that
applies retention applies it (:mod:`bkspark.recovery.retention`, through
:func:`bkspark.recovery.offload.run`); ``bkspark shell offload LOG`` runs it now. Spark reads
offloaded ledgers from their files (:mod:`bkspark.spark.offloaded`). The bookies keep their
copy, which other readers read, until the policy's ``keep_on_bookies_ms`` has passed since the
offload; then it is dropped (:func:`bkspark.recovery.offload.drop_copies`) if the files give
back every entry byte for byte (the record's ``encoding``), and every reader reads the files
(:func:`read_entries`; :func:`on_bookies` says which tier holds a ledger).

Layout: ``<location>/log=<name>/<offset of the file's first entry, 20 digits>-<ledger id>
.parquet`` -- one directory per log, in Hive style, so ``spark.read.parquet(location)`` reads
every log offloaded there as one table with a ``log`` column (``spark.read.parquet(
location + "/log=NAME")``: one log), and the files sort in log order. (Partition discovery
infers types: logs named ``007`` and ``7`` would both read as the number 7 -- read such logs'
directories one by one, or turn ``spark.sql.sources.partitionColumnTypeInference.enabled``
off, pyarrow's ``partitioning="hive"`` with a string ``log`` field.) A ledger becomes one
file per :data:`FILE_ENTRY_BYTES` of entries (a rule of the entries' bytes, so a retry writes the
same names).
Columns: record entries -- ``offset``, ``ledger_id``, ``entry_id``, ``key``, ``value``,
``timestamp`` (UTC, microseconds), ``headers``; Arrow entries -- the written columns plus
``_offset``, ``_ledger_id``, ``_entry_id``. Row groups of at most :data:`ROW_GROUP_ROWS` rows,
statistics on every column (offset and time: a reader skips row groups), zstd, page
checksums.

What a log's metadata records of it, and when: :mod:`bkspark.recovery.offload` (the pass that
writes the files, crash-safe). This module holds the policy, the layout, the records and
the clean-up: :func:`collect_orphans` removes temporary files older than
:data:`TEMP_GRACE_S` and files of ledgers the log no longer lists (retention, truncation).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass

from bkspark.errors import BadRequestError, BKError
from bkspark.log.records import encode_record
from bkspark.log.retention import closed_at, parse_duration_ms, parse_size_bytes
from metadata.layout import check_log_name, log_path
from metadata.log_entry import LogLedger
from metadata.update import NoChange

log = logging.getLogger("bkspark.log.offload")

PROPERTY = "offload"                    # the head property holding a log's policy
#: head property: how far offload went -- ``{"next": the first segment not offloaded yet,
#: "offset", "byte_offset": the log offset and byte offset where that segment starts}``
PROGRESS = "offload.progress"
#: entry bytes (:func:`bkspark.recovery.offload.entry_cost`) per Parquet file: a rule of the
#: entries alone, so a retry or a racing offloader writes the same file names
FILE_ENTRY_BYTES = 128 << 20
ROW_GROUP_ROWS = 1 << 20
#: ledgers one pass offloads at most (the next pass goes on)
MAX_LEDGERS_PER_PASS = 64
#: temporary files older than this are a crashed offload's (seconds, the filesystem's mtime)
TEMP_GRACE_S = 3600.0
TEMP_PREFIX = "_tmp-"
#: a temporary file's name ends so that no reader globbing ``*.parquet`` takes it (DuckDB's
#: ``read_parquet`` does not skip names starting with ``_`` as Spark and pyarrow do)
TEMP_SUFFIX = ".inprogress"
#: segments the orphan sweep reads a request
SWEEP_CHUNK = 512
#: entry bytes one pass offloads of a log at most (the next pass goes on), so one log's
#: backlog does not hold up the pass's other logs, nor a leader that lost its election
MAX_BYTES_PER_PASS = 1 << 30
SUFFIX = ".parquet"

ARROW_COLUMNS = ("_offset", "_ledger_id", "_entry_id")
#: rows a batch read from a file holds at most
READ_BATCH_ROWS = 64 * 1024
#: head property: locations a log's policy named before its current one whose directory may
#: still hold its files -- ``[{"location": uri, "left": ms the policy left it}, ...]``, most
#: recent last -- each swept as the current one (:func:`sweep_locations`) until it holds none
#: (and :data:`TEMP_GRACE_S` has passed since it was left: a pass that read the old policy
#: may still write there); the oldest is forgotten past :data:`MAX_PREVIOUS_LOCATIONS`
PREVIOUS = "offload.previous"
MAX_PREVIOUS_LOCATIONS = 8
#: head property: how far the bookies' copies of offloaded ledgers were dropped -- the shape
#: of :data:`PROGRESS` (:func:`bkspark.recovery.offload.drop_copies`)
DROPPED = "offload.dropped"


class OffloadError(BKError):
    """An offload could not complete (its file did not read back as written, the location
    failed); nothing was recorded, the next pass tries again."""


@dataclass(frozen=True)
class OffloadPolicy:
    """What of a log to offload and where (module docstring). ``location``: an absolute path
    or a URI of a directory; ``after_ms``: ledgers closed longer ago; ``beyond_bytes``: ledgers
    wholly beyond this many bytes of the log's tail (at least one of the two)."""

    location: str
    after_ms: int | None = None
    beyond_bytes: int | None = None
    #: how long the bookies keep their copy of an offloaded ledger (ms; None: for ever, the
    #: default): then its files are the only copy (:func:`bkspark.recovery.offload.drop_copies`)
    keep_on_bookies_ms: int | None = None

    def __post_init__(self):
        if not isinstance(self.location, str) or not self.location:
            raise BadRequestError("offload location: give an absolute path or a URI "
                                  "(file:///data/history, hdfs://..., s3://...)")
        if "://" not in self.location and not os.path.isabs(self.location):
            raise BadRequestError(
                f"offload location {self.location!r} is relative: give an absolute path or a "
                "URI (the service that offloads runs in another directory, maybe on another host)")
        for key in ("after_ms", "beyond_bytes"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise BadRequestError(f"offload {key} must be a positive int or None, got {v!r}")
        v = self.keep_on_bookies_ms
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise BadRequestError(f"offload keep_on_bookies_ms must be an int >= 0 or None (for "
                                  f"ever), got {v!r}")
        if self.after_ms is None and self.beyond_bytes is None:
            raise BadRequestError("an offload policy needs after_ms and/or beyond_bytes (when a "
                                  "closed ledger is offloaded)")

    @classmethod
    def parse(cls, location: str, after=None, beyond=None, keep=None) -> "OffloadPolicy":
        """A policy from user text: ``after`` like ``"1h"``, ``beyond`` like ``"10GiB"``,
        ``keep`` (on bookies) like ``"7d"`` or ``"0"``."""
        return cls(location=location,
                   after_ms=None if after is None else parse_duration_ms(after, "offload after"),
                   beyond_bytes=None if beyond is None else parse_size_bytes(beyond,
                                                                             "offload beyond"),
                   keep_on_bookies_ms=None if keep is None else parse_duration_ms(
                       keep, "offload keep-on-bookies", zero=True))

    def to_property(self) -> dict:
        return asdict(self)

    @classmethod
    def from_property(cls, value) -> "OffloadPolicy | None":
        if value is None:
            return None
        if not isinstance(value, dict) or not set(value) <= set(cls.__dataclass_fields__):
            raise BadRequestError(f"bad offload property {value!r}")
        return cls(**value)

    def describe(self) -> str:
        parts = []
        if self.after_ms is not None:
            parts.append(f"closed over {self.after_ms / 1000:g} s ago")
        if self.beyond_bytes is not None:
            parts.append(f"beyond {self.beyond_bytes} B of the tail")
        keep = ("the bookies keep their copy" if self.keep_on_bookies_ms is None else
                f"the bookies' copy dropped {self.keep_on_bookies_ms / 1000:g} s after")
        return f"to {self.location} when " + " or ".join(parts) + f"; {keep}"


# ---- where files go ----------------------------------------------------------------------------

class Location:
    """A directory on a :mod:`pyarrow.fs` filesystem. On a local filesystem files and
    renames are fsynced; elsewhere durability is the filesystem's on close (S3, HDFS).
    (pyarrow is imported here, not with the module: the retention service of every bookie
    started with ``--autorecovery`` imports this module, and most logs offload nothing.)"""

    def __init__(self, uri: str):
        import pyarrow as pa
        import pyarrow.fs as pafs
        try:
            if "://" in uri:
                self.fs, self.root = pafs.FileSystem.from_uri(uri)
            else:
                self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(uri)
        except (pa.ArrowInvalid, OSError) as exc:
            raise BadRequestError(f"offload location {uri!r}: {exc}") from None
        self.uri = uri
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self._pafs = pafs

    @property
    def place(self) -> tuple[str, str]:
        """What identifies the directory whatever the spelling of its URI (a trailing ``/``,
        ``file:///x`` or ``/x``): the filesystem's type and the normalized root (local
        directories are compared by :func:`same_place` as files: symlinks, mounts)."""
        root = os.path.normpath(self.root) if self.local else self.root.rstrip("/")
        return self.fs.type_name, root

    def log_dir(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/log={check_log_name(name)}"

    def write(self, path: str, table) -> int:
        """Write ``table`` (a pyarrow Table) as Parquet at ``path``, durable when this
        returns; its bytes."""
        import pyarrow.parquet as pq
        kw = dict(row_group_size=ROW_GROUP_ROWS, compression="zstd", write_statistics=True,
                  write_page_checksum=True)
        if self.local:
            directory = os.path.dirname(path)
            if not os.path.isdir(directory):        # (its entry in the parent made durable)
                os.makedirs(directory, exist_ok=True)
                _fsync_dir(os.path.dirname(directory))
            with open(path, "wb") as f:
                pq.write_table(table, f, **kw)
                f.flush()
                os.fsync(f.fileno())
            return os.path.getsize(path)
        self.fs.create_dir(os.path.dirname(path), recursive=True)
        with self.fs.open_output_stream(path) as out:
            pq.write_table(table, out, **kw)
        return self.fs.get_file_info(path).size

    def verify(self, path: str, table, offsets: str, check) -> None:
        """Read the Parquet file at ``path`` back (page checksums verified), one row group at a
        time, and compare it with ``table``; ``check(column)`` judges its column ``offsets``
        read whole. :raises OffloadError: it differs."""
        import pyarrow.parquet as pq
        pf = pq.ParquetFile(path, filesystem=self.fs, page_checksum_verification=True)
        if pf.metadata.num_rows != table.num_rows:
            raise OffloadError(f"read back {pf.metadata.num_rows} rows, wrote {table.num_rows}")
        at = 0
        for i in range(pf.metadata.num_row_groups):
            back = pf.read_row_group(i)
            if not _same_rows(back, table.slice(at, back.num_rows)):
                raise OffloadError(f"the file read back differs from what was written (row "
                                   f"group {i})")
            at += back.num_rows
        got = pf.read(columns=[offsets])        # (the last: a writer may name a column so)
        check(got.column(got.num_columns - 1))

    def publish(self, tmp: str, final: str) -> None:
        """Rename ``tmp`` to ``final`` (replacing a file of that name)."""
        if self.local:
            os.replace(tmp, final)
            _fsync_dir(os.path.dirname(final))
        else:
            self.fs.move(tmp, final)

    def delete(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def files(self, directory: str) -> list:
        """The files (pyarrow FileInfo) in ``directory``; none if it does not exist."""
        pafs = self._pafs
        try:
            return [i for i in self.fs.get_file_info(pafs.FileSelector(directory))
                    if i.type == pafs.FileType.File]
        except FileNotFoundError:
            return []


def same_place(a, b) -> bool | None:
    """Whether location URIs ``a`` and ``b`` name the same directory (:attr:`Location.place`);
    None when that is unknown (one is missing or does not parse): callers then keep files."""
    if not isinstance(a, str) or not isinstance(b, str):
        return None
    if a == b:
        return True
    try:
        la, lb = Location(a), Location(b)
    except BadRequestError:
        return None
    if la.local and lb.local:       # (a symlink, a bind mount: the same directory)
        try:
            return os.path.samefile(la.root, lb.root)
        except OSError:
            return os.path.realpath(la.root) == os.path.realpath(lb.root)
    return la.place == lb.place


def _same_rows(a, b) -> bool:
    """Whether tables ``a`` and ``b`` hold the same rows, NaNs included (``equals`` says a NaN
    differs from itself): else their schemas and their rows' bytes, both copied into fresh
    buffers, are compared."""
    if a.equals(b):
        return True
    if not a.schema.equals(b.schema) or a.num_rows != b.num_rows:
        return False
    from bkspark.log.arrow_entries import fresh

    def rows(t) -> bytes:
        return fresh(t.to_batches()).serialize().to_pybytes() if t.num_rows else b""
    return rows(a) == rows(b)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_name(first_offset: int, ledger_id: int) -> str:
    return f"{first_offset:020d}-{ledger_id}{SUFFIX}"


def parse_file_name(name: str) -> tuple[int, int] | None:
    """``(first offset, ledger id)`` of a final file's name (None: not one)."""
    if not name.endswith(SUFFIX):
        return None
    offset, dash, lid = name[:-len(SUFFIX)].partition("-")
    if not dash or not offset.isdigit() or not lid.isdigit():
        return None
    return int(offset), int(lid)


# ---- the entries back from the files ------------------------------------------------------------

#: how an offload record's files give back its ledger's entries byte for byte (its
#: ``encoding``; checked when they are written: a ledger without one keeps its bookies' copy):
#: record entries, a producer's own bytes, Arrow entries (``arrow+lz4``, ``arrow+zstd``: their
#: bodies compressed so -- byte for byte with the pyarrow that checked it, an equal batch with
#: any, :mod:`bkspark.log.arrow_entries`)
RECORD, RAW, ARROW = "record", "raw", "arrow"
ARROW_COMPRESSIONS = (None, "lz4", "zstd")


def arrow_encoding(compression: str | None) -> str:
    return ARROW if compression is None else f"{ARROW}+{compression}"


def _arrow_compression(encoding: str):
    """``(True, compression)`` of an Arrow encoding, ``(False, None)`` of another."""
    head, _, compression = encoding.partition("+")
    if head != ARROW or (compression or None) not in ARROW_COMPRESSIONS:
        return False, None
    return True, compression or None


def on_bookies(record: dict | None) -> bool:
    """Whether the bookies still hold the ledger whose offload record is ``record`` (None: not
    offloaded). False once :func:`bkspark.recovery.offload.drop_copies` marked it: its files
    are then its only copy, every reader reads them (:func:`read_entries`)."""
    return record is None or record.get("on_bookies", True) is not False


def files_of(record: dict, first: int, last: int) -> list[dict]:
    """The files of an offload ``record`` that hold entries of ``first..last``, in order."""
    return [f for f in record.get("files", []) if f["last"] >= first and f["first"] <= last]


def row_groups(pf, column: str, first: int, last: int) -> list[int]:
    """The row groups of ParquetFile ``pf`` whose ``column`` statistics meet first..last (all
    of those without statistics)."""
    md = pf.metadata
    names = md.schema.names
    idx = len(names) - 1 - names[::-1].index(column)    # (the last: appended to a user's)
    out = []
    for i in range(md.num_row_groups):
        st = md.row_group(i).column(idx).statistics
        if st is None or not st.has_min_max or (st.max >= first and st.min <= last):
            out.append(i)
    return out


def _entry_runs(batches):
    """``(entry id, [row slices])`` of Arrow ``batches`` whose rows are in entry order (their
    last column: ``_entry_id``, whatever columns a writer named so before it)."""
    cur, parts = None, []
    for b in batches:
        eids = b.column(b.num_columns - 1).to_numpy()
        if not len(eids):
            continue
        cuts = (eids[1:] != eids[:-1]).nonzero()[0] + 1
        starts = [0, *cuts.tolist()]
        for s, e in zip(starts, [*cuts.tolist(), len(eids)]):
            eid = int(eids[s])
            if eid != cur:
                if parts:
                    yield cur, parts
                cur, parts = eid, []
            parts.append(b.slice(s, e - s))
    if parts:
        yield cur, parts


def encode_entries(batches, encoding: str):
    """``(entry id, bytes)`` of the rows ``batches`` (read from a ledger's files, in entry
    order) as the ledger held them: record entries re-encoded (:mod:`bkspark.log.records`),
    raw ones their ``value``, an Arrow entry its rows as one uncompressed IPC record batch
    message. Whether that is each entry's bytes was checked when the files were written (a
    raw entry that decoded as a record without a value comes back as None: not raw)."""
    arrow, compression = _arrow_compression(encoding)
    if arrow:
        from bkspark.log.arrow_entries import encode_arrow, fresh
        for eid, parts in _entry_runs(batches):
            # the entry's rows in fresh buffers, whatever batches and row groups they were
            # read in; the offload columns (last) dropped
            b = fresh(parts)
            yield eid, encode_arrow(b.select(range(b.num_columns - len(ARROW_COLUMNS))),
                                    compression).to_pybytes()
        return
    for b in batches:
        eids = b.column("entry_id").to_pylist()
        values = b.column("value").to_pylist()
        if encoding == RAW:
            yield from zip(eids, values)
            continue
        keys = b.column("key").to_pylist()
        tss = b.column("timestamp").cast("int64").to_pylist()
        hdrs = b.column("headers").to_pylist()
        for eid, k, v, ts, h in zip(eids, keys, values, tss, hdrs):
            yield eid, encode_record(v, key=k, timestamp_us=ts, headers=h)


def read_entries(where: "Location", name: str, record: dict, first: int, last: int):
    """``(entry id, bytes)`` of entries ``first..last`` of the offloaded ledger whose record
    is ``record`` (it has an ``encoding``), read from its files under ``where`` (only the row
    groups meeting the range; page checksums verified), in order.

    :raises OffloadError: the record has no encoding (its files do not give the entries back).
    :raises OSError, pyarrow.ArrowException: a file could not be read."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    encoding = record.get("encoding")
    arrow = isinstance(encoding, str) and _arrow_compression(encoding)[0]
    if encoding not in (RECORD, RAW) and not arrow:
        raise OffloadError(f"log {name}: the offloaded files of entries {first}..{last} do not "
                           "give the entries back byte for byte; read them from the bookies")
    eid_col = "_entry_id" if arrow else "entry_id"
    columns = None if arrow else (
        ["entry_id", "value"] if encoding == RAW else
        ["entry_id", "key", "value", "timestamp", "headers"])
    directory = where.log_dir(name)

    def batches():
        for f in files_of(record, first, last):
            pf = pq.ParquetFile(f"{directory}/{f['name']}", filesystem=where.fs,
                                page_checksum_verification=True)
            for b in pf.iter_batches(batch_size=READ_BATCH_ROWS, columns=columns,
                                     row_groups=row_groups(pf, eid_col, first, last)):
                if f["first"] < first or f["last"] > last:
                    eids = b.column(b.num_columns - 1 if arrow else "entry_id")
                    b = b.filter(pc.and_(pc.greater_equal(eids, first),
                                         pc.less_equal(eids, last)))
                yield b
    yield from encode_entries(batches(), encoding)


# ---- a pass over one log ------------------------------------------------------------------------

def due(logs, name: str, policy: OffloadPolicy, now_ms: int,
        max_ledgers: int = MAX_LEDGERS_PER_PASS) -> list[LogLedger]:
    """The listed, closed, not yet offloaded ledgers the policy offloads now, oldest first,
    scanning from the head's :data:`PROGRESS` mark (so a pass costs what it offloads, not the
    log's age). A ledger whose offset is not stamped yet stops the scan."""
    first, nxt = logs.bounds(name)
    start = max(first, progress_of(logs.properties(name)).get("next", 0))
    end_bytes = None
    if policy.beyond_bytes is not None:
        last = logs.last_listed(name)
        if last is not None and last.byte_offset is not None:
            end_bytes = last.byte_offset + last.sealed_length()
    out: list[LogLedger] = []
    lo, step = start, 16
    while lo < nxt and len(out) < max_ledgers:
        for e in logs.segments(name, lo, min(nxt, lo + step)):
            if e.offloaded is not None:
                continue
            if not e.closed or e.offset is None or len(out) >= max_ledgers:
                return out
            old = policy.after_ms is not None and (
                (t := closed_at(logs, e)) is not None and t <= now_ms - policy.after_ms)
            far = end_bytes is not None and e.byte_offset is not None and \
                end_bytes - (e.byte_offset + e.sealed_length()) >= policy.beyond_bytes
            if not (old or far):
                return out
            out.append(e)
        lo, step = lo + step, min(step * 2, 256)
    return out


def progress_of(properties: dict, key: str = PROGRESS) -> dict:
    """The :data:`PROGRESS` (or ``key``: :data:`DROPPED`) mark of a head's properties
    (``{}``: none yet, or not one)."""
    got = properties.get(key)
    ok = isinstance(got, dict) and all(isinstance(got.get(k), int) and not isinstance(
        got.get(k), bool) for k in ("next", "offset", "byte_offset"))
    return got if ok else {}


def progress_after(entry: LogLedger) -> dict:
    """The :data:`PROGRESS` mark once ``entry`` (closed, its offsets stamped) is offloaded."""
    return {"next": entry.seq + 1, "offset": entry.offset + (entry.entry_count() or 0),
            "byte_offset": (entry.byte_offset or 0) + entry.sealed_length()}


def valid_runs(runs) -> list:
    """The well-formed runs (``[offset, entries, byte_offset, bytes]``, ints) of a
    :data:`DROPPED` mark's ``kept`` (anything else is ignored: another version's, an edit)."""
    if not isinstance(runs, list):
        return []
    return [r for r in runs if isinstance(r, list) and len(r) == 4 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in r)]


def summary(properties: dict, first_offset, end_offset, first_byte_offset) -> dict:
    """What :meth:`bkspark.log.LogStore.stats` shows of a log's offload, from its head's
    properties and its ends: ``offload`` (the policy's property, None: none),
    ``offloaded_entries`` / ``offloaded_bytes`` (of the listed entries, those in Parquet; bytes
    as the bookies hold them), ``offload_lag`` (entries after them) and ``dropped_entries`` /
    ``dropped_bytes`` (of those, the ones the bookies no longer hold)."""
    policy = properties.get(PROPERTY)
    mark = progress_of(properties)
    out = {"offload": policy, "offloaded_entries": 0, "offloaded_bytes": 0, "offload_lag": None,
           "dropped_entries": 0, "dropped_bytes": 0}
    if not mark or first_offset is None or end_offset is None:
        if policy is not None and end_offset is not None and first_offset is not None:
            out["offload_lag"] = end_offset - first_offset
        return out
    out["offloaded_entries"] = max(0, mark["offset"] - first_offset)
    out["offloaded_bytes"] = max(0, mark["byte_offset"] - (first_byte_offset or 0))
    out["offload_lag"] = max(0, end_offset - max(first_offset, mark["offset"]))
    dropped = progress_of(properties, DROPPED)
    if dropped:
        first_bytes = first_byte_offset or 0
        entries = max(0, dropped["offset"] - first_offset)
        nbytes = max(0, dropped["byte_offset"] - first_bytes)
        for run in valid_runs(dropped.get("kept")):   # (passed over, kept on the bookies)
            entries -= max(0, run[0] + run[1] - max(run[0], first_offset))
            nbytes -= max(0, run[2] + run[3] - max(run[2], first_bytes))
        out["dropped_entries"], out["dropped_bytes"] = max(0, entries), max(0, nbytes)
    return out


def record(logs, name: str, done: dict[int, dict], progress: dict | None,
           listed_at: dict[int, tuple] | None = None) -> set[int]:
    """Step 5: store the offload records ``done`` (ledger id -> record) of log ``name`` in one
    change, and the head's :data:`PROGRESS` mark at ``progress``. A ledger the log no longer
    lists where it was offloaded from (``listed_at``: ledger id -> its ``(seq, offset)`` then;
    cut meanwhile -- the cut deleted the files it knew of, not these -- or unlisted and listed
    again elsewhere, its rows' offsets now wrong) has its files deleted now. A ledger another
    offloader recorded meanwhile keeps that record (never replaced: its bookies' copy may be
    dropped on its word) and the files it names. The ids of both are returned."""
    gone: set[int] = set()
    theirs: set[int] = set()
    listed_at = listed_at or {}

    def change(edit) -> None:
        changed = False
        gone.clear()
        theirs.clear()
        for lid, rec in done.items():
            e = edit.entry(lid)
            if e is None or lid in listed_at and (e.seq, e.offset) != listed_at[lid]:
                gone.add(lid)
            elif e.offloaded is None:
                edit.mark_offloaded(lid, rec)
                changed = True
            elif e.offloaded != rec:    # (equal: this change, its answer lost)
                theirs.add(lid)
        if progress is not None and progress_of(edit.properties).get("next", -1) < \
                progress["next"]:
            edit.properties[PROGRESS] = progress
            changed = True
        if not changed:
            raise NoChange()
    logs.update(name, change)
    if gone:
        delete_files(name, {lid: done[lid] for lid in gone})
    return gone | theirs


def delete_files(name: str, records: dict[int, dict]) -> None:
    """Delete the files of offload ``records`` (ledger id -> record) of log ``name``: those
    of ledgers a stored change unlisted (a truncation, retention's among them, an overwrite;
    :meth:`bkspark.log.LogStore.truncate_segments`). A file that cannot be deleted now is an
    orphan :func:`collect_orphans` removes later."""
    for lid, rec in records.items():
        try:
            where = Location(rec["location"])
            for f in rec.get("files", []):
                where.delete(f"{where.log_dir(name)}/{f['name']}")
        except (OSError, BKError, KeyError, TypeError) as exc:
            log.warning("log %s: the offloaded files of removed ledger %d stay for now (%s); "
                        "`bkspark shell offload %s` collects them", name, lid, exc, name)


def collect_orphans(logs, name: str, where: Location | None = None,
                    now_s: float | None = None) -> list[str]:
    """Remove what no reader should see under log ``name``'s directory at ``where`` (default:
    its policy's location): temporary files older than :data:`TEMP_GRACE_S`, and final files
    of ledgers the log does not list any more (removed by retention or a truncation) or whose
    record names other files or another location. Files of a listed ledger without a record
    are kept (the next pass records them -- at the policy's location: then these are swept).
    Returns the names removed. Reads the log's segments up to its :data:`PROGRESS` mark,
    :data:`SWEEP_CHUNK` a read, once -- not a lookup per file -- after a ``sync`` of the log's
    head, made once the files are listed: a file is judged on what the store held when it was
    seen, never on a server's older view (a ledger listed and offloaded by another process
    meanwhile)."""
    if where is None:
        policy = logs.offload_policy(name)
        if policy is None:
            return []
        where = Location(policy.location)
    now_s = time.time() if now_s is None else now_s
    directory = where.log_dir(name)
    removed = []
    infos = where.files(directory)
    if any(not i.base_name.startswith(TEMP_PREFIX) for i in infos):
        logs.store.sync(log_path(name))
    recorded: dict[int, set | None] | None = None      # listed ledger -> its file names

    def files_of_listed() -> dict[int, set | None]:
        first, _ = logs.bounds(name)
        stop = progress_of(logs.properties(name)).get("next", first)
        out: dict[int, set | None] = {}
        for lo in range(first, stop, SWEEP_CHUNK):
            for e in logs.segments(name, lo, min(stop, lo + SWEEP_CHUNK)):
                rec = e.offloaded
                if rec is None:
                    out[e.ledger_id] = None
                    continue
                at = rec.get("location") if isinstance(rec.get("location"), str) else None
                if at not in places:
                    places[at] = same_place(at, where.uri)
                # a ledger recorded at another location has no file here; where that is not
                # known (no location, one that does not parse), its files are kept
                out[e.ledger_id] = set() if places[at] is False else \
                    None if places[at] is None else {f["name"] for f in rec.get("files", [])}
        return out
    places: dict = {}
    for info in infos:
        base = info.base_name
        if base.startswith(TEMP_PREFIX) or base.endswith(TEMP_SUFFIX):
            mtime = info.mtime.timestamp() if info.mtime is not None else now_s
            if now_s - mtime > TEMP_GRACE_S:
                where.delete(info.path)
                removed.append(base)
            continue
        parsed = parse_file_name(base)
        if parsed is None:
            continue                    # not ours
        if recorded is None:
            recorded = files_of_listed()
        lid = parsed[1]
        if lid in recorded:
            names = recorded[lid]
            orphan = names is not None and base not in names
        else:           # not among those up to the mark: listed after it (kept), or not at all
            orphan = logs.entry_of(name, lid) is None
        if orphan:
            where.delete(info.path)
            removed.append(base)
    if removed:
        log.info("log %s: removed %d orphan offload files", name, len(removed))
    return removed


def previous_locations(properties: dict) -> list[dict]:
    """The :data:`PREVIOUS` entries of a head's properties (anything malformed: none)."""
    value = properties.get(PREVIOUS)
    if not isinstance(value, list):
        return []
    return [p for p in value if isinstance(p, dict) and isinstance(p.get("location"), str)
            and isinstance(p.get("left"), int)]


def left_location(properties: dict, location: str, now_ms: int) -> None:
    """Remember in ``properties`` (a head's, being edited) that the policy left ``location``
    at ``now_ms`` (:data:`PREVIOUS`)."""
    kept = [p for p in previous_locations(properties) if not same_place(p["location"], location)]
    properties[PREVIOUS] = (kept + [{"location": location, "left": now_ms}])[
        -MAX_PREVIOUS_LOCATIONS:]


def returned_to(properties: dict, location: str) -> None:
    """Forget ``location`` in ``properties`` (a head's, being edited): the policy names it."""
    kept = [p for p in previous_locations(properties) if not same_place(p["location"], location)]
    if kept:
        properties[PREVIOUS] = kept
    else:
        properties.pop(PREVIOUS, None)


def sweep_locations(logs, name: str, now_s: float | None = None) -> list[str]:
    """:func:`collect_orphans` at log ``name``'s policy location and at each location it named
    before (:data:`PREVIOUS`); a previous location whose directory holds none of the log's
    files any more -- nothing recorded there is kept by retention, nothing left of a crash --
    and that was left over :data:`TEMP_GRACE_S` ago is forgotten (one change, decided on what
    the head holds then). Returns the names removed. A location that fails is retried at the
    next sweep; the others are swept all the same, and the first failure is raised once they
    are."""
    removed: list[str] = []
    failure = None
    policy = logs.offload_policy(name)
    current = policy.location if policy is not None else None
    now_ms = logs.store.clock.now_ms()
    done: list[dict] = []
    for uri, left in ([(current, None)] if current else []) + [
            (p["location"], p["left"]) for p in previous_locations(logs.properties(name))]:
        try:
            if left is not None and same_place(uri, current):
                continue                # (the current one, spelt otherwise: swept above)
            where = Location(uri)
            removed += collect_orphans(logs, name, where, now_s)
            if left is not None and now_ms - left >= TEMP_GRACE_S * 1000 and \
                    not where.files(where.log_dir(name)):
                done.append({"location": uri, "left": left})
        except Exception as exc:  # noqa: BLE001 - one location must not stop the others
            failure = failure or exc
            log.warning("log %s: sweeping offload location %s: %s", name, uri, exc)
    if done:
        def change(edit) -> None:   # (an entry left again meanwhile has another "left")
            now = previous_locations(edit.properties)
            keep = [p for p in now if p not in done]
            if keep == now:
                raise NoChange()
            if keep:
                edit.properties[PREVIOUS] = keep
            else:
                edit.properties.pop(PREVIOUS, None)
        logs.update(name, change)
    if failure is not None:
        raise failure
    return removed
