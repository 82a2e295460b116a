"""Record entries: the one byte format of a log entry that carries a key, a value, a time and
headers (pure; the Spark connector's ``entryFormat=record``, and what a log's offloaded rows
turn back into, :mod:`bkspark.log.offload`). An entry is::

    MAGIC (4 bytes b"\\xffBKR") | version (1 byte, = 1) | flags (1 byte)
    [timestamp  int64 LE, microseconds since the epoch]          if flags & TS
    [key        uint32 LE length | bytes]                        if flags & KEY
    [headers    uint16 LE count | count x (uint16 name length | UTF-8 name |
                                           int32 value length, -1 = null | value)]  if flags & HDR
    value       the rest of the entry                            unless flags & NULL_VALUE

The leading 0xff can never start UTF-8 text, so entries written by other producers (plain
payloads, JSON, ...) do not look like records: they decode as ``value`` = the whole entry,
with ``key``, ``timestamp`` and ``headers`` None. :func:`encode_record` of what
:func:`decode_record` returns is the same bytes for every record entry (one encoding).
"""
from __future__ import annotations

import struct

MAGIC = b"\xffBKR"
VERSION = 1
F_TS, F_KEY, F_HDR, F_NULL_VALUE = 1, 2, 4, 8
_HEAD = struct.Struct("<4sBB")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")


def _b(v, what: str) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{what} must be bytes or str, got {type(v).__name__}")


def encode_record(value, key=None, timestamp_us: int | None = None, headers=None) -> bytes:
    """One record entry. ``headers``: dict or iterable of (name, value-or-None) pairs."""
    flags = 0
    parts = [b""]
    if timestamp_us is not None:
        flags |= F_TS
        parts.append(_I64.pack(int(timestamp_us)))
    if key is not None:
        flags |= F_KEY
        k = _b(key, "key")
        parts.append(_U32.pack(len(k)))
        parts.append(k)
    if headers is not None:
        items = list(headers.items()) if isinstance(headers, dict) else list(headers)
        if len(items) > 0xFFFF:
            raise ValueError("at most 65535 headers per record")
        flags |= F_HDR
        parts.append(_U16.pack(len(items)))
        for name, hv in items:
            n = name.encode() if isinstance(name, str) else _b(name, "header name")
            parts.append(_U16.pack(len(n)))
            parts.append(n)
            if hv is None:
                parts.append(_I32.pack(-1))
            else:
                hb = _b(hv, f"header {name!r}")
                parts.append(_I32.pack(len(hb)))
                parts.append(hb)
    if value is None:
        flags |= F_NULL_VALUE
    else:
        parts.append(_b(value, "value"))
    parts[0] = _HEAD.pack(MAGIC, VERSION, flags)
    return b"".join(parts)


def decode_record(data) -> tuple:
    """(key, value, timestamp_us, headers-as-list-of-pairs) of one entry (see module doc)."""
    mv = memoryview(data)
    if len(mv) < 6 or mv[:4] != MAGIC or mv[4] != VERSION:
        return None, bytes(mv), None, None
    flags = mv[5]
    off = 6
    ts = key = headers = None
    if flags & F_TS:
        ts = _I64.unpack_from(mv, off)[0]
        off += 8
    if flags & F_KEY:
        n = _U32.unpack_from(mv, off)[0]
        off += 4
        key = bytes(mv[off:off + n])
        off += n
    if flags & F_HDR:
        count = _U16.unpack_from(mv, off)[0]
        off += 2
        headers = []
        for _ in range(count):
            n = _U16.unpack_from(mv, off)[0]
            off += 2
            name = bytes(mv[off:off + n]).decode()
            off += n
            m = _I32.unpack_from(mv, off)[0]
            off += 4
            if m < 0:
                headers.append((name, None))
            else:
                headers.append((name, bytes(mv[off:off + m])))
                off += m
    value = None if flags & F_NULL_VALUE else bytes(mv[off:])
    return key, value, ts, headers
