"""The dashboard's HTTP endpoint: the page, its data as JSON, detail pages, and actions.

Routes (GET unless said):

* ``/`` -- the overview page (``page.html``): bookies, plots of the last hour, the logs table
  (totals over every log; the busiest, largest or most lagging first, or by name; a search
  by name), ledgers by state, ledgers under-replicated, the auditor; it polls the three
  routes below every two seconds (the table at once when its order or search changes).
* ``/api/overview`` -- the latest sample (:meth:`Collector.overview`): totals over every log
  and ledger, as of the census's last complete pass.
* ``/api/logs?sort=busiest|largest|lagging|name&q=TEXT&limit=N`` -- the logs table: the first
  ``N`` (default 100, at most :data:`~bkspark.dashboard.collector.MAX_SHOWN`) logs in that
  order among those whose name holds ``TEXT`` (case-insensitive, at most
  :data:`~bkspark.dashboard.collector.MAX_QUERY` characters), from every log's census row
  (:meth:`Census.rank`), and how many match; a bad parameter is a 400.
* ``/api/series?since=T`` -- the points of every series after time ``T`` (seconds).
* ``/ledger/<id>``, ``/api/ledger/<id>`` -- one ledger: state, quorums, its ensembles (which
  bookie holds which fragment), under-replication.
* ``/log/<name>``, ``/api/log/<name>`` -- one log: size, retention, cursors, its newest
  segments.
* ``/static/plotly.min.js`` -- the charting library, from the installed ``plotly`` package
  (the page works offline).
* POST ``/api/actions/readonly`` ``{"bookie", "readOnly"}``, ``/api/actions/audit`` and
  ``/api/actions/reclaim-pending`` ``{"grace": seconds}`` (Spark write jobs abandoned that
  long: their unlisted ledgers are deleted) -- only with the token given at start
  (``Authorization: Bearer <token>``); without a token the dashboard is read-only and
  refuses them (403).

Viewers: with a token, every route needs it too -- the header above, or the viewer cookie a
browser gets by opening any page with ``?token=<token>`` once (then redirected to the page
without it, as Jupyter does). The cookie holds an HMAC of the token, not the token: it
opens the pages, never an action (actions take the header only, so a page of another site
cannot trigger one). Without a token the pages are open, and the dashboard may only listen on
loopback (:func:`bkspark.auth.guard.check_listen`). With a certificate it speaks HTTPS.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import html
import json
import os
from http.cookies import CookieError, SimpleCookie

from bkspark.errors import BKError, NoSuchLedgerError, NoSuchLogError
from bkspark.httpd import HttpEndpoint, JsonHandler

from .collector import Collector

_PAGE = os.path.join(os.path.dirname(__file__), "page.html")
#: newest segments a log's page lists
LOG_PAGE_SEGMENTS = 100
VIEWER_COOKIE = "bkspark_dashboard"


@functools.lru_cache(maxsize=1)
def plotly_js() -> bytes:
    """plotly.js as the installed ``plotly`` package ships it."""
    from plotly.offline import get_plotlyjs
    return get_plotlyjs().encode()


class Dashboard(HttpEndpoint):
    """The dashboard of ``collector`` on ``host:port`` (0: a free port, then :attr:`port`);
    ``token``: what actions must present (None: no actions)."""

    def __init__(self, collector: Collector, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, ssl_context=None):
        self.collector = collector
        self.token = token
        self._viewer = None if not token else hmac.new(
            token.encode(), b"bkspark dashboard viewer", hashlib.sha256).hexdigest()
        super().__init__(_handler_for(self), host, port, "bkspark-dashboard", None, ssl_context)

    @property
    def url(self) -> str:
        host = self._httpd.server_address[0]
        return (f"{self.scheme}://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:"
                f"{self.port}/")

    # ---- who may look ----------------------------------------------------------------------------
    def may_view(self, headers) -> bool:
        """Whether a request may see the pages: no token set, or the token's header, or the
        viewer cookie (compared in constant time)."""
        if not self.token or self.authorized(headers.get("Authorization")):
            return True
        try:
            morsel = SimpleCookie(headers.get("Cookie") or "").get(VIEWER_COOKIE)
        except CookieError:
            return False
        return morsel is not None and hmac.compare_digest(morsel.value.encode(),
                                                          self._viewer.encode())

    def viewer_cookie(self) -> str:
        """The ``Set-Cookie`` value given for a right ``?token=``."""
        return (f"{VIEWER_COOKIE}={self._viewer}; Path=/; HttpOnly; SameSite=Strict"
                + ("; Secure" if self.scheme == "https" else ""))

    # ---- data of the detail pages ------------------------------------------------------------
    def ledger(self, ledger_id: int) -> dict:
        from bkspark.recovery.urm import UnderReplicationManager
        from metadata import ledgers as ledger_store
        md, version = ledger_store.read_ledger(self.collector.store, ledger_id)
        doc = md.to_public_dict()
        doc["version"] = version
        ends = [first for first, _ in md.ensembles[1:]] + [None]
        doc["fragments"] = [{"first": first, "last": None if end is None else end - 1,
                             "bookies": list(bookies)}
                            for (first, bookies), end in zip(md.ensembles, ends)]
        got = UnderReplicationManager(self.collector.store).get(ledger_id)
        doc["under_replicated"] = None if got is None else got[0]
        return doc

    def log(self, name: str) -> dict:
        from bkspark.log import LogStore
        if self.collector.bk is None:
            raise NoSuchLogError("this dashboard reads no logs (no client)")
        logs = LogStore(self.collector.bk)
        first, nxt = logs.bounds(name)
        doc = {"log": name, **logs.stats(name),
               "cursors": {c: {"position": list(p), "lag": lag}
                           for c, (p, lag) in logs.cursor_lags(name).items()}}
        doc["segments_shown"] = [e.to_dict() | {"seq": e.seq}
                                 for e in logs.segments(name, max(first, nxt - LOG_PAGE_SEGMENTS), nxt)]
        return doc

    # ---- actions -----------------------------------------------------------------------------
    def authorized(self, header: str | None) -> bool:
        if not self.token:
            return False
        scheme, _, given = (header or "").partition(" ")
        return scheme == "Bearer" and hmac.compare_digest(given.strip().encode(),
                                                          self.token.encode())

    def set_read_only(self, bookie: str, read_only: bool) -> dict:
        doc = next((b for b in self.collector.overview()["bookies"] if b["bookie_id"] == bookie), None)
        if doc is None or doc.get("http_port") in (None, -1):
            raise NoSuchBookie(f"no bookie {bookie!r} with an admin endpoint is known")
        host = doc.get("address", bookie).rsplit(":", 1)[0]
        creds = self.collector.credentials
        status, answer = creds.http_json(
            creds.url(host, doc["http_port"], "/api/v1/bookie/state/readonly",
                      doc.get("tls", False)), "PUT",
            {"readOnly": read_only})
        if status != 200:
            raise OSError(f"bookie {bookie} answered {status}: {answer}")
        return answer

    def reclaim_pending(self, grace: float) -> list[dict]:
        """Reclaim Spark write jobs abandoned for ``grace`` seconds: their ledgers that no
        log lists are deleted (:func:`bkspark.spark.pending.reclaim`)."""
        from bkspark.log import LogStore
        from bkspark.spark import pending
        if self.collector.bk is None:
            raise ValueError("this dashboard has no client")
        return [j.to_dict() for j in pending.reclaim(LogStore(self.collector.bk), grace=grace)]

    def trigger_audit(self) -> dict:
        from bkspark.recovery.urm import UnderReplicationManager
        urm = UnderReplicationManager(self.collector.store, "dashboard")
        return {"requested": urm.request_audit(by="dashboard"), "auditor": urm.auditor()}


def logs_table(collector: Collector, query: dict) -> dict:
    """The answer of ``/api/logs`` (module docstring) for the request's ``query`` parameters.
    :raises ValueError: a bad ``sort``, ``q`` or ``limit`` (the handler answers 400)."""
    from .collector import OVERVIEW_LOGS
    limit = query.get("limit", str(OVERVIEW_LOGS))
    if not limit.isdigit() or len(limit) > 6:
        raise ValueError("limit is a number")
    table = collector.census.rank(query.get("sort", "busiest"), query.get("q", ""), int(limit))
    view = collector.census.view()
    table.update(log_totals=view["log_totals"], census=view["census"])
    return table


class NoSuchBookie(LookupError):
    pass


def pending_grace() -> float:
    from bkspark.spark.pending import DEFAULT_GRACE_S
    return DEFAULT_GRACE_S


def _handler_for(dash: Dashboard):
    class Handler(JsonHandler):
        def _viewer_admitted(self, path: str, query: dict) -> bool:
            """Let a viewer in, or answer: a right ``?token=`` gets the cookie and the page
            without the token in its address; anything else without the token, 401."""
            given = query.get("token")
            if given is not None and dash.authorized(f"Bearer {given}"):
                self.send_response(303)
                # the page, on this site: never "//host" nor "/\\host" (another site)
                self.send_header("Location", "/" + path.lstrip("/\\"))
                self.send_header("Set-Cookie", dash.viewer_cookie())
                self.send_header("Content-Length", "0")
                self.end_headers()
                return False
            if dash.may_view(self.headers):
                return True
            self.json(401, {"error": "this dashboard needs its token: open it once as "
                                     "<url>?token=<the token of `bkspark dashboard "
                                     "--token-file`>, or send Authorization: Bearer <token>"})
            self.close_connection = True
            return False

        def do_GET(self):  # noqa: N802 - http.server API
            path, query = self.route
            if not self._viewer_admitted(path, query):
                return
            try:
                if path in ("", "/index.html"):
                    with open(_PAGE, "rb") as f:
                        self.send(200, f.read(), "text/html; charset=utf-8")
                elif path == "/static/plotly.min.js":
                    self.send(200, plotly_js(), "application/javascript")
                elif path == "/api/overview":
                    overview = dash.collector.overview()
                    overview["actions"] = bool(dash.token)
                    self.json(200, overview)
                elif path == "/api/logs":
                    self.json(200, logs_table(dash.collector, query))
                elif path == "/api/series":
                    self.json(200, dash.collector.history.since(float(query.get("since", 0))))
                elif path.startswith("/api/ledger/"):
                    self.json(200, dash.ledger(int(path.rsplit("/", 1)[1])))
                elif path.startswith("/api/log/"):
                    self.json(200, dash.log(path.split("/", 3)[3]))
                elif path.startswith("/ledger/"):
                    self.send(200, _ledger_page(dash.ledger(int(path.rsplit("/", 1)[1]))),
                              "text/html; charset=utf-8")
                elif path.startswith("/log/"):
                    self.send(200, _log_page(dash.log(path.split("/", 2)[2])),
                              "text/html; charset=utf-8")
                else:
                    self.not_found(path)
            except (NoSuchLedgerError, NoSuchLogError) as exc:
                self.json(404, {"error": str(exc)})
            except ValueError as exc:
                self.json(400, {"error": f"bad request: {exc}"})
            except BKError as exc:
                self.json(503, {"error": str(exc)})

        def do_POST(self):  # noqa: N802
            path, _ = self.route
            if not dash.authorized(self.headers.get("Authorization")):
                self.json(403, {"error": "actions need the token given to `bkspark dashboard "
                                         "--token-file` (this dashboard is read-only without "
                                         "one)"})
                return
            try:
                body = self.body_json()
                if path == "/api/actions/readonly":
                    value = body.get("readOnly")
                    if not isinstance(value, bool) or not isinstance(body.get("bookie"), str):
                        raise ValueError("give {\"bookie\": id, \"readOnly\": true|false}")
                    self.json(200, dash.set_read_only(body["bookie"], value))
                elif path == "/api/actions/audit":
                    self.json(200, dash.trigger_audit())
                elif path == "/api/actions/reclaim-pending":
                    grace = body.get("grace", pending_grace())
                    if not isinstance(grace, (int, float)) or grace < 0:
                        raise ValueError("give {\"grace\": seconds >= 0}")
                    self.json(200, {"jobs": dash.reclaim_pending(float(grace))})
                else:
                    self.not_found(path)
            except NoSuchBookie as exc:
                self.json(404, {"error": str(exc)})
            except ValueError as exc:
                self.json(400, {"error": f"bad request: {exc}"})
            except (BKError, OSError) as exc:
                self.json(503, {"error": str(exc)})

    return Handler


# ---- detail pages (server-rendered: tables, no script) -----------------------------------------

_STYLE = ("<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}</style>")


def _table(header, rows) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(title: str, body: str) -> bytes:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"{_STYLE}</head><body><p><a href='/'>overview</a></p><h1>{html.escape(title)}</h1>"
            f"{body}</body></html>").encode()


def _ledger_page(doc: dict) -> bytes:
    e = html.escape
    facts = _table(["state", "E / Qw / Qa", "last entry", "length", "digest"],
                   [(e(doc["state"]), f"{doc['ensemble_size']} / {doc['write_quorum']} / {doc['ack_quorum']}",
                     doc["last_entry_id"], doc["length"], e(str(doc["digest_type"])))])
    frags = _table(["entries", "bookies (ensemble order)"],
                   [(f"{f['first']} .. {'' if f['last'] is None else f['last']}",
                     ", ".join(e(b) for b in f["bookies"])) for f in doc["fragments"]])
    ur = doc["under_replicated"]
    under = "<p>fully replicated (no under-replication record)</p>" if ur is None else \
        f"<p class='under'>under-replicated: missing {e(', '.join(ur.get('missing', [])))}</p>"
    return _page(f"ledger {doc['ledger_id']}", facts + "<h2>fragments</h2>" + frags + under)


def _log_page(doc: dict) -> bytes:
    e = html.escape
    offload = "" if doc.get("offload") is None else (
        f"to {e(str(doc['offload'].get('location')))}: {doc['offloaded_entries']} entries, "
        f"{doc['offloaded_bytes']} bytes; {doc['offload_lag']} entries not yet" +
        (f"; {doc['dropped_entries']} entries, {doc['dropped_bytes']} bytes only there (the "
         "bookies' copy dropped)" if doc.get("dropped_entries") else ""))
    facts = _table(["segments", "entries", "bytes", "offsets", "retention", "offload"],
                   [(doc["segments"], doc["entries"], doc["bytes"],
                     f"{doc['first_offset']} .. {doc['end_offset']}", e(json.dumps(doc["retention"])),
                     offload)])
    cursors = _table(["cursor", "position", "lag"],
                     [(e(c), e(str(v["position"])), v["lag"]) for c, v in doc["cursors"].items()])
    segs = _table(["seq", "ledger", "state", "entries", "bytes", "offset"],
                  [(s["seq"], f"<a href='/ledger/{s['ledger_id']}'>{s['ledger_id']}</a>",
                    e(str(s.get("state", ""))),
                    "" if s.get("last_entry_id") is None else s["last_entry_id"] + 1,
                    s.get("length", ""), s.get("offset", ""))
                   for s in reversed(doc["segments_shown"])])
    return _page(f"log {doc['log']}", facts + "<h2>cursors</h2>" + cursors
                 + f"<h2>newest {len(doc['segments_shown'])} segments</h2>" + segs)
