"""`bkspark localcluster`: embedded metadata store + N bookies on loopback until Ctrl-C.

``--background`` starts the same cluster in a process of its own (output in
``<data dir>/localcluster.log``) and returns once it is running; ``--stop`` stops the cluster
running on a data directory (SIGTERM to the process holding the directory's lock, as Ctrl-C).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from bkspark import private
from bkspark.errors import BKError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bookies", type=int, default=3, help="number of bookies (default 3)")
    parser.add_argument("--metadata", default=None,
                        help="metadata URI (default: the one this data dir's cluster used last, "
                             "else an embedded sqlite store in the data dir)")
    parser.add_argument("--data-dir", default="./bkspark-data",
                        help="where the cluster keeps its data; starting again on the same "
                             "directory restarts the same bookies (same ids and ports)")
    parser.add_argument("--retention-interval", type=float, default=60.0,
                        help="seconds between passes applying the logs' retention policies "
                             "(default 60; 0 = none here, e.g. when `bkspark autorecovery` "
                             "runs against this cluster)")
    parser.add_argument("--dashboard-port", type=int, default=0,
                        help="serve the cluster dashboard (read-only) on this port (default 0: "
                             "any free port, printed; -1: none)")
    parser.add_argument("--bookie-arg", action="append", default=[],
                        help="extra flag passed to every bookie, e.g. --bookie-arg=--write-cache-mb=32")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--background", action="store_true",
                      help="run in the background; return once the cluster is up (output in "
                           "DATA_DIR/localcluster.log; stop it with --stop)")
    mode.add_argument("--stop", action="store_true",
                      help="stop the local cluster running on --data-dir")


def _background(args: argparse.Namespace) -> int:
    """Start the cluster in a detached process; return once it runs (or failed to start)."""
    from bkspark.cluster_registry import ClusterDir
    records = ClusterDir(args.data_dir)
    private.make_dir(records.data_dir)
    if records.running():
        print(f"bkspark localcluster: a local cluster already runs on {records.data_dir} "
              f"(pid {records.record().get('pid', '?')}); stop it with --stop", file=sys.stderr)
        return 1
    log_path = os.path.join(records.data_dir, "localcluster.log")

    def output() -> str:
        with open(log_path, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    with open(log_path, "ab") as log:
        start = log.tell()
        proc = subprocess.Popen([sys.executable, "-m", "bkspark.cli.main", *_argv(args)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    while proc.poll() is None and "press Ctrl-C" not in output():
        time.sleep(0.2)
    if proc.poll() is not None:
        print(output()[-4000:], file=sys.stderr, end="")
        print(f"bkspark localcluster: the cluster did not start (exit {proc.returncode}); "
              f"its output is in {log_path}", file=sys.stderr)
        return 1
    print(output().replace("press Ctrl-C to stop", "").rstrip())
    print(f"running in the background (pid {proc.pid}, output in {log_path}); stop it with: "
          f"bkspark localcluster --stop --data-dir {args.data_dir}")
    return 0


def _argv(args: argparse.Namespace) -> list[str]:
    argv = ["localcluster", "--bookies", str(args.bookies), "--data-dir", args.data_dir]
    if args.metadata:
        argv += ["--metadata", args.metadata]
    argv += ["--retention-interval", str(args.retention_interval),
             "--dashboard-port", str(args.dashboard_port)]
    return argv + [f"--bookie-arg={a}" for a in args.bookie_arg]


def _stop(args: argparse.Namespace, timeout: float = 120.0) -> int:
    from bkspark.cluster_registry import ClusterDir
    records = ClusterDir(args.data_dir)
    pid = records.record().get("pid")
    if not records.running() or not pid:
        print(f"bkspark localcluster: no local cluster runs on {records.data_dir}", file=sys.stderr)
        return 1
    os.kill(int(pid), signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while records.running() and time.monotonic() < deadline:
        time.sleep(0.2)
    if records.running():
        print(f"bkspark localcluster: the cluster on {records.data_dir} (pid {pid}) did not stop "
              f"within {timeout:g}s", file=sys.stderr)
        return 1
    print(f"stopped the local cluster on {records.data_dir}")
    return 0


def _start_dashboard(cluster, port: int):
    """The cluster's read-only dashboard on ``port`` (its URL printed), or None (``-1``, or
    it could not start: said, and the cluster runs on)."""
    if port < 0:
        return None
    from bkspark.cli.dashboard_cmd import start
    try:
        dash = start(cluster.metadata_uri, port=port)
    except BKError as exc:
        print(f"  dashboard not started: {exc}", file=sys.stderr)
        return None
    print(f"  dashboard {dash.url}")
    return dash


def run(args: argparse.Namespace) -> int:
    from bkspark.localcluster import LocalCluster

    if args.bookies < 1:
        print("bkspark localcluster: --bookies must be at least 1", file=sys.stderr)
        return 2
    if args.retention_interval < 0:
        print("bkspark localcluster: --retention-interval must be >= 0 seconds (0: no "
              "retention service)", file=sys.stderr)
        return 2
    if args.stop:
        return _stop(args)
    if args.background:
        return _background(args)
    cluster = LocalCluster(args.metadata, args.bookies, args.data_dir, args.bookie_arg, publish=True,
                           retention_interval=args.retention_interval)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        cluster.start_all()
    except BKError as exc:
        cluster.stop_all()
        print(f"bkspark localcluster: {exc}", file=sys.stderr)
        return 1
    print(f"local cluster running: {len(cluster.bookies)} bookies (data in {cluster.data_dir})")
    print(f"  metadata service URI: {cluster.metadata_uri}")
    for bookie in cluster.bookies:
        print(f"  bookie {bookie.bookie_id}  admin http://127.0.0.1:{bookie.http_port}/  log {bookie.log_path}")
    dashboard = _start_dashboard(cluster, args.dashboard_port)
    print(f"connect with:  BookKeeper({cluster.metadata_uri!r})   or   "
          f"export BKSPARK_METADATA_URI={cluster.metadata_uri}")
    if cluster.default_elsewhere is None:
        print("clients and Spark without a URI (and without BKSPARK_METADATA_URI) find this cluster")
    else:
        print(f"note: the local cluster in {cluster.default_elsewhere.data_dir} is running and stays "
              "the default for clients without a URI; reach this one with the URI above")
    print("press Ctrl-C to stop", flush=True)
    try:
        while not stop.wait(1.0):
            for bookie in cluster.bookies:
                if not bookie.alive:
                    print(f"bookie {bookie.bookie_id} exited ({bookie.proc.returncode}); see {bookie.log_path}",
                          file=sys.stderr)
                    stop.set()
    finally:
        print("stopping local cluster ...", flush=True)
        if dashboard is not None:
            from bkspark.cli.dashboard_cmd import stop_dashboard
            stop_dashboard(dashboard)
        cluster.stop_all()
        print("stopped")
    return 0
