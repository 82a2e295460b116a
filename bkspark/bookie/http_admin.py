"""The bookie's HTTP admin endpoint (BookKeeper's paths).

GET  /heartbeat                   -> "OK"
GET  /metrics                     -> Prometheus text format (with the in-process
                                     autorecovery's, when the bookie runs one)
GET  /api/v1/bookie/info          -> {"freeSpace", "totalSpace", "bookieId"}
GET  /api/v1/bookie/state         -> {"running", "readOnly", "diskReadOnly", "manualReadOnly",
                                      "registeredAs": null | "available" | "readonly"}
PUT  /api/v1/bookie/state/readonly  body {"readOnly": true|false} -> switch manual read-only
POST /api/v1/bookie/gc            -> run a garbage collection pass now
     /api/v1/autorecovery/...     -> the cluster's autorecovery (:mod:`bkspark.recovery.http`)
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bkspark.httpd import HttpEndpoint, JsonHandler


class AdminHttpServer(HttpEndpoint):
    """The routes above; each needs the role :data:`bkspark.auth.roles.HTTP_ROUTES` gives it,
    checked by the bookie's ``guard`` (its tokens, or client certificates; ``/heartbeat`` is
    open). A bookie with a certificate serves it over HTTPS."""

    def __init__(self, bookie, host: str, port: int, guard, ssl_context=None) -> None:
        super().__init__(_handler_for(bookie), host, port, "bookie-http", guard, ssl_context)


def _autorecovery(handler, bookie, method: str) -> bool:
    """Answer an /api/v1/autorecovery route through the bookie's metadata store."""
    from bkspark.recovery import http as ar_http
    path, _ = handler.route
    if not path.startswith(ar_http.PREFIX):
        return False
    ar_http.answer(handler, method, bookie.store, bookie.autorecovery)
    return True


def _handler_for(bookie):
    class Handler(JsonHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            path, _ = self.route
            state = bookie.state
            if path == "/heartbeat":
                self.send(200, b"OK\n", "text/plain")
            elif path == "/metrics":
                text = generate_latest(bookie.metrics.registry)
                if bookie.autorecovery is not None:
                    text += generate_latest(bookie.autorecovery.metrics)
                self.send(200, text, CONTENT_TYPE_LATEST)
            elif path == "/api/v1/bookie/info":
                total, free = state.disk_space()
                self.json(200, {"bookieId": state.bookie_id, "freeSpace": free, "totalSpace": total})
            elif path == "/api/v1/bookie/state":
                self.json(200, {"running": state.running, "readOnly": state.read_only,
                                "diskReadOnly": state.disk_read_only,
                                "manualReadOnly": state.manual_read_only,
                                "diskErrors": [{"kind": e.kind, "dir": e.path,
                                                "error": e.message, "full": e.full}
                                               for e in state.disk_errors],
                                "registeredAs": state.registered_as})
            elif not _autorecovery(self, bookie, "GET"):
                self.not_found(path)

        def do_PUT(self):  # noqa: N802
            path, _ = self.route
            if _autorecovery(self, bookie, "PUT"):
                return
            if path != "/api/v1/bookie/state/readonly":
                self.not_found(path)
                return
            try:
                value = self.body_json()["readOnly"]
                if not isinstance(value, bool):
                    raise ValueError("readOnly must be true or false")
            except (ValueError, KeyError, TypeError) as exc:
                self.json(400, {"error": f"bad request: {exc}"})
                return
            bookie.set_manual_read_only(value)
            self.json(200, {"readOnly": bookie.state.read_only})

        def do_POST(self):  # noqa: N802
            path, _ = self.route
            if _autorecovery(self, bookie, "POST"):
                return
            if path != "/api/v1/bookie/gc":
                self.not_found(path)
                return
            deleted = bookie.garbage_collect()
            self.json(200, {"deletedLedgers": deleted})

    return Handler
