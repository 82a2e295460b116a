"""Entry point of the ``bkspark`` command."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from bkspark.bookie import command as bookie_cmd
    from bkspark.cli import (
        auth_cmd,
        autorecovery_cmd,
        dashboard_cmd,
        localcluster_cmd,
        shell,
        spark_env_cmd,
    )

    parser = argparse.ArgumentParser(prog="bkspark", description="bkspark: replicated logs for Spark")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bookie", help="run a bookie (storage server)")
    bookie_cmd.add_arguments(p)
    p.set_defaults(run=bookie_cmd.run)
    p = sub.add_parser("localcluster", help="run an embedded metadata store and N bookies")
    localcluster_cmd.add_arguments(p)
    p.set_defaults(run=localcluster_cmd.run)
    p = sub.add_parser("autorecovery", help="run the auditor and a replication worker")
    autorecovery_cmd.add_arguments(p)
    p.set_defaults(run=autorecovery_cmd.run)
    p = sub.add_parser("dashboard", help="serve a live web page of the cluster")
    dashboard_cmd.add_arguments(p)
    p.set_defaults(run=dashboard_cmd.run)
    p = sub.add_parser("auth", help="make keys, tokens and certificates of a secured cluster")
    auth_cmd.add_arguments(p)
    p.set_defaults(run=auth_cmd.run)
    p = sub.add_parser("spark-env", help="pack an environment for Spark executors")
    spark_env_cmd.add_arguments(p)
    p.set_defaults(run=spark_env_cmd.run)
    p = sub.add_parser("shell", help="admin commands (listbookies, recover, decommission, ...)")
    shell.add_arguments(p)
    p.set_defaults(run=shell.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
