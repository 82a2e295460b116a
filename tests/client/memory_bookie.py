"""In-process bookies for fast client tests: the real gRPC service (``BookieService``) over
an in-memory storage. Used for quick write/read-path tests; the scenario tests
(``test_scenarios.py``) run real bookie processes."""
from __future__ import annotations

import threading
from concurrent import futures
from types import SimpleNamespace

import grpc

from bkspark import errors
from bkspark.bookie.service import BookieService, add_to_server
from metadata import open_store, registry


class MemoryStorage:
    def __init__(self):
        self.entries: dict[int, dict[int, bytes]] = {}
        self.keys: dict[int, bytes] = {}
        self.fenced: set[int] = set()
        self.lacs: dict[int, bytes] = {}
        self.lock = threading.Lock()

    def add_entries(self, adds):
        out = []
        with self.lock:
            for lid, eid, mk, recovery, body in adds:
                known = self.keys.get(lid)
                if known is not None and known != mk:
                    out.append(errors.EUA)
                    continue
                if lid in self.fenced and not recovery:
                    out.append(errors.EFENCED)
                    continue
                self.keys[lid] = mk
                self.entries.setdefault(lid, {})[eid] = bytes(body)
                out.append(errors.EOK)
        return out

    def add_batch(self, payload, max_entry_bytes):
        """No native path here: the service stores the batch through add_entries."""
        raise errors.BKError("memory storage stores batches through add_entries")

    def read_entry(self, lid, eid):
        with self.lock:
            es = self.entries.get(lid)
            if es is None:
                raise errors.NoSuchLedgerError("no ledger")
            if eid == -1:
                if not es:
                    raise errors.NoSuchEntryError("empty")
                eid = max(es)
            if eid not in es:
                raise errors.NoSuchEntryError(f"no entry {eid}")
            return es[eid]

    def read_range(self, lid, first, last, max_bytes, step=1):
        out, size = [], 0
        with self.lock:
            es = self.entries.get(lid, {})
            for e in range(first, last + 1, step):
                if e not in es or (out and size + len(es[e]) > max_bytes):
                    break
                out.append((e, es[e]))
                size += len(es[e])
        return out

    def fence(self, lid, mk):
        with self.lock:
            known = self.keys.get(lid)
            if known is not None and known != mk:
                return errors.EUA
            self.keys[lid] = mk
            self.entries.setdefault(lid, {})
            self.fenced.add(lid)
            return errors.EOK

    def explicit_lac(self, lid):
        return self.lacs.get(lid)

    def set_explicit_lac(self, lid, body):
        self.lacs[lid] = body

    def master_key(self, lid):
        return self.keys.get(lid)

    def has_ledger(self, lid):
        return lid in self.entries

    def list_entries(self, lid):
        es = sorted(self.entries.get(lid, {}))
        return [(e, e) for e in es]

    def force(self, lid):
        pass


class MemoryBookie:
    def __init__(self, store):
        self.storage = MemoryStorage()
        config = SimpleNamespace(max_entry_bytes=64 << 20, max_message_bytes=256 << 20,
                                 long_poll_max_ms=30000, fault_injection=True,
                                 max_inflight_add_mb=512, max_adds_per_message=65_536,
                                 max_long_polls=24)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=32),
                                  options=[("grpc.max_receive_message_length", 256 << 20),
                                           ("grpc.max_send_message_length", 256 << 20)])
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.bookie_id = f"127.0.0.1:{port}"
        state = SimpleNamespace(read_only=False, bookie_id=self.bookie_id,
                                disk_space=lambda: (1 << 40, 1 << 39))
        self.service = BookieService(self.storage, config, state)
        add_to_server(self.service, self.server)
        self.server.start()
        self.store = store
        registry.register_bookie(store, self.bookie_id, {"address": self.bookie_id})

    def stop(self):
        registry.unregister_bookie(self.store, self.bookie_id)
        self.server.stop(0)


class MemCluster:
    def __init__(self, uri, n):
        self.metadata_uri = uri
        self.store = open_store(uri, create=True)
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
