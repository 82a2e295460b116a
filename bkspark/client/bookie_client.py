"""Per-bookie clients: one gRPC channel per bookie, one add stream per bookie.

* :class:`BookieClient` owns the channel to one bookie. Adds from every ledger handle of the
  process go down one add stream per bookie: on the bookie's data port (plain TCP frames,
  :mod:`bkspark.bookie.data_port`; the port is asked from the bookie over gRPC each time a
  stream opens) or, for a bookie without one, gRPC's ``AddStream``. Appenders hand the stream
  hand-encoded ``AddBatch`` elements (see :mod:`bkspark.proto.wire`); one message carries
  whatever waited (up to ``MAX_BATCH_BYTES``). Messages are self-clocked: the next one waits,
  up to ``max_linger`` (5 ms), for the previous ones to be answered. On a data port the
  thread that sees the stream answered sends it -- the appender on an idle stream, the ack
  reader the moment it reads the answer -- so no thread hand-off sits between an ack and the
  next message (:class:`_AddStream`); over gRPC, whose per-message cost is ~0.3 ms of CPU on
  each end, a request generator drains a queue and also spaces messages by at least
  ``linger`` (2 ms). A reader thread hands acks to the ledger handle registered for their
  ledger id (``sink.on_add_responses(bookie_id, [(entry_id, status), ...])``). When the
  stream breaks, every registered sink hears ``sink.on_bookie_failed(bookie_id, error)``;
  the next send opens a new stream. One ``send_adds`` call larger than ``MAX_BATCH_BYTES`` is
  cut into several messages (a bookie refuses a frame over its ``max_message_bytes``).
* Unary calls (reads, recovery adds, LAC reads) return :class:`concurrent.futures.Future`
  objects; transport failures become :class:`BookieUnavailableError` /
  :class:`OperationTimeoutError` here and nowhere else (:func:`rpc_error`). Wire statuses
  are mapped to exceptions by :func:`bkspark.errors.error_for_status` (:func:`check`).
"""
from __future__ import annotations

import logging
import queue
import socket
import ssl
import threading
import time
from collections import deque
from concurrent.futures import Future

import grpc

from bkspark import errors
from bkspark.auth.credentials import Credentials
from bkspark.errors import BookieUnavailableError, OperationTimeoutError
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.proto import wire


log = logging.getLogger("bkspark.client.bookie")

MAX_BATCH_BYTES = 2 << 20            # one AddBatch message carries at most ~2 MiB
MAX_RESPONSE_BYTES = 256 << 20       # largest frame accepted from a bookie
DATA_CONNECT_TIMEOUT = 10.0          # GetBookieInfo + connect + hello of an add stream
CONNECT_ATTEMPT = 1.0                # one TCP connect attempt (a new SYN after this long)
MAX_IDLE_READS = 5                   # data-port connections kept for later range reads
MAX_PIPELINED_RANGES = 256           # range requests sent together on one (read_ranges)
GRPC_ADD_LINGER = 0.002              # spacing of add messages over gRPC (~0.3 ms CPU each)
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),
]
_ADD_STREAM_METHOD = "/bkspark.bookie.v1.Bookie/AddStream"
_CLOSE = object()


_REFUSALS = {grpc.StatusCode.UNAUTHENTICATED: errors.UnauthorizedError,
             grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDeniedError}


def rpc_error(bookie_id: str, exc: BaseException, note: str = "") -> errors.BKError:
    """Map a transport failure to the client's exceptions (an *unknown* answer); ``note``
    (why the bookie may be unreachable, e.g. it serves TLS) is added to its message."""
    if isinstance(exc, errors.BKError):
        return exc
    note = f" -- {note}" if note else ""
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return OperationTimeoutError(f"bookie {bookie_id}: request timed out{note}")
        if code in _REFUSALS:
            return _REFUSALS[code](f"bookie {bookie_id} refused this client: "
                                   f"{(exc.details() or '').strip()}{note}")
        return BookieUnavailableError(f"bookie {bookie_id}: {code.name} "
                                      f"{(exc.details() or '').strip()}".rstrip() + note)
    return BookieUnavailableError(f"bookie {bookie_id}: {exc!r}{note}")


def check(status: int, message: str = "", bookie_id: str = "") -> None:
    """Raise the exception of a non-EOK wire status."""
    if status != errors.EOK:
        where = f"bookie {bookie_id}: " if bookie_id else ""
        raise errors.error_for_status(
            status, where + (message or f"{errors.status_name(status)}"))


class _AddStream:
    """One add stream to a bookie (data port, or gRPC ``AddStream``) and its reader thread.

    On a data port (no ``linger``), elements wait in ``held`` while a message is unanswered,
    and whichever thread sees the stream answered sends them: the appender on an idle stream,
    else the reader thread the moment it reads the ack (before it hands the acks on). A
    message costs no thread hand-off on the client; the sender thread only finishes frames the
    socket did not take at once (an appender never blocks on a stalled bookie) and, when a
    message stays unanswered ``max_linger`` (a dropped add must not stall the stream), sends
    what is held anyway. A generator transport (gRPC, or a data port with a ``linger``) drains
    a queue instead (:meth:`_requests`).
    """

    def __init__(self, client: "BookieClient"):
        self.client = client
        self.lock = threading.Lock()    # held, partial, sent_elements, one message at a time
        self.wake = threading.Condition(self.lock)  # data-port sender: partial frame, timer, close
        self.held: list[bytes] = []     # elements not sent yet (data port, or not open yet)
        self.held_bytes = 0
        self.q: queue.SimpleQueue | None = None     # generator transports: their requests
        self.dead = False
        self.cancelled = False
        self.broken: errors.BKError | None = None   # why break_stream ended it (its sinks hear)
        self.closing = False
        self._cancel = None         # ends the transport once it is open
        self.backlog = 0            # bytes queued but not yet handed to the transport
        # self-clocking: elements sent (under lock), responses received (by the reader)
        self.sent_elements = 0
        self.acked_elements = 0
        self.owed_since = None      # monotonic time since when an answer has been owed with
                                    # no answer arriving (None: nothing owed)
        self.sock = None            # the data-port connection, once open
        self.last_send = 0.0
        self.sender_idle = False    # the data-port sender waits without a timeout
        self._direct = None     # data port: sends what it can of a message without blocking
        self.partial = None     # ... and the rest, for the sender thread to send first
        self.answered = threading.Event()
        self.linger = client.linger     # None: the transport's default, once it is open
        self.thread = threading.Thread(target=self._read, daemon=True,
                                       name=f"bk-acks-{client.bookie_id}")
        self.thread.start()

    def _requests(self):
        """Generator transports: the request messages, each a list of encoded ``AddBatch``
        elements: whatever is queued, coalesced (see the module docstring).

        Message spacing is self-clocked: a message goes out at least ``linger`` after the
        previous one, and not before the previous messages were answered unless
        ``max_linger`` passed. At light load the bookie answers quickly and entries go out at
        once; when the bookies (journal sync, CPU) are slower, messages get fewer and larger
        instead of piling up per-message costs.
        """
        q = self.q
        client = self.client
        monotonic, sleep = time.monotonic, time.sleep
        get_nowait, Empty = q.get_nowait, queue.Empty
        answered = self.answered
        last = 0.0
        while True:
            linger = self.linger
            if linger:
                wait = last + linger - monotonic()
                if wait > 0:
                    sleep(wait)
            item = q.get()
            if item is _CLOSE:
                return
            if self.sent_elements != self.acked_elements:
                deadline = last + client.max_linger
                while True:
                    answered.clear()
                    if self.sent_elements == self.acked_elements:
                        break
                    wait = deadline - monotonic()
                    if wait <= 0:
                        break
                    answered.wait(wait)
            parts = list(item)
            size = sum(map(len, parts))
            while size < MAX_BATCH_BYTES:
                try:
                    item = get_nowait()
                except Empty:
                    break
                if item is _CLOSE:
                    if parts:
                        yield parts
                    return
                parts.extend(item)
                size += sum(map(len, item))
            last = monotonic()
            self.backlog -= size
            with self.lock:
                self._count_sent(len(parts))
            tracer = client.trace
            if tracer is not None:
                tracer.sent(parts)
            yield parts

    def use_queue(self) -> None:
        """The transport is a generator one: what was held before it opened goes first."""
        with self.lock:
            self.q = queue.SimpleQueue()
            if self.held:
                self.q.put(self.held)
                self.held, self.held_bytes = [], 0
            if self.closing:
                self.q.put(_CLOSE)

    def _count_sent(self, elements: int) -> None:
        """One message of ``elements`` adds goes out (``lock`` held): self-clocking and the
        perf counters."""
        if self.owed_since is None:
            self.owed_since = time.monotonic()
        self.sent_elements += elements
        self.client.add_messages += 1
        self.client.add_elements += elements

    def _pump_locked(self, force: bool = False) -> None:
        """Data port (``lock`` held): send what is held if the stream is answered -- or if
        ``force`` (one message: ``max_linger`` passed), closing (everything), or a whole
        message is held (no reason to wait) -- at most ``MAX_BATCH_BYTES`` a message, from
        the calling thread, without blocking: the rest of a frame the socket did not take
        goes to the sender thread."""
        direct = self._direct
        if direct is None or self.partial is not None:
            return
        held = self.held
        while held and (force or self.closing or self.held_bytes >= MAX_BATCH_BYTES
                        or self.sent_elements == self.acked_elements):
            if self.held_bytes <= MAX_BATCH_BYTES:
                parts, size = held, self.held_bytes
                self.held = held = []
            else:
                k, size = 1, len(held[0])
                while k < len(held) and size + len(held[k]) <= MAX_BATCH_BYTES:
                    size += len(held[k])
                    k += 1
                parts = held[:k]
                del held[:k]
            self.held_bytes -= size
            self.backlog -= size
            self._count_sent(len(parts))
            self.last_send = time.monotonic()
            force = False
            tracer = self.client.trace
            if tracer is not None and tracer.sent(parts):
                parts = [wire.ADD_TRACE_FIELD, *parts]      # (the bookie's stamps, please)
            rest = direct(parts)
            if rest is not None:        # socket buffer full: never block an appender
                self.partial = rest
                self.backlog += len(rest)
                self.wake.notify()
                return
        if held and self.sender_idle:   # unanswered: arm the sender's max_linger timer
            self.sender_idle = False
            self.wake.notify()

    def _read(self):
        error = None
        client = self.client
        sinks = client.sinks
        try:
            for msg in client._open_add_transport(self):
                responses = msg.responses
                if not responses:
                    continue
                tracer = client.trace
                if tracer is not None:
                    tracer.ack_arrived(msg.trace_received_ns, msg.trace_stored_ns)
                client.ack_messages += 1
                self.acked_elements += len(responses)
                self.owed_since = (None if self.acked_elements == self.sent_elements
                                   else time.monotonic())
                if self.q is None:
                    with self.lock:         # the next message goes before the acks are handled
                        self._pump_locked()
                else:
                    self.answered.set()
                by_ledger: dict[int, list] = {}
                for r in responses:
                    lst = by_ledger.get(r.ledger_id)
                    if lst is None:
                        lst = by_ledger[r.ledger_id] = []
                    lst.append((r.entry_id, r.status))
                for lid, items in by_ledger.items():
                    sink = sinks.get(lid)
                    if sink is not None:
                        try:
                            sink.on_add_responses(self.client.bookie_id, items)
                        except Exception:  # noqa: BLE001 - a sink bug must not kill acks
                            log.exception("add response handler failed")
            error = BookieUnavailableError(f"bookie {self.client.bookie_id}: add stream ended")
        except Exception as exc:  # noqa: BLE001
            error = self.client._error(exc)
        self.client._stream_died(self, error)

    def opened(self, cancel) -> None:
        """The transport is open; ``cancel()`` aborts it (at once if already cancelled)."""
        self._cancel = cancel
        if self.cancelled:
            cancel()

    def send(self, elems: list[bytes]) -> bool:
        """Hand ``elems`` to the stream; False if it is dead or cancelled (the elements are
        dropped: its sinks hear the stream end and resend what is unacknowledged to the
        bookie's replacement). Never blocks on the bookie."""
        size = sum(map(len, elems))
        with self.lock:
            if self.dead or self.cancelled:
                return False
            self.backlog += size
            if self.q is not None:
                self.q.put(elems)
                return True
            self.held.extend(elems)
            self.held_bytes += size
            self._pump_locked()
        return True

    def close(self):
        """End the stream after sending what is held or queued (acks still arrive)."""
        with self.lock:
            self.closing = True
            if self.q is not None:
                self.q.put(_CLOSE)
            else:
                self._pump_locked()
                self.wake.notify()

    def cancel(self):
        """Abort the stream now: unanswered adds get no ack (the reader sees it end)."""
        self.cancelled = True
        if self._cancel is not None:
            try:
                self._cancel()
            except Exception:  # noqa: BLE001
                pass


def _runs(elems: list[bytes], limit: int = MAX_BATCH_BYTES) -> list[list[bytes]]:
    """``elems`` cut into runs of at most ``limit`` bytes (a larger element alone): each run
    becomes at most one add message, and a bookie refuses a message over its frame limit."""
    if sum(map(len, elems)) <= limit:
        return [elems]
    runs, run, size = [], [], 0
    for elem in elems:
        if run and size + len(elem) > limit:
            runs.append(run)
            run, size = [], 0
        run.append(elem)
        size += len(elem)
    runs.append(run)
    return runs


def _joined(messages):
    for parts in messages:
        yield b"".join(parts)


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    """Connect within ``timeout`` by attempts of at most :data:`CONNECT_ATTEMPT` seconds.

    One ``connect`` whose SYNs are dropped (a partition) retransmits them at growing
    intervals (1, 2, 4 s...), so once the path heals it may wait seconds for its next SYN;
    a fresh attempt sends one at once."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            return socket.create_connection((host, port),
                                            timeout=max(0.05, min(CONNECT_ATTEMPT, remaining)))
        except (socket.timeout, TimeoutError):     # refused and the like fail at once
            if deadline - time.monotonic() <= 0:
                raise


class _Pipeline:
    """Range reads whose requests went out together on one data-port connection: the bookie
    answers them in order (each one's chunks, then its end frame), so their answers are read
    in that order whichever range is iterated.

    A range iterated while ranges sent before it are unfinished has their chunks read into
    memory for them, copied out of the frame pool (meant for small ranges: what is held is
    their entries); a range closed early has the rest of its answer read and dropped when a
    later one needs the connection. Each frame read for range ``i`` is bounded by ``i``'s
    deadline (its ``timeout`` from its first read); a range whose deadline passed before a
    frame was begun fails alone. A transport error, a timeout inside a frame or a malformed
    frame fails every range not yet fully read (each raises it when iterated: their readers
    fall over) and closes the connection; once every answer is read the connection goes
    back to the idle list."""

    def __init__(self, client: "BookieClient", sock: socket.socket, reqs: list, timeout: float):
        self.client, self.sock, self.reqs, self.timeout = client, sock, reqs, timeout
        self.rfile = sock.makefile("rb", buffering=1 << 20)
        self.lock = threading.RLock()   # (a range dropped by the collector while reading)
        self.head = 0                   # the range whose answer is read next
        self.held: dict[int, deque] = {}    # chunks read ahead for a range not at its turn
        self.dropped: set[int] = set()  # ranges closed before their answers were read
        self.to_drop: list[int] = []    # ... closed while another thread was reading
        self.deadlines: dict[int, float] = {}
        self.failed: tuple | None = None    # (type, args) of what broke the connection

    def next_chunk(self, i: int):
        """The next ``(status, message, entries)`` of range ``i``; None after its last."""
        with self.lock:
            if i not in self.deadlines:
                self.deadlines[i] = time.monotonic() + self.timeout
            while True:
                self._apply_drops()
                held = self.held.get(i)
                if held:
                    return held.popleft()
                if i < self.head:
                    self.held.pop(i, None)
                    return None
                if self.failed is not None:
                    kind, args = self.failed
                    raise kind(*args)       # (a fresh one each: no traceback kept alive)
                if time.monotonic() >= self.deadlines[i]:   # between frames: only i fails
                    self._drop(i)
                    raise errors.OperationTimeoutError(
                        f"bookie {self.client.bookie_id}: range read timed out")
                self._read_one(i)

    def drop(self, i: int) -> None:
        """Range ``i`` will not be read further: what is held or still comes of it is
        dropped. Never waits for a reading thread (which applies it)."""
        if self.lock.acquire(blocking=False):
            try:
                self._drop(i)
            finally:
                self.lock.release()
        else:
            self.to_drop.append(i)

    def _apply_drops(self) -> None:
        while self.to_drop:
            self._drop(self.to_drop.pop())

    def _drop(self, i: int) -> None:
        self.dropped.add(i)
        self.held.pop(i, None)
        if all(j in self.dropped for j in range(self.head, len(self.reqs))):
            self._close()       # nobody waits for the rest: do not read it

    def _read_one(self, i: int) -> None:
        """Read the head range's next chunk (and its end frame after its last) for range
        ``i``'s read, keeping it for the head range unless that was dropped."""
        client, h = self.client, self.head
        try:
            chunk, last = self._frame(self.deadlines[i], pooled=h == i), False
            if chunk is None:
                raise wire.FrameError("range end frame before any chunk")
            status, next_id, message, entries = chunk
            if status != errors.EOK or next_id > self.reqs[h].last_entry_id:
                if self._frame(self.deadlines[i], pooled=False) is not None:
                    raise wire.FrameError("no end frame after a range's last chunk")
                last = True
        except socket.timeout:
            self._fail(errors.OperationTimeoutError,
                       f"bookie {client.bookie_id}: range read timed out")
        except (OSError, wire.FrameError) as exc:
            self._fail(BookieUnavailableError, f"bookie {client.bookie_id}: data port: {exc}")
        except BaseException:
            self.failed = (BookieUnavailableError,
                           (f"bookie {client.bookie_id}: a range read was interrupted",))
            self._close()
            raise
        if h not in self.dropped:
            self.held.setdefault(h, deque()).append((status, message, entries))
        if last:
            self.head += 1
            if self.head == len(self.reqs):
                self.rfile.close()
                client._reuse_read_connection(self.sock)
                self.sock = None

    def _frame(self, deadline: float, pooled: bool):
        """The next chunk, decoded; None for an end frame. ``pooled``: read into the client's
        frame pool (for the caller: a buffer of at least 1 MiB); else into its own bytes."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout()
        if self.sock is None:
            raise wire.FrameError("connection closed")
        self.sock.settimeout(remaining)
        item = (wire.read_frame_into(self.rfile, MAX_RESPONSE_BYTES, self.client._frames)
                if pooled else wire.read_frame(self.rfile, MAX_RESPONSE_BYTES))
        if item is None:
            raise wire.FrameError("data port closed")
        kind, payload = item
        if kind == wire.KIND_READ_END:
            return None
        if kind != wire.KIND_READ_CHUNK:
            raise wire.FrameError(f"unexpected frame kind {kind} on a range read")
        return wire.decode_range_chunk(payload)

    def _fail(self, kind, message: str):
        self.failed = (kind, (message,))
        self._close()
        raise kind(message) from None

    def _close(self) -> None:
        if self.sock is not None:
            self.rfile.close()
            self.sock.close()
            self.sock = None

    def __del__(self):
        self._close()


class _PipedRange:
    """The chunks of range ``i`` of a :class:`_Pipeline` (an iterator; closing or dropping it
    before its end drops the rest of its answer)."""

    def __init__(self, pipeline: _Pipeline, i: int):
        self._pipeline, self._i = pipeline, i

    def __iter__(self):
        return self

    def __next__(self):
        if self._pipeline is None:
            raise StopIteration
        chunk = self._pipeline.next_chunk(self._i)
        if chunk is None:
            self._pipeline = None
            raise StopIteration
        return chunk

    def close(self) -> None:
        if self._pipeline is not None:
            self._pipeline.drop(self._i)
            self._pipeline = None

    __del__ = close


def _idle_and_open(sock: socket.socket) -> bool:
    """False if the peer closed an idle connection (or sent something unasked)."""
    if isinstance(sock, ssl.SSLSocket):
        return True             # no peeking under TLS: a stale one fails its first read
    try:
        sock.setblocking(False)
        try:
            sock.recv(1, socket.MSG_PEEK)
            return False
        finally:
            sock.setblocking(True)
    except BlockingIOError:
        return True
    except OSError:
        return False


class BookieClient:
    """Channel, stub and add stream of one bookie (thread-safe)."""

    linger = None       # min seconds between two add messages (None: 0 on the data port,
                        # GRPC_ADD_LINGER on gRPC)
    max_linger = 0.005  # ... and at most this long waiting for the previous ones' acks
    max_backlog = 0     # unsent add bytes beyond which senders wait (0: no bound) ...
    backlog_wait = 10.0  # ... at most this long, then the stream is broken (send_adds)

    def __init__(self, bookie_id: str, address: str, sinks: dict, on_failure=None,
                 credentials: Credentials | None = None):
        self.bookie_id = bookie_id
        self.on_failure = on_failure
        self.address = address
        self.sinks = sinks      # ledger_id -> handle, shared by the whole BookKeeper client
        self.credentials = credentials = credentials or Credentials()
        self.note = ""          # added to transport errors (see rpc_error)
        self.channel = credentials.channel(address, options=_CHANNEL_OPTIONS)
        self.stub = pb_grpc.BookieStub(self.channel)
        self._add_stream_callable = self.channel.stream_stream(
            _ADD_STREAM_METHOD, request_serializer=wire.identity,
            response_deserializer=pb.AddBatchResponse.FromString)
        self._lock = threading.Lock()
        self._stream: _AddStream | None = None
        self._data_port: int | None = None      # learnt from GetBookieInfo; 0 = none
        self._idle_reads: list[socket.socket] = []
        self._frames = wire.FramePool()     # range chunks, received into reused buffers
        self.closed = False
        # perf counters (add stream): request messages and the AddBatch elements they
        # carried, ack messages received
        self.add_messages = 0
        self.add_elements = 0
        self.ack_messages = 0
        self.trace = None       # the client's AddTracer, while it traces adds (add_trace)

    def _error(self, exc: BaseException) -> errors.BKError:
        return rpc_error(self.bookie_id, exc, self.note)

    # ---- streamed adds -----------------------------------------------------------------
    def send_adds(self, elems: list[bytes]) -> None:
        """Queue encoded ``AddBatch`` elements; acks arrive through the sinks.

        Back-pressure: a bookie that takes adds slower than they come (a hung or stopped
        process outside the ack quorum) grows the stream's unsent backlog. Once it is over
        ``max_backlog`` bytes the caller waits here (never holding a ledger's lock) until the
        backlog drains below it -- a healthy bookie sent one large burst -- or the stream
        ends, or ``backlog_wait`` seconds pass: then the stream is broken, so its sinks
        replace the bookie. The client so holds at most ``max_backlog`` unsent bytes per
        bookie plus what the callers of the moment queue, whatever the writers' rate (it
        grew by gigabytes in seconds before). (The client's periodic check also replaces a
        bookie whose backlog stayed over the softer ``max_bookie_backlog_bytes`` for the
        add timeout.)"""
        with self._lock:
            if self.closed:
                raise BookieUnavailableError(f"bookie client {self.bookie_id} closed")
            st = self._stream
            if st is None or st.dead:
                st = self._stream = _AddStream(self)
            for run in _runs(elems):
                st.send(run)
        if self.max_backlog and st.backlog > self.max_backlog:
            self._wait_for_backlog(st)

    def _wait_for_backlog(self, st: "_AddStream") -> None:
        deadline = time.monotonic() + self.backlog_wait
        while st.backlog > self.max_backlog and not (st.dead or st.cancelled):
            if time.monotonic() >= deadline:
                self.break_stream(f"{st.backlog} bytes of adds unsent, over the bound of "
                                  f"{self.max_backlog}, for {self.backlog_wait}s", st,
                                  backlogged=True)
                return
            time.sleep(0.002)

    def _open_add_transport(self, stream: _AddStream):
        """Open ``stream``'s transport; return the iterator of its ``AddBatchResponse``s.

        The data port (asked from the bookie itself, so a restarted bookie's new port is
        found) when the bookie has one, else gRPC's ``AddStream``."""
        data_port = self._data_port = self.info(timeout=DATA_CONNECT_TIMEOUT).data_port
        if not data_port:
            if stream.linger is None:
                stream.linger = GRPC_ADD_LINGER
            stream.use_queue()
            call = self._add_stream_callable(_joined(stream._requests()))
            stream.opened(call.cancel)
            return call
        sock = self._connect_data_port(data_port)
        if stream.linger is None:
            stream.linger = 0.0
        stream.opened(lambda: wire.shutdown(sock))
        stream.sock = sock
        return self._data_port_responses(sock, stream)

    def _connect_data_port(self, data_port: int,
                           timeout: float = DATA_CONNECT_TIMEOUT) -> socket.socket:
        """A data-port connection whose hello the bookie answered within ``timeout``."""
        host = self.address.rsplit(":", 1)[0].strip("[]")
        deadline = time.monotonic() + timeout
        sock = _connect(host, data_port, timeout)
        try:
            sock.settimeout(max(0.05, deadline - time.monotonic()))   # for the hello
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.credentials.tls:
                sock = self.credentials.ssl_context.wrap_socket(sock, server_hostname=host)
            sock.sendall(wire.hello(self.credentials.token))
            hello = wire.recv_exact(sock, len(wire.DATA_MAGIC))
            if hello == wire.DATA_REFUSED:
                why = wire.read_frame(sock.makefile("rb"), wire.MAX_HELLO_BYTES)
                raise errors.UnauthorizedError(
                    f"bookie {self.bookie_id} refused this client: "
                    f"{why[1].decode(errors='replace') if why else 'no reason given'}")
            if hello != wire.DATA_MAGIC:
                raise BookieUnavailableError(
                    f"bookie {self.bookie_id}: data port {host}:{data_port} did not answer "
                    f"the data protocol's hello")
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        return sock

    def _data_port_responses(self, sock: socket.socket, stream: _AddStream):
        """Start the stream's sender thread; yield the responses read here."""
        frame, add_kind = wire.frame, wire.KIND_ADD_BATCH

        def direct(parts):
            """Send without blocking (caller holds the lock); return the unsent rest."""
            data = frame(add_kind, parts)
            try:
                n = sock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                n = 0
            except OSError:
                wire.shutdown(sock)     # the reader sees the end: the stream dies, adds are resent
                return None
            return memoryview(data)[n:] if n < len(data) else None

        def send_held():
            """Finish partial frames; send held elements ``max_linger`` after an unanswered
            message; on close, send what is left and end the request side."""
            lock, wake, max_linger = stream.lock, stream.wake, self.max_linger
            try:
                with lock:
                    try:
                        stream._direct = direct
                        stream._pump_locked()
                        while not stream.dead:
                            rest = stream.partial
                            if rest is not None:
                                lock.release()
                                try:
                                    sock.sendall(rest)
                                finally:
                                    lock.acquire()
                                stream.partial = None
                                stream.backlog -= len(rest)
                                stream._pump_locked()
                            elif stream.closing and not stream.held:
                                break
                            elif stream.held and stream.sent_elements != stream.acked_elements:
                                wait = stream.last_send + max_linger - time.monotonic()
                                if wait > 0:
                                    wake.wait(wait)
                                else:
                                    stream._pump_locked(force=True)
                            else:
                                stream.sender_idle = True
                                wake.wait()
                                stream.sender_idle = False
                    finally:
                        stream._direct = None
                sock.shutdown(socket.SHUT_WR)   # closed: the bookie answers, then ends
            except OSError:
                wire.shutdown(sock)

        def send_queued():
            try:
                for parts in stream._requests():
                    sock.sendall(frame(add_kind, parts))
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                wire.shutdown(sock)

        if stream.linger or isinstance(sock, ssl.SSLSocket):   # no MSG_DONTWAIT under TLS
            stream.use_queue()
            sender = send_queued
        else:
            sender = send_held
        threading.Thread(target=sender, daemon=True, name=f"bk-adds-{self.bookie_id}").start()
        try:
            rfile = sock.makefile("rb", buffering=256 << 10)
            from_string = pb.AddBatchResponse.FromString
            while True:
                item = wire.read_frame(rfile, MAX_RESPONSE_BYTES)
                if item is None:
                    return
                kind, payload = item
                if kind != wire.KIND_ADD_RESPONSES:
                    raise wire.FrameError(f"unexpected frame kind {kind} on an add stream")
                yield from_string(payload)
        except (OSError, wire.FrameError) as exc:
            if not stream.cancelled:
                raise BookieUnavailableError(f"bookie {self.bookie_id}: data port: {exc}") from None
        finally:
            wire.shutdown(sock)
            stream.close()          # ends the sender
            sock.close()

    def _stream_died(self, stream: _AddStream, error: errors.BKError) -> None:
        """``stream`` is over: its sinks hear it once (a stream broken while it was still
        opening is reported by :meth:`break_stream`, and again, ignored, when its opening
        ends)."""
        with self._lock:
            if stream.dead:
                return
            stream.dead = True
            error = stream.broken or error
            if self._stream is stream:
                self._stream = None
        stream.close()          # ends the request generator
        if self.closed:
            return
        log.info("add stream to %s ended: %s", self.bookie_id, error)
        if self.on_failure is not None:
            self.on_failure(self.bookie_id)
        for sink in list(self.sinks.values()):
            try:
                sink.on_bookie_failed(self.bookie_id, error)
            except Exception:  # noqa: BLE001
                log.exception("bookie failure handler failed")

    @property
    def backlog(self) -> int:
        """Bytes of adds queued for this bookie and not yet sent (a stuck bookie grows it)."""
        st = self._stream
        return st.backlog if st is not None else 0

    def stalled_for(self) -> float:
        """Seconds the add stream has owed an answer without any arriving (0: none owed)."""
        st = self._stream
        since = st.owed_since if st is not None and not st.dead else None
        return 0.0 if since is None else time.monotonic() - since

    def stuck_in_backoff(self, timeout: float) -> bool:
        """Whether the add stream's connection is stuck in TCP back-off while the bookie
        answers: its socket is backing off (``TCP_INFO`` backoff or retransmits > 0: data or
        window probes go unanswered, retried at doubling intervals up to 2 minutes) and a new
        connection's hello is answered within ``timeout``. That is a partition that healed
        (a bookie still cut off does not answer the hello, nor does a hung one). Data-port
        streams only."""
        st = self._stream
        sock = st.sock if st is not None and not st.dead else None
        if sock is None:
            return False
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
        except OSError:
            return False
        if info[2] == 0 and info[4] == 0:     # tcpi_retransmits, tcpi_backoff
            return False
        try:
            self._connect_data_port(self._data_port, timeout=timeout).close()
            return True
        except (OSError, errors.BKError):
            return False

    def break_stream(self, reason: str, stream: "_AddStream | None" = None,
                     backlogged: bool = False) -> None:
        """Abort the add stream -- ``stream``, or the current one (its sinks hear
        on_bookie_failed and replace the bookie; ``backlogged``: with a
        :class:`BookieBackloggedError`, which writers act on even with nothing pending).

        A stream still opening (a stopped bookie does not answer ``GetBookieInfo`` or the
        hello until ``DATA_CONNECT_TIMEOUT``) is reported dead now rather than when its
        opening gives up: the bookie is replaced at once."""
        st = stream if stream is not None else self._stream
        if st is not None and not st.dead:
            log.warning("bookie %s: %s; abandoning its add stream", self.bookie_id, reason)
            kind = errors.BookieBackloggedError if backlogged else BookieUnavailableError
            st.broken = kind(f"bookie {self.bookie_id}: {reason}")
            st.cancel()
            if st._cancel is None:
                self._stream_died(st, st.broken)

    # ---- unary calls -------------------------------------------------------------------
    def _wrap(self, grpc_future) -> Future:
        out: Future = Future()

        def done(f):
            try:
                out.set_result(f.result())
            except BaseException as exc:  # noqa: BLE001
                out.set_exception(self._error(exc))

        grpc_future.add_done_callback(done)
        return out

    def read(self, ledger_id: int, entry_id: int, *, flags: int = 0, master_key: bytes = b"",
             timeout: float = 10.0, previous_lac: int | None = None,
             long_poll_ms: int = 0) -> Future:
        """Future of the ``ReadResponse`` (status not checked)."""
        req = pb.ReadRequest(ledger_id=ledger_id, entry_id=entry_id, flags=flags,
                             master_key=master_key)
        if previous_lac is not None:
            req.has_previous_lac = True
            req.previous_lac = previous_lac
            req.timeout_ms = int(long_poll_ms)
        try:
            return self._wrap(self.stub.Read.future(req, timeout=timeout))
        except Exception as exc:  # noqa: BLE001
            f: Future = Future()
            f.set_exception(self._error(exc))
            return f

    def add(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes, *,
            flags: int = 0, timeout: float = 10.0) -> Future:
        """Unary add (used by recovery write-back); Future of the ``AddResponse``."""
        req = pb.AddRequest(ledger_id=ledger_id, entry_id=entry_id, master_key=master_key,
                            flags=flags, body=body)
        try:
            return self._wrap(self.stub.Add.future(req, timeout=timeout))
        except Exception as exc:  # noqa: BLE001
            f: Future = Future()
            f.set_exception(self._error(exc))
            return f

    def list_entries(self, ledger_id: int, *, timeout: float = 10.0) -> Future:
        """Future of the ``ListEntriesResponse`` (the entry ranges this bookie holds)."""
        try:
            return self._wrap(self.stub.ListEntries.future(
                pb.ListEntriesRequest(ledger_id=ledger_id), timeout=timeout))
        except Exception as exc:  # noqa: BLE001
            f: Future = Future()
            f.set_exception(self._error(exc))
            return f

    def force(self, ledger_id: int, *, timeout: float = 10.0) -> Future:
        """Future of the ``ForceResponse``: everything this bookie accepted is durable."""
        try:
            return self._wrap(self.stub.Force.future(pb.ForceRequest(ledger_id=ledger_id),
                                                     timeout=timeout))
        except Exception as exc:  # noqa: BLE001
            f: Future = Future()
            f.set_exception(self._error(exc))
            return f

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes, lac_body: bytes, *,
                  timeout: float = 10.0) -> Future:
        """Unary WriteLac (explicit LAC for tailing readers); Future of the response."""
        req = pb.WriteLacRequest(ledger_id=ledger_id, lac=lac, master_key=master_key,
                                 lac_body=lac_body)
        try:
            return self._wrap(self.stub.WriteLac.future(req, timeout=timeout))
        except Exception as exc:  # noqa: BLE001
            f: Future = Future()
            f.set_exception(self._error(exc))
            return f

    def read_range(self, ledger_id: int, first: int, last: int, *, timeout: float = 60.0,
                   max_bytes: int = 4 << 20, step: int = 1):
        """An iterator of ``(entry_id, body)`` for first, first+step, ... <= last (body: bytes,
        or a memoryview of the received chunk on the data port). The request is sent now, so a
        caller may start several ranges (of several bookies and ledgers) before reading any;
        the iterator raises the first error (status or transport) after yielding what was
        served before it, and an error sending the request is raised here. It is
        :meth:`read_ranges` of one range: on the data port when the bookie has one (a
        connection per concurrent range, kept for reuse), else gRPC's ``ReadRange`` (whose call
        is made when first iterated); ``timeout`` counts from the first read of the answer: a
        range started ahead is not timed while its caller is busy with others."""
        return self.read_ranges([(ledger_id, first, last, step)], timeout=timeout,
                                max_bytes=max_bytes)[0]

    def read_ranges(self, ranges: list, *, timeout: float = 60.0, max_bytes: int = 4 << 20):
        """:meth:`read_range` of each ``(ledger_id, first, last, step)`` of ``ranges``: one
        iterator each, all requests sent now -- on the data port up to
        :data:`MAX_PIPELINED_RANGES` on one connection in one send, answered in order by the
        bookie (one round trip and one connection for many small ranges; see
        :class:`_Pipeline` for what reading them out of order holds in memory). An iterator
        raises the first error of its range after what was served before it; an error
        sending the requests is raised here. Without a data port, each range is its own gRPC
        ``ReadRange`` call."""
        reqs = [pb.ReadRangeRequest(ledger_id=lid, first_entry_id=first, last_entry_id=last,
                                    max_bytes_per_message=max_bytes, step=step, more=True)
                for lid, first, last, step in ranges]
        out = []
        for at in range(0, len(reqs), MAX_PIPELINED_RANGES):
            group = reqs[at:at + MAX_PIPELINED_RANGES]
            group[-1].more = False      # the bookie sends the group's answers after this one
            try:
                sock = self._read_connection(timeout)
            except (OSError, ssl.SSLError, grpc.RpcError) as exc:
                raise self._error(exc) from None
            if sock is None:
                out += [self._range_entries(self._grpc_range(req, timeout)) for req in group]
                continue
            try:
                sock.sendall(b"".join(wire.frame(wire.KIND_READ_RANGE, (req.SerializeToString(),))
                                      for req in group))
            except OSError as exc:
                sock.close()
                raise BookieUnavailableError(f"bookie {self.bookie_id}: data port: {exc}") from None
            pipeline = _Pipeline(self, sock, group, timeout)
            out += [self._range_entries(_PipedRange(pipeline, i)) for i in range(len(group))]
        return out

    def _reuse_read_connection(self, sock: socket.socket) -> None:
        """Keep a data-port connection whose answers were all read for later range reads (at
        most :data:`MAX_IDLE_READS`), else close it."""
        with self._lock:
            if not self.closed and len(self._idle_reads) < MAX_IDLE_READS:
                self._idle_reads.append(sock)
                return
        sock.close()

    def _range_entries(self, chunks):
        for status, message, entries in chunks:
            yield from entries
            if status != errors.EOK:
                check(status, message, self.bookie_id)

    def _grpc_range(self, req, timeout: float):
        call = self.stub.ReadRange(req, timeout=timeout)
        try:
            for msg in call:
                yield msg.status, msg.message, [(e.entry_id, e.body) for e in msg.entries]
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        finally:
            call.cancel()

    def _read_connection(self, timeout: float) -> socket.socket | None:
        """An idle or new data-port connection for a range read; None: use gRPC."""
        while True:
            with self._lock:
                sock = self._idle_reads.pop() if self._idle_reads else None
            if sock is None:
                break
            if _idle_and_open(sock):
                return sock
            sock.close()            # the bookie closed it (restarted, stopped)
        if self._data_port is None:
            self._data_port = self.info(timeout=min(timeout, DATA_CONNECT_TIMEOUT)).data_port
        if not self._data_port:
            return None
        try:
            return self._connect_data_port(self._data_port)
        except OSError:         # restarted on another port?
            self._data_port = self.info(timeout=min(timeout, DATA_CONNECT_TIMEOUT)).data_port
            return self._connect_data_port(self._data_port) if self._data_port else None

    def info(self, timeout: float = 5.0) -> pb.BookieInfoResponse:
        try:
            return self.stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def close(self) -> None:
        with self._lock:
            self.closed = True
            st, self._stream = self._stream, None
            idle, self._idle_reads = self._idle_reads, []
        for sock in idle:
            sock.close()
        if st is not None:
            st.close()
            st.cancel()
        self.channel.close()


class BookieClientPool:
    """One :class:`BookieClient` per bookie id; addresses from the bookie registry."""

    def __init__(self, resolve_address, on_failure=None, credentials: Credentials | None = None, *,
                 linger: float | None = None, max_linger: float | None = None, note_for=None,
                 max_backlog: int = 0, backlog_wait: float = BookieClient.backlog_wait):
        self._resolve = resolve_address     # bookie_id -> "host:port"
        self._note_for = note_for           # bookie_id -> BookieClient.note
        self.on_failure = on_failure        # called with a bookie id whose stream broke
        self.credentials = credentials      # who this client is; the roots of bookies
        self.linger = BookieClient.linger if linger is None else linger
        self.max_linger = BookieClient.max_linger if max_linger is None else max_linger
        self.max_backlog = max_backlog      # see BookieClient.send_adds
        self.backlog_wait = backlog_wait
        self._clients: dict[str, BookieClient] = {}
        self._lock = threading.Lock()
        self.sinks: dict[int, object] = {}
        self.trace = None       # the client's AddTracer, while it traces adds (add_trace)

    def set_trace(self, tracer) -> None:
        """Stamp the sends and acks of every bookie's add stream in ``tracer`` (None: no
        more)."""
        with self._lock:
            self.trace = tracer
            for c in self._clients.values():
                c.trace = tracer

    def get(self, bookie_id: str) -> BookieClient:
        c = self._clients.get(bookie_id)
        if c is not None:
            return c
        with self._lock:
            c = self._clients.get(bookie_id)
            if c is None:
                c = BookieClient(bookie_id, self._resolve(bookie_id), self.sinks,
                                 self.on_failure, self.credentials)
                c.linger, c.max_linger = self.linger, self.max_linger
                c.max_backlog, c.backlog_wait = self.max_backlog, self.backlog_wait
                c.trace = self.trace
                if self._note_for is not None:
                    c.note = self._note_for(bookie_id)
                self._clients[bookie_id] = c
            return c

    def register(self, ledger_id: int, sink) -> None:
        self.sinks[ledger_id] = sink

    def unregister(self, ledger_id: int, sink) -> None:
        if self.sinks.get(ledger_id) is sink:
            del self.sinks[ledger_id]

    def clients(self) -> list[BookieClient]:
        return list(self._clients.values())

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
