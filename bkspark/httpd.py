"""The small HTTP endpoints of bkspark's processes (a bookie's admin endpoint, autorecovery's):
a threaded ``http.server`` whose handler answers JSON, and its thread."""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("bkspark.http")


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler with JSON answers; subclasses implement ``do_GET`` etc."""

    def log_message(self, fmt, *args):  # route through logging, quietly
        log.debug("http %s", fmt % args)

    @property
    def route(self) -> tuple[str, dict[str, str]]:
        """``(path without a trailing slash, {query parameter: last value})``."""
        parts = urlsplit(self.path)
        return parts.path.rstrip("/"), {k: v[-1] for k, v in parse_qs(parts.query).items()}

    def body_json(self) -> dict:
        """The request's JSON body ({} when empty); ValueError when it is not JSON."""
        length = int(self.headers.get("Content-Length", "0") or 0)
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


class HttpEndpoint:
    """``handler`` served on ``host:port`` (0: any free port, then :attr:`port`) by a daemon
    thread between :meth:`start` and :meth:`stop`."""

    def __init__(self, handler: type, host: str, port: int, name: str) -> None:
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=name, daemon=True)

    def start(self) -> "HttpEndpoint":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
