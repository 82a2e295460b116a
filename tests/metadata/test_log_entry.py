"""The typed ledger-list entry of logs (pure logic)."""
import json

import pytest

from bkspark.errors import BadRequestError, MetadataFormatError
from metadata.log_entry import CLOSED, OPEN, LogLedger
from metadata.log_segments import decode_segment, encode_segment, next_byte_offset, next_offset


def test_a_stored_entry_reads_back_exactly_as_it_was_written():
    stored = {"ledger_id": 7, "state": "closed", "last_entry_id": 9, "length": 120,
              "offset": 30, "byte_offset": 400, "closed_ms": 1_700_000_000_000,
              "min_ts": 5, "max_ts": 9, "rows": 10, "writer": {"task": 3}}
    entry = decode_segment(json.dumps(stored).encode(), seq=4)
    assert (entry.ledger_id, entry.seq, entry.closed, entry.entry_count()) == (7, 4, True, 10)
    assert entry.extra == {"rows": 10, "writer": {"task": 3}}
    assert json.loads(encode_segment(entry)) == stored          # seq is never stored


def test_a_known_key_of_the_wrong_type_is_kept_as_written_not_trusted():
    entry = LogLedger.from_dict({"ledger_id": 1, "offset": "12", "state": "sealed"})
    assert entry.offset is None and entry.state is None and not entry.closed
    assert entry.to_dict() == {"ledger_id": 1, "offset": "12", "state": "sealed"}
    assert next_offset(entry) is None


@pytest.mark.parametrize("obj", [[], {"ledger_id": -1}, {"ledger_id": True}, {"id": 1}])
def test_an_entry_without_a_ledger_id_is_refused(obj):
    with pytest.raises(BadRequestError, match="ledger_id"):
        LogLedger.from_dict(obj)
    with pytest.raises(MetadataFormatError, match="corrupt log segment 3"):
        decode_segment(json.dumps(obj).encode(), seq=3)


def test_set_routes_fields_and_keeps_a_writers_own_keys():
    entry = LogLedger(5, state=OPEN).set(rows=3)
    entry.set(state=CLOSED, last_entry_id=2, length=30)
    assert entry.closed and entry.extra == {"rows": 3} and entry.sealed_length() == 30
    with pytest.raises(BadRequestError):
        entry.set(ledger_id=6)
    sealed = LogLedger(5, state=OPEN).with_end(entry)
    assert (sealed.state, sealed.last_entry_id, sealed.length) == (CLOSED, 2, 30)


def test_offsets_follow_from_a_closed_entry_only():
    assert next_offset(None) == 0 and next_byte_offset(None) == 0
    opened = LogLedger(1, state=OPEN, offset=10, byte_offset=100)
    assert next_offset(opened) is None and next_byte_offset(opened) is None
    closed = opened.copy().set(state=CLOSED, last_entry_id=4, length=50)
    assert next_offset(closed) == 15 and next_byte_offset(closed) == 150
    assert next_byte_offset(closed.copy(byte_offset=None)) == 0     # a new base
