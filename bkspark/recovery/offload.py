"""The offload pass: a log's closed ledgers written as Parquet, crash-safe and exactly once.

What is offloaded, where and how it is laid out: :mod:`bkspark.log.offload`. The steps for
one ledger, each safe to crash in:

1. read its entries (the client verifies every entry's digest) and convert them;
2. write each file under a temporary name (``_tmp-....inprogress``: Spark and pyarrow skip
   names starting with ``_``, a ``*.parquet`` glob -- DuckDB's -- names ending otherwise),
   flushed to disk (fsync of the file, on a local filesystem);
3. verify: read the file back one row group at a time (page checksums verified) and compare
   it with what was converted -- rows, values, offsets contiguous from the ledger's offset;
4. once every file of the ledger is written and verified, publish them by rename to their
   final names, in offset order (on a local filesystem an atomic replace, then an fsync of
   the directory; a retry replaces a published file with the same rows). A failure before
   (an entry that does not decode, the ledger deleted by a cut, the location failing, the
   ledger recorded by another offloader meanwhile -- checked on a synced read just before)
   publishes nothing of the ledger; a crash or a failed rename amid the renames of a ledger
   of several files leaves its first files published (never deleted: another offloader may
   have published and recorded the same names), until the next pass publishes the rest;
5. one metadata change (per pass, of every ledger it offloaded) records each ledger's files:
   location, names, entry ranges, rows, bytes, and a crc32c of the entries' payloads chained
   in entry order (:attr:`metadata.log_entry.LogLedger.offloaded`). A lost answer is settled
   as every log change is (:meth:`bkspark.log.LogStore.update`): re-read, and the change is
   applied again only if it is not stored.

So no reader sees a temporary file; a published file whose record is not stored yet (a crash
between 4 and 5) holds exactly its entries' rows, and the next pass writes and records it
again. Ledgers are offloaded oldest first and their files published in offset order, so a
reader of the directory always sees a prefix of the log's offloaded rows (from the oldest
ledger retention keeps), each row once, whatever step a crash stopped. Where a ledger is cut
into files is a rule of its entries' bytes alone (:func:`entry_cost`, whatever pyarrow build
decodes them), so the next pass -- or another offloader racing on the same ledger --
publishes the same names holding the same rows. (A racing offloader of another pyarrow build
may replace a published file with one of the same rows and other bytes;
:func:`drop_copies` accepts a file whose size is not the recorded one only once it gives
back the record's entries.) Offloaders of bkspark versions whose split rules differ do not
agree: the next pass after a crash may publish other names, whose rows a reader of the
directory sees twice until :func:`bkspark.log.offload.collect_orphans` deletes the files no
record names -- so upgrade the offloading processes (the service's leader, ``shell
offload``) together, and not while one is mid-pass.

The record also says whether the files give back every entry byte for byte, as every reader
reads them back (its ``encoding``, checked at step 3 on the file itself). Only then, and once
the policy's ``keep_on_bookies_ms`` has passed, may :func:`drop_copies` delete the ledger from
the bookies (its own steps, each safe to crash in, are in its docstring).
"""
from __future__ import annotations

import logging
import secrets
import struct
import time

import crc32c
import pyarrow as pa
import pyarrow.compute as pc

from bkspark.errors import BadRequestError, BKError, NoSuchLedgerError, NoSuchLogError
from bkspark.log.offload import (ARROW, ARROW_COLUMNS, ARROW_COMPRESSIONS, DROPPED,
                                 FILE_ENTRY_BYTES, MAX_BYTES_PER_PASS, MAX_LEDGERS_PER_PASS,
                                 READ_BATCH_ROWS, RAW, RECORD, TEMP_PREFIX, TEMP_SUFFIX,
                                 Location, OffloadError, arrow_encoding, delete_files, due,
                                 encode_entries, file_name, on_bookies, progress_after,
                                 progress_of, record, valid_runs)
from bkspark.log.records import MAGIC, VERSION
from bkspark.spark import codec
from metadata.layout import log_path
from metadata.log_entry import LogLedger
from metadata.update import NoChange

log = logging.getLogger("bkspark.recovery.offload")

TS_TYPE = pa.timestamp("us", tz="UTC")
RECORD_SCHEMA = pa.schema([
    ("offset", pa.int64()), ("ledger_id", pa.int64()), ("entry_id", pa.int64()),
    ("key", pa.binary()), ("value", pa.binary()), ("timestamp", TS_TYPE),
    ("headers", pa.map_(pa.string(), pa.binary())),
])


# ---- converting entries -------------------------------------------------------------------------

#: record entries converted together into one batch at most (rows, bytes of their entries)
RECORD_CHUNK_ROWS = 8192
RECORD_CHUNK_BYTES = 8 << 20
#: what a row's fixed-width columns add to its entry's bytes in :func:`entry_cost`
#: (record: offset, ledger id, entry id, timestamp, three value offsets; Arrow: the three
#: ``_`` columns)
RECORD_ROW_COST = 44
ARROW_ROW_COST = 24
#: converted Arrow entries merged into one batch (a copy of their rows) once this many wait
#: for their file: the memory a file holds stays about its entries' :func:`entry_cost`
ARROW_MERGE_BATCHES = 8192


def entry_cost(data, batch: pa.RecordBatch | None = None) -> int:
    """The bytes one entry counts for in the split of a ledger into files
    (:data:`FILE_ENTRY_BYTES` a file): a record entry's length plus
    :data:`RECORD_ROW_COST`; an Arrow entry's ``batch`` (decoded from it), the sizes of the
    buffers it decodes to (their lengths in its IPC message, after decompression) plus
    :data:`ARROW_ROW_COST` a row -- about what its rows hold in memory once converted (and
    merged: :data:`ARROW_MERGE_BATCHES`). A function of the entry's bytes alone, whatever
    pyarrow build decodes them (not ``nbytes``, whose accounting differs between builds,
    nor where converted rows happen to be cut into batches): every offloader of one bkspark
    version splits a ledger at the same entries, so a retry or a racing offloader publishes
    the same names with the same rows. The rule and its constants are part of the offloaded
    layout: a version that changes them splits ledgers elsewhere (see the module
    docstring)."""
    if batch is None:
        return len(data) + RECORD_ROW_COST
    return sum(buf.size for col in batch.columns for buf in col.buffers() if buf is not None) \
        + ARROW_ROW_COST * batch.num_rows


def _record_table(rows: list, ledger_id: int, base: int) -> pa.Table:
    """The table of decoded record entries ``rows`` (``(entry id, key, value, timestamp_us,
    headers)``, :func:`bkspark.log.records.decode_record`) of the ledger whose entry 0 is log
    offset ``base``."""
    eids = [r[0] for r in rows]
    n = len(eids)
    return pa.Table.from_arrays([
        pa.array([base + eid for eid in eids], pa.int64()),
        pa.array([ledger_id] * n, pa.int64()), pa.array(eids, pa.int64()),
        pa.array([r[1] for r in rows], pa.binary()), pa.array([r[2] for r in rows], pa.binary()),
        pa.array([r[3] for r in rows], pa.int64()).cast(TS_TYPE),
        pa.array([r[4] for r in rows], RECORD_SCHEMA.field("headers").type)],
        schema=RECORD_SCHEMA)


def _arrow_table(decoded: list, ledger_id: int, base: int, stored: pa.Schema) -> pa.Table:
    """The table of Arrow entries ``decoded`` (``(entry id, its batch)``) with their positions'
    columns, of the ledger whose entry 0 is log offset ``base``."""
    schema = stored
    for col in ARROW_COLUMNS:
        schema = schema.append(pa.field(col, pa.int64(), nullable=False))
    batches = []
    for eid, b in decoded:
        n = b.num_rows
        batches.append(pa.RecordBatch.from_arrays(
            list(b.columns) + [pa.array([base + eid] * n, pa.int64()),
                               pa.array([ledger_id] * n, pa.int64()),
                               pa.array([eid] * n, pa.int64())], schema=schema))
    return pa.Table.from_batches(batches, schema=schema)


def _check(col, arrow: bool, first: int, last: int, base: int, rows: int) -> None:
    """What a file read back must hold: ``rows`` rows of entries ``first..last`` of the
    ledger whose entry 0 is log offset ``base``, in order (``col``: its offsets, read back).
    :raises OffloadError: not so."""
    if len(col) != rows:
        raise OffloadError(f"read back {len(col)} offsets, wrote {rows} rows")
    if not rows:
        return
    if arrow:               # (an entry holds any number of rows: non-decreasing, in range)
        ok = pc.min(col).as_py() >= base + first and pc.max(col).as_py() <= base + last and \
            (rows == 1 or pc.all(pc.greater_equal(col[1:], col[:-1])).as_py())
    else:
        ok = pc.all(pc.equal(col, pa.array(range(base + first, base + last + 1),
                                           pa.int64()))).as_py()
    if not ok:
        raise OffloadError(f"read back offsets that are not {base + first}..{base + last} "
                           "in order")


# ---- one ledger ---------------------------------------------------------------------------------

_UNDECODABLE = (ValueError, TypeError, IndexError, struct.error, UnicodeDecodeError,
                pa.ArrowException)


def _arrow_batches(e, stored, ledger_id: int, base: int) -> tuple[list, int]:
    """The rows of one Arrow entry as RecordBatches (``stored``: the ledger's Arrow schema),
    and its :func:`entry_cost`. :raises OffloadError: the entry does not decode as Arrow."""
    try:
        b = codec.decode_arrow(e.data, stored)
        table = _arrow_table([(e.entry_id, b)], ledger_id, base, stored)
        return table.combine_chunks().to_batches(), entry_cost(e.data, b)
    except _UNDECODABLE as exc:
        raise OffloadError(f"ledger {ledger_id} entry {e.entry_id} does not decode as "
                           f"Arrow: {exc}") from None


def _arrow_kind(data, stored) -> str | None:
    """The Arrow encoding (:func:`bkspark.log.offload.arrow_encoding`) an Arrow entry has: the
    body compression whose re-encoding of its batch gives its bytes (None: none does)."""
    from bkspark.log.arrow_entries import encode_arrow
    try:
        batch = codec.decode_arrow(data, stored)
        for compression in ARROW_COMPRESSIONS:
            if encode_arrow(batch, compression) == pa.py_buffer(data):
                return arrow_encoding(compression)
    except _UNDECODABLE:
        pass                            # (the conversion says what is wrong with it)
    return None


def _record_row(e, ledger_id: int) -> tuple:
    """``(entry id, key, value, timestamp_us, headers)`` of one record entry (copies: the
    entry's buffer is not kept). :raises OffloadError: it does not decode as a record."""
    try:
        return (e.entry_id, *codec.decode_record(e.data))
    except _UNDECODABLE as exc:
        raise OffloadError(f"ledger {ledger_id} entry {e.entry_id} does not decode as "
                           f"a record: {exc}") from None


def _kind(data) -> str:
    """The encoding (:data:`RECORD` or :data:`RAW`) an entry that is not Arrow has."""
    head = bytes(data[:5])
    return RECORD if head[:4] == MAGIC and head[4:] == bytes([VERSION]) else RAW


_LEN = struct.Struct("<I")


def _framed_crc(data, crc: int) -> int:
    """``crc`` chained over ``data``'s length then its bytes: entry boundaries count (a crc of
    the bytes alone is the same for any split of them into entries)."""
    return crc32c.crc32c(data, crc32c.crc32c(_LEN.pack(len(data)), crc))


def _plain_crc(data, crc: int) -> int:
    """``crc`` chained over ``data`` (a file record's ``crc32c``)."""
    return crc32c.crc32c(data, crc)


def _gives_back(where: Location, path: str, encoding: str, first: int, last: int,
                crc: int, chain=_framed_crc) -> bool:
    """Whether the file at ``path``, read as every reader reads offloaded entries
    (:func:`bkspark.log.offload.encode_entries`), gives back entries ``first..last`` whose
    lengths and payloads, chained (:func:`_framed_crc`; or only their payloads,
    :func:`_plain_crc`), have ``crc``: byte for byte the entries read from the bookies."""
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(path, filesystem=where.fs)
    expect, got = first, 0
    try:
        for eid, data in encode_entries(pf.iter_batches(batch_size=READ_BATCH_ROWS),
                                        encoding):
            if eid != expect or data is None:
                return False
            got = chain(data, got)
            expect += 1
    except Exception as exc:  # noqa: BLE001 - the check only decides whether to drop, ever
        log.info("%s: re-encoding its entries failed (%s): not given back", path, exc)
        return False
    return expect == last + 1 and got == crc


def offload_ledger(logs, name: str, entry: LogLedger, where: Location,
                   now_ms: int | None = None) -> dict:
    """Write ledger ``entry`` (closed, listed in log ``name``, its offset stamped) as Parquet
    (steps 1-4 of the module docstring); returns the record step 5 stores. A file holds the
    entries whose :func:`entry_cost` reaches :data:`FILE_ENTRY_BYTES` (about what it holds in
    memory: the rows converted, then one row group read back at a time).

    :raises OffloadError: an entry does not decode, a file did not read back as converted,
        or the location failed (nothing of that file published).
    :raises NoSuchLedgerError: the ledger was deleted meanwhile (a retention cut).

    The record's ``encoding`` says how its files give back the entries byte for byte
    (:func:`_gives_back`, every file checked), ``at`` when it was made (``now_ms``): only such
    a ledger may lose its bookies' copy (:func:`drop_copies`)."""
    if not entry.closed or entry.offset is None or entry.last_entry_id is None:
        raise BadRequestError(f"log {name}: ledger {entry.ledger_id} is not closed with a "
                              "known offset; it cannot be offloaded yet")
    # (the service's own credentials, not the writer's password: it offloads every log,
    # as autorecovery copies every ledger; entries are verified all the same)
    rh = logs.bk.open_ledger_without_password(entry.ledger_id, recovery=False, read_lac=False)
    stored = codec.ledger_arrow_schema(rh.metadata.custom_metadata)
    directory = where.log_dir(name)
    files: list[dict] = []
    temps: list[str] = []           # written and verified, not published yet
    batches: list = []
    span: list[int] = []            # first and last entry of the file being filled
    # (an empty ledger's nothing is given back in any encoding)
    state = {"size": 0, "crc": 0, "framed": 0, "merged": 0,
             "encoding": ARROW if stored is not None else RAW}

    def flush():
        first, last = span
        convert_rows()
        table = pa.Table.from_batches(batches) if batches else (
            _arrow_table([], entry.ledger_id, entry.offset, stored) if stored is not None
            else _record_table([], entry.ledger_id, entry.offset))
        final_name = file_name(entry.offset + first, entry.ledger_id)
        tmp = f"{directory}/{TEMP_PREFIX}{final_name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        what = f"log {name}: ledger {entry.ledger_id} entries {first}..{last}"
        temps.append(tmp)
        try:
            nbytes = where.write(tmp, table)
            where.verify(tmp, table, "_offset" if stored is not None else "offset",
                         lambda col: _check(col, stored is not None, first, last, entry.offset,
                                            table.num_rows))
            if state["encoding"] is not None and not _gives_back(
                    where, tmp, state["encoding"], first, last, state["framed"]):
                log.info("%s: its files do not give back its entries byte for byte (%s); "
                         "the bookies keep their copy", what, state["encoding"])
                state["encoding"] = None
        except OffloadError as exc:
            raise OffloadError(f"{what}: {exc}") from None
        except (OSError, pa.ArrowException) as exc:
            raise OffloadError(f"{what}: writing {tmp}: {exc}") from exc
        files.append({"name": final_name, "first": first, "last": last,
                      "rows": table.num_rows, "bytes": nbytes, "crc32c": state["crc"]})
        batches.clear()
        span.clear()
        state.update(size=0, crc=0, framed=0, merged=0)

    def merge_tail():
        # (many small entries: each batch keeps its objects and its entry's whole buffer --
        # ~4 KB an entry for a row of a few bytes; merged, only their rows are kept)
        tail = pa.Table.from_batches(batches[state["merged"]:]).combine_chunks().to_batches()
        del batches[state["merged"]:]
        batches.extend(tail)
        state["merged"] = len(batches)

    rows: list = []                 # record entries decoded, not in a batch yet
    pending = [0]                   # ... the bytes of their entries

    def convert_rows():
        if rows:
            batches.extend(_record_table(rows, entry.ledger_id, entry.offset).to_batches())
            rows.clear()
            pending[0] = 0

    published = 0
    try:
        if entry.last_entry_id >= 0:
            for e in rh.read(0, entry.last_entry_id):
                if not span:
                    span[:] = [e.entry_id, e.entry_id]
                span[1] = e.entry_id
                state["crc"] = crc32c.crc32c(e.data, state["crc"])
                state["framed"] = _framed_crc(e.data, state["framed"])
                if e.entry_id == 0:
                    state["encoding"] = _kind(e.data) if stored is None else \
                        _arrow_kind(e.data, stored)
                if stored is not None:
                    converted, cost = _arrow_batches(e, stored, entry.ledger_id, entry.offset)
                    batches.extend(converted)
                    state["size"] += cost
                    if len(batches) - state["merged"] >= ARROW_MERGE_BATCHES:
                        merge_tail()
                else:
                    rows.append(_record_row(e, entry.ledger_id))
                    pending[0] += len(e.data)
                    state["size"] += entry_cost(e.data)
                    if len(rows) >= RECORD_CHUNK_ROWS or pending[0] >= RECORD_CHUNK_BYTES:
                        convert_rows()
                if state["size"] >= FILE_ENTRY_BYTES:
                    flush()
            if span:
                flush()
        # every file is written and verified: only now is any published (a ledger is never
        # half in the directory) -- unless another offloader recorded the ledger meanwhile:
        # its files (the same names) are the ones its record names, never to be replaced
        if _recorded(logs, name, entry.ledger_id):
            raise _Recorded(f"log {name}: ledger {entry.ledger_id} was offloaded by another "
                            "process meanwhile")
        for tmp, f in zip(temps, files):
            where.publish(tmp, f"{directory}/{f['name']}")
            published += 1
    except BaseException as exc:
        for tmp in temps[published:]:
            where.delete(tmp)
        # (a rename that failed after others leaves those published: each holds exactly its
        # entries' rows, the next pass publishes the same names again, and another offloader
        # may have published -- and recorded -- the same names meanwhile: never deleted here)
        if isinstance(exc, OSError):
            raise OffloadError(f"log {name}: ledger {entry.ledger_id}: publishing: {exc}") \
                from exc
        raise
    finally:
        rh.close()
    out = {"location": where.uri, "dir": f"log={name}", "files": files,
           "at": logs.store.clock.now_ms() if now_ms is None else now_ms}
    if state["encoding"] is not None:
        out["encoding"] = state["encoding"]
    return out


class _Recorded(BKError):
    """The ledger being offloaded was recorded by another offloader meanwhile."""


def _recorded(logs, name: str, ledger_id: int) -> bool:
    """Whether log ``name`` lists ``ledger_id`` with an offload record, on a synced read."""
    logs.store.sync(log_path(name))
    e = logs.entry_of(name, ledger_id)
    return e is not None and e.offloaded is not None


# ---- a pass over one log ------------------------------------------------------------------------

def run(logs, name: str, now_ms: int | None = None,
        max_ledgers: int = MAX_LEDGERS_PER_PASS, still_leader=lambda: True) -> dict[int, dict]:
    """Apply log ``name``'s offload policy once: offload the ledgers :func:`due` names -- at
    most :data:`MAX_BYTES_PER_PASS` of entries, and none once ``still_leader()`` says the
    caller lost its election -- then record them (one change). Returns the records stored,
    by ledger id in log order. A ledger that fails stops the pass after recording those
    before it (the next pass retries it).

    :raises OffloadError: a ledger could not be offloaded (those before it are recorded)."""
    policy = logs.offload_policy(name)
    if policy is None:
        return {}
    if now_ms is None:
        now_ms = logs.store.clock.check_skew(f"offload of log {name}")
    where = Location(policy.location)
    todo = due(logs, name, policy, now_ms, max_ledgers)
    done: dict[int, dict] = {}
    progress = None
    failure = None
    budget = MAX_BYTES_PER_PASS
    for e in todo:
        if budget <= 0 or not still_leader():
            break
        budget -= e.sealed_length()
        t = time.perf_counter()
        try:
            done[e.ledger_id] = offload_ledger(logs, name, e, where, now_ms)
        except (NoSuchLedgerError, _Recorded):
            continue                    # cut by retention meanwhile, or offloaded by another
                                        # process (nothing published)
        except BKError as exc:          # (OffloadError among them)
            failure = exc
            break
        progress = progress_after(e)
        rec = done[e.ledger_id]
        log.info("log %s: ledger %d offloaded to %s (%d files, %d rows, %.2f s)", name,
                 e.ledger_id, policy.location, len(rec["files"]),
                 sum(f["rows"] for f in rec["files"]), time.perf_counter() - t)
    if done or progress is not None:
        try:
            gone = record(logs, name, done, progress, {e.ledger_id: (e.seq, e.offset)
                                                       for e in todo if e.ledger_id in done})
        except NoSuchLogError:          # deleted meanwhile: its deletion did not see these
            delete_files(name, done)
            raise
        for lid in gone:
            done.pop(lid)               # (cut meanwhile: not recorded, its files deleted)
    if failure is not None:
        raise failure
    return done


# ---- dropping the bookies' copy -----------------------------------------------------------------

#: runs of ledgers passed over but kept on the bookies the :data:`DROPPED` mark lists at most
#: (the oldest merged beyond: the stats then count the ledgers between them kept too)
MAX_KEPT_RUNS = 64


def kept_runs(runs, kept: list[LogLedger]) -> list:
    """``runs`` (``[[offset, entries, byte_offset, bytes], ...]``: of the log, ledgers the
    bookies keep below the :data:`DROPPED` mark) with the ledgers ``kept`` added, adjacent
    ones merged, at most :data:`MAX_KEPT_RUNS`."""
    out = [list(r) for r in valid_runs(runs)]
    for e in kept:
        n, size = e.entry_count() or 0, e.sealed_length()
        if out and out[-1][0] + out[-1][1] == e.offset:
            out[-1][1] += n
            out[-1][3] += size
        else:
            out.append([e.offset, n, e.byte_offset or 0, size])
    while len(out) > MAX_KEPT_RUNS:
        a, b = out[0], out.pop(1)
        a[1], a[3] = b[0] + b[1] - a[0], b[2] + b[3] - a[2]
    return out


#: ledgers one pass drops the bookies' copy of at most (the next pass goes on)
MAX_DROPS_PER_PASS = 256
#: segments the scan reads a request
_DROP_SCAN = 64


def _files_there(where: Location, name: str, rec: dict) -> str | None:
    """None if every file of offload record ``rec`` is in place: with its recorded size, or
    -- replaced by a racing offloader of another pyarrow build -- giving back the entries it
    is recorded with (their payloads' crc); else what is wrong."""
    directory = where.log_dir(name)
    for f in rec.get("files", []):
        path = f"{directory}/{f['name']}"
        info = where.fs.get_file_info(path)
        if info.size is None:
            return f"{path} is missing"
        if info.size != f["bytes"] and not ("crc32c" in f and _gives_back(
                where, path, rec["encoding"], f["first"], f["last"], f["crc32c"], _plain_crc)):
            return (f"{path} holds {info.size} bytes, not {f['bytes']}, and does not give "
                    f"back entries {f['first']}..{f['last']} as recorded")
    return None


def drop_copies(logs, name: str, now_ms: int | None = None,
                max_ledgers: int = MAX_DROPS_PER_PASS, still_leader=lambda: True) -> list[int]:
    """Drop the bookies' copy of log ``name``'s offloaded ledgers once its policy's
    ``keep_on_bookies_ms`` passed since they were offloaded; returns the ledgers dropped. The
    steps, each safe to crash in:

    1. scan from the head's :data:`DROPPED` mark up to the offload progress, never the last
       listed ledger (a writer checks its password): a ledger marked already is dropped again
       (a crash after step 2); one whose record has no ``encoding`` (its files do not give its
       entries back byte for byte) is passed over and keeps its copy; one offloaded long
       enough ago is due -- if every file is in place with its recorded size; the first that
       is not due stops the scan;
    2. one change marks the due ones ``on_bookies: false``, their records otherwise as they
       were (one cut, or offloaded again meanwhile, is not marked; a lost answer is settled by
       the update loop). From then on every reader reads them from their files
       (:func:`bkspark.log.offload.read_entries`), and one that opened a ledger before reads
       its files when the bookies no longer serve it;
    3. their ledgers are deleted (their metadata; the bookies' garbage collection frees the
       disk; ledgers already gone are skipped);
    4. the :data:`DROPPED` mark moves past what was handled.

    :raises OffloadError: a due ledger's files are not in place (those before it are dropped);
        the next pass tries again."""
    policy = logs.offload_policy(name)
    if policy is None:
        return []
    keep = policy.keep_on_bookies_ms
    if now_ms is None:
        now_ms = logs.store.clock.check_skew(f"dropping bookie copies of log {name}")
    first, nxt = logs.bounds(name)
    props = logs.properties(name)
    upto = min(progress_of(props).get("next", first), nxt - 1)
    lo = max(first, progress_of(props, DROPPED).get("next", first))
    scanned: list[tuple[LogLedger, str]] = []       # (entry, "marked" | "due" | "kept")
    failure = None
    while lo < upto and failure is None and len(scanned) < max_ledgers:
        stop = False
        for e in logs.segments(name, lo, min(upto, lo + _DROP_SCAN)):
            rec = e.offloaded
            if rec is None:
                stop = True
            elif not on_bookies(rec):
                scanned.append((e, "marked"))
            elif rec.get("encoding") is None:
                scanned.append((e, "kept"))
            elif keep is not None and isinstance(rec.get("at"), int) and \
                    rec["at"] + keep <= now_ms:
                wrong = _files_there(Location(rec["location"]), name, rec)
                if wrong is not None:
                    failure = OffloadError(f"log {name}: ledger {e.ledger_id}: {wrong}; the "
                                           "bookies keep their copy")
                    stop = True
                else:
                    scanned.append((e, "due"))
            else:
                stop = True
            if stop or len(scanned) >= max_ledgers:
                break
        if stop:
            break
        lo += _DROP_SCAN
    due_ = [e for e, what in scanned if what == "due"]
    found: set[int] = {e.ledger_id for e, what in scanned if what == "marked"}
    marked: set[int] = set(found)       # ... and those the stored change marks
    if due_ and still_leader():
        def mark(edit) -> None:
            changed = False
            marked.clear()              # (each attempt decides on what it read)
            marked.update(found)
            for e in due_:
                cur = edit.entry(e.ledger_id)
                if cur is None or cur.offloaded is None:
                    continue                        # cut meanwhile
                if not on_bookies(cur.offloaded):
                    marked.add(e.ledger_id)         # (a lost answer: applied)
                elif cur.offloaded == e.offloaded:
                    edit.mark_offloaded(e.ledger_id, {**cur.offloaded, "on_bookies": False})
                    marked.add(e.ledger_id)
                    changed = True
            if not changed:
                raise NoChange()
        logs.update(name, mark)
    if marked:
        # every one is stored ``on_bookies: false``: marked by the change the update loop
        # stored (its last attempt decided on what it read; after a lost answer it reads
        # again after a sync), or read so by the scan -- a mark is never undone (record()
        # never replaces a record, and a deleted ledger cannot be listed again), so even a
        # server's older view that shows it shows what is stored
        logs.bk.delete_ledgers(sorted(marked))
        log.info("log %s: the bookies' copy of %d offloaded ledgers dropped (%s)", name,
                 len(marked), ", ".join(map(str, sorted(marked))))
    handled = None                                  # the last of the prefix handled
    kept: list = []                                 # ... its ledgers kept on the bookies
    for e, what in scanned:
        if what != "kept" and e.ledger_id not in marked:
            break
        handled = e
        if what == "kept":
            kept.append(e)
    if handled is not None:
        mark_to = progress_after(handled)

        def advance(edit) -> None:
            before = progress_of(edit.properties, DROPPED)
            if before.get("next", -1) >= mark_to["next"]:
                raise NoChange()
            edit.properties[DROPPED] = dict(mark_to, kept=kept_runs(
                before.get("kept"), [e for e in kept if e.seq >= before.get("next", -1)]))
        logs.update(name, advance)
    if failure is not None:
        raise failure
    return sorted(marked)
