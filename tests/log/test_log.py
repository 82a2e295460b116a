"""Logs: ownership by fencing, ordered reads across ledgers, batch commits, cursors, retention."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from bkspark import errors
from bkspark.client import BookKeeper
from bkspark.log import EARLIEST, LATEST, LogStore, Position
from metadata.ledgers import write_ledger


def read_all(logs, name, start=EARLIEST):
    with logs.open_reader(name, start, tail=False) as reader:
        return list(reader)


def test_write_roll_and_read_across_ledgers_in_order(logs, log_name):
    with logs.open_writer(log_name, roll_bytes=50) as writer:
        positions = [writer.append(b"record-%03d" % i) for i in range(25)]
    md, _ = logs.get(log_name)
    assert len(md.ledger_ids()) > 3, "roll_bytes=50 should have rolled several times"
    assert all(e.closed for e in md.ledgers)
    records = read_all(logs, log_name)
    assert [r.data for r in records] == [b"record-%03d" % i for i in range(25)]
    assert [r.position for r in records] == positions
    # reading from a position starts exactly there
    assert [r.data for r in read_all(logs, log_name, positions[10])] == [b"record-%03d" % i for i in range(10, 25)]


def test_second_writer_fences_the_first(logs, log_name):
    first = logs.open_writer(log_name)
    acked_first = [first.append(b"a%d" % i) for i in range(5)]
    second = logs.open_writer(log_name)
    with pytest.raises(errors.LogFencedError):
        first.append(b"after-takeover")
    second.append(b"b0")
    second.close()
    data = [r.data for r in read_all(logs, log_name)]
    assert data == [b"a%d" % i for i in range(5)] + [b"b0"]
    assert second.epoch == first.epoch + 1
    assert len(acked_first) == 5


def test_two_writers_racing_exactly_one_keeps_writing(logs, log_name):
    logs.create(log_name)
    acked = {0: [], 1: []}
    attempted = {0: [], 1: []}
    fenced = {}
    barrier = threading.Barrier(2)

    def run(i):
        barrier.wait()
        try:
            writer = logs.open_writer(log_name)
        except errors.BKError as exc:
            fenced[i] = exc
            return
        try:
            for n in range(40):
                attempted[i].append(b"w%d-%d" % (i, n))
                writer.append(b"w%d-%d" % (i, n))
                acked[i].append(b"w%d-%d" % (i, n))
                time.sleep(0.005)
            writer.close()
        except errors.LogFencedError as exc:
            fenced[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    survivors = [i for i in (0, 1) if i not in fenced]
    assert len(survivors) == 1, f"exactly one writer must survive, fenced={fenced}"
    data = [r.data for r in read_all(logs, log_name)]
    for i in (0, 1):
        in_log = [d for d in data if d.startswith(b"w%d-" % i)]
        # every acknowledged entry is in the log, in order; an append that failed with a
        # fenced error may or may not be (the seed: "LedgerFenced should be treated like a
        # timeout"), but nothing attempted after the fencing error is
        assert in_log[:len(acked[i])] == acked[i]
        assert in_log == attempted[i][:len(in_log)]
    assert data == sorted(data, key=lambda d: (d.split(b"-")[0] != data[0].split(b"-")[0],)), \
        "one writer's entries come entirely before the other's"


def test_new_writer_fences_the_last_two_ledgers(logs, bk, log_name):
    """A writer may still write the second-to-last ledger while adding the last (seed)."""
    logs.create(log_name)
    older = bk.create_ledger(3, 2, 2, password=b"pw")
    newer = bk.create_ledger(3, 2, 2, password=b"pw")
    older.append(b"old-0")
    newer.append(b"new-0")
    logs.update(log_name, lambda edit: (edit.append(older.ledger_id, state="open"),
                                        edit.append(newer.ledger_id, state="open")))
    writer = logs.open_writer(log_name)
    for handle in (older, newer):
        with pytest.raises((errors.FencedError, errors.LedgerClosedError)):
            handle.append(b"late")
    writer.append(b"w-0")
    writer.close()
    assert [r.data for r in read_all(logs, log_name)] == [b"old-0", b"new-0", b"w-0"]


def test_writer_losing_its_ledger_mid_recovery_records_no_end(logs, bk, log_name):
    """Found by the fault runner: a new owner has the writer's ledger IN_RECOVERY, the old
    writer's roll fails to close it, and its close() then must not record an end (the
    metadata's -1 would hide every acknowledged entry of the ledger). The recovering owner
    records the real end."""
    writer = logs.open_writer(log_name)
    acked = [writer.append(b"e%d" % i) for i in range(10)]
    lid = writer.ledger_id
    md, version = bk.ctx.read_metadata(lid)          # a recoverer got as far as IN_RECOVERY
    write_ledger(bk.store, md.with_in_recovery(), version)
    with pytest.raises(errors.LogFencedError):
        writer.roll()
    writer.close()                          # lost: leaves the list alone
    entry = logs.get(log_name)[0].ledgers[-1]
    assert entry.to_dict() == {"ledger_id": lid, "state": "open", "offset": 0, "byte_offset": 0}
    with pytest.raises(errors.FencedError):  # a failed close stays failed
        writer._handle.close()
    with logs.open_writer(log_name) as new:   # recovers the ledger at its real end
        new.append(b"after")
    assert [r.data for r in read_all(logs, log_name)] == [b"e%d" % i for i in range(10)] + [b"after"]
    assert [p.entry_id for p in acked] == list(range(10))


WRITER_SCRIPT = r"""
import sys
from bkspark.client import BookKeeper
from bkspark.log import LogStore
uri, name = sys.argv[1], sys.argv[2]
bk = BookKeeper(uri)
logs = LogStore(bk, password=b"pw")
w = logs.open_writer(name)
i = 0
while True:
    w.append(b"crash-%d" % i)
    print(i, flush=True)
    i += 1
"""


def test_writer_crash_mid_ledger_then_new_writer(cluster, logs, log_name):
    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, cluster.metadata_uri, log_name],
                            stdout=subprocess.PIPE, text=True)
    acked = []
    for line in proc.stdout:
        acked.append(int(line))
        if len(acked) >= 50:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with logs.open_writer(log_name) as writer:
        writer.append(b"after-crash")
    data = [r.data for r in read_all(logs, log_name)]
    crashed = [d for d in data if d.startswith(b"crash-")]
    assert crashed[:len(acked)] == [b"crash-%d" % i for i in acked], "an acknowledged entry was lost"
    assert crashed == [b"crash-%d" % i for i in range(len(crashed))]
    assert data[-1] == b"after-crash"


def test_replayed_multi_ledger_append_is_a_no_op(logs, bk, log_name):
    def ledger_with(*values):
        handle = bk.create_ledger(3, 2, 2, password=b"pw")
        for v in values:
            handle.append(v)
        handle.close()
        return handle.ledger_id

    first = [ledger_with(b"a", b"b"), ledger_with(b"c")]
    assert logs.append_ledgers(log_name, first, writer_id="job-1", sequence=0)
    replay = [ledger_with(b"a", b"b"), ledger_with(b"c")]
    assert not logs.append_ledgers(log_name, replay, writer_id="job-1", sequence=0)
    assert logs.append_ledgers(log_name, [ledger_with(b"d")], writer_id="job-1", sequence=1)
    assert [r.data for r in read_all(logs, log_name)] == [b"a", b"b", b"c", b"d"]
    assert logs.get(log_name)[0].ledger_ids()[:2] == first
    for lid in replay:                      # the duplicate ledgers were deleted
        with pytest.raises(errors.NoSuchLedgerError):
            bk.open_ledger(lid, password=b"pw", recovery=False)
    # a superseded owner (older epoch) cannot commit
    assert logs.append_ledgers(log_name, [ledger_with(b"e")], writer_id="q", sequence=0, epoch=2)
    with pytest.raises(errors.LogFencedError):
        logs.append_ledgers(log_name, [ledger_with(b"f")], writer_id="q", sequence=1, epoch=1)


def test_overwrite_replaces_the_list_and_deletes_old_ledgers(logs, bk, log_name):
    with logs.open_writer(log_name) as w:
        w.append(b"old")
    old_ids = logs.get(log_name)[0].ledger_ids()
    handle = bk.create_ledger(3, 2, 2, password=b"pw")
    handle.append(b"new")
    handle.close()
    assert logs.overwrite(log_name, [handle.ledger_id])
    assert [r.data for r in read_all(logs, log_name)] == [b"new"]
    for lid in old_ids:
        with pytest.raises(errors.NoSuchLedgerError):
            bk.open_ledger(lid, password=b"pw", recovery=False)


def test_truncation_is_bounded_by_the_slowest_cursor(logs, log_name):
    with logs.open_writer(log_name, roll_bytes=1) as w:
        positions = [w.append(b"r%d" % i) for i in range(6)]
    ids = logs.get(log_name)[0].ledger_ids()
    logs.commit_cursor(log_name, "slow", positions[1])
    logs.commit_cursor(log_name, "fast", positions[4])
    lags = logs.cursor_lags(log_name)
    assert lags["slow"][1] == 5 and lags["fast"][1] == 2
    with pytest.raises(errors.BadRequestError, match="slow"):
        logs.truncate(log_name, positions[3])
    removed = logs.truncate(log_name, positions[1])
    assert removed == ids[:ids.index(positions[1].ledger_id)]
    assert [r.data for r in read_all(logs, log_name)][0] == b"r1"
    assert logs.truncate(log_name, positions[3], force=True)
    assert [r.data for r in read_all(logs, log_name)] == [b"r3", b"r4", b"r5"]


def test_reader_tails_the_open_ledger_without_fencing(logs, log_name):
    writer = logs.open_writer(log_name)
    writer.append(b"t0")
    got = []
    reader = logs.open_reader(log_name, EARLIEST, idle_timeout=None)

    def consume():
        for record in reader:
            got.append(record.data)
            if len(got) == 5:
                return

    thread = threading.Thread(target=consume)
    thread.start()
    for i in range(1, 6):
        writer.append(b"t%d" % i)
        time.sleep(0.05)
    thread.join(60)
    assert got == [b"t0", b"t1", b"t2", b"t3", b"t4"]
    writer.append(b"t6")       # the writer was never fenced by the tailing reader
    writer.close()
    reader.close()


def test_lone_record_reaches_a_tailing_reader_of_another_client(cluster, logs, log_name):
    """A trickle writer appends one record at a time and stays idle (its periodic explicit
    LAC 30 s away): a tailing reader of another client returns each within one read_batch
    wait -- the writer sent its LAC once its add stream went idle."""
    with BookKeeper(cluster.metadata_uri, explicit_lac_interval=30) as writer_bk:
        writer = LogStore(writer_bk, password=b"pw", ensemble_size=3, write_quorum=2,
                          ack_quorum=2).open_writer(log_name)
        with logs.open_reader(log_name, EARLIEST, tail=True) as reader:
            assert reader.read_batch(timeout=0.1) == []
            for i in range(3):
                position = writer.append(b"lone-%d" % i)
                got = reader.read_batch(timeout=8)
                assert [(r.position, r.data) for r in got] == [(position, b"lone-%d" % i)]
        writer.close()


def test_flush_makes_the_last_record_visible_at_once(cluster, logs, log_name):
    """LogWriter.flush publishes the ledger's LAC before it returns: with the delayed send off
    and the periodic one 30 s away, a reader of another client sees every record right
    after it."""
    with BookKeeper(cluster.metadata_uri, explicit_lac_delay=0,
                    explicit_lac_interval=30) as writer_bk:
        writer = LogStore(writer_bk, password=b"pw", ensemble_size=3, write_quorum=2,
                          ack_quorum=2).open_writer(log_name)
        assert writer.flush() is None                       # nothing appended yet
        futures = [writer.append_async(b"f%d" % i) for i in range(3)]
        assert writer.flush(30) == futures[-1].result()
        assert [r.data for r in read_all(logs, log_name)] == [b"f0", b"f1", b"f2"]
        writer.close()
        with pytest.raises(errors.BadRequestError, match="closed"):
            writer.flush()


def test_latest_starts_after_existing_entries(logs, log_name):
    with logs.open_writer(log_name) as w:
        w.append(b"x")
    start = logs.resolve(log_name, LATEST)
    with logs.open_writer(log_name) as w:
        w.append(b"y")
    assert [r.data for r in read_all(logs, log_name, start)] == [b"y"]


def test_bad_names_and_missing_logs(logs):
    with pytest.raises(errors.BadRequestError, match="invalid log name"):
        logs.open_writer("../etc")
    with pytest.raises(errors.NoSuchLogError):
        logs.get("never-created")


# ---- a tailing reader follows rolls and takeovers (issue 27, item 4) ----------------------
#
# A tailing reader of the open ledger only sees entries up to the LAC it learned, which
# trails the writer's last acknowledged entry (an entry carries the LAC of the entries before
# it). When the ledger is closed -- by a roll, or by a new writer's recovery -- its end is
# the closed metadata's last entry, beyond that LAC: the reader must return the rest, exactly
# once, and then go on in the next ledger of the list.

def step_until_caught_up(reader, got, want, timeout=60.0):
    """Step a tailing reader until it has returned at least ``want`` records and then found
    nothing more to read (it waits at the LAC it knows)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = reader.read_batch(timeout=0.1)
        got.extend(batch)
        if not batch and len(got) >= want:
            return
    raise AssertionError(f"the reader did not catch up: {len(got)} of {want} records")


def step_until(reader, got, want, timeout=60.0):
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got.extend(reader.read_batch(timeout=0.1))
    assert len(got) >= want, f"the reader returned {len(got)} of {want} records"


def visible_at_least(acked, in_current_ledger):
    """Records a caught-up reader has surely returned: all but the current ledger's last
    acknowledged one (the LAC it can learn may trail it by one)."""
    return len(acked) - (1 if in_current_ledger else 0)


def assert_exactly_once_in_order(got, acked):
    assert [r.data for r in got] == [data for data, _ in acked]
    assert [r.position for r in got] == [position for _, position in acked]


@pytest.mark.parametrize("change", ["roll", "takeover"])
def test_caught_up_tailing_reader_follows_rolls_and_takeovers(logs, log_name, change):
    """The reader is stepped (read_batch with a short wait), caught up with the open ledger
    before each change: 10 rolls, or 5 takeovers by a new writer, some of them of ledgers
    closed empty."""
    counts = [3, 1, 0, 5, 2, 0, 4, 1, 3, 2] if change == "roll" else [2, 0, 3, 1, 4]
    writer = logs.open_writer(log_name)
    reader = logs.open_reader(log_name, EARLIEST, tail=True)
    acked, got = [], []
    try:
        for round_, count in enumerate(counts):
            for i in range(count):
                data = b"%s-%d-%d" % (change.encode(), round_, i)
                acked.append((data, writer.append(data)))
            step_until_caught_up(reader, got, visible_at_least(acked, count > 0))
            if change == "roll":
                writer.roll()
            else:
                writer = logs.open_writer(log_name)     # fences and recovers the old ledger
            step_until(reader, got, len(acked))         # the rest of the closed ledger
            assert_exactly_once_in_order(got, acked)
        writer.append(b"last")
        acked.append((b"last", Position(writer.ledger_id, 0)))
        writer.close()
        step_until(reader, got, len(acked))
        assert reader.read_batch(timeout=0.1) == []
        assert_exactly_once_in_order(got, acked)
        assert len(logs.get(log_name)[0].ledger_ids()) == len(counts) + 1
    finally:
        reader.close()


class TailingConsumer:
    """A tailing reader iterated in a thread (blocked in its long-poll when caught up) until it
    has returned ``expected`` records or failed."""

    def __init__(self, reader, expected):
        self.reader, self.expected = reader, expected
        self.got, self.error = [], None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            for record in self.reader:
                with self._cond:
                    self.got.append(record)
                    self._cond.notify_all()
                    if len(self.got) >= self.expected:
                        return
        except BaseException as exc:  # noqa: BLE001 - reported by wait_for
            with self._cond:
                self.error = exc
                self._cond.notify_all()

    def wait_for(self, count, timeout=60.0):
        with self._cond:
            self._cond.wait_for(lambda: self.error is not None or len(self.got) >= count, timeout)
            if self.error is not None:
                raise AssertionError(f"the tailing reader failed: {self.error!r}") from self.error
            assert len(self.got) >= count, f"the reader returned {len(self.got)} of {count} records"

    def join(self, timeout=60.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive()
        if self.error is not None:
            raise AssertionError(f"the tailing reader failed: {self.error!r}") from self.error


def test_iterating_tailing_reader_follows_rolls_and_takeovers(logs, log_name):
    """The reader iterates in a thread, waiting at the tail, while the log is rolled and taken
    over in turns (the reader caught up before each change)."""
    changes = ["roll", "takeover", "roll", "roll", "takeover", "takeover", "roll", "takeover"]
    counts = [2, 3, 0, 1, 4, 0, 2, 1]
    writer = logs.open_writer(log_name)
    acked = []
    expected = sum(counts) + 1
    with logs.open_reader(log_name, EARLIEST, tail=True) as reader:
        consumer = TailingConsumer(reader, expected)
        for round_, (change, count) in enumerate(zip(changes, counts)):
            for i in range(count):
                data = b"r%d-%d" % (round_, i)
                acked.append((data, writer.append(data)))
            consumer.wait_for(visible_at_least(acked, count > 0))
            if change == "roll":
                writer.roll()
            else:
                writer = logs.open_writer(log_name)
            consumer.wait_for(len(acked))
        writer.append(b"last")
        acked.append((b"last", Position(writer.ledger_id, 0)))
        writer.close()
        consumer.join()
    assert_exactly_once_in_order(consumer.got, acked)


def test_roll_right_after_the_reader_read_the_last_entry(cluster, logs, log_name):
    """The reader has read the very last entry of the open ledger (the writer published its LAC)
    and waits for more when the writer rolls; it goes on in the new ledger."""
    with BookKeeper(cluster.metadata_uri, explicit_lac_interval=0.05) as writer_bk:
        writer_logs = LogStore(writer_bk, password=b"pw", ensemble_size=3, write_quorum=2,
                               ack_quorum=2)
        writer = writer_logs.open_writer(log_name)
        acked = []
        rounds = 4
        with logs.open_reader(log_name, EARLIEST, tail=True) as reader:
            consumer = TailingConsumer(reader, 2 * rounds + 1)
            for round_ in range(rounds):
                for i in range(2):
                    data = b"e%d-%d" % (round_, i)
                    acked.append((data, writer.append(data)))
                consumer.wait_for(len(acked))   # all of it: the idle writer wrote its LAC
                writer.roll()
            writer.append(b"last")
            acked.append((b"last", Position(writer.ledger_id, 0)))
            writer.close()
            consumer.join()
    assert_exactly_once_in_order(consumer.got, acked)


def test_tailing_reader_through_a_recovery_and_an_unlisted_close(logs, bk, log_name):
    """The reader keeps polling a ledger a new owner is recovering (IN_RECOVERY, fenced: reads
    still work) and returns its rest once the takeover closed it; it also reads a ledger up to
    the end its metadata says CLOSED before the list records it (its writer stopped between
    the close and the list update), then goes on when a new writer lists the next ledger."""
    writer = logs.open_writer(log_name)
    acked = [(d, writer.append(d)) for d in (b"a0", b"a1", b"a2")]
    got = []
    with logs.open_reader(log_name, EARLIEST, tail=True) as reader:
        step_until_caught_up(reader, got, visible_at_least(acked, True))
        md, version = bk.ctx.read_metadata(writer.ledger_id)         # a recoverer got as far as this
        write_ledger(bk.store, md.with_in_recovery(), version)
        for _ in range(3):
            got.extend(reader.read_batch(timeout=0.1))
        assert [r.data for r in got] == [d for d, _ in acked][:len(got)]
        second = logs.open_writer(log_name)                 # completes the recovery
        acked += [(d, second.append(d)) for d in (b"b0", b"b1")]
        step_until_caught_up(reader, got, visible_at_least(acked, True))
        second._handle.close()                              # CLOSED, the list still says open
        assert logs.get(log_name)[0].ledgers[-1].state == "open"
        step_until(reader, got, len(acked))                 # b1, beyond the LAC it saw
        assert_exactly_once_in_order(got, acked)
        third = logs.open_writer(log_name)
        acked.append((b"c0", third.append(b"c0")))
        third.close()
        step_until(reader, got, len(acked))
        assert reader.read_batch(timeout=0.1) == []
    assert_exactly_once_in_order(got, acked)
