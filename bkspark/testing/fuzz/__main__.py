"""``python -m bkspark.testing.fuzz TARGET [--native SO] [libFuzzer flags] [corpus dirs]``;
``python -m bkspark.testing.fuzz --make-seeds DIR`` writes the seed corpora."""
from __future__ import annotations

import argparse
import sys

from . import TARGETS


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bkspark.testing.fuzz",
                                     description=__doc__)
    parser.add_argument("target", nargs="?", choices=TARGETS)
    parser.add_argument("--native", help="the fuzz build of bkspark._native "
                                         "(bkspark.testing.fuzz.build); default: the normal one")
    parser.add_argument("--make-seeds", metavar="DIR")
    args, libfuzzer = parser.parse_known_args(argv)
    if args.native:
        from .build import load
        load(args.native)
    if args.make_seeds:
        from .targets import make_seeds
        make_seeds(args.make_seeds)
        return
    if not args.target:
        parser.error("name a target, or --make-seeds DIR")
    import atheris
    with atheris.instrument_imports(include=["bkspark.proto", "bkspark.bookie", "bkspark.testing.fuzz"]):
        from . import targets
    one = targets.setup(args.target)
    atheris.Setup([sys.argv[0], *libfuzzer], one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
