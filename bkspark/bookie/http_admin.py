"""The bookie's HTTP admin endpoint (BookKeeper's paths).

GET  /heartbeat                   -> "OK"
GET  /metrics                     -> Prometheus text format
GET  /api/v1/bookie/info          -> {"freeSpace", "totalSpace", "bookieId"}
GET  /api/v1/bookie/state         -> {"running", "readOnly", "diskReadOnly", "manualReadOnly",
                                      "registeredAs": null | "available" | "readonly"}
PUT  /api/v1/bookie/state/readonly  body {"readOnly": true|false} -> switch manual read-only
POST /api/v1/bookie/gc            -> run a garbage collection pass now
"""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("bkspark.bookie.http")


class AdminHttpServer:
    def __init__(self, bookie, host: str, port: int) -> None:
        handler = _handler_for(bookie)
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="bookie-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler_for(bookie):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # route through logging, quietly
            log.debug("http %s", fmt % args)

        def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj) -> None:
            self._send(code, json.dumps(obj).encode())

        def do_GET(self):  # noqa: N802 - http.server API
            path = self.path.split("?")[0].rstrip("/")
            state = bookie.state
            if path == "/heartbeat":
                self._send(200, b"OK\n", "text/plain")
            elif path == "/metrics":
                self._send(200, generate_latest(bookie.metrics.registry), CONTENT_TYPE_LATEST)
            elif path == "/api/v1/bookie/info":
                total, free = state.disk_space()
                self._json(200, {"bookieId": state.bookie_id, "freeSpace": free, "totalSpace": total})
            elif path == "/api/v1/bookie/state":
                self._json(200, {"running": state.running, "readOnly": state.read_only,
                                 "diskReadOnly": state.disk_read_only,
                                 "manualReadOnly": state.manual_read_only,
                                 "registeredAs": state.registered_as})
            else:
                self._json(404, {"error": f"no such endpoint {path}"})

        def do_PUT(self):  # noqa: N802
            path = self.path.split("?")[0].rstrip("/")
            if path != "/api/v1/bookie/state/readonly":
                self._json(404, {"error": f"no such endpoint {path}"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                value = body["readOnly"]
                if not isinstance(value, bool):
                    raise ValueError("readOnly must be true or false")
            except (ValueError, KeyError, TypeError) as exc:
                self._json(400, {"error": f"bad request: {exc}"})
                return
            bookie.set_manual_read_only(value)
            self._json(200, {"readOnly": bookie.state.read_only})

        def do_POST(self):  # noqa: N802
            path = self.path.split("?")[0].rstrip("/")
            if path != "/api/v1/bookie/gc":
                self._json(404, {"error": f"no such endpoint {path}"})
                return
            deleted = bookie.garbage_collect()
            self._json(200, {"deletedLedgers": deleted})

    return Handler
