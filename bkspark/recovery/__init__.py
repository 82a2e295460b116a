"""Autorecovery: auditor, replication workers, manual recovery and decommission.

* :mod:`.urm` -- under-replication records, worker locks, the enable/disable switch;
* :mod:`.replicator` -- re-replication of a ledger's fragments (RECOVERY_ADD + CAS);
* :mod:`.election` -- auditor election (kazoo's Election recipe on ZooKeeper, a lease on
  the embedded store);
* :mod:`.auditor`, :mod:`.worker` -- the two halves of autorecovery;
  :mod:`.service` runs both (``bkspark autorecovery`` / ``bkspark bookie --autorecovery``);
* :mod:`.manual` -- ``recover <bookie>`` and ``decommission <bookie>``.
"""
from .replicator import FULL, OPEN, PARTIAL, LedgerReplicator, ReplicationError, fragments
from .urm import UnderReplicationManager

__all__ = ["LedgerReplicator", "ReplicationError", "fragments", "FULL", "PARTIAL", "OPEN",
           "UnderReplicationManager"]
