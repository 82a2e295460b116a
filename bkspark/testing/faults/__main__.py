"""`python -m bkspark.testing.faults ...`: see :mod:`bkspark.testing.faults.cli`."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
