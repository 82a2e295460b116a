"""`python -m bkspark.bookie ...` is `bkspark bookie ...`."""
import sys

from bkspark.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bookie", *sys.argv[1:]]))
