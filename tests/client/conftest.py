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

from memory_bookie import MemoryBookie  # noqa: E402

from metadata import open_store  # noqa: E402


class MemCluster:
    def __init__(self, uri, n):
        self.metadata_uri = uri
        self.store = open_store(uri)
        self.bookies = [MemoryBookie(self.store) for _ in range(n)]

    @property
    def bookie_ids(self):
        return [b.bookie_id for b in self.bookies]

    def by_id(self, bookie_id) -> MemoryBookie:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    def close(self):
        for b in self.bookies:
            try:
                b.stop()
            except Exception:  # noqa: BLE001
                pass
        self.store.close()


@pytest.fixture
def mem_cluster(tmp_path, request):
    n = getattr(request, "param", 3)
    c = MemCluster(f"sqlite://{tmp_path}/meta.db", n)
    yield c
    c.close()
