"""Read-only, offline readers of a bookie's files (for `bkspark shell lastmark/readjournal/
readlog`). Formats are those of the engine (``bookie_native/engine_int.h``, ``journal.c``,
``entrylog.c``, ``checkpoint.c``; integers in native byte order, little-endian on the supported
platforms):

* journal ``<journal_dir>/<%016x>.txn``: 512-byte header ``"BKSJ"``, u32 version, u64 id,
  then either u32 crc32c(header[0:16]) (records follow directly) or u32 flags + u32
  crc32c(header[0:20]) (records inside ``"BKSG"`` groups: u32 len, u32 crc32c(records),
  u64 offset of the group, u32 crc32c(journal id + the 20 group-header bytes before it));
  records are ``u32 len, u32 type, u32 crc`` + ``len``
  bytes, crc = crc32c(first 8 header bytes + payload). Types: 1 add (u64 ledger, i64 entry,
  body), 2 master key / 3 fence (u64 ledger, u64 incarnation, u16 key length, key), 4
  explicit LAC (u64 ledger, LAC body), 5 delete (u64 ledger). A zero length (preallocated
  tail), an impossible length or a bad crc ends the journal.
* entry log ``<ledger_dir>/<%08x>.log``: 64-byte header ``"BKSL"``, u32 version, u32 id,
  crc32c of the first 60 bytes in the last 4; records ``u32 len (=16+body), u32 crc, u64
  ledger, i64 entry`` + body, crc = crc32c(ledger, entry, body).
* ``<ledger_dir>/lastMark``: 32 bytes ``"BKSM"``, u32 version, u64 journal id, u64 position,
  u32 crc32c(first 24 bytes).

These tools never write: run them on a stopped bookie's directories (or on a copy).
"""
from __future__ import annotations

import os
import struct

from bkspark import _native
from bkspark.errors import BadRequestError

JR_TYPES = {1: "add", 2: "masterkey", 3: "fence", 4: "lac", 5: "delete"}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_GROUP_HEADER = 24      # "BKSG", u32 len, u32 crc(records), u64 own offset, u32 header crc


def _crc(data: bytes, value: int = 0) -> int:
    return _native.crc32c(data, value)


def read_lastmark(path: str) -> dict:
    """``{"path", "journal_id", "position", "valid"}`` of a ``lastMark`` file (or of the one
    inside a ledger directory)."""
    if os.path.isdir(path):
        path = os.path.join(path, "lastMark")
    try:
        with open(path, "rb") as f:
            m = f.read(32)
    except OSError as e:
        raise BadRequestError(f"cannot read {path}: {e.strerror}") from None
    if len(m) < 32 or m[:4] != b"BKSM":
        raise BadRequestError(f"{path} is not a lastMark file")
    valid = _U32.unpack_from(m, 24)[0] == _crc(m[:24])
    return {"path": path, "version": _U32.unpack_from(m, 4)[0],
            "journal_id": _U64.unpack_from(m, 8)[0], "journal_file": f"{_U64.unpack_from(m, 8)[0]:016x}.txn",
            "position": _U64.unpack_from(m, 16)[0], "valid": valid}


def journal_files(path: str) -> list[str]:
    if os.path.isdir(path):
        return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".txn"))
    return [path]


def _records(data: bytes, off: int, end: int, fp: str, ledger_id):
    """Records back to back in ``data[off:end]``; yields dicts, stops at the first bad one."""
    while off + 12 <= end:
        ln, typ, crc = struct.unpack_from("<III", data, off)
        if ln == 0 or typ not in JR_TYPES or off + 12 + ln > end:
            return
        payload = data[off + 12:off + 12 + ln]
        if _crc(payload, _crc(data[off:off + 8])) != crc:
            yield {"file": os.path.basename(fp), "offset": off, "type": "corrupt", "length": ln}
            return
        rec = {"file": os.path.basename(fp), "offset": off, "type": JR_TYPES[typ], "length": ln}
        if ln >= 8:
            rec["ledger_id"] = _U64.unpack_from(payload, 0)[0]
        if typ == 1 and ln >= 16:
            rec["entry_id"] = _I64.unpack_from(payload, 8)[0]
            rec["body_bytes"] = ln - 16
        if ledger_id is None or rec.get("ledger_id") == ledger_id:
            yield rec
        off += 12 + ln


def read_journal(path: str, ledger_id: int | None = None):
    """Yield one dict per journal record of the file (or every ``.txn`` of a directory).

    Reads both journal layouts of ``bookie_native``: records back to back after the header
    (header crc over bytes 0..16), and records inside ``"BKSG"`` groups (header with flags,
    crc over bytes 0..20; each group: magic, u32 len, u32 crc32c(records), u64 own offset,
    u32 crc32c(journal id + the 20 bytes before it)). A bad spot ends the file's listing (with a ``corrupt`` record)."""
    files = journal_files(path)
    if not files:
        raise BadRequestError(f"no journal files (*.txn) in {path}")
    for fp in files:
        try:
            with open(fp, "rb") as f:
                data = f.read()
        except OSError as e:
            raise BadRequestError(f"cannot read {fp}: {e.strerror}") from None
        if len(data) < 512 or data[:4] != b"BKSJ":
            yield {"file": os.path.basename(fp), "offset": 0, "type": "invalid-header"}
            continue
        if _U32.unpack_from(data, 20)[0] == _crc(data[:20]):         # grouped layout
            journal_id = data[8:16]
            off = 512
            while off + _GROUP_HEADER <= len(data):
                if data[off:off + 4] != b"BKSG":
                    if any(data[off:off + _GROUP_HEADER]):
                        yield {"file": os.path.basename(fp), "offset": off, "type": "corrupt"}
                    break
                ln, rcrc, goff, hcrc = struct.unpack_from("<IIQI", data, off + 4)
                end = off + _GROUP_HEADER + ln
                if (hcrc != _crc(journal_id + data[off:off + 20]) or goff != off or end > len(data)
                        or _crc(data[off + _GROUP_HEADER:end]) != rcrc):
                    yield {"file": os.path.basename(fp), "offset": off, "type": "corrupt"}
                    break
                yield from _records(data, off + _GROUP_HEADER, end, fp, ledger_id)
                off = end
        elif _U32.unpack_from(data, 16)[0] == _crc(data[:16]):       # records only
            yield from _records(data, 512, len(data), fp, ledger_id)
        else:
            yield {"file": os.path.basename(fp), "offset": 0, "type": "invalid-header"}


def read_entry_log(path: str, ledger_id: int | None = None, with_body: bool = False):
    """Yield one dict per record of an entry log file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BadRequestError(f"cannot read {path}: {e.strerror}") from None
    if len(data) < 64 or data[:4] != b"BKSL":
        raise BadRequestError(f"{path} is not an entry log (no BKSL header)")
    if _U32.unpack_from(data, 60)[0] != _crc(data[:60]):
        raise BadRequestError(f"{path}: entry log header checksum mismatch")
    off = 64
    while off + 24 <= len(data):
        ln, crc = struct.unpack_from("<II", data, off)
        if ln < 16 or off + 8 + ln > len(data):
            break
        lid = _U64.unpack_from(data, off + 8)[0]
        eid = _I64.unpack_from(data, off + 16)[0]
        body = data[off + 24:off + 8 + ln]
        ok = _crc(body, _crc(data[off + 8:off + 24])) == crc
        if ledger_id is None or lid == ledger_id:
            rec = {"offset": off, "ledger_id": lid, "entry_id": eid, "body_bytes": ln - 16,
                   "crc_ok": ok}
            if with_body:
                rec["body"] = body
            yield rec
        off += 8 + ln
