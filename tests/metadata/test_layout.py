"""BookKeeper's ZooKeeper layout (paths relative to the store root)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkspark.errors import BadRequestError
from metadata import layout


@pytest.mark.parametrize("lid,path", [
    (0, "/00/0000/L0000"),
    (1, "/00/0000/L0001"),
    (12345, "/00/0001/L2345"),
    (9_999_999_999, "/99/9999/L9999"),
    (10_000_000_000, "/000/0000/0100/0000/L0000"),
    (2 ** 63 - 1, "/922/3372/0368/5477/L5807"),
])
def test_ledger_path(lid, path):
    assert layout.ledger_path(lid) == path
    assert layout.ledger_id_from_path(path) == lid


@given(st.integers(0, 2 ** 63 - 1))
def test_ledger_path_round_trip(lid):
    assert layout.ledger_id_from_path(layout.ledger_path(lid)) == lid


@pytest.mark.parametrize("bad", [-1, 2 ** 63, "1", 1.0, True, None])
def test_ledger_path_rejects_bad_ids(bad):
    with pytest.raises(BadRequestError):
        layout.ledger_path(bad)


@pytest.mark.parametrize("bad", [
    "/00/0000/0001", "/00/0000/L001", "00/0000/L0001", "/available/x",
    "/000/0000/0000/0000/L0001",  # long form of a short id: not canonical
    "/00/0000/L0001/extra", "", None,
])
def test_ledger_id_from_path_rejects(bad):
    with pytest.raises(BadRequestError):
        layout.ledger_id_from_path(bad)


def test_named_nodes():
    assert layout.AVAILABLE == "/available"
    assert layout.READONLY == "/available/readonly"
    assert layout.COOKIES == "/cookies"
    assert layout.UNDERREPLICATION == "/underreplication"
    assert layout.UR_LEDGERS == "/underreplication/ledgers"
    assert layout.UR_LOCKS == "/underreplication/locks"
    assert layout.AUDITOR_ELECTION == "/underreplication/auditorelection"
    assert layout.UR_DISABLE == "/underreplication/disable"
    assert layout.LOGS == "/logs"
    assert layout.INSTANCEID == "/INSTANCEID" and layout.LAYOUT == "/LAYOUT"
    assert layout.bookie_path("127.0.0.1:3181") == "/available/127.0.0.1:3181"
    assert layout.bookie_path("b1", readonly=True) == "/available/readonly/b1"
    assert layout.cookie_path("b1") == "/cookies/b1"
    assert layout.log_path("events") == "/logs/events"
    assert layout.underreplicated_path(0x1234) == \
        "/underreplication/ledgers/0000/0000/0000/1234/urL0000004660"
    assert layout.underreplication_lock_path(5) == "/underreplication/locks/urL0000000005"


@pytest.mark.parametrize("bad", ["", "a/b", "readonly", "..", "white space", None])
def test_bad_bookie_ids(bad):
    with pytest.raises(BadRequestError):
        layout.bookie_path(bad)


@pytest.mark.parametrize("name", ["", "a/b", "..", "sp ace", None, "a:b", "x=y", "p+q", "u@h",
                                  "-lead", ".hidden", "a" * 201])
def test_one_log_name_rule_for_the_api_and_the_path(name):
    """The log API and the metadata path refuse the same names, so no path holds a log the
    API cannot name."""
    with pytest.raises(BadRequestError, match="invalid log name"):
        layout.check_log_name(name)
    with pytest.raises(BadRequestError, match="invalid log name"):
        layout.log_path(name)


def test_log_paths_of_good_names():
    assert layout.log_path("orders_2026.v1-b") == "/logs/orders_2026.v1-b"
    assert layout.check_log_name("_x" + "a" * 198) == "_x" + "a" * 198
