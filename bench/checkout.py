"""What every Spark bench does first: run this checkout's bkspark, in the bench's own Python
and in every Python Spark starts (its workers inherit PYTHONPATH and PYSPARK_PYTHON).

    import checkout  # noqa: F401  (bench/ is sys.path[0] of a bench run as a script)
"""
from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if REPO not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([REPO] + _paths)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
