"""The wire format of client and bookie, in one place: hand-encoded protobuf for the hot paths
(the client's add requests; the bookie's add answers and range-read chunks) and the data
port's framing. Both sides import it; ``bookie.proto`` is the schema, and
``tests/client/test_wire.py`` and ``tests/bookie/test_add_response_encoding.py`` pin every
hand-encoded message against the generated protobuf code.

Building an ``AddRequest`` message per entry per bookie and serializing the batch costs
several microseconds per entry in Python; the same request bytes go to every bookie of the
write quorum and are resent unchanged after an ensemble change. So the client encodes each
``AddRequest`` once, already wrapped as an ``AddBatch.adds`` element (field 1,
length-delimited), and an ``AddBatch`` message is simply the concatenation of such
elements.
"""
from __future__ import annotations

import socket
import ssl
import struct
import sys
import threading

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

# ---- the bookie's answers ---------------------------------------------------------------------
# AddBatchResponse.responses: 1 bytes; AddResponse: status 1, ledger_id 2, entry_id 3,
# request_id 4 (varints), message 5 (bytes)
_T_RESPONSES = b"\x0a"
_R_STATUS, _R_LEDGER, _R_ENTRY, _R_REQUEST = b"\x08", b"\x10", b"\x18", b"\x20"
_R_MESSAGE = b"\x2a"
# ReadRangeResponse: status 1 (varint), entries 2 (EntryBody), next_entry_id 3 (varint),
# message 4 (bytes); EntryBody: entry_id 1 (varint), body 2 (bytes)
_RR_STATUS, _RR_ENTRIES, _RR_NEXT, _RR_MESSAGE = b"\x08", b"\x12", b"\x18", b"\x22"
_EB_ENTRY, _EB_BODY = b"\x08", b"\x12"


def encode_add_oks(accepted) -> bytes:
    """``AddBatchResponse`` body acknowledging ``(ledger, entry, ...)`` tuples with EOK (and
    request id 0). Parses to the same message as the generated code (which would omit a zero
    entry id rather than encode it) at about half the cost of building ``AddResponse``
    objects; tests/bookie/test_add_response_encoding.py pins it against the generated code."""
    v, small = varint, SMALL_VARINTS
    parts = []
    append = parts.append
    last_lid, head = None, b""
    for a in accepted:
        lid = a[0]
        if lid != last_lid:
            last_lid, head = lid, _R_LEDGER + v(lid) + _R_ENTRY
        ev = v(a[1])
        append(_T_RESPONSES)
        append(small[len(head) + len(ev)])      # < 128: two int64 varints and 2 tags
        append(head)
        append(ev)
    return b"".join(parts)


def encode_add_responses(items) -> bytes:
    """``AddBatchResponse`` body of ``(status, ledger, entry, request_id, message)`` tuples."""
    v = varint
    parts = []
    for status, lid, eid, rid, message in items:
        body = []
        if status:
            body += [_R_STATUS, v(status)]
        if lid:
            body += [_R_LEDGER, v(lid)]
        if eid:
            body += [_R_ENTRY, v(eid)]
        if rid:
            body += [_R_REQUEST, v(rid)]
        if message:
            m = message.encode()
            body += [_R_MESSAGE, v(len(m)), m]
        b = b"".join(body)
        parts += [_T_RESPONSES, v(len(b)), b]
    return b"".join(parts)


def range_chunk_parts(status: int, next_entry_id: int, entries, message: str = "") -> list:
    """The pieces of a ``ReadRangeResponse`` of ``(entry_id, body)`` pairs, hand-encoded: the
    bodies are referenced, not copied (the data port sends the pieces with one ``sendmsg``;
    building an ``EntryBody`` per entry copied each body twice). Pinned against the generated
    code by tests/bookie/test_add_response_encoding.py."""
    v = varint
    parts = []
    if status:
        parts += [_RR_STATUS, v(status)]
    for eid, body in entries:
        ev, bl = v(eid), v(len(body))
        parts += [_RR_ENTRIES, v(2 + len(ev) + len(bl) + len(body)), _EB_ENTRY, ev, _EB_BODY, bl,
                  body]
    if next_entry_id:
        parts += [_RR_NEXT, v(next_entry_id)]
    if message:
        m = message.encode()
        parts += [_RR_MESSAGE, v(len(m)), m]
    return parts


def encode_range_chunk(status: int, next_entry_id: int, entries, message: str = "") -> bytes:
    """:func:`range_chunk_parts` as one message."""
    return b"".join(range_chunk_parts(status, next_entry_id, entries, message))


RECOVERY_ADD = pb.AddRequest.RECOVERY_ADD
FENCE_LEDGER = pb.ReadRequest.FENCE_LEDGER
ENTRY_PIGGYBACK = pb.ReadRequest.ENTRY_PIGGYBACK


# ---- the data port: AddStream and ReadRange over plain TCP frames -------------------------
# The hello: the client sends DATA_MAGIC and one KIND_HELLO frame (its token, UTF-8, or
# empty: a client certificate or an open bookie); the bookie answers DATA_MAGIC, or
# DATA_REFUSED and one KIND_REFUSED frame (why, UTF-8) and closes (bkspark.auth). Then each
# direction carries frames: FRAME header (payload length, kind) + payload. Payloads are the
# gRPC methods' protobuf messages, so both transports share every encoder and decoder.
DATA_MAGIC = b"BKD2"
DATA_REFUSED = b"BKNO"
MAX_HELLO_BYTES = 16 << 10
FRAME = struct.Struct(">IB")
_IOV_MAX = 1024             # pieces per sendmsg call
KIND_ADD_BATCH = 1          # client -> bookie: AddBatch (pipelined)
KIND_ADD_RESPONSES = 2      # bookie -> client: AddBatchResponse
KIND_READ_RANGE = 3         # client -> bookie: ReadRangeRequest (one at a time)
KIND_READ_CHUNK = 4         # bookie -> client: ReadRangeResponse (a chunk, or the error)
KIND_READ_END = 5           # bookie -> client: end of the range (empty payload)
KIND_HELLO = 6              # client -> bookie, once, after DATA_MAGIC: its token (or empty)
KIND_REFUSED = 7            # bookie -> client, after DATA_REFUSED: why the hello was refused


#: ``AddBatch.trace = true``, sent as the first field of a traced add message
#: (bkspark.client.add_trace): a batch of adds starts with field 1 otherwise
ADD_TRACE_FIELD = b"\x10\x01"


def add_trace_stamps(received_ns: int, stored_ns: int) -> bytes:
    """``AddBatchResponse.trace_received_ns`` and ``trace_stored_ns``, encoded: appended to
    the answer of a traced add message."""
    return b"\x10" + _varint(received_ns) + b"\x18" + _varint(stored_ns)


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1              # (int64 on the wire: two's complement)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class FrameError(Exception):
    """The peer broke the framing (closed mid-frame, unknown kind, oversized frame)."""


def frame(kind: int, payload_parts) -> bytes:
    """Header + payload in one buffer (one copy of the payload, one send)."""
    return b"".join((FRAME.pack(sum(map(len, payload_parts)), kind), *payload_parts))


def hello(token: str) -> bytes:
    """What a client sends first on a data-port connection."""
    return DATA_MAGIC + frame(KIND_HELLO, (token.encode(),))


def refusal(why: str) -> bytes:
    """A bookie's answer to a hello it refuses."""
    return DATA_REFUSED + frame(KIND_REFUSED, (why.encode()[:MAX_HELLO_BYTES],))


def recv_exact(sock, n: int) -> bytes:
    """``n`` bytes from ``sock``, or fewer if it ends first."""
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            break
        data += more
    return data


def shutdown(sock) -> None:
    """Shut both directions of a data-port socket (the peer and our reader see the end);
    an already closed one is fine."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def send_frame(sock, kind: int, payload_parts) -> None:
    """Send one frame without joining its pieces (``sendmsg``; a TLS socket gets
    :func:`frame`'s one buffer)."""
    if isinstance(sock, ssl.SSLSocket):
        sock.sendall(frame(kind, payload_parts))
        return
    views = [memoryview(p) for p in payload_parts if len(p)]
    views.insert(0, memoryview(FRAME.pack(sum(map(len, views)), kind)))
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        i = 0
        while i < len(views) and sent >= len(views[i]):
            sent -= len(views[i])
            i += 1
        views = views[i:]
        if sent:
            views[0] = views[0][sent:]


def _frame_header(rfile, max_bytes: int) -> tuple[int, int] | None:
    """``(payload size, kind)`` of the next frame; None at a clean end of stream."""
    head = rfile.read(FRAME.size)
    if not head:
        return None
    if len(head) != FRAME.size:
        raise FrameError("connection closed inside a frame header")
    size, kind = FRAME.unpack(head)
    if size > max_bytes:
        raise FrameError(f"frame of {size} bytes exceeds the limit of {max_bytes}")
    return size, kind


def read_frame(rfile, max_bytes: int) -> tuple[int, bytes] | None:
    """Next ``(kind, payload)`` from a buffered socket file; None at a clean end of stream."""
    header = _frame_header(rfile, max_bytes)
    if header is None:
        return None
    size, kind = header
    payload = rfile.read(size) if size else b""
    if len(payload) != size:
        raise FrameError("connection closed inside a frame")
    return kind, payload


class FramePool:
    """Buffers for received frame payloads, each reused once nothing references it.

    A payload read with :func:`read_frame_into` lives in one of the pool's bytearrays and is
    handed out as a read-only view; what is decoded from it (entry bodies) are views of the
    same buffer. When the last of them is dropped (CPython reference counting), a later
    frame reuses the buffer: a stream of large frames runs on memory the process already
    holds instead of a fresh allocation per frame -- on a VM that returns freed memory to
    its host, every fresh 4 KiB page costs a fault. Thread-safe; keeps at most ``keep``
    buffers (a frame that finds none free gets a buffer of its own)."""

    def __init__(self, keep: int = 3):
        self._bufs: list[bytearray] = []
        self._keep = keep
        self._lock = threading.Lock()

    def take(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes that nothing else references."""
        with self._lock:
            bufs = self._bufs
            spare = -1      # a free buffer too small for this frame
            for i in range(len(bufs)):
                # references: the list's and getrefcount's argument -- no view is alive
                if sys.getrefcount(bufs[i]) == 2:
                    if len(bufs[i]) >= size:
                        return bufs[i]
                    spare = i
            buf = bytearray(max(size, 1 << 20))
            if len(bufs) < self._keep:
                bufs.append(buf)
            elif spare >= 0:    # frames grew past it: keep the larger one in its place
                bufs[spare] = buf
            return buf


def read_frame_into(rfile, max_bytes: int, pool: FramePool) -> tuple[int, memoryview] | None:
    """:func:`read_frame` with the payload read into a buffer of ``pool`` (a read-only view)."""
    header = _frame_header(rfile, max_bytes)
    if header is None:
        return None
    size, kind = header
    view = memoryview(pool.take(size))[:size]
    got = 0
    while got < size:
        n = rfile.readinto(view[got:])
        if not n:
            raise FrameError("connection closed inside a frame")
        got += n
    return kind, view.toreadonly()


def _read_varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise FrameError("varint too long")


def only_response(batch: bytes) -> bytes:
    """The ``AddResponse`` bytes of an ``AddBatchResponse`` body holding exactly one (what
    :func:`encode_add_responses` / :func:`encode_add_oks` make of one add)."""
    if batch[:1] != _T_RESPONSES:
        raise FrameError("not an AddBatchResponse element")
    length, pos = _read_varint(batch, 1)
    if pos + length != len(batch):
        raise FrameError("not exactly one AddResponse")
    return batch[pos:]


def decode_range_chunk(payload: bytes):
    """``(status, next_entry_id, message, [(entry_id, body), ...])`` of an encoded
    ``ReadRangeResponse``, each body a memoryview of ``payload`` (no copy: the generated
    parser copies every body twice). Unknown varint and length-delimited fields are skipped;
    anything else, or a malformed message, is a :class:`FrameError`."""
    view = memoryview(payload)
    status = next_id = 0
    message = ""
    entries = []
    pos, end = 0, len(view)
    try:
        while pos < end:
            key, pos = _read_varint(view, pos)
            field, wtype = key >> 3, key & 7
            if wtype == 0:
                value, pos = _read_varint(view, pos)
                if field == 1:
                    status = value
                elif field == 3:
                    next_id = value - (1 << 64) if value >= 1 << 63 else value
                continue
            if wtype != 2:
                raise FrameError(f"unexpected wire type {wtype} in a range chunk")
            size, pos = _read_varint(view, pos)
            if pos + size > end:
                raise FrameError("range chunk field runs past the message")
            if field == 2:
                eid, body, p, stop = 0, view[0:0], pos, pos + size
                while p < stop:
                    k, p = _read_varint(view, p)
                    if k == 0x08:
                        eid, p = _read_varint(view, p)
                    elif k == 0x12:
                        blen, p = _read_varint(view, p)
                        body, p = view[p:p + blen], p + blen
                    else:
                        raise FrameError(f"unexpected field {k >> 3} in an entry")
                if p != stop:
                    raise FrameError("entry runs past its length")
                entries.append((eid, body))
            elif field == 4:
                message = bytes(view[pos:pos + size]).decode("utf-8", "replace")
            pos += size
    except IndexError:
        raise FrameError("range chunk truncated") from None
    return status, next_id, message, entries
