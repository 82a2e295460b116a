"""Log offsets: one number per entry, in log order, stable across truncation and overwrite."""
from bkspark.log import Position
from metadata.log_entry import LogLedger
from metadata.log_metadata import LogMetadata


def test_offsets_count_entries_of_closed_ledgers():
    md = LogMetadata("x", ledgers=[
        LogLedger(4, state="closed", last_entry_id=9),
        LogLedger(2, state="closed", last_entry_id=0),       # ids need not grow
        LogLedger(7, state="open")])
    assert md.offsets() == [0, 10, 11]
    stamped = md.with_offsets()
    assert [e.offset for e in stamped.ledgers] == [0, 10, 11]
    # a recorded offset wins (ledgers before it were truncated away)
    md = LogMetadata("x", ledgers=[LogLedger(7, state="closed", last_entry_id=4, offset=100),
                                   LogLedger(8, state="open")])
    assert md.offsets() == [100, 105]


def test_offsets_survive_truncation_and_continue_after_overwrite(logs, log_name):
    with logs.open_writer(log_name) as w:
        for i in range(5):
            w.append(b"a%d" % i)
        w.roll()
        for i in range(3):
            last = w.append(b"b%d" % i)
    md = logs.get(log_name)[0]
    assert md.offsets() == [0, 5]
    assert [e.offset for e in md.ledgers] == [0, 5]          # stored, not only computed
    logs.truncate(log_name, Position(last.ledger_id, 0), force=True)
    assert logs.get(log_name)[0].offsets() == [5]                # kept by the survivor
    h = logs.bk.create_ledger(**logs.ledger_options)
    h.append(b"new")
    h.close()
    logs.overwrite(log_name, [h.ledger_id])
    assert logs.get(log_name)[0].offsets() == [8]                # never reused
