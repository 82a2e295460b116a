"""Fixtures of the client tests.

* ``mem_cluster``: in-process bookies (the real gRPC ``BookieService`` over memory storage)
  registered in a fresh SQLite store — fast tests of the write and read paths;
* ``proc_cluster``: a module-wide :class:`bkspark.testing.cluster.BookieCluster` of real
  bookie processes with fault injection on (scenario tests).
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from memory_bookie import MemCluster  # noqa: E402


@pytest.fixture
def mem_cluster(tmp_path, request):
    n = getattr(request, "param", 3)
    c = MemCluster(f"sqlite://{tmp_path}/meta.db", n)
    yield c
    c.close()
