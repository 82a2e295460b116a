"""`bkspark bookie` and `python -m bkspark.bookie`: run one bookie from a config file and/or flags
(flags win)."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from bkspark.bookie.config import BookieConfig
from bkspark.errors import BKError

ALIASES = {"metadata_uri": ["--metadata"], "ledger_dirs": ["--ledger-dir"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="INI file with a [bookie] section (see examples/bookie.conf)")
    for field in dataclasses.fields(BookieConfig):
        flag = "--" + field.name.replace("_", "-")
        names = [flag] + ALIASES.get(field.name, [])
        if field.type in ("bool", bool):
            parser.add_argument(*names, dest=field.name, action=argparse.BooleanOptionalAction,
                                default=None, help=f"(default {field.default})")
        else:
            default = field.default if field.default is not dataclasses.MISSING else "[]"
            parser.add_argument(*names, dest=field.name, default=None,
                                help=f"(default {default!r})" + (", comma separated" if field.name in ("ledger_dirs", "journal_dirs") else ""))


def config_from_args(args: argparse.Namespace) -> BookieConfig:
    config = BookieConfig.from_file(args.config) if args.config else BookieConfig()
    config.update({f.name: getattr(args, f.name) for f in dataclasses.fields(BookieConfig)})
    return config.finalize()


def run(args: argparse.Namespace) -> int:
    from bkspark.logging_setup import setup_logging
    try:
        config = config_from_args(args)
    except BKError as exc:
        print(f"bkspark bookie: {exc}", file=sys.stderr)
        return 2
    from bkspark import private
    private.restrict_umask()        # (its data, index, cookies and log are private)
    setup_logging(config.log_level, config.log_format, config.log_file, config.log_max_mb,
                  config.log_backups)
    from bkspark.bookie.server import BookieServer
    server = BookieServer(config)
    try:
        server.run()
    except BKError as exc:
        print(f"bkspark bookie: {exc}", file=sys.stderr)
        return 1
    return 0
