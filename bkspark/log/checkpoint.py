"""A durable, replicated store of a streaming query's progress, with single ownership.

The store is a log of its own (``__ckpt.<query>``) whose entries are JSON records::

    {"op": "commit", "batch_id": N, "payload": ...}     a committed batch
    {"op": "purge", "before": N}                        batches < N forgotten
    {"op": "snapshot", "commits": {N: payload, ...}}     compaction: the whole live state

Opening a store opens the log's writer, which fences the previous owner's ledger: from then
on the old owner's ``commit`` raises :class:`LogFencedError` — two drivers of one query
can never both commit (split brain is impossible, not just unlikely). ``epoch`` increases
with every owner and is what the Spark sink passes to ``LogStore.append_ledgers``.

A commit returns after the record is acknowledged by Qa bookies. The state is replayed from
the log on open; when the log holds ``compact_after`` records past the last snapshot, the
store rolls to a new ledger that starts with a snapshot and drops the older ledgers.

Spark's own ``checkpointLocation`` remains a file path (Spark offers no Python hook for it);
this store holds what the connector must get exactly right: committed offsets and batch ids.
"""
from __future__ import annotations

import json
import threading

from bkspark.errors import BadRequestError
from bkspark.log.position import EARLIEST
from bkspark.log.store import LogStore
from metadata.layout import INTERNAL_LOG_PREFIX, check_log_name

PREFIX = f"{INTERNAL_LOG_PREFIX}ckpt."


class CheckpointStore:
    def __init__(self, logs: LogStore, query_id: str, *, compact_after: int = 1000) -> None:
        self.logs = logs
        self.query_id = query_id
        self.log_name = check_log_name(PREFIX + query_id)
        self.compact_after = compact_after
        self._lock = threading.Lock()
        self._commits: dict[int, object] = {}
        self._records_since_snapshot = 0
        self._writer = logs.open_writer(self.log_name)      # fences the previous owner
        self.epoch = self._writer.epoch
        self._replay()

    def _replay(self) -> None:
        with self.logs.open_reader(self.log_name, EARLIEST, tail=False) as reader:
            for record in reader:
                self._apply(json.loads(record.data))

    def _apply(self, record: dict) -> None:
        op = record.get("op")
        if op == "commit":
            self._commits[int(record["batch_id"])] = record["payload"]
            self._records_since_snapshot += 1
        elif op == "purge":
            before = int(record["before"])
            self._commits = {b: p for b, p in self._commits.items() if b >= before}
            self._records_since_snapshot += 1
        elif op == "snapshot":
            self._commits = {int(b): p for b, p in record["commits"].items()}
            self._records_since_snapshot = 0

    def _append(self, record: dict) -> None:
        self._writer.append(json.dumps(record, separators=(",", ":")).encode())
        self._apply(record)

    def commit(self, batch_id: int, payload) -> None:
        """Durably record ``payload`` (any JSON value) for ``batch_id``.

        LogFencedError if a new owner took the store over. The commit that raised it is in
        doubt, as any BookKeeper add that failed while being fenced: the new owner's recovery
        decides whether its record is in the store (``get(batch_id)`` of the new owner tells).
        Commits that returned are always there; the old owner can commit nothing more."""
        if not isinstance(batch_id, int) or batch_id < 0:
            raise BadRequestError(f"batch_id must be a non-negative integer, got {batch_id!r}")
        try:
            json.dumps(payload)
        except (TypeError, ValueError) as exc:
            raise BadRequestError(f"checkpoint payload must be JSON-serialisable: {exc}") from None
        with self._lock:
            self._append({"op": "commit", "batch_id": batch_id, "payload": payload})
            if self._records_since_snapshot >= self.compact_after:
                self._compact()

    def latest(self):
        """(batch_id, payload) of the highest committed batch, or None."""
        with self._lock:
            if not self._commits:
                return None
            batch_id = max(self._commits)
            return batch_id, self._commits[batch_id]

    def get(self, batch_id: int):
        """Payload committed for ``batch_id``, or None."""
        with self._lock:
            return self._commits.get(batch_id)

    def batch_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._commits)

    def purge(self, before: int) -> None:
        """Forget batches < ``before`` (durably)."""
        with self._lock:
            self._append({"op": "purge", "before": int(before)})

    def _compact(self) -> None:
        """Roll to a new ledger starting with a snapshot, then drop the older ledgers."""
        self._writer.roll()
        position = self._writer.append(json.dumps(
            {"op": "snapshot", "commits": {str(b): p for b, p in self._commits.items()}}).encode())
        self._records_since_snapshot = 0
        self.logs.truncate(self.log_name, position, force=True)

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> "CheckpointStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
