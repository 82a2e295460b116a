"""`python -m bkspark.testing.diskfaults ...`: see :mod:`bkspark.testing.diskfaults.campaign`."""
import sys

from .campaign import main

if __name__ == "__main__":
    sys.exit(main())
