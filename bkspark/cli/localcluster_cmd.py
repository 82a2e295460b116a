"""`bkspark localcluster`: embedded metadata store + N bookies on loopback until Ctrl-C."""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from bkspark.errors import BKError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bookies", type=int, default=3, help="number of bookies (default 3)")
    parser.add_argument("--metadata", default=None,
                        help="metadata URI (default: the one this data dir's cluster used last, "
                             "else an embedded sqlite store in the data dir)")
    parser.add_argument("--data-dir", default="./bkspark-data",
                        help="where the cluster keeps its data; starting again on the same "
                             "directory restarts the same bookies (same ids and ports)")
    parser.add_argument("--bookie-arg", action="append", default=[],
                        help="extra flag passed to every bookie, e.g. --bookie-arg=--write-cache-mb=32")


def run(args: argparse.Namespace) -> int:
    from bkspark.localcluster import LocalCluster

    if args.bookies < 1:
        print("bkspark localcluster: --bookies must be at least 1", file=sys.stderr)
        return 2
    cluster = LocalCluster(args.metadata, args.bookies, args.data_dir, args.bookie_arg, publish=True)
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
        cluster.stop_all()
        print("stopped")
    return 0
