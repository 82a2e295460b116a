"""`bkspark dashboard`: serve the cluster dashboard (:mod:`bkspark.dashboard`)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from bkspark.cli import client_args
from bkspark.errors import BadRequestError, BKError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata", default=None,
                        help="metadata URI (default: $BKSPARK_METADATA_URI, else the running local cluster)")
    parser.add_argument("--port", type=int, default=8089, help="HTTP port (default 8089; 0: any free port)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to serve on (default 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="a file holding the token that viewers need (a browser opens "
                             "the dashboard once with ?token=<it>) and that enables actions "
                             "(set a bookie read-only, trigger an audit); or "
                             f"${TOKEN_ENV}. Without one the pages are open and the "
                             "dashboard read-only. (Never on the command line: every local "
                             "user sees it in `ps`.)")
    parser.add_argument("--token", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--https-cert-file", default="", metavar="PEM",
                        help="serve HTTPS with this certificate (and --https-key-file)")
    parser.add_argument("--https-key-file", default="", metavar="PEM")
    parser.add_argument("--allow-insecure-network", action="store_true",
                        help="serve --host beyond loopback without a token or without HTTPS "
                             "(it shows the cluster to whoever reaches it)")
    parser.add_argument("--interval", type=float, default=2.0,
                        help="seconds between samples of the bookies (default 2)")
    parser.add_argument("--history", type=float, default=3600.0,
                        help="seconds of history the plots keep (default 3600)")
    parser.add_argument("--log-level", default="INFO")
    client_args.add_arguments(parser)


TOKEN_ENV = "BKSPARK_DASHBOARD_TOKEN"


def action_token(args) -> str | None:
    """The actions' token: ``--token-file``'s content, else ``$BKSPARK_DASHBOARD_TOKEN``;
    BadRequestError for ``--token`` (argv is public) or an unreadable file."""
    import os
    from bkspark.auth.tokens import read_token_file
    if args.token is not None:
        raise BadRequestError("--token would show the token to every local user (`ps`): put it "
                              f"in a file for --token-file, or in ${TOKEN_ENV}")
    if args.token_file:
        return read_token_file(args.token_file)
    return os.environ.get(TOKEN_ENV) or None


def start(uri: str, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
          interval: float = 2.0, history: float = 3600.0, slow_interval: float = 10.0,
          client_settings: dict | None = None, allow_insecure_network: bool = False,
          https_cert_file: str = "", https_key_file: str = ""):
    """A running dashboard of the cluster at ``uri`` (its collector, a client for logs and
    the HTTP endpoint); ``stop_dashboard`` of the result ends all three. ``slow_interval``:
    seconds between samples of logs and under-replication. ``token``: what viewers and
    actions need (None: open pages, no actions). ``https_*``: serve HTTPS. Beyond loopback
    it needs both, or ``allow_insecure_network``."""
    from bkspark.client import BookKeeper
    from bkspark.dashboard import Collector, Dashboard
    if interval <= 0 or history < interval:
        raise BadRequestError(f"--interval {interval:g} / --history {history:g}: give an interval "
                              "> 0 and a history at least that long")
    from bkspark.auth.certs import server_tls_context
    from bkspark.auth.guard import check_listen
    if bool(https_cert_file) != bool(https_key_file):
        raise BadRequestError("dashboard: give both --https-cert-file and --https-key-file, "
                              "or neither")
    tls = server_tls_context(https_cert_file, https_key_file) if https_cert_file else None
    check_listen("the dashboard", host, authenticated=bool(token), tls=tls is not None,
                 allow_insecure_network=allow_insecure_network,
                 authenticate=f"--token-file (or ${TOKEN_ENV})",
                 encrypt="--https-cert-file and --https-key-file")
    bk = BookKeeper(uri, role="admin",      # a local cluster's admin: scrapes and actions
                    **{"add_timeout": 10.0, "read_timeout": 10.0, **(client_settings or {})})
    collector = Collector(bk.store, bk, interval=interval, slow_interval=slow_interval,
                          history_s=history).start()
    try:
        dash = Dashboard(collector, host, port, token, tls).start()
    except OSError as exc:
        collector.stop()
        bk.close()
        raise BadRequestError(f"dashboard: cannot serve on {host}:{port}: {exc} (choose "
                              "another --port)") from None
    return dash


def stop_dashboard(dash) -> None:
    dash.stop()
    dash.collector.stop()
    dash.collector.bk.close()


def run(args: argparse.Namespace) -> int:
    from bkspark.logging_setup import setup_logging
    uri = client_args.metadata_uri("dashboard", args.metadata)
    if not uri:
        return 2
    setup_logging(args.log_level, "text")
    try:
        token = action_token(args)
        dash = start(uri, host=args.host, port=args.port, token=token,
                     interval=args.interval, history=args.history,
                     client_settings=client_args.client_settings(args),
                     allow_insecure_network=args.allow_insecure_network,
                     https_cert_file=args.https_cert_file, https_key_file=args.https_key_file)
    except BKError as exc:
        print(f"bkspark dashboard: {exc}", file=sys.stderr)
        return 2
    print(f"bkspark dashboard of {uri}: {dash.url}"
          + (" (open it once as <that URL>?token=<the token>; actions with the token)"
             if token else " (open to local users, read-only)"), flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    stop_dashboard(dash)
    return 0
