"""The bkspark ledger client.

>>> from bkspark.client import BookKeeper
>>> with BookKeeper("sqlite:///tmp/meta.db") as bk:
...     with bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw") as lh:
...         lh.append(b"payload")
...     with bk.open_ledger(lh.ledger_id, password=b"pw") as rh:
...         for entry in rh.read(0, rh.last_add_confirmed):
...             print(entry.entry_id, entry.data)

Modules: :mod:`.api` (BookKeeper), :mod:`.ledger_handle` (write path, ensemble change,
close), :mod:`.read_handle` (reads, LAC, tailing), :mod:`.recovery` (fencing + recovery),
:mod:`.quorum` (quorum arithmetic), :mod:`.digest` (entry framing), :mod:`.placement`,
:mod:`.bookie_client` (gRPC), :mod:`.wire` (hand-encoded add requests). Its settings,
``ClientConfig`` and how they are given as text (Spark options, command-line flags, files),
are :mod:`bkspark.client_settings`, a layer below (the bookie reads them too).
"""
from bkspark.client_settings import ClientConfig

from .api import BookKeeper
from .digest import DigestManager
from .ledger_handle import LedgerHandle
from .read_handle import LedgerEntry, RangeBatch, ReadHandle

__all__ = ["BookKeeper", "ClientConfig", "LedgerHandle", "ReadHandle", "LedgerEntry", "RangeBatch",
           "DigestManager"]
