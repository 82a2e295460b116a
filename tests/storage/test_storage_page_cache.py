"""Entry logs and the page cache (StorageConfig.entry_log_page_cache).

By default written-back entry-log pages leave the page cache and flushed entries are read with
O_DIRECT, neighbours sharing one aligned read; with the page cache kept, reads go through it.
Both read paths must return the same bytes for every range: records spread over several logs,
interleaved ledgers (gaps between a ledger's records), a record larger than one direct read,
and after a reopen (logs opened from disk).
"""
import ctypes
import glob
import mmap
import os
import random

import pytest

from bkspark.bookie.storage import Storage, StorageConfig

_libc = ctypes.CDLL(None, use_errno=True)


def make(d, page_cache, **kw):
    return Storage(StorageConfig(journal_dir=os.path.join(d, "j"), ledger_dirs=[os.path.join(d, "l")],
                                 entry_log_page_cache=page_cache, checkpoint_interval_s=3600, **kw))


def body(lid, e):
    if (lid, e) == (2, 17):
        return bytes([e % 251]) * (9 << 20)      # larger than one direct read (4 MiB)
    n = (lid * 7919 + e * 104729) % 70000
    return (b"%d:%d|" % (lid, e)) * (n // 8 + 1)


def populate(s):
    """Three ledgers, added in interleaved batches (each ledger's records have others between them)."""
    want = {}
    for step in range(40):
        for lid in (1, 2, 3):
            batch = [(lid, e, b"k", False, body(lid, e)) for e in range(step * 2, step * 2 + 2)]
            assert s.add_entries(batch) == [0] * len(batch)
            want.update({(lid, e): b for lid, e, _k, _r, b in batch})
    return want


def resident_fraction(path):
    """Fraction of the file's pages in the page cache (mincore)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        assert _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0, ctypes.get_errno()
        return sum(v & 1 for v in vec) / pages
    finally:
        del addr
        m.close()


def test_direct_and_cached_reads_agree(tmp_path):
    direct = make(str(tmp_path / "direct"), False, entry_log_max_size=1 << 20, write_cache_bytes=8 << 20)
    cached = make(str(tmp_path / "cached"), True, entry_log_max_size=1 << 20, write_cache_bytes=8 << 20)
    stores = [direct, cached]
    try:
        want = populate(direct)
        assert populate(cached) == want
        for s in stores:
            s.checkpoint()          # every entry in an entry log, none left in the write cache
        assert len(glob.glob(str(tmp_path / "direct" / "l" / "*.log"))) > 3
        rnd = random.Random(7)
        buf = bytearray(1 << 20)    # read_range_into's, reused by every read
        for reopen in (False, True):
            if reopen:
                for s in stores:
                    s.close()
                stores = direct, cached = [make(str(tmp_path / "direct"), False),
                                           make(str(tmp_path / "cached"), True)]
            for lid in (1, 2, 3):
                assert [b for _, b in direct.read_range(lid, 0, 79)] == [want[lid, e] for e in range(80)]
            for _ in range(150):
                lid = rnd.randint(1, 3)
                first = rnd.randrange(80)
                last = rnd.randrange(first, 80)
                max_bytes = rnd.choice([1, 50_000, 300_000, 3 << 20, 1 << 40])
                got = direct.read_range(lid, first, last, max_bytes)
                assert got == cached.read_range(lid, first, last, max_bytes)
                assert got and got[0][0] == first
                assert got == [(e, want[lid, e]) for e in range(first, first + len(got))]
                # into one reused buffer: the prefix of got that fits it
                fits, used = [], 0
                for e, b in got:
                    if used + len(b) > len(buf):
                        break
                    fits.append((e, b))
                    used += len(b)
                for s in stores:
                    assert [(e, bytes(b)) for e, b in s.read_range_into(lid, first, last, max_bytes, buf)] == fits
                # strided, as a striped ledger's bookie serves it
                step = rnd.choice([2, 3, 5])
                strided = direct.read_range(lid, first, last, max_bytes, step)
                assert strided == cached.read_range(lid, first, last, max_bytes, step)
                assert strided == [(e, want[lid, e]) for e in range(first, last + 1, step)][:len(strided)]
                assert len(strided) >= 1
            for (lid, e), b in want.items():
                assert direct.read_entry(lid, e) == b
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("page_cache", [False, True])
def test_written_entry_logs_leave_the_page_cache_unless_kept(tmp_path, page_cache):
    s = make(str(tmp_path), page_cache, write_cache_bytes=16 << 20)
    try:
        payload = os.urandom(64 << 10)
        for b in range(4):
            assert s.add_entries([(1, b * 64 + e, b"k", False, payload) for e in range(64)]) == [0] * 64
        s.checkpoint()
        (log,) = glob.glob(str(tmp_path / "l" / "*.log"))
        assert os.path.getsize(log) > 16 << 20
        after_write = resident_fraction(log)
        assert [b for _, b in s.read_range(1, 0, 255)] == [payload] * 256
        after_read = resident_fraction(log)
    finally:
        s.close()
    if page_cache:
        assert after_write > 0.9 and after_read > 0.9
    else:   # dropped once written back; direct reads do not bring them back
        assert after_write < 0.1 and after_read < 0.1, (after_write, after_read)


def small_ledgers(s, first: int, count: int, per: int = 8) -> dict:
    """``count`` ledgers of ``per`` small entries each, flushed into the entry logs."""
    want = {}
    for lid in range(first, first + count):
        batch = [(lid, e, b"k", False, b"%d:%d|" % (lid, e) * 12) for e in range(per)]
        assert s.add_entries(batch) == [0] * per
        want.update({(lid, e): b for lid, e, _k, _r, b in batch})
    s.checkpoint()
    return want


def read_striped(s, lids, want, buf, step=3, per=8):
    """Read each ledger as a striped ledger's bookies are asked for it (every ``step``-th entry
    from each residue), checking every body."""
    for lid in lids:
        for r in range(step):
            got = [(e, bytes(b)) for e, b in s.read_range_into(lid, r, per - 1, 1 << 20, buf, step)]
            assert got == [(e, want[lid, e]) for e in range(r, per, step)]


def test_small_ranges_read_in_order_share_direct_reads(tmp_path):
    """A thread that reads many small neighbouring ranges in order (a task reading small
    ledgers) reads ahead: a few direct reads serve thousands of ranges, each record still
    verified. Without read-ahead each range cost one device read."""
    s = make(str(tmp_path), False, write_cache_bytes=64 << 20)
    try:
        want = small_ledgers(s, 1, 2000)
        buf = bytearray(1 << 20)
        before = s.stats()
        read_striped(s, range(1, 2001), want, buf)
        st = s.stats()
        reads = st["direct_reads"] - before["direct_reads"]
        hits = st["read_ahead_hits"] - before["read_ahead_hits"]
        assert reads < 60 and reads + hits == 6000, (reads, hits)
        # a thread reading at scattered places reads only what it needs: no window
        before = s.stats()
        for lid in random.Random(3).sample(range(1, 2001), 40):
            assert [(e, bytes(b)) for e, b in s.read_range_into(lid, 0, 7, 1 << 20, buf)] == \
                [(e, want[lid, e]) for e in range(8)]
        assert s.stats()["direct_reads"] - before["direct_reads"] >= 30
    finally:
        s.close()


def test_read_ahead_stops_at_what_the_log_held(tmp_path):
    """Entries flushed into the same entry log after a thread read ahead to its end are read
    from the disk, not from the bytes the read-ahead held (taken below the log's written size);
    another storage's log of the same id, and the same storage reopened, are read right by the
    same thread."""
    d = str(tmp_path)
    s = make(d, False, write_cache_bytes=64 << 20, entry_log_max_size=256 << 20)
    try:
        want = small_ledgers(s, 1, 300)
        buf = bytearray(1 << 20)
        read_striped(s, range(1, 301), want, buf)
        want.update(small_ledgers(s, 301, 300))
        assert len(glob.glob(os.path.join(d, "l", "*.log"))) == 1     # appended to the same log
        read_striped(s, range(1, 601), want, buf)
        other = make(str(tmp_path / "other"), False, write_cache_bytes=64 << 20)
        try:        # another storage's log of the same id, read on the same thread
            theirs = {k: v[::-1] for k, v in want.items()}
            for lid in range(1, 601):
                assert other.add_entries([(lid, e, b"k", False, theirs[lid, e])
                                          for e in range(8)]) == [0] * 8
            other.checkpoint()
            for lid in range(1, 601):
                read_striped(other, [lid], theirs, buf)
                read_striped(s, [lid], want, buf)
        finally:
            other.close()
    finally:
        s.close()
    s = make(d, False)
    try:
        read_striped(s, range(1, 601), want, bytearray(1 << 20))
    finally:
        s.close()


def test_a_bad_block_past_what_was_asked_fails_only_the_reads_that_include_it(tmp_path):
    """A read-ahead window that runs into an unreadable block (EIO for any read including it)
    reads again only what was asked: the ledgers before the block read as they did without
    read-ahead, and only those with a record in it fail. (The first read-ahead failed every
    forward read up to ~1 MiB before the block, naming readable entries unreadable.)"""
    import errno

    from bkspark import _native, errors
    from tests.storage.test_storage_corruption import entry_offsets
    d = str(tmp_path)
    s = make(d, False, write_cache_bytes=64 << 20)
    try:
        want = small_ledgers(s, 1, 600)
        offsets = entry_offsets(d)
        _, at, _ = offsets[500, 0]
        page = at // 4096
        in_block = {lid for (lid, _e), (_p, off, ln) in offsets.items()
                    if off // 4096 <= page <= (off + 24 + ln - 1) // 4096}
        assert 500 in in_block and len(in_block) < 10
        _native.io_faults_clear()
        _native.io_fault("read", ".log", errno.EIO, times=-1, at=at)
        failed = set()
        buf = bytearray(1 << 20)
        for lid in range(1, 601):
            for r in range(3):
                expect = [(e, want[lid, e]) for e in range(r, 8, 3)]
                try:
                    got = [(e, bytes(b)) for e, b in s.read_range_into(lid, r, 7, 1 << 20, buf, 3)]
                except errors.BookieIOError:
                    failed.add(lid)
                    continue
                if got != expect:       # served up to the bad block (the next read fails)
                    assert got and got == expect[:len(got)]
                    failed.add(lid)
        assert failed and failed <= in_block, (sorted(failed), sorted(in_block))
    finally:
        _native.io_faults_clear()
        s.close()


def test_a_thread_reading_backwards_or_skipping_reads_little_more_than_it_asks(tmp_path):
    """Only a thread moving forward reads ahead, and a window that served nothing stops: reading
    ledgers in descending order, or at random, reads about the log once, not a window per read
    (the first read-ahead read ~1 MiB a read going backwards: 456 MiB for a 3 MiB log)."""
    d = str(tmp_path)
    s = make(d, False, write_cache_bytes=64 << 20)
    try:
        want = small_ledgers(s, 1, 2000)
        (log,) = glob.glob(os.path.join(d, "l", "*.log"))
        size = os.path.getsize(log)
        buf = bytearray(1 << 20)
        for order in (range(2000, 0, -1), random.Random(5).sample(range(1, 2001), 2000)):
            before = s.stats()["direct_read_bytes"]
            for lid in order:
                assert [(e, bytes(b)) for e, b in s.read_range_into(lid, 0, 7, 1 << 20, buf)] == \
                    [(e, want[lid, e]) for e in range(8)]
            read = s.stats()["direct_read_bytes"] - before
            print(f"{read / 2000:.0f} bytes a read, log {size}")
            assert read < 2000 * (12 << 10), read   # (a 4 KiB page per read at least, either way)
        before = s.stats()["direct_read_bytes"]
        read_striped(s, range(1, 2001), want, buf)
        assert s.stats()["direct_read_bytes"] - before < 2 * size     # forward: once, about
    finally:
        s.close()
