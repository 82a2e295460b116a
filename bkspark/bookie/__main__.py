"""`python -m bkspark.bookie ...` runs one bookie, with the flags of `bkspark bookie ...`."""
import argparse
import sys

from bkspark.bookie.command import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bkspark.bookie",
                                     description="run a bookie (storage server)")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
