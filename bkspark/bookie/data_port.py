"""The bookie's data port: streamed adds and range reads over plain TCP frames.

Python gRPC costs ~0.2-0.3 ms of CPU per message on each end (``shared/notes``,
``bench/client.py``), which made a steady, moderate add rate cost several times the CPU per
entry of the peak rate and put add latency in the tens of milliseconds. Like BookKeeper's
binary protocol next to its protobuf one, the bookie therefore also serves its two bulk
streams on a data port: the same ``AddBatch`` / ``AddBatchResponse`` / ``ReadRangeRequest`` /
``ReadRangeResponse`` messages, framed by :mod:`bkspark.proto.wire`, at a few microseconds
per message. Clients learn the port from ``GetBookieInfo`` (gRPC stays the identity and the
control plane); TLS, when the bookie has a certificate, wraps the data port too.

Authentication: a connection is admitted once, at its hello (a token, or the client
certificate of its TLS session), with the role :data:`bkspark.auth.roles.DATA_PORT`; a
refused hello is answered ``DATA_REFUSED`` and the reason, and the connection is closed
before any frame is read (:mod:`bkspark.auth.guard`).

Durability and failure semantics are those of ``BookieService.AddStream`` and ``ReadRange``:
both call the same ``BookieService`` code (validation, fault injection, in-flight bounds,
durable journal before EOK). Ordering: a connection's frames are answered in the order they
came. A connection that breaks the framing is closed; an add batch being stored then is
still stored, its acks are lost (the client resends or replaces this bookie, as on any
broken stream).
"""
from __future__ import annotations

import logging
import math
import socket
import ssl
import threading
import time

from bkspark.auth import roles
from bkspark.bookie import threads
from bkspark.bookie.service import RangeBuffer
from bkspark.errors import BadRequestError, UnauthorizedError
from bkspark.logging_setup import LogBudget
from bkspark.proto import wire
from bkspark.proto import bookie_pb2 as pb

log = logging.getLogger("bkspark.bookie.data_port")

MAX_CONNECTIONS = 1024      # beyond this, new connections are closed at once (a thread each)
MAX_PER_PEER = 256          # connections from one address, admitted or not (a host's clients)
MAX_UNADMITTED = 128        # connections whose hello is not yet admitted, all peers
MAX_UNADMITTED_PER_PEER = 16    # ... and from one address
HELLO_DEADLINE_S = 10.0     # the whole hello (and TLS handshake) within this, or closed
HOLD_BYTES = 256 << 10      # answers a connection holds for requests marked ``more``, at most
HELD_FRAME_COST = 64        # ... each held frame counting this much more than its bytes (the
                            # bytes object and its list slot: tiny answers are bounded too)
SEND_TIMEOUT_S = 30.0       # a peer that reads none of its answers this long is closed (the
                            # answers it holds in the bookie's socket buffer are bounded so);
                            # the default of data_port_send_timeout_s


class DataPortServer:
    """Accepts data-port connections for one :class:`~bkspark.bookie.service.BookieService`."""

    def __init__(self, service, host: str, port: int, *, max_frame_bytes: int, guard,
                 ssl_context: ssl.SSLContext | None = None,
                 send_timeout: float = SEND_TIMEOUT_S) -> None:
        self.service = service
        self.send_timeout = send_timeout
        self.guard = guard
        self.max_frame_bytes = max_frame_bytes
        self.ssl_context = ssl_context
        self._listener = socket.create_server((host, port), backlog=128)
        self.port = self._listener.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._unadmitted: dict[str, int] = {}   # address -> connections not admitted yet
        self._per_peer: dict[str, int] = {}     # address -> its connections, admitted or not
        self._budget = LogBudget(10, 60.0)      # warnings about refused connections
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threads.thread(self._accept_loop, "bookie-data-accept")

    def start(self) -> "DataPortServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and end every connection (in-flight adds still complete)."""
        self._stopped = True
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            wire.shutdown(conn)

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                conn, addr = self._listener.accept()
            except OSError:
                if self._stopped:
                    return
                continue
            peer = addr[0] if isinstance(addr, tuple) else "?"
            why = self._refuse_why(peer)
            if why:
                if (withheld := self._budget.allow()) is not None:
                    log.warning("data port: refusing a connection from %s: %s%s", peer, why,
                                f" ({withheld} more refused since the last warning)"
                                if withheld else "")
                conn.close()
                continue
            threads.thread(self._serve, "bookie-data-conn", (conn, peer)).start()

    def _refuse_why(self, peer: str) -> str:
        """Why a new connection from ``peer`` is refused ("" if it is taken; then it counts
        as not admitted until its hello is)."""
        with self._lock:
            total = sum(self._unadmitted.values())
            if len(self._conns) + total >= MAX_CONNECTIONS:
                return f"{len(self._conns) + total} connections open"
            if total >= MAX_UNADMITTED:
                return f"{total} connections wait for their hello to be admitted"
            if self._unadmitted.get(peer, 0) >= MAX_UNADMITTED_PER_PEER:
                return f"{MAX_UNADMITTED_PER_PEER} of its connections wait for their hello"
            if self._per_peer.get(peer, 0) >= MAX_PER_PEER:
                return f"it holds {MAX_PER_PEER} connections"
            self._unadmitted[peer] = self._unadmitted.get(peer, 0) + 1
            self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
            return ""

    def _admitted(self, peer: str) -> None:
        with self._lock:
            left = self._unadmitted.get(peer, 0) - 1
            if left > 0:
                self._unadmitted[peer] = left
            else:
                self._unadmitted.pop(peer, None)

    # ---- one connection ----------------------------------------------------------------

    def _serve(self, conn: socket.socket, peer: str) -> None:
        admitted = False
        sock = [conn]           # the connection as _hello leaves it (TLS-wrapped, maybe)
        try:
            identity, rfile = self._hello(sock, peer)
            conn = sock[0]
            if identity is None:
                return
            with self._lock:
                if self._stopped:
                    return
                self._conns.add(conn)
            self._admitted(peer)
            admitted = True
            conn.settimeout(None)
            conn.sendall(wire.DATA_MAGIC)
            DataConnection(self, conn, rfile, identity.expires).run()
        except (OSError, ssl.SSLError, wire.FrameError) as exc:
            log.debug("data connection ended: %s", exc)
        except BadRequestError as exc:      # a message refused whole: the peer is not ours
            if (withheld := self._budget.allow()) is not None:
                log.warning("data port: closed a connection from %s: %s%s", peer, exc,
                            f" ({withheld} more refused since the last warning)"
                            if withheld else "")
        except Exception as exc:  # noqa: BLE001 - a message that does not parse, or a bug
            log.warning("data connection closed: %r", exc)
        finally:
            conn = sock[0]
            if not admitted:
                self._admitted(peer)
            with self._lock:
                self._conns.discard(conn)
                left = self._per_peer.pop(peer, 1) - 1
                if left > 0:
                    self._per_peer[peer] = left
            try:
                conn.close()
            except OSError:
                pass

    def _hello(self, sock: list, peer: str):
        """Read and judge the hello on ``sock[0]`` within :data:`HELLO_DEADLINE_S` (all of it,
        however the peer trickles its bytes; ``sock[0]`` becomes the TLS connection):
        ``(identity, buffered reader)``, or ``(None, None)`` when it is malformed, late or
        refused (a refusal is answered)."""
        deadline = time.monotonic() + HELLO_DEADLINE_S
        conn = sock[0]
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(HELLO_DEADLINE_S)
        if self.ssl_context is not None:
            conn = sock[0] = self.ssl_context.wrap_socket(conn, server_side=True)
        if _recv_until(conn, len(wire.DATA_MAGIC), deadline) != wire.DATA_MAGIC:
            return None, None           # another protocol, or a client of before: closed
        head = _recv_until(conn, wire.FRAME.size, deadline)
        if head is None:
            return None, None
        size, kind = wire.FRAME.unpack(head)
        if kind != wire.KIND_HELLO or size > wire.MAX_HELLO_BYTES:
            return None, None
        token = _recv_until(conn, size, deadline)
        identity = None if token is None else self._admit(conn, token, peer)
        if identity is None:
            return None, None
        return identity, conn.makefile("rb", buffering=256 << 10)


    def _admit(self, conn, token: bytes, peer: str):
        """The identity the hello's credentials admit; None after answering a refusal."""
        cert = conn.getpeercert(binary_form=True) if isinstance(conn, ssl.SSLSocket) else None
        try:
            return self.guard.admit(roles.DATA_PORT, peer,
                                    token=token.decode(errors="replace"), cert=cert)
        except UnauthorizedError as exc:
            conn.sendall(wire.refusal(str(exc)))
            _drain_before_close(conn)
            return None


def _drain_before_close(conn, limit: int = 64 << 10, seconds: float = 1.0) -> None:
    """End our side, then read (at most ``limit`` bytes, ``seconds``) what the peer already
    sent: closing with unread input would reset the connection, and the peer could lose the
    answer just sent (a refusal) to the reset."""
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(seconds)
        deadline = time.monotonic() + seconds
        while limit > 0 and time.monotonic() < deadline:
            chunk = conn.recv(min(limit, 16 << 10))
            if not chunk:
                return
            limit -= len(chunk)
    except OSError:
        pass


def _recv_until(conn, n: int, deadline: float) -> bytes | None:
    """``n`` bytes from ``conn`` by ``deadline`` (monotonic); None if it ends or is late."""
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(left)
        more = conn.recv(n - len(data))
        if not more:
            return None
        data += more
    return data


class DataConnection:
    """Serves one connection from its own thread: each frame is answered before the next is
    read.

    An add batch is stored inline (``BookieService.process_add_batch``: journal group commit,
    then the encoded acks are sent). No hand-off to another thread: on two cores every
    thread switch per message cost more than the message itself. (A pipelined variant was
    measured too: a responder thread per connection answering each batch when its group
    commit completed, ``Store.add_batch`` split into submit + wait, clients allowed 2-3
    unanswered messages. At half the peak 1 KiB rate, ``bench/client.py`` in three
    alternating 20 s pairs: p50 3.0-3.5 ms against 2.9-3.2, p99 11-163 ms against
    8.6-10.0. The hand-off costs more than the round trip it hides.) The client's stream is
    self-clocked -- its next batch carries everything queued while this one was stored --
    and the journal still groups the batches of all connections (clients, bookies
    re-replicating) into one fdatasync.
    """

    def __init__(self, server: DataPortServer, conn: socket.socket, rfile,
                 expires: float = math.inf) -> None:
        self.expires = expires      # the credentials' end: the connection ends with them
        self.server = server
        self.service = server.service
        self.conn = conn
        self.rfile = rfile
        self.range_buf = RangeBuffer()      # range reads' bodies, reused
        self.held: list[bytes] = []         # framed answers not sent yet (see _answer_range)
        self.held_bytes = 0

    def _send(self, kind: int, parts) -> None:
        """Send one frame within the server's ``send_timeout`` (socket.timeout, an OSError, ends the
        connection). The deadline is set around each send only: a connection waits for its
        next frame without one (an idle client keeps it), and a frame is answered before the
        next is read, so no read runs meanwhile. (SO_SNDTIMEO would not do: a TLS socket
        retries its write past it.)"""
        if self.held:
            self._flush()
        conn = self.conn
        conn.settimeout(self.server.send_timeout)
        try:
            wire.send_frame(conn, kind, parts)
        finally:
            conn.settimeout(None)

    def _hold(self, kind: int, parts) -> None:
        """Keep one answer frame to send with later ones (copied: its parts may be views of
        the range buffer, which the next chunk reuses)."""
        frame = wire.frame(kind, parts)
        self.held.append(frame)
        self.held_bytes += len(frame) + HELD_FRAME_COST

    def _flush(self) -> None:
        """Send the held frames in one write, as :meth:`_send` sends one."""
        data = b"".join(self.held)
        self.held.clear()
        self.held_bytes = 0
        conn = self.conn
        conn.settimeout(self.server.send_timeout)
        try:
            conn.sendall(data)
        finally:
            conn.settimeout(None)

    def _answer_range(self, request) -> None:
        """Send the chunks and the end frame answering one ``ReadRangeRequest``.

        A request marked ``more`` (the client sent others right behind it: a pipelined
        batch of small ranges) has its answer held, so that one write sends the answers of
        many ranges; the batch's last request, unmarked, sends them with its own. Held are
        at most :data:`HOLD_BYTES` (each frame counting :data:`HELD_FRAME_COST` more); an
        answer that would pass that sends what is held and then itself as it is read, and
        an add batch sends what is held before its answer. Order is kept: every send goes
        out after what is held. A connection that ends sends what it held first (best
        effort). (2026-11-28, a task reading 3,000 ledgers of 8 entries, E=3 Qw=2: per
        range, two sends and their four timeout switches became one send per batch, and the
        bookies' CPU fell by about a third; see bkspark/spark/README.md.)

        The cost: the answers before a slow range wait for it too. A range stalled past the
        client's ``read_range_timeout`` then fails the ranges held before it as well, and
        they are read again from other replicas, as it is.
        """
        service = self.service
        more = request.more
        hold = more or bool(self.held)
        for parts in service.read_range_chunks(request, lambda: not service._stopping,
                                               self.range_buf):
            if hold and (self.held_bytes + sum(map(len, parts)) + HELD_FRAME_COST
                         <= HOLD_BYTES):
                self._hold(wire.KIND_READ_CHUNK, parts)
            else:
                hold = False            # too large to hold: the rest is sent as it is read
                self._send(wire.KIND_READ_CHUNK, parts)     # sent: buf is free
        if not hold:
            self._send(wire.KIND_READ_END, ())
            return
        self._hold(wire.KIND_READ_END, ())
        if not more:
            self._flush()

    def run(self) -> None:
        try:
            self._serve_frames()
        finally:
            if self.held:           # the connection ends (credentials expired, the bookie
                try:                # stopping, the peer gone): what it held goes first
                    self._flush()
                except (OSError, ssl.SSLError):
                    pass

    def _serve_frames(self) -> None:
        service = self.service
        max_bytes = self.server.max_frame_bytes
        send = self._send
        while not service._stopping:
            item = wire.read_frame(self.rfile, max_bytes)
            if item is None:
                return
            kind, payload = item
            if self.expires != math.inf and time.time() > self.expires:
                log.info("data connection closed: its credentials expired")
                return
            if kind == wire.KIND_ADD_BATCH:
                traced = payload[:2] == wire.ADD_TRACE_FIELD
                received = time.perf_counter_ns() if traced else 0
                raw = service.process_add_batch(payload)
                if raw:                 # b"": every add dropped by fault injection
                    send(wire.KIND_ADD_RESPONSES, (raw, wire.add_trace_stamps(
                        received, time.perf_counter_ns())) if traced else (raw,))
            elif kind == wire.KIND_READ_RANGE:
                self._answer_range(pb.ReadRangeRequest.FromString(payload))
            else:
                raise wire.FrameError(f"unknown frame kind {kind}")

