"""Logs built from ledgers: ordered ledger lists, writers, readers, cursors, checkpoint store.

    from bkspark.client import BookKeeper
    from bkspark.log import LogStore, Position, CheckpointStore
    with BookKeeper(uri) as bk:
        logs = LogStore(bk, ensemble_size=3, write_quorum=2, ack_quorum=2)
        with logs.open_writer("events") as w:
            pos = w.append(b"hello")
        for record in logs.open_reader("events", "earliest", tail=False):
            record.position, record.data
"""
from bkspark.log.checkpoint import CheckpointStore
from bkspark.log.position import EARLIEST, LATEST, Position
from bkspark.log.reader import LogReader, LogRecord
from bkspark.log.store import LogStore
from bkspark.log.writer import LogWriter

__all__ = ["LogStore", "LogWriter", "LogReader", "LogRecord", "Position", "CheckpointStore",
           "EARLIEST", "LATEST"]
