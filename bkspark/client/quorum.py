"""Quorum arithmetic of the round-robin distribution schedule (pure functions).

* write set of entry ``e``: the ``Qw`` ensemble indices ``(e + i) mod E``, i < Qw;
* an entry is acknowledged once ``Qa`` bookies of its write set acknowledged it;
* *quorum coverage*: a property holds for at least one bookie of every possible ack
  quorum of a cohort, i.e. for at least ``(cohort - Qa) + 1`` of its members
  ("Closing Ledgers Safely"). Fencing uses the whole ensemble as cohort (``(E - Qa) + 1``
  fenced bookies); recovery reads use the entry's write set (``(Qw - Qa) + 1`` negative
  answers make an entry unrecoverable);
* :func:`rr_coverage` is BookKeeper's RRQuorumCoverageSet: every one of the E write sets
  has fewer than ``Qa`` members without the property.
"""
from __future__ import annotations

from bkspark.errors import BadRequestError


def validate_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Raise :class:`BadRequestError` unless ``E >= Qw >= Qa >= 1``."""
    for name, v in (("ensemble_size", ensemble_size), ("write_quorum", write_quorum),
                    ("ack_quorum", ack_quorum)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise BadRequestError(f"{name} must be a positive integer, got {v!r}")
    if ensemble_size < write_quorum:
        raise BadRequestError(
            f"ensemble size E={ensemble_size} is smaller than write quorum Qw={write_quorum}: "
            "the protocol requires E >= Qw >= Qa")
    if write_quorum < ack_quorum:
        raise BadRequestError(
            f"write quorum Qw={write_quorum} is smaller than ack quorum Qa={ack_quorum}: "
            "the protocol requires E >= Qw >= Qa")


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Ensemble indices holding ``entry_id``: ``[(e + i) % E for i in range(Qw)]``."""
    start = entry_id % ensemble_size
    return [(start + i) % ensemble_size for i in range(write_quorum)]


def write_set_bookies(entry_id: int, ensemble: list, write_quorum: int) -> list:
    """The bookies (in write-set order) of ``entry_id`` in ``ensemble``."""
    e = len(ensemble)
    start = entry_id % e
    return [ensemble[(start + i) % e] for i in range(write_quorum)]


def has_entry(index: int, entry_id: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether ensemble index ``index`` is in ``entry_id``'s write set (it stores the entry
    and its acknowledgement counts): ``(index - entry_id) mod E < Qw``."""
    return (index - entry_id) % ensemble_size < write_quorum


def coverage_threshold(cohort_size: int, ack_quorum: int) -> int:
    """Members that must satisfy a property so every ack quorum has one: (cohort - Qa) + 1."""
    return cohort_size - ack_quorum + 1


def fencing_threshold(ensemble_size: int, ack_quorum: int) -> int:
    """Fenced bookies needed so that no ack quorum of the ensemble is unfenced."""
    return coverage_threshold(ensemble_size, ack_quorum)


def negative_threshold(write_quorum: int, ack_quorum: int) -> int:
    """NoSuchEntry/NoSuchLedger answers making an entry unrecoverable: (Qw - Qa) + 1."""
    return coverage_threshold(write_quorum, ack_quorum)


def rr_coverage(ensemble_size: int, write_quorum: int, ack_quorum: int,
                covered: set[int]) -> bool:
    """True when every write set has fewer than Qa ensemble indices outside ``covered``."""
    for i in range(ensemble_size):
        missing = 0
        for j in range(write_quorum):
            if (i + j) % ensemble_size not in covered:
                missing += 1
        if missing >= ack_quorum:
            return False
    return True


def fencing_covered(ensemble_size: int, write_quorum: int, ack_quorum: int,
                    fenced: set[int]) -> bool:
    """Fencing is complete: (E - Qa) + 1 bookies of the ensemble answered the fence.

    That count implies :func:`rr_coverage` (every ack quorum of the whole ensemble, hence
    of every write set, contains a fenced bookie).
    """
    return len(fenced) >= fencing_threshold(ensemble_size, ack_quorum)


# Outcomes of a recovery read of one entry.
RECOVERABLE = "recoverable"
UNRECOVERABLE = "unrecoverable"
UNKNOWN = "unknown"       # every answer is in and neither threshold was reached
PENDING = "pending"       # wait for more answers


class RecoveryReadTally:
    """Decides one entry of recovery from its write set's answers.

    Generous on positive (one positive read suffices), strict on negative ((Qw - Qa) + 1
    NoSuchEntry/NoSuchLedger answers); anything else (timeout, I/O error, unreachable,
    overloaded, digest mismatch) is *unknown*. When all answers are in and neither threshold
    is met the outcome is UNKNOWN: recovery must abort, never close.
    """

    __slots__ = ("write_quorum", "ack_quorum", "positive", "negative", "unknown")

    def __init__(self, write_quorum: int, ack_quorum: int):
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.positive = 0
        self.negative = 0
        self.unknown = 0

    def add_positive(self) -> str:
        self.positive += 1
        return self.outcome()

    def add_negative(self) -> str:
        self.negative += 1
        return self.outcome()

    def add_unknown(self) -> str:
        self.unknown += 1
        return self.outcome()

    def outcome(self) -> str:
        if self.positive > 0:
            return RECOVERABLE
        if self.negative >= negative_threshold(self.write_quorum, self.ack_quorum):
            return UNRECOVERABLE
        if self.positive + self.negative + self.unknown >= self.write_quorum:
            return UNKNOWN
        return PENDING
