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
   final names (on a local filesystem an atomic replace, then an fsync of the directory; a
   retry replaces a published file with the same rows). A failure before (an entry that does
   not decode, the ledger deleted by a cut, the location failing) publishes nothing of the
   ledger; only a crash amid the renames of a ledger of several files leaves part of it
   published, until the next pass publishes the rest;
5. one metadata change (per pass, of every ledger it offloaded) records each ledger's files:
   location, names, entry ranges, rows, bytes, and a crc32c of the entries' payloads chained
   in entry order (:attr:`metadata.log_entry.LogLedger.offloaded`). A lost answer is settled
   as every log change is (:meth:`bkspark.log.LogStore.update`): re-read, and the change is
   applied again only if it is not stored.

So no reader sees a temporary file; a published file whose record is not stored yet (a crash
between 4 and 5) holds exactly its entries' rows, and the next pass writes and records it
again. :func:`bkspark.log.offload.collect_orphans` removes what a crash left.
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
from bkspark.log.offload import (ARROW_COLUMNS, FILE_ENTRY_BYTES, MAX_BYTES_PER_PASS,
                                 MAX_LEDGERS_PER_PASS, TEMP_PREFIX, TEMP_SUFFIX, Location,
                                 OffloadError, delete_files, due, file_name, progress_after,
                                 record)
from bkspark.spark import codec
from metadata.log_entry import LogLedger

log = logging.getLogger("bkspark.recovery.offload")

TS_TYPE = pa.timestamp("us", tz="UTC")
RECORD_SCHEMA = pa.schema([
    ("offset", pa.int64()), ("ledger_id", pa.int64()), ("entry_id", pa.int64()),
    ("key", pa.binary()), ("value", pa.binary()), ("timestamp", TS_TYPE),
    ("headers", pa.map_(pa.string(), pa.binary())),
])


# ---- converting entries -------------------------------------------------------------------------

def _record_table(entries: list, ledger_id: int, base: int) -> pa.Table:
    offsets, eids, keys, values, tss, hdrs = [], [], [], [], [], []
    for e in entries:
        k, v, ts, h = codec.decode_record(e.data)
        offsets.append(base + e.entry_id)
        eids.append(e.entry_id)
        keys.append(k)
        values.append(v)
        tss.append(ts)
        hdrs.append(h)
    n = len(eids)
    return pa.Table.from_arrays([
        pa.array(offsets, pa.int64()), pa.array([ledger_id] * n, pa.int64()),
        pa.array(eids, pa.int64()), pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
        pa.array(tss, pa.int64()).cast(TS_TYPE),
        pa.array(hdrs, RECORD_SCHEMA.field("headers").type)], schema=RECORD_SCHEMA)


def _arrow_table(entries: list, ledger_id: int, base: int, stored: pa.Schema) -> pa.Table:
    schema = stored
    for col in ARROW_COLUMNS:
        schema = schema.append(pa.field(col, pa.int64(), nullable=False))
    batches = []
    for e in entries:
        b = codec.decode_arrow(e.data, stored)
        n = b.num_rows
        batches.append(pa.RecordBatch.from_arrays(
            list(b.columns) + [pa.array([base + e.entry_id] * n, pa.int64()),
                               pa.array([ledger_id] * n, pa.int64()),
                               pa.array([e.entry_id] * n, pa.int64())], schema=schema))
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

def _convert(e, stored, ledger_id: int, base: int):
    """The rows of one entry as a RecordBatch (``stored``: the ledger's Arrow schema, None:
    record entries). :raises OffloadError: the entry does not decode as its format says."""
    try:
        if stored is not None:
            return _arrow_table([e], ledger_id, base, stored).combine_chunks().to_batches()
        return _record_table([e], ledger_id, base).to_batches()
    except (ValueError, TypeError, IndexError, struct.error, UnicodeDecodeError,
            pa.ArrowException) as exc:
        raise OffloadError(f"ledger {ledger_id} entry {e.entry_id} does not decode as "
                           f"{'Arrow' if stored is not None else 'a record'}: {exc}") from None


def offload_ledger(logs, name: str, entry: LogLedger, where: Location) -> dict:
    """Write ledger ``entry`` (closed, listed in log ``name``, its offset stamped) as Parquet
    (steps 1-4 of the module docstring); returns the record step 5 stores. A file holds the
    entries whose decoded rows reach :data:`FILE_ENTRY_BYTES` (what it holds in memory: the
    rows converted, then one row group read back at a time).

    :raises OffloadError: an entry does not decode, a file did not read back as converted,
        or the location failed (nothing of that file published).
    :raises NoSuchLedgerError: the ledger was deleted meanwhile (a retention cut)."""
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
    state = {"size": 0, "crc": 0}

    def flush():
        first, last = span
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
        except OffloadError as exc:
            raise OffloadError(f"{what}: {exc}") from None
        except (OSError, pa.ArrowException) as exc:
            raise OffloadError(f"{what}: writing {tmp}: {exc}") from exc
        files.append({"name": final_name, "first": first, "last": last,
                      "rows": table.num_rows, "bytes": nbytes, "crc32c": state["crc"]})
        batches.clear()
        span.clear()
        state.update(size=0, crc=0)

    published = 0
    try:
        if entry.last_entry_id >= 0:
            for e in rh.read(0, entry.last_entry_id):
                if not span:
                    span[:] = [e.entry_id, e.entry_id]
                span[1] = e.entry_id
                state["crc"] = crc32c.crc32c(e.data, state["crc"])
                for b in _convert(e, stored, entry.ledger_id, entry.offset):
                    batches.append(b)
                    state["size"] += b.nbytes
                if state["size"] >= FILE_ENTRY_BYTES:
                    flush()
            if span:
                flush()
        # every file is written and verified: only now is any published (a ledger is never
        # half in the directory)
        for tmp, f in zip(temps, files):
            where.publish(tmp, f"{directory}/{f['name']}")
            published += 1
    except BaseException as exc:
        for tmp in temps[published:]:
            where.delete(tmp)
        for f in files[:published]:             # (a rename that failed after others)
            where.delete(f"{directory}/{f['name']}")
        if isinstance(exc, OSError):
            raise OffloadError(f"log {name}: ledger {entry.ledger_id}: publishing: {exc}") \
                from exc
        raise
    finally:
        rh.close()
    return {"location": where.uri, "dir": f"log={name}", "files": files}


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
            done[e.ledger_id] = offload_ledger(logs, name, e, where)
        except NoSuchLedgerError:
            continue                    # cut by retention meanwhile (nothing published)
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
