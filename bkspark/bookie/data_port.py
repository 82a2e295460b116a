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
import socket
import ssl
import threading

from bkspark.auth import roles
from bkspark.errors import UnauthorizedError
from bkspark.proto import wire
from bkspark.proto import bookie_pb2 as pb

log = logging.getLogger("bkspark.bookie.data_port")

MAX_CONNECTIONS = 1024      # beyond this, new connections are closed at once (a thread each)


class DataPortServer:
    """Accepts data-port connections for one :class:`~bkspark.bookie.service.BookieService`."""

    def __init__(self, service, host: str, port: int, *, max_frame_bytes: int, guard,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.service = service
        self.guard = guard
        self.max_frame_bytes = max_frame_bytes
        self.ssl_context = ssl_context
        self._listener = socket.create_server((host, port), backlog=128)
        self.port = self._listener.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name="bookie-data-accept")

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
                conn, _addr = self._listener.accept()
            except OSError:
                if self._stopped:
                    return
                continue
            if len(self._conns) >= MAX_CONNECTIONS:
                log.warning("data port: %d connections open; refusing another", len(self._conns))
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="bookie-data-conn").start()

    # ---- one connection ----------------------------------------------------------------

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            if self._stopped:
                conn.close()
                return
            self._conns.add(conn)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(30.0)                       # the hello, and the TLS handshake
            if self.ssl_context is not None:
                conn = self.ssl_context.wrap_socket(conn, server_side=True)
            rfile = conn.makefile("rb", buffering=256 << 10)
            if rfile.read(len(wire.DATA_MAGIC)) != wire.DATA_MAGIC:
                return
            item = wire.read_frame(rfile, wire.MAX_HELLO_BYTES)
            if item is None or item[0] != wire.KIND_HELLO:
                return
            if not self._admit(conn, item[1]):
                return
            conn.settimeout(None)
            conn.sendall(wire.DATA_MAGIC)
            _Connection(self, conn, rfile).run()
        except (OSError, ssl.SSLError, wire.FrameError) as exc:
            log.debug("data connection ended: %s", exc)
        except Exception as exc:  # noqa: BLE001 - a message that does not parse, or a bug
            log.warning("data connection closed: %r", exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass


    def _admit(self, conn, token: bytes) -> bool:
        """Whether the hello's credentials admit this connection; a refusal is answered."""
        cert = conn.getpeercert(binary_form=True) if isinstance(conn, ssl.SSLSocket) else None
        try:
            peer = conn.getpeername()[0]
        except OSError:
            peer = "?"
        try:
            self.guard.admit(roles.DATA_PORT, peer, token=token.decode(errors="replace"),
                             cert=cert)
            return True
        except UnauthorizedError as exc:
            conn.sendall(wire.refusal(str(exc)))
            return False


class _Connection:
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

    def __init__(self, server: DataPortServer, conn: socket.socket, rfile) -> None:
        self.server = server
        self.service = server.service
        self.conn = conn
        self.rfile = rfile
        self.range_buf: bytearray | None = None     # range reads' bodies, reused

    def run(self) -> None:
        service = self.service
        max_bytes = self.server.max_frame_bytes
        sendall, frame, send_frame = self.conn.sendall, wire.frame, wire.send_frame
        while not service._stopping:
            item = wire.read_frame(self.rfile, max_bytes)
            if item is None:
                return
            kind, payload = item
            if kind == wire.KIND_ADD_BATCH:
                raw = service.process_add_batch(payload)
                if raw:                 # b"": every add dropped by fault injection
                    sendall(frame(wire.KIND_ADD_RESPONSES, (raw,)))
            elif kind == wire.KIND_READ_RANGE:
                request = pb.ReadRangeRequest.FromString(payload)
                buf = self.range_buf = service.range_buffer(self.range_buf, request)
                for parts in service.read_range_chunks(request, lambda: not service._stopping,
                                                       buf):
                    send_frame(self.conn, wire.KIND_READ_CHUNK, parts)   # sent: buf is free
                sendall(frame(wire.KIND_READ_END, ()))
            else:
                raise wire.FrameError(f"unknown frame kind {kind}")

