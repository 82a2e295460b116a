"""The bookie's gRPC service: the wire protocol of ``bookie.proto`` on top of the storage engine.

Durability: an add is answered EOK only after ``Storage.add_entries`` returned, i.e. after
its journal record was synced. A fencing read answers only after the fence is durable.
Ordering: acks of a streamed batch may come in any order, each entry exactly once.
Failure: every error becomes a status code (never an exception through gRPC); a corrupt
entry is EIO, never ENOENTRY; overload is ETOOMANYREQUESTS with bounded in-flight bytes.
"""
from __future__ import annotations

import hmac
import logging
import queue
import struct
import threading
import time

import grpc
from google.protobuf.message import DecodeError

from bkspark import _native, errors
from bkspark.bookie import threads
from bkspark.bookie.faults import ANY_ENTRY, Fault, FaultInjector, FaultRule
from bkspark.logging_setup import LogBudget
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.proto.wire import (encode_add_oks, encode_add_responses, only_response,
                                range_chunk_parts)

log = logging.getLogger("bkspark.bookie.service")

MASTER_KEY_LEN = 20          # metadata.ledger_keys.KEY_BYTES
MAX_KEY_LOOKUPS = 8          # checks of a new ledger's key in the metadata at once; more
KEY_LOOKUP_WAIT_S = 10.0     # wait this long, then are answered ETOOMANYREQUESTS (unknown)
ADMITTED_LEDGERS = 4096      # new ledgers remembered with the key the metadata gave them
_LAC = struct.Struct(">q")
_STREAM_MAX_INFLIGHT_BATCHES = 16
#: what the bookie's own work on one add costs in memory beyond its bytes (parsed request,
#: storage request, status, refusal text, response: bookie_native/module.c add_batch), so
#: the in-flight bound counts what a message costs, not what it says
ADD_OVERHEAD_BYTES = 320
#: storage's answer to an add of an entry it holds with other bytes (bookie_native store_adds)
OTHER_BYTES = "entry already stored with other bytes: never replaced"
_RANGE_DEFAULT_BYTES = 4 << 20
_RANGE_BUFFER_MAX = 16 << 20        # a connection's range buffer; larger chunks read as bytes


def entry_lac(body: bytes) -> int:
    """The writer's LAC piggybacked in a framed entry body (bytes 16..24)."""
    return _LAC.unpack_from(body, 16)[0] if len(body) >= 24 else -1


def explicit_lac_value(body: bytes) -> int:
    """The LAC of an explicit-LAC body as a client frames it for WriteLac: ledger id, LAC,
    digest (bytes 8..16; BookKeeper's layout -- not an entry's, whose LAC is at 16..24)."""
    return _LAC.unpack_from(body, 8)[0] if len(body) >= 16 else -1


class LacTracker:
    """Highest LAC this bookie knows per ledger, with long-poll waiting for it to advance."""

    def __init__(self, storage) -> None:
        self._storage = storage
        self._lac: dict[int, int] = {}
        self._cond = threading.Condition()
        self._waiters: dict[int, int] = {}

    def get(self, ledger_id: int) -> int:
        lac = self._lac.get(ledger_id)
        if lac is None:
            lac = self._load(ledger_id)
            with self._cond:
                lac = max(lac, self._lac.get(ledger_id, -1))
                self._lac[ledger_id] = lac
        return lac

    def _load(self, ledger_id: int) -> int:
        lac = -1
        try:
            lac = entry_lac(self._storage.read_entry(ledger_id, -1))
        except errors.BKError:
            pass
        explicit = self._storage.explicit_lac(ledger_id)
        if explicit:
            lac = max(lac, explicit_lac_value(explicit))
        return lac

    def advance(self, updates: dict[int, int]) -> None:
        with self._cond:
            woke = False
            for ledger_id, lac in updates.items():
                if lac > self._lac.get(ledger_id, -1):
                    self._lac[ledger_id] = lac
                    woke = woke or ledger_id in self._waiters
            if woke:
                self._cond.notify_all()

    def forget(self, ledger_id: int) -> None:
        with self._cond:
            self._lac.pop(ledger_id, None)

    def wait_beyond(self, ledger_id: int, previous: int, timeout_s: float, stopped) -> int:
        """Block until the LAC exceeds ``previous`` or the timeout passes; return the LAC.

        Woken at once by :meth:`advance` (an add's piggybacked LAC, a WriteLac); the LAC is
        read again once registered as a waiter, so an advance between the first read and
        the registration is not missed (it would have cost a 0.25-s wait)."""
        lac = self.get(ledger_id)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._waiters[ledger_id] = self._waiters.get(ledger_id, 0) + 1
            lac = max(lac, self._lac.get(ledger_id, lac))
            try:
                while lac <= previous and not stopped():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(min(remaining, 0.25))
                    lac = self._lac.get(ledger_id, lac)
            finally:
                self._waiters[ledger_id] -= 1
                if not self._waiters[ledger_id]:
                    del self._waiters[ledger_id]
        return lac


class RangeBuffer:
    """A data-port connection's buffer for range reads, kept from range to range and sized
    by what the connection was served, never by what a request asks: none until a chunk was
    read (a range of a ledger that does not exist costs nothing), then the power of two
    holding the largest chunk read outside it, doubled while chunks fill more than half of it
    (64 KiB to :data:`_RANGE_BUFFER_MAX`, never beyond what a request allows)."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes: bytearray | None = None

    def served(self, nbytes: int) -> None:
        """A chunk of ``nbytes`` was read outside the buffer: grow it to hold the next."""
        want = min(_RANGE_BUFFER_MAX, 1 << max(16, (nbytes - 1).bit_length()))
        if nbytes and (self.bytes is None or len(self.bytes) < want):
            self.bytes = bytearray(want)

    def filled(self, nbytes: int, asked: int) -> None:
        """A chunk of ``nbytes`` was read into the buffer for a request allowing ``asked``:
        when it took more than half the buffer, double it (up to ``asked``) for the next."""
        size = len(self.bytes)
        if nbytes > size // 2:
            self.served(min(asked, 2 * size))


class BookieService(pb_grpc.BookieServicer):
    """Implements every RPC of ``bookie.proto`` against a ``Storage``."""

    def __init__(self, storage, config, state, metrics=None) -> None:
        self.storage = storage
        self.config = config
        self.state = state              # BookieState: read_only flag, bookie id, disk usage
        self.metrics = metrics
        self.lac = LacTracker(storage)
        self.faults = FaultInjector()
        self.ledger_master_key = None   # ledger id -> its master key from the metadata (None:
                                        # not listed); set by the server (see Read's fencing)
        self._inflight_bytes = 0
        self._inflight_lock = threading.Lock()
        self._max_inflight = config.max_inflight_add_mb << 20
        self._long_polls = 0            # long-poll reads waiting (config.max_long_polls)
        self._write_lac_lock = threading.Lock()
        self._key_lookups = threading.BoundedSemaphore(MAX_KEY_LOOKUPS)
        self._admitted: dict[int, bytes] = {}       # see _check_new_ledgers
        self._replace_refusals = LogBudget(10, 60.0)    # adds that would replace an entry
        self._add_pool = threads.pool(16, "bookie-add")
        self._stopping = False
        self.data_port = 0              # set by the server once its data port listens

    def stop(self) -> None:
        self._stopping = True
        self._add_pool.shutdown(wait=True)

    # ---- adds ------------------------------------------------------------------------

    def _reserve(self, nbytes: int) -> bool:
        with self._inflight_lock:
            if self._inflight_bytes and self._inflight_bytes + nbytes > self._max_inflight:
                return False
            self._inflight_bytes += nbytes
            return True

    def _release(self, nbytes: int) -> None:
        with self._inflight_lock:
            self._inflight_bytes -= nbytes

    @property
    def inflight_bytes(self) -> int:
        return self._inflight_bytes

    def _process_adds(self, adds) -> bytes:
        """Validate, apply faults, store durably; return the encoded responses.

        The result is the body of an ``AddBatchResponse``: one ``responses`` element per add
        that is answered (dropped adds -- fault injection -- get none), hand-encoded
        (:func:`encode_add_responses`) instead of building an ``AddResponse`` object per
        entry. This is the hot path: one pass over the batch, no per-entry work beyond what
        each ack needs.
        """
        rejected: list[tuple] = []          # (status, ledger, entry, request_id, message)
        accepted: list[tuple] = []          # (ledger, entry, key, recovery, body)
        request_ids: list[int] | None = None
        delay = 0.0
        read_only = self.state.read_only
        faults = self.faults if self.faults.active else None
        max_entry = self.config.max_entry_bytes
        rejection = _native.add_rejection   # the one rule, shared with the data port's C path
        gate = self._check_new_ledgers if self.ledger_master_key is not None else None
        nbytes = 0
        for req in adds:
            lid, eid, key, flags, body = req.ledger_id, req.entry_id, req.master_key, req.flags, req.body
            size = len(body)
            bad = None
            why = rejection(lid, eid, len(key), flags, size, max_entry)
            if why is not None:
                bad = (errors.EBADREQ, why)
            elif read_only:
                bad = (errors.EREADONLY, "bookie is read-only")
            elif gate is not None and (refused := gate(((lid, key),))):
                bad = refused
            elif faults is not None:
                fault = faults.check("add", lid, eid)
                if fault is not None:
                    delay = max(delay, fault.delay_s)
                    if fault.drop:
                        continue
                    if fault.error:
                        bad = (fault.error, "injected fault")
            rid = req.request_id
            if bad is not None:
                rejected.append((bad[0], lid, eid, rid, bad[1]))
                continue
            if rid:
                if request_ids is None:
                    request_ids = [0] * len(accepted)
            if request_ids is not None:
                request_ids.append(rid)
            accepted.append((lid, eid, key, bool(flags), body))
            nbytes += size
        out = [encode_add_responses(rejected)] if rejected else []
        if not accepted:
            if delay:
                time.sleep(delay)
            return out[0] if out else b""
        if not self._reserve(nbytes):
            out.append(encode_add_responses(
                [(errors.ETOOMANYREQUESTS, a[0], a[1], request_ids[i] if request_ids else 0,
                  "bookie overloaded") for i, a in enumerate(accepted)]))
            return b"".join(out)
        started = time.perf_counter()
        message = ""
        try:
            if delay:           # injected slowness holds its in-flight bytes, like a slow disk
                time.sleep(delay)
            statuses = self.storage.add_entries(accepted)
        except errors.BKError as exc:
            log.error("add batch failed: %s", exc)
            statuses = [exc.status or errors.EIO] * len(accepted)
            message = str(exc)
        finally:
            self._release(nbytes)
        lacs: dict[int, int] = {}
        unpack, ok = _LAC.unpack_from, errors.EOK
        all_ok = True
        for (lid, _eid, _key, _rec, body), status in zip(accepted, statuses):
            if status == ok:
                lac = unpack(body, 16)[0]
                if lac > lacs.get(lid, -1):
                    lacs[lid] = lac
            else:
                all_ok = False
        if not all_ok:
            self._log_replacements(sum(s == errors.EBADREQ for s in statuses))
        if all_ok and request_ids is None:
            out.append(encode_add_oks(accepted))
        else:
            out.append(encode_add_responses(
                [(status, a[0], a[1], request_ids[i] if request_ids else 0,
                  "" if status == ok else OTHER_BYTES if status == errors.EBADREQ else message)
                 for i, (a, status) in enumerate(zip(accepted, statuses))]))
        if lacs:
            self.lac.advance(lacs)
        if self.metrics is not None:
            self.metrics.record_adds(accepted, statuses, nbytes, time.perf_counter() - started)
        return b"".join(out)

    def process_add_batch(self, payload) -> bytes:
        """The add path of both streams (the data port's frames, gRPC ``AddStream``): an
        encoded ``AddBatch`` in, the encoded ``AddBatchResponse`` body out, answered like
        :meth:`_process_adds` but parsed, validated, stored and encoded in C
        (``Storage.add_batch``) with no Python object per entry. A read-only or overloaded
        bookie refuses it in C too (``_native.answer_adds``). Falls back to
        :meth:`_process_adds` while faults are injected and when storage fails as a whole
        (closed), so those answers have one implementation.

        A message is first walked without decoding (``_native.scan_add_batch``): one that is
        not protobuf, holds an add too short to carry a master key or more than
        ``max_adds_per_message`` adds raises :class:`BadRequestError` and costs nothing more
        (the caller ends the stream). The in-flight bound counts its bytes plus
        :data:`ADD_OVERHEAD_BYTES` an add."""
        size = len(payload) + self.scan_add_batch(payload) * ADD_OVERHEAD_BYTES
        if self.faults.active:          # (tests) the one implementation of faults, in Python
            return self._process_adds(pb.AddBatch.FromString(payload).adds)
        if self.state.read_only:        # refused in C: no Python object per add
            return _native.answer_adds(payload, self.config.max_entry_bytes, errors.EREADONLY,
                                       "bookie is read-only")
        if self.ledger_master_key is not None:
            refused = self._check_new_ledgers(_native.batch_ledgers(payload))
            if refused:         # (an honest writer's ledger is listed, under its key)
                return _native.answer_adds(payload, self.config.max_entry_bytes, *refused)
        if not self._reserve(size):
            return _native.answer_adds(payload, self.config.max_entry_bytes,
                                       errors.ETOOMANYREQUESTS, "bookie overloaded")
        started = time.perf_counter()
        try:
            stored = self.storage.add_batch(payload, self.config.max_entry_bytes)
        except errors.BadRequestError:
            raise       # not an AddBatch: the caller drops the connection
        except errors.BKError:
            stored = None
        finally:
            self._release(size)
        if stored is None:      # storage failed as a whole: the Python path words the answers
            return self._process_adds(pb.AddBatch.FromString(payload).adds)
        raw, lacs, ok, ok_bytes, failed = stored
        if failed:
            self._log_replacements(failed.count(errors.EBADREQ))
        if lacs:
            self.lac.advance(lacs)
        if self.metrics is not None and (ok or failed):
            self.metrics.record_batch(ok, ok_bytes, failed, time.perf_counter() - started)
        return raw

    def _log_replacements(self, refused: int) -> None:
        """Say (10 lines a minute at most) that adds were refused for holding other bytes
        than the entries they name: a client bug or a hostile peer, never a writer of ours."""
        if refused and (withheld := self._replace_refusals.allow()) is not None:
            log.warning("refused %d adds of entries stored with other bytes (an entry is never "
                        "replaced)%s", refused,
                        f"; {withheld} such warnings withheld" if withheld else "")

    def scan_add_batch(self, payload) -> int:
        """The number of adds of an encoded ``AddBatch``, walked without decoding one;
        :raises BadRequestError: a message refused whole (not protobuf, an add too short to
            carry a master key, more than ``max_adds_per_message`` adds)."""
        try:
            return _native.scan_add_batch(payload, self.config.max_adds_per_message)
        except ValueError as exc:       # before storage mapped _native's errors to ours
            raise errors.BadRequestError(str(exc)) from None

    def Add(self, request, context):
        raw = self._process_adds([request])
        if not raw:       # dropped by fault injection: never answer
            FaultInjector.apply_delay(Fault(drop=True), cancelled=lambda: not context.is_active())
            return pb.AddResponse(status=errors.EIO, message="dropped").SerializeToString()
        return only_response(raw)

    def AddStream(self, request_iterator, context):
        """Pipelined adds: batches are stored concurrently; acks stream back as they are durable.

        Up to ``_STREAM_MAX_INFLIGHT_BATCHES`` request messages are stored at once (by the
        add pool). Every answered batch puts its encoded responses on ``out``; this
        generator sends whatever is ready as ONE ``AddBatchResponse`` (the batches a journal
        group commit completes together travel in one message: per-message costs dominate
        in Python gRPC, on both ends).
        """
        out: queue.SimpleQueue = queue.SimpleQueue()
        slots: queue.SimpleQueue = queue.SimpleQueue()      # tokens: batches in flight
        for _ in range(_STREAM_MAX_INFLIGHT_BATCHES):
            slots.put(None)
        process = self.process_add_batch
        refused: list[str] = []         # why the stream's messages were refused (ends it)

        def store(payload):
            try:
                raw = process(payload)
            except Exception as exc:  # noqa: BLE001 - must answer, never kill the stream
                log.error("add batch failed: %r", exc)
                raw = b""
            slots.put(None)
            out.put(raw)

        def reader():
            submitted = 0
            try:
                for payload in request_iterator:        # AddBatch bytes (add_to_server)
                    if self._stopping:
                        break
                    try:
                        self.scan_add_batch(payload)
                    except errors.BadRequestError as exc:
                        refused.append(str(exc))
                        break
                    while True:
                        try:
                            slots.get(timeout=0.5)
                            break
                        except queue.Empty:
                            if not context.is_active():
                                return
                    self._add_pool.submit(store, payload)
                    submitted += 1
            except Exception:  # noqa: BLE001 - client went away or sent garbage
                pass
            finally:
                out.put(submitted)      # an int: the reader's end, with its batch count

        threads.thread(reader, "bookie-addstream-reader").start()
        answered = 0
        total = None            # batches submitted, once the reader ended
        get, get_nowait = out.get, out.get_nowait
        while total is None or answered < total:
            try:
                item = get(timeout=0.5)
            except queue.Empty:
                if not context.is_active():
                    return
                continue
            parts = []
            while True:
                if type(item) is int:
                    total = item
                else:
                    answered += 1
                    if item:
                        parts.append(item)
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
            if parts:
                yield b"".join(parts) if len(parts) > 1 else parts[0]
        if refused:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, refused[0])

    def _injected(self, op: str, ledger_id: int, alive, entry_id: int = ANY_ENTRY) -> int:
        """Apply a matching test fault: sleep its delay (a drop sleeps until the caller gives
        up: ``alive()`` false); return the status to answer instead (EIO for a drop), or 0."""
        fault = self.faults.check(op, ledger_id, entry_id)
        if fault is None:
            return 0
        FaultInjector.apply_delay(fault, cancelled=lambda: not alive())
        return fault.error or (errors.EIO if fault.drop else 0)

    # ---- reads -----------------------------------------------------------------------

    def _read_error(self, req, status, message=""):
        return pb.ReadResponse(status=status, ledger_id=req.ledger_id, entry_id=req.entry_id,
                               max_lac=-1, message=message)

    def Read(self, request, context):
        """One entry; or, for entry -1 (a fencing read with FENCE_LEDGER, which fences durably
        before answering) and for long polls (``has_previous_lac``: wait until this bookie's
        LAC passes ``previous_lac``), an answer about the LAC: ``max_lac`` (a hint), the last
        entry held as the body (with ENTRY_PIGGYBACK, on a long poll) and the explicit LAC
        body -- the digest-protected proofs that readers verify before counting a LAC."""
        started = time.perf_counter()
        if request.ledger_id < 0 or request.entry_id < -1:
            return self._read_error(request, errors.EBADREQ, "bad ledger or entry id")
        fencing = request.entry_id == -1 and request.flags & pb.ReadRequest.FENCE_LEDGER
        status = self._injected("fence" if fencing else "read", request.ledger_id,
                                context.is_active, request.entry_id)
        if status:
            return self._read_error(request, status, "injected fault")
        if request.flags & pb.ReadRequest.FENCE_LEDGER:
            if len(request.master_key) != MASTER_KEY_LEN:
                return self._read_error(request, errors.EBADREQ, "fencing read needs the master key")
            refused = self._check_new_ledgers(((request.ledger_id, request.master_key),))
            if refused:
                return self._read_error(request, *refused)
            try:
                status = self.storage.fence(request.ledger_id, request.master_key)
            except errors.BKError as exc:
                return self._read_error(request, exc.status or errors.EIO, str(exc))
            if status != errors.EOK:
                return self._read_error(request, status, "fence refused")
        lac = None
        if request.has_previous_lac:
            if not self._enter_long_poll():
                return self._read_error(request, errors.ETOOMANYREQUESTS,
                                        f"{self.config.max_long_polls} long polls wait already")
            timeout_s = min(request.timeout_ms, self.config.long_poll_max_ms) / 1000.0
            try:
                lac = self.lac.wait_beyond(
                    request.ledger_id, request.previous_lac, timeout_s,
                    stopped=lambda: self._stopping or not context.is_active())
            finally:
                with self._inflight_lock:
                    self._long_polls -= 1
            if lac <= request.previous_lac or not (request.flags & pb.ReadRequest.ENTRY_PIGGYBACK):
                return pb.ReadResponse(status=errors.EOK, ledger_id=request.ledger_id,
                                       entry_id=request.entry_id, max_lac=lac,
                                       lac_body=self._lac_body(request.ledger_id))
        # an answer about the LAC (entry -1, a long poll) carries what proves it: the last
        # entry held (its piggybacked LAC) and the explicit LAC body, both digest-protected
        about_lac = request.entry_id == -1 or request.has_previous_lac
        try:
            body = self.storage.read_entry(request.ledger_id,
                                           -1 if about_lac else request.entry_id)
        except errors.BKError as exc:
            if request.has_previous_lac and exc.status in (errors.ENOENTRY, errors.ENOLEDGER):
                return pb.ReadResponse(status=errors.EOK, ledger_id=request.ledger_id,
                                       entry_id=request.entry_id, max_lac=lac,
                                       lac_body=self._lac_body(request.ledger_id))
            return self._read_error(request, exc.status or errors.EIO, str(exc))
        entry_id = _entry_id_of(body) if about_lac else request.entry_id
        if self.metrics is not None:
            self.metrics.record_read(len(body), seconds=None if request.has_previous_lac
                                     else time.perf_counter() - started)
        return pb.ReadResponse(status=errors.EOK, ledger_id=request.ledger_id, entry_id=entry_id,
                               body=body, max_lac=lac if lac is not None else self.lac.get(request.ledger_id),
                               lac_body=self._lac_body(request.ledger_id) if about_lac else b"")

    def _lac_body(self, ledger_id: int) -> bytes:
        """The explicit LAC body stored for ``ledger_id`` (b"" if none, or unreadable: the
        answer then proves only what its entry body does)."""
        try:
            return self.storage.explicit_lac(ledger_id) or b""
        except errors.BKError:
            return b""

    def _check_new_ledgers(self, pairs):
        """A fence or the first add of a ledger creates its record on this bookie under the
        caller's key, for good. Such a record is made only under the key the ledger's
        metadata holds: a ledger the metadata does not list (a guessed future id) is
        answered ENOLEDGER and not recorded, a key that is not the ledger's EUA -- else any
        client could claim ids in advance and lock their writers out. ``pairs``: ``(ledger,
        master key)`` of a request. ``(status, message)`` to answer, or None to go on (the
        bookie knows the ledger: storage checks the key; or the service has no metadata
        store: ``ledger_master_key`` unset). A metadata store that cannot answer gives EIO:
        unknown, never a record made on a guess. Ledgers admitted are remembered with their
        key (:data:`ADMITTED_LEDGERS` of them) so a writer's batches cost no lookup."""
        lookup = self.ledger_master_key
        if lookup is None:
            return None
        admitted = self._admitted
        for ledger_id, master_key in pairs:
            if admitted.get(ledger_id) == master_key or ledger_id < 0:
                continue
            try:
                held = self.storage.master_key(ledger_id)
            except errors.BKError as exc:
                return exc.status or errors.EIO, str(exc)
            if held is not None:        # a ledger the bookie has: its storage checks keys
                self._admit(ledger_id, held)
                continue
            if not self._key_lookups.acquire(timeout=KEY_LOOKUP_WAIT_S):  # each a metadata
                return (errors.ETOOMANYREQUESTS,                          # round trip
                        f"{MAX_KEY_LOOKUPS} checks of new ledgers wait on the metadata store")
            try:
                expected = lookup(ledger_id)
            except errors.BKError as exc:
                return errors.EIO, f"cannot read ledger {ledger_id}'s metadata to check the key: {exc}"
            finally:
                self._key_lookups.release()
            if expected is None:
                return errors.ENOLEDGER, f"no ledger {ledger_id} in the metadata"
            if not hmac.compare_digest(expected, master_key):
                return errors.EUA, "wrong master key"
            self._admit(ledger_id, master_key)
        return None

    def _admit(self, ledger_id: int, master_key: bytes) -> None:
        """Remember an admitted ledger's key; the oldest beyond :data:`ADMITTED_LEDGERS` go."""
        admitted = self._admitted
        with self._inflight_lock:
            admitted[ledger_id] = master_key
            while len(admitted) > ADMITTED_LEDGERS:
                admitted.pop(next(iter(admitted)))

    def _enter_long_poll(self) -> bool:
        """Count a long poll in, unless ``max_long_polls`` wait already (each holds a gRPC
        worker: the others must stay free for adds, reads and fencing)."""
        with self._inflight_lock:
            if self._long_polls >= self.config.max_long_polls:
                return False
            self._long_polls += 1
            return True

    def ReadRange(self, request, context):
        for parts in self.read_range_chunks(request, context.is_active):
            yield b"".join(parts)

    def read_range_chunks(self, request, alive, buf: "RangeBuffer | None" = None):
        """The ``ReadRangeResponse`` messages answering ``request``, each as the pieces of its
        encoding (:func:`range_chunk_parts`; gRPC and the data port): EOK chunks of up to
        ``max_bytes_per_message``, then at most one error chunk (ENOENTRY at the first absent
        entry, EIO for an unreadable one); stops early once ``alive()`` is false. With ``buf``
        (a connection's :class:`RangeBuffer`) the bodies of a chunk may be views of it: the
        caller must be done with a chunk before asking for the next."""
        lid, first, last = request.ledger_id, request.first_entry_id, request.last_entry_id
        if lid < 0 or first < 0 or last < first:
            yield self._range_error(errors.EBADREQ, first, "bad ledger id or entry range")
            return
        max_bytes = min(request.max_bytes_per_message or _RANGE_DEFAULT_BYTES,
                        self.config.max_message_bytes // 2)
        step = max(1, request.step)
        next_id = first
        while next_id <= last and alive():
            status = self._injected("read_range", lid, alive, next_id)
            if status:
                yield self._range_error(status, next_id, "injected fault")
                return
            started = time.perf_counter()
            try:
                chunk = None
                if buf is not None and buf.bytes is not None:
                    chunk = self.storage.read_range_into(lid, next_id, last, max_bytes,
                                                         buf.bytes, step)
                    if chunk and max_bytes > len(buf.bytes):    # the buffer cut the chunk?
                        buf.filled(sum(len(b) for _, b in chunk), max_bytes)
                if not chunk:           # no buffer yet, or its first entry is larger
                    chunk = self.storage.read_range(lid, next_id, last, max_bytes, step)
                    if buf is not None:     # the next chunk goes into one this large
                        buf.served(sum(len(b) for _, b in chunk))
            except errors.BKError as exc:
                yield self._range_error(exc.status or errors.EIO, next_id, str(exc))
                return
            if not chunk:
                yield self._range_error(errors.ENOENTRY, next_id)
                return
            next_id = chunk[-1][0] + step
            if self.metrics is not None:
                self.metrics.record_read(sum(len(b) for _, b in chunk), len(chunk),
                                         seconds=time.perf_counter() - started, op="range")
            yield range_chunk_parts(errors.EOK, next_id, chunk)

    def _range_error(self, status: int, next_id: int, message: str = ""):
        if self.metrics is not None:
            self.metrics.record_error("ReadRange", status)
        return range_chunk_parts(status, next_id, (), message)


    # ---- LAC ---------------------------------------------------------------------------

    def ReadLac(self, request, context):
        status = self._injected("read_lac", request.ledger_id, context.is_active)
        if status:
            return pb.ReadLacResponse(status=status, ledger_id=request.ledger_id)
        if request.ledger_id < 0:
            return pb.ReadLacResponse(status=errors.EBADREQ, ledger_id=request.ledger_id,
                                      message="bad ledger id")
        try:            # (an index or journal failure, or a storage being reopened: EIO)
            if not self.storage.has_ledger(request.ledger_id):
                return pb.ReadLacResponse(status=errors.ENOLEDGER, ledger_id=request.ledger_id)
            lac_body = self.storage.explicit_lac(request.ledger_id) or b""
            try:
                last = self.storage.read_entry(request.ledger_id, -1)
            except (errors.NoSuchEntryError, errors.NoSuchLedgerError):
                last = b""
        except errors.BKError as exc:
            return pb.ReadLacResponse(status=exc.status or errors.EIO, ledger_id=request.ledger_id,
                                      message=str(exc))
        return pb.ReadLacResponse(status=errors.EOK, ledger_id=request.ledger_id,
                                  lac_body=lac_body, last_entry_body=last)

    def WriteLac(self, request, context):
        """Store an idle writer's explicit LAC (journaled: answered EOK once durable), then
        raise this bookie's LAC for the ledger, which wakes its long-polling readers. The
        LAC is the one of ``lac_body`` -- what is stored and what readers verify with the
        ledger's digest --, never a separate number: a request whose ``lac`` field or ledger
        id disagrees with its body is refused (EBADREQ)."""
        reply = self._write_lac(request, context)
        if self.metrics is not None:
            self.metrics.record_write_lac(reply.status)
        return reply

    def _write_lac(self, request, context):
        status = self._injected("write_lac", request.ledger_id, context.is_active)
        if status:
            return pb.WriteLacResponse(status=status)
        if len(request.master_key) != MASTER_KEY_LEN or request.ledger_id < 0:
            return pb.WriteLacResponse(status=errors.EBADREQ, message="bad ledger id or master key")
        if self.state.read_only:
            return pb.WriteLacResponse(status=errors.EREADONLY)
        body = request.lac_body
        if len(body) < 16 or _LAC.unpack_from(body, 0)[0] != request.ledger_id \
                or explicit_lac_value(body) != request.lac:
            return pb.WriteLacResponse(status=errors.EBADREQ,
                                       message="lac_body must be this ledger's LAC body (ledger "
                                               "id, LAC, digest) and agree with lac")
        known = self.storage.master_key(request.ledger_id)
        if known is not None and not hmac.compare_digest(known, request.master_key):
            return pb.WriteLacResponse(status=errors.EUA, message="wrong master key")
        lac = explicit_lac_value(body)
        try:
            with self._write_lac_lock:  # the stored LAC never goes back: a late WriteLac of an
                stored = self.storage.explicit_lac(request.ledger_id)     # earlier round, which
                if stored and explicit_lac_value(stored) >= lac:          # readers would now
                    return pb.WriteLacResponse(status=errors.EOK)         # verify and believe
                self.storage.set_explicit_lac(request.ledger_id, body)
        except errors.BKError as exc:
            return pb.WriteLacResponse(status=exc.status or errors.EIO, message=str(exc))
        self.lac.advance({request.ledger_id: lac})
        return pb.WriteLacResponse(status=errors.EOK)

    # ---- info, listing, force, faults ------------------------------------------------

    def GetBookieInfo(self, request, context):
        total, free = self.state.disk_space()
        return pb.BookieInfoResponse(status=errors.EOK, bookie_id=self.state.bookie_id,
                                     total_disk_bytes=total, free_disk_bytes=free,
                                     read_only=self.state.read_only,
                                     data_port=self.data_port)

    def ListEntries(self, request, context):
        if request.ledger_id < 0:
            return pb.ListEntriesResponse(status=errors.EBADREQ, message="bad ledger id")
        try:
            if not self.storage.has_ledger(request.ledger_id):
                return pb.ListEntriesResponse(status=errors.ENOLEDGER)
            ranges = self.storage.list_entries(request.ledger_id)
        except errors.BKError as exc:
            return pb.ListEntriesResponse(status=exc.status or errors.EIO, message=str(exc))
        return pb.ListEntriesResponse(status=errors.EOK,
                                      ranges=[pb.EntryRange(first=a, last=b) for a, b in ranges])

    def Force(self, request, context):
        try:
            self.storage.force(request.ledger_id)
        except errors.BKError as exc:
            return pb.ForceResponse(status=exc.status or errors.EIO, message=str(exc))
        return pb.ForceResponse(status=errors.EOK)

    def SetFaults(self, request, context):
        if not self.config.fault_injection:
            return pb.SetFaultsResponse(status=errors.EBADREQ)
        self.faults.set_rules([
            FaultRule(op=r.op or "any", action=r.action or "fail", delay_ms=r.delay_ms,
                      error=r.error or errors.EIO, ledger_id=r.ledger_id,
                      entry_id=r.entry_id if r.match_entry else ANY_ENTRY,
                      probability=r.probability or 1.0, remaining=r.count)
            for r in request.rules])
        return pb.SetFaultsResponse(status=errors.EOK)


def _entry_id_of(body: bytes) -> int:
    return _LAC.unpack_from(body, 8)[0] if len(body) >= 16 else -1


SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Bookie"].full_name     # bkspark.bookie.v1.Bookie


#: methods whose answers the service encodes itself (bytes)
_ENCODED_ANSWERS = frozenset({"Add", "AddStream", "ReadRange"})


def _counting_errors(service: BookieService, rpc: str, serialize):
    """``serialize``, counting each answer whose status is not EOK in the bookie's metrics
    (the encoded answers count theirs where they are made)."""
    def respond(answer) -> bytes:
        if answer.status != errors.EOK and service.metrics is not None:
            service.metrics.record_error(rpc, answer.status)
        return serialize(answer)
    return respond


def _as_is(answer: bytes) -> bytes:
    return answer


def _parsing(service: BookieService, method, handler):
    """``handler`` taking its request as bytes: parsed here, so a request that does not parse
    is answered EBADREQ by the service -- never an exception inside gRPC, whose Python server
    kept ~20 KB for every request it failed to deserialize (measured 2026-11-27: 1 GB after
    50,000 garbage requests; grpc/grpc#36908) and logged each with its traceback."""
    parse = getattr(pb, method.input_type.name).FromString
    answer_type = getattr(pb, method.output_type.name)
    encoded = method.name in _ENCODED_ANSWERS
    fields = answer_type.DESCRIPTOR.fields_by_name

    def refusal(exc):
        if service.metrics is not None:
            service.metrics.record_error(method.name, errors.EBADREQ)
        answer = answer_type(status=errors.EBADREQ)
        if "message" in fields:
            answer.message = f"malformed {method.input_type.name}: {exc}"[:200]
        return answer.SerializeToString() if encoded else answer

    if method.server_streaming:
        def streamed(raw, context):
            try:
                request = parse(raw)
            except DecodeError as exc:
                yield refusal(exc)
                return
            yield from handler(request, context)
        return streamed

    def unary(raw, context):
        try:
            request = parse(raw)
        except DecodeError as exc:
            return refusal(exc)
        return handler(request, context)
    return unary


def add_to_server(service: BookieService, server) -> None:
    """Serve ``service`` on the gRPC ``server``: every method of ``bookie.proto``'s Bookie
    service. Add, AddStream and ReadRange answer with the bytes the service already encoded
    (:mod:`bkspark.proto.wire`), sent as they are -- no message is built only to be
    serialized again; the other methods answer protobuf objects. Requests reach the service
    as bytes: AddStream's messages are walked and parsed in C (process_add_batch), never
    decoded into a Python object per add; the others are parsed by :func:`_parsing`."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Bookie"].methods:
        handler = getattr(service, method.name)
        if method.name != "AddStream":
            handler = _parsing(service, method, handler)
        respond = _as_is if method.name in _ENCODED_ANSWERS else \
            _counting_errors(service, method.name,
                             getattr(pb, method.output_type.name).SerializeToString)
        kind = {(False, False): grpc.unary_unary_rpc_method_handler,
                (False, True): grpc.unary_stream_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler}[
            (method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(handler, request_deserializer=_as_is,
                                     response_serializer=respond)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


__all__ = ["BookieService", "add_to_server", "LacTracker", "entry_lac", "explicit_lac_value", "ANY_ENTRY"]
