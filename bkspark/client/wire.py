"""Hand-encoded protobuf for the add hot path (the client's requests; the bookie's
responses use the same :func:`varint`).

Building an ``AddRequest`` message per entry per bookie and serializing the batch costs
several microseconds per entry in Python; the same request bytes go to every bookie of the
write quorum and are resent unchanged after an ensemble change. So the client encodes each
``AddRequest`` once, already wrapped as an ``AddBatch.adds`` element (field 1,
length-delimited), and an ``AddBatch`` message is simply the concatenation of such
elements. ``tests/client/test_wire.py`` pins the bytes against the generated protobuf code.
"""
from __future__ import annotations

from bkspark.proto import bookie_pb2 as pb

# AddRequest field tags (field_number << 3 | wire_type)
_T_LEDGER = b"\x08"      # 1 varint
_T_ENTRY = b"\x10"       # 2 varint
_T_MKEY = b"\x1a"        # 3 bytes
_T_FLAGS = b"\x20"       # 4 varint
_T_BODY = b"\x2a"        # 5 bytes
_T_ADDS = b"\x0a"        # AddBatch.adds: 1 bytes

SMALL_VARINTS = [bytes([i]) for i in range(128)]   # varints of 0..127


def varint(n: int) -> bytes:
    """Protobuf varint of a non-negative int (negative int64s use 10-byte two's complement)."""
    if 0 <= n < 0x80:
        return SMALL_VARINTS[n]
    if 0 < n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    if 0 < n < 0x200000:
        return bytes((n & 0x7F | 0x80, (n >> 7) & 0x7F | 0x80, n >> 14))
    if 0 < n < 0x10000000:
        return bytes((n & 0x7F | 0x80, (n >> 7) & 0x7F | 0x80, (n >> 14) & 0x7F | 0x80,
                      n >> 21))
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def request_prefix(ledger_id: int, master_key: bytes) -> bytes:
    """The per-ledger constant fields of an AddRequest (ledger id, master key)."""
    return b"".join((_T_LEDGER, varint(ledger_id), _T_MKEY, varint(len(master_key)), master_key))


def encode_add(prefix: bytes, entry_id: int, flags: int, body_parts) -> bytes:
    """One ``AddBatch.adds`` element: tag, length, AddRequest(prefix fields, entry id,
    flags, body = concatenation of ``body_parts``)."""
    body_len = 0
    for p in body_parts:
        body_len += len(p)
    head = [prefix, _T_ENTRY, varint(entry_id)]
    if flags:
        head += [_T_FLAGS, varint(flags)]
    head += [_T_BODY, varint(body_len)]
    head_b = b"".join(head)
    msg_len = len(head_b) + body_len
    return b"".join((_T_ADDS, varint(msg_len), head_b, *body_parts))


def identity(b: bytes) -> bytes:
    return b


RECOVERY_ADD = pb.AddRequest.RECOVERY_ADD
FENCE_LEDGER = pb.ReadRequest.FENCE_LEDGER
ENTRY_PIGGYBACK = pb.ReadRequest.ENTRY_PIGGYBACK
