"""Randomized fault runs with an invariant checker (issue 9).

    python -m bkspark.testing.faults --seed 7 --duration 120 --store both --report run.json
    python -m bkspark.testing.faults crash --seed 7 --kills 300 --report crash.json

A **fault run** starts metadata (the embedded SQLite store, or a real ZooKeeper server in
its own chroot), N bookies (``BookieCluster`` with fault injection, small write cache and
frequent checkpoints) and writer *processes*:

* ledger writers create ledgers of random (E, Qw, Qa) and append numbered, checksummed
  records (:func:`make_record`), pipelined;
* log writers append records to a shared log through ``LogStore.open_writer`` (rolling
  ledgers often), re-taking the log when fenced.

Every acknowledgement is appended to the worker's ack file and flushed to the OS before
the worker counts it, so a SIGKILLed worker still leaves every ack it saw.

The **schedule** is a pure function of the seed (:func:`make_schedule`): SIGKILL+restart of
bookies, SIGSTOP/SIGCONT pauses, delays/drops/failures injected with ``set_faults``,
SIGKILL of writer processes (a replacement starts), a second client recovering a writer's
current ledger (or taking over the log) while the first still writes, metadata session
expiry of a writer (SIGUSR1 makes the worker expire its own session with
``metadata.testing.expire_session``), and disk-full bookies (restarted with a tiny
``--disk-usage-threshold`` -> read-only). The runner also snapshots the log metadata.

The **checker** (:class:`Checker`) heals the cluster, then opens every ledger with
recovery and verifies against the ack files:

* ``acked-entry-lost``: an acknowledged entry is past the closed end or unreadable;
* ``fenced-writer-success``: a writer got an ack past the end a recoverer closed at;
* ``bad-record`` / ``ack-mismatch``: an entry fails its record checksum, or is not the
  record that was acknowledged at that id;
* ``out-of-order``: a ledger's records are not in the writer's order; a log's records of
  one writer are not in order;
* ``replica-divergence`` / ``under-replicated``: two replicas of an entry differ, or an
  entry of a closed ledger is held by fewer than Qa bookies of its write set;
* ``reader-divergence``: two clients read different sequences;
* ``end-moved``: a closed ledger's end (recorded by its writer, a recoverer, or the first
  check) differs when re-opened later (after every bookie was SIGKILLed and restarted);
* ``log-*``: a non-empty ledger vanished from a log's list or changed position, more than
  one ledger open, or an acknowledged log position not in the log.

A failing run prints its seed; ``--seed S --duration D`` replays the same schedule.

The package: :mod:`.common` (settings, records, bookie RPC), :mod:`.workloads` (the writer
processes), :mod:`.schedule` (faults from the seed), :mod:`.runner` (:class:`FaultRun`),
:mod:`.checker` (:class:`Checker`), :mod:`.cli` (sessions of runs, summary, the command).
"""
from .checker import Checker
from .cli import main, run_campaign, run_line
from .common import PASSWORD, make_record, parse_record
from .runner import FaultRun
from .schedule import FAULT_KINDS, Fault, make_schedule

__all__ = ["Checker", "FAULT_KINDS", "Fault", "FaultRun", "PASSWORD", "main", "make_record",
           "make_schedule", "parse_record", "run_campaign", "run_line"]
