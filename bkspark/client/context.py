"""The client context: what one client's ledger handles, their recovery and the replicator
share, handed to them explicitly so that none reaches into the client's internals.

One :class:`ClientContext` per :class:`~bkspark.client.BookKeeper`, built by it and closed with
it. It holds the client's configuration and metadata store, the bookie connections (one
:class:`~bkspark.client.bookie_client.BookieClient` per bookie: every request to a bookie goes
through it, and its errors are mapped there and nowhere else), the bookies' health (slow or
failed ones are asked last), one timer thread and one executor, the ledger-metadata update
loop, and the writable bookies this client can reach.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from metadata import ledgers as ledger_store

if TYPE_CHECKING:
    from .add_trace import AddTracer
    from .metrics import ClientMetrics
    from metadata.store import MetadataStore

    from .bookie_client import BookieClientPool
    from bkspark.client_settings import ClientConfig

log = logging.getLogger("bkspark.client")


class BookieHealth:
    """Bookies that recently failed or answered slowly; reads ask them last."""

    def __init__(self, quarantine: float):
        self.quarantine = quarantine
        self._until: dict[str, float] = {}

    def suspect(self, bookie_id: str) -> None:
        self._until[bookie_id] = time.monotonic() + self.quarantine

    def is_suspect(self, bookie_id: str) -> bool:
        t = self._until.get(bookie_id)
        return t is not None and t > time.monotonic()

    def order(self, bookies: list[str]) -> list[str]:
        if not self._until:
            return bookies
        now = time.monotonic()
        good = [b for b in bookies if self._until.get(b, 0) <= now]
        if len(good) == len(bookies):
            return bookies
        return good + [b for b in bookies if self._until.get(b, 0) > now]


class Scheduler:
    """One timer thread for speculative reads (cheaper than a Timer per read)."""

    def __init__(self):
        self._heap: list = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="bk-scheduler")
        self._thread.start()

    def schedule(self, delay: float, fn) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), fn))
            self._cond.notify()

    def _run(self):
        while True:
            with self._cond:
                while not self._stopped and (not self._heap
                                             or self._heap[0][0] > time.monotonic()):
                    timeout = (self._heap[0][0] - time.monotonic()) if self._heap else None
                    self._cond.wait(timeout)
                if self._stopped:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("scheduled task failed")

    def stop(self):
        with self._cond:
            self._stopped = True
            self._cond.notify()


@dataclass
class ClientContext:
    conf: "ClientConfig"
    store: "MetadataStore"
    pool: "BookieClientPool"
    health: BookieHealth
    scheduler: Scheduler
    executor: ThreadPoolExecutor
    #: ``writable_bookies(fresh=True) -> {id: registration}``: the registered writable bookies
    #: this client can talk to (BadRequestError naming TLS when there are some but none)
    writable_bookies: Callable[..., dict]
    #: a ledger handle with adds in flight joins (and leaves) the client's add-timeout ticks
    register_writer: Callable[[object], None]
    unregister_writer: Callable[[object], None]
    #: the client's Prometheus metrics, once the application enabled them (None: none kept)
    metrics: "ClientMetrics | None" = None
    #: sampled per-stage stamps of adds, while the application traces them (None: off)
    add_trace: "AddTracer | None" = None

    def read_metadata(self, ledger_id: int, settle: bool = False):
        """``(LedgerMetadata, version)``; ``settle``: read after a sync (see
        :func:`metadata.update.settled_read`)."""
        return ledger_store.read_ledger(self.store, ledger_id, settle=settle)

    def update_metadata(self, ledger_id: int, transform, *, start=None, what: str = ""):
        """The metadata update loop on a ledger (:func:`metadata.ledgers.update_ledger`)."""
        return ledger_store.update_ledger(self.store, ledger_id, transform, start=start,
                                          what=what)
