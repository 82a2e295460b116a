"""`bkspark spark-env pack`: an environment archive for Spark executors without bkspark.

    bkspark spark-env pack env.tar.gz --wheel dist/bkspark-*.whl [--with-pyspark]

then, in client mode (the driver's Python has bkspark)::

    PYSPARK_DRIVER_PYTHON=python3 PYSPARK_PYTHON=./environment/bin/python \\
        spark-submit --archives env.tar.gz#environment app.py

(``bkspark/spark/packenv.py`` says what the archive holds and where it runs.)
"""
from __future__ import annotations

import argparse
import sys

from bkspark.errors import BKError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="spark_env_command", required=True)
    p = sub.add_parser("pack", help="a venv-pack archive of bkspark and its dependencies")
    p.add_argument("output", help="the archive to write (.tar.gz, .tgz or .zip)")
    p.add_argument("--wheel", required=True, help="the bkspark wheel (make wheel)")
    p.add_argument("--with-pyspark", action="store_true",
                   help="include PySpark (executors take their Spark's own otherwise)")


def run(args: argparse.Namespace) -> int:
    from bkspark.spark.packenv import pack
    try:
        done = pack(args.output, args.wheel, with_pyspark=args.with_pyspark)
    except BKError as exc:
        print(f"bkspark spark-env pack: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {done['output']} ({done['bytes'] / 1e6:.0f} MB). Use it with:\n"
          f"  PYSPARK_DRIVER_PYTHON=python3 PYSPARK_PYTHON=./environment/bin/python \\\n"
          f"    spark-submit --archives {done['output']}#environment app.py\n"
          f"(or spark.archives={done['output']}#environment)")
    return 0
