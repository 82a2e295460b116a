"""Log (ledger-list) metadata model."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkspark.errors import BadRequestError, MetadataFormatError
from metadata.log_entry import LogLedger
from metadata.log_metadata import LogMetadata


def test_round_trip_and_helpers():
    md = LogMetadata("l").with_ledger(3, first_offset=0).with_ledger(9, first_offset=10)
    md = md.with_ledger_updated(3, entries=10).with_writer_sequence("w", 7)
    md.properties["retention"] = {"ms": 1000}
    data = md.serialize()
    assert data.startswith(b"bkspark-log-metadata\t1\n")
    back = LogMetadata.deserialize(data)
    assert back == md
    assert back.ledger_ids() == [3, 9]
    assert back.last_ledger().to_dict() == {"ledger_id": 9, "first_offset": 10}
    assert back.without_ledgers([3]).ledger_ids() == [9]
    assert back.ledger_ids() == [3, 9]  # copies, not mutation


@given(st.lists(st.integers(0, 2 ** 63 - 1), unique=True, max_size=20),
       st.dictionaries(st.text(max_size=10), st.integers(-1, 2 ** 63 - 1), max_size=5))
def test_round_trip_property(ids, writers):
    md = LogMetadata("name", ledgers=[LogLedger(i) for i in ids], writers=writers)
    assert LogMetadata.deserialize(md.serialize()) == md


@pytest.mark.parametrize("data", [
    b"", b"bkspark-log-metadata\t2\n{}", b"bkspark-ledger-metadata\t1\n{}",
    b"bkspark-log-metadata\t1\n{",
    b'bkspark-log-metadata\t1\n{"name":"x","ledgers":[],"writers":{}}',
    b'bkspark-log-metadata\t1\n{"name":"x","ledgers":[{"id":1}],"writers":{},"properties":{}}',
    b'bkspark-log-metadata\t1\n{"name":"x","ledgers":[{"ledger_id":1},{"ledger_id":1}],'
    b'"writers":{},"properties":{}}',
    b'bkspark-log-metadata\t1\n{"name":"x","ledgers":[],"writers":{"w":"1"},"properties":{}}',
    b'bkspark-log-metadata\t1\n{"name":"","ledgers":[],"writers":{},"properties":{}}',
])
def test_corrupt_log_metadata(data):
    with pytest.raises(MetadataFormatError):
        LogMetadata.deserialize(data)


def test_validation():
    with pytest.raises(BadRequestError):
        LogMetadata("x").with_ledger(-1)
    with pytest.raises(BadRequestError):
        LogMetadata("x").with_ledger(1).with_ledger(1)
    with pytest.raises(BadRequestError):
        LogMetadata("x").with_ledger_updated(5, a=1)
