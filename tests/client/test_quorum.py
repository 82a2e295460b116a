"""Pure quorum arithmetic: write sets, coverage thresholds, recovery-read decisions."""
import itertools

import pytest
from hypothesis import given, strategies as st

from bkspark.client import quorum
from bkspark.errors import BadRequestError


def test_write_sets_of_the_protocol_page():
    ens = ["B1", "B2", "B3", "B4"]
    want = [["B1", "B2", "B3"], ["B2", "B3", "B4"], ["B3", "B4", "B1"], ["B4", "B1", "B2"],
            ["B1", "B2", "B3"], ["B2", "B3", "B4"]]
    assert [quorum.write_set_bookies(e, ens, 3) for e in range(6)] == want
    assert quorum.write_set(5, 4, 3) == [1, 2, 3]


@pytest.mark.parametrize("e,qw,qa", [(2, 3, 2), (3, 2, 3), (1, 2, 1), (3, 3, 4), (0, 0, 0),
                                     (3, 0, 0), (3, 2, 0)])
def test_invalid_quorums_rejected(e, qw, qa):
    with pytest.raises(BadRequestError, match="E >= Qw >= Qa|positive"):
        quorum.validate_quorums(e, qw, qa)


# "Closing Ledgers Safely": WQ | AQ | negative responses required
NEGATIVE_TABLE = [(2, 1, 2), (2, 2, 1), (3, 1, 3), (3, 2, 2), (3, 3, 1), (4, 2, 3), (4, 3, 2),
                  (4, 4, 1)]


@pytest.mark.parametrize("wq,aq,need", NEGATIVE_TABLE)
def test_negative_threshold_table(wq, aq, need):
    assert quorum.negative_threshold(wq, aq) == need
    # exactly `need` negatives decide UNRECOVERABLE, one fewer never does
    t = quorum.RecoveryReadTally(wq, aq)
    for i in range(need - 1):
        assert t.add_negative() in (quorum.PENDING, quorum.UNKNOWN)
    if need - 1 < wq:
        assert t.add_negative() == quorum.UNRECOVERABLE


@pytest.mark.parametrize("wq,aq,need", NEGATIVE_TABLE)
def test_negative_threshold_is_quorum_coverage(wq, aq, need):
    """need negatives <=> no ack quorum of the write set can consist only of non-negatives."""
    for k in range(wq + 1):
        covered = set(range(k))     # k bookies answered "no such entry"
        no_aq_left = all(any(b in covered for b in aqset)
                         for aqset in itertools.combinations(range(wq), aq))
        assert no_aq_left == (k >= need)


def test_unknowns_never_close():
    for wq, aq, need in NEGATIVE_TABLE:
        # need-1 negatives and the rest unknown -> UNKNOWN (abort), never UNRECOVERABLE
        t = quorum.RecoveryReadTally(wq, aq)
        outcomes = [t.add_negative() for _ in range(need - 1)]
        outcomes += [t.add_unknown() for _ in range(wq - (need - 1))]
        assert quorum.UNRECOVERABLE not in outcomes
        assert outcomes[-1] == quorum.UNKNOWN
        # all unknown -> unknown
        t = quorum.RecoveryReadTally(wq, aq)
        assert [t.add_unknown() for _ in range(wq)][-1] == quorum.UNKNOWN


def test_one_positive_is_enough():
    t = quorum.RecoveryReadTally(3, 2)
    assert t.add_unknown() == quorum.PENDING
    assert t.add_positive() == quorum.RECOVERABLE
    t = quorum.RecoveryReadTally(3, 2)
    assert t.add_negative() == quorum.PENDING
    assert t.add_positive() == quorum.RECOVERABLE


@given(e=st.integers(1, 7), data=st.data())
def test_fencing_threshold_implies_rr_coverage(e, data):
    qw = data.draw(st.integers(1, e))
    qa = data.draw(st.integers(1, qw))
    fenced = data.draw(st.sets(st.integers(0, e - 1)))
    if quorum.fencing_covered(e, qw, qa, fenced):
        assert quorum.rr_coverage(e, qw, qa, fenced)
        # and then no write set has an ack quorum of unfenced bookies
        for s in range(e):
            ws = quorum.write_set(s, e, qw)
            assert sum(1 for b in ws if b not in fenced) < qa
    # rr_coverage is exactly "every write set has < qa unfenced members"
    want = all(sum(1 for b in quorum.write_set(s, e, qw) if b not in fenced) < qa
               for s in range(e))
    assert quorum.rr_coverage(e, qw, qa, fenced) == want


def test_fencing_threshold_values():
    assert quorum.fencing_threshold(3, 2) == 2
    assert quorum.fencing_threshold(3, 3) == 1
    assert quorum.fencing_threshold(5, 2) == 4
    assert not quorum.fencing_covered(3, 2, 2, {0})
    assert quorum.fencing_covered(3, 2, 2, {0, 2})


@given(st.integers(1, 9), st.integers(1, 9), st.integers(0, 10 ** 12))
def test_has_entry_is_membership_of_the_write_set(e, qw, entry_id):
    qw = min(qw, e)
    ws = quorum.write_set(entry_id, e, qw)
    assert [i for i in range(e) if quorum.has_entry(i, entry_id, e, qw)] == sorted(ws)
