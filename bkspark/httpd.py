"""The small HTTP endpoints of bkspark's processes (a bookie's admin endpoint, autorecovery's):
a threaded ``http.server`` whose handler answers JSON, and its thread."""
from __future__ import annotations

import json
import logging
import re
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("bkspark.http")

MAX_CONNECTIONS = 64            # connections served at once (a thread each); more are closed
MAX_PER_PEER = 16               # of which one address may hold at most this many
HANDSHAKE_TIMEOUT_S = 5.0       # a TLS handshake must finish within this
MAX_BODY_BYTES = 1 << 20        # a request body beyond this is refused (400)
_SECRET_PARAM = re.compile(r"(token=)[^&\s\"]*")


class _BoundedServer(ThreadingHTTPServer):
    """A threaded HTTP server whose peers can hold at most :data:`MAX_CONNECTIONS` threads,
    :data:`MAX_PER_PEER` of them from one address (each connection also times out after
    ``JsonHandler.timeout`` idle seconds, its TLS handshake after
    :data:`HANDSHAKE_TIMEOUT_S`)."""

    daemon_threads = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._held = 0
        self._per_peer: dict[str, int] = {}

    def process_request(self, request, client_address):
        peer = client_address[0]
        with self._lock:
            if self._held >= MAX_CONNECTIONS or self._per_peer.get(peer, 0) >= MAX_PER_PEER:
                admitted = False
            else:
                admitted = True
                self._held += 1
                self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        if not admitted:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(peer)
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(client_address[0])

    def _release(self, peer: str) -> None:
        with self._lock:
            self._held -= 1
            left = self._per_peer.pop(peer) - 1
            if left:
                self._per_peer[peer] = left


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler with JSON answers; subclasses implement ``do_GET`` etc.

    Every request is admitted by the endpoint's :class:`~bkspark.auth.guard.Guard` (its
    token and the route's role in :data:`bkspark.auth.roles.HTTP_ROUTES`) before a ``do_*``
    method sees it; a refused one is answered 401/403 there."""

    guard = None        # set by HttpEndpoint
    timeout = 30        # seconds a connection may sit between requests (or in its handshake)

    def setup(self) -> None:
        super().setup()
        if isinstance(self.request, ssl.SSLSocket):
            # here, in the connection's thread, not in accept; within its own deadline
            self.request.settimeout(HANDSHAKE_TIMEOUT_S)
            self.request.do_handshake()
            self.request.settimeout(self.timeout)

    @property
    def peer_certificate(self) -> bytes | None:
        """The client certificate of an HTTPS connection, verified (None: none, or HTTP)."""
        if isinstance(self.request, ssl.SSLSocket):
            return self.request.getpeercert(binary_form=True)
        return None

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        return self.guard is None or self.guard.admit_http(self) is not None

    def log_message(self, fmt, *args):  # route through logging, quietly; no token shown
        log.debug("http %s", _SECRET_PARAM.sub(r"\1<hidden>", fmt % args))

    @property
    def route(self) -> tuple[str, dict[str, str]]:
        """``(path without a trailing slash, {query parameter: last value})``."""
        parts = urlsplit(self.path)
        return parts.path.rstrip("/"), {k: v[-1] for k, v in parse_qs(parts.query).items()}

    def body_json(self) -> dict:
        """The request's JSON body ({} when empty); ValueError when it is not JSON."""
        length = int(self.headers.get("Content-Length", "0") or 0)
        if not 0 <= length <= MAX_BODY_BYTES:
            raise ValueError(f"a body of {length} bytes (at most {MAX_BODY_BYTES})")
        doc = json.loads(self.rfile.read(length) or b"{}")
        if not isinstance(doc, dict):
            raise ValueError("the body must be a JSON object")
        return doc

    def send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def json(self, code: int, obj) -> None:
        self.send(code, json.dumps(obj).encode())

    def not_found(self, path: str) -> None:
        self.json(404, {"error": f"no such endpoint {path}"})


def _quiet_error(request, client_address) -> None:
    import sys
    log.debug("http connection from %s ended: %r", client_address, sys.exc_info()[1])


class HttpEndpoint:
    """``handler`` served on ``host:port`` (0: any free port, then :attr:`port`) by a daemon
    thread between :meth:`start` and :meth:`stop`; ``guard`` admits each request; with an
    ``ssl_context``, over HTTPS (the guard then also sees client certificates)."""

    def __init__(self, handler: type, host: str, port: int, name: str, guard,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        handler = type(handler.__name__, (handler,), {"guard": guard})
        self._httpd = _BoundedServer((host, port), handler)
        self._httpd.handle_error = _quiet_error     # a peer's bad handshake is no traceback
        if ssl_context is not None:     # HTTPS; each connection's handshake in its thread
            self._httpd.socket = ssl_context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self._httpd.server_address[1]
        self.scheme = "http" if ssl_context is None else "https"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=name, daemon=True)

    def start(self) -> "HttpEndpoint":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
