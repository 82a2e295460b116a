"""Flush path: records written straight from the write cache, run-merge ordering, flushes that do
not fdatasync (the mark does not move), the 3-stream CRC32C."""
import random
import time

import crc32c as ref_crc32c

import bkspark._native as native
from bkspark.bookie.storage import Storage, StorageConfig


def make(d, **kw):
    cfg = StorageConfig(journal_dir=str(d / "journal"), ledger_dirs=[str(d / "l0"), str(d / "l1")], **kw)
    return Storage(cfg)


def test_crc32c_three_stream_boundaries():
    rnd = random.Random(11)
    for n in (767, 768, 769, 775, 776, 1040, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 1, 3 * 8192 + 769,
              6 * 8192 + 3 * 256 + 13, 1 << 20, (1 << 20) + 7):
        data = rnd.randbytes(n + 8)
        for off in (0, 1, 5):
            chunk = data[off:off + n]
            want = ref_crc32c.crc32c(chunk)
            assert native.crc32c(chunk) == want, (n, off)
            seed = rnd.randrange(1 << 32)
            assert native.crc32c(chunk, seed) == ref_crc32c.crc32c(chunk, seed), (n, off)


def _body(lid, e, gen):
    return (b"%d/%d/%d|" % (lid, e, gen)) * ((lid * 31 + e * 7 + gen) % 40 + 1)


def test_flush_order_runs_rewrites_and_unsynced_flushes(tmp_path):
    """Interleaved ledgers, increasing and decreasing batches, re-adds of the same entries (runs
    that overlap; with their bytes: an entry is never replaced by others), sparse ids:
    everything reads back from cache, after flushes that did not move the mark (crash-like
    close: no checkpoint, journal replay + uncommitted index blocks), and after a full
    checkpoint."""
    rnd = random.Random(5)
    want = {}
    s = make(tmp_path, write_cache_bytes=256 << 10, checkpoint_interval_s=3600, entry_log_max_size=128 << 10)
    try:
        nxt = {lid: 0 for lid in range(1, 6)}
        for step in range(300):
            lid = rnd.randrange(1, 6)
            kind = rnd.random()
            if kind < 0.6:  # a run of increasing entries
                ids = list(range(nxt[lid], nxt[lid] + rnd.randint(1, 30)))
                nxt[lid] = ids[-1] + 1
            elif kind < 0.8:  # decreasing ids in one batch
                ids = list(range(nxt[lid] + rnd.randint(1, 20), nxt[lid] - 1, -1))
                nxt[lid] = max(ids) + 1
            else:  # re-add (recovery) of earlier entries, possibly in the same cache half
                lo = rnd.randrange(0, max(1, nxt[lid]))
                ids = list(range(lo, min(nxt[lid], lo + rnd.randint(1, 10))))
            if not ids:
                continue
            batch = [(lid, e, b"k", True, want.get((lid, e)) or _body(lid, e, step))
                     for e in ids]
            assert s.add_entries(batch) == [0] * len(batch)
            for _, e, _, _, body in batch:
                want[(lid, e)] = body
            if step % 50 == 0:
                for (l, e), b in rnd.sample(sorted(want.items()), min(20, len(want))):
                    assert s.read_entry(l, e) == b
        st = s.stats()
        assert st["flushes"] >= 3, st
        for (l, e), b in want.items():
            assert s.read_entry(l, e) == b
    finally:
        s._store.close(checkpoint=False)  # as after a crash: recent flushes were never fdatasync'ed
    s = make(tmp_path, write_cache_bytes=256 << 10, checkpoint_interval_s=3600, entry_log_max_size=128 << 10)
    try:
        for (l, e), b in want.items():
            assert s.read_entry(l, e) == b, (l, e)
        for lid in range(1, 6):
            got = [e for a, b in s.list_entries(lid) for e in range(a, b + 1)]
            assert got == sorted(e for (l, e) in want if l == lid)
        s.checkpoint()
    finally:
        s.close()
    s = make(tmp_path)
    try:
        assert s.stats()["replayed_records"] == 0
        for (l, e), b in want.items():
            assert s.read_entry(l, e) == b, (l, e)
    finally:
        s.close()


def test_crc32c_combine_matches_concatenation():
    """The journal's record and group checksums are combined from the entry-log crc (no second
    pass over the body); the combine must equal the crc of the concatenation."""
    rnd = random.Random(13)
    for _ in range(500):
        a = rnd.randbytes(rnd.randrange(0, 3000))
        b = rnd.randbytes(rnd.choice([0, 1, 12, 1040, rnd.randrange(0, 200000)]))
        assert native.crc32c_combine(ref_crc32c.crc32c(a), ref_crc32c.crc32c(b), len(b)) == ref_crc32c.crc32c(a + b)


def test_threshold_flushes_are_paced_and_hurry_when_the_cache_fills(tmp_path):
    """A flush started by the fill threshold spreads its writes (paced_flushes counts them); when
    adds fill the active half to the threshold meanwhile, the flush stops pacing (hurried_flushes)
    rather than make them wait out its budget. Every entry reads back, before and after a
    reopen."""
    s = make(tmp_path, write_cache_bytes=8 << 20, checkpoint_interval_s=3600)
    want = {}
    body = lambda e: (b"%08d" % e) * (8 << 10)  # noqa: E731  (64 KiB)

    def add(first, n):
        batch = [(7, e, b"k", True, body(e)) for e in range(first, first + n)]
        assert s.add_entries(batch) == [0] * n
        want.update((e, body(e)) for e in range(first, first + n))
        return first + n

    try:
        nxt = 0
        # slow fills: the first threshold flush has no fill time to pace by, the later ones do
        while s.stats()["paced_flushes"] < 2:
            nxt = add(nxt, 1)
            time.sleep(0.005)
            assert nxt < 2000, s.stats()
        # idle long enough that the next flush's budget is the full second, then flood
        time.sleep(2.5)
        while s.stats()["hurried_flushes"] < 1:
            nxt = add(nxt, 16)
            assert nxt < 4000, s.stats()
        assert s.stats()["background_errors"] == 0
        for e, b in want.items():
            assert s.read_entry(7, e) == b, e
    finally:
        s.close()
    s = make(tmp_path)
    try:
        for e, b in want.items():
            assert s.read_entry(7, e) == b, e
    finally:
        s.close()


def test_checkpoint_during_a_paced_flush_makes_it_hurry(tmp_path):
    """An explicit checkpoint() does not wait out a paced flush's budget: the flush stops pacing
    (hurried_flushes) and the checkpoint then makes everything durable (no replay on reopen)."""
    s = make(tmp_path, write_cache_bytes=8 << 20, checkpoint_interval_s=3600)
    body = lambda e: (b"%08d" % e) * (8 << 10)  # noqa: E731  (64 KiB)
    nxt = 0
    try:
        while s.stats()["paced_flushes"] < 1:       # a first (unpaced) flush sets the fill clock
            assert s.add_entries([(9, nxt, b"k", True, body(nxt))]) == [0]
            nxt += 1
            time.sleep(0.002)
            assert nxt < 2000, s.stats()
        time.sleep(2.5)                 # the next threshold flush gets the full second's budget
        before = s.stats()
        batch = [(9, e, b"k", True, body(e)) for e in range(nxt, nxt + 40)]     # 2.5 MiB
        assert s.add_entries(batch) == [0] * 40
        nxt += 40
        deadline = time.monotonic() + 10
        while s.stats()["paced_flushes"] == before["paced_flushes"]:
            assert time.monotonic() < deadline, "no paced flush started"
            time.sleep(0.001)
        s.checkpoint()
        st = s.stats()
        assert st["hurried_flushes"] == before["hurried_flushes"] + 1, st
    finally:
        s.close()
    s = make(tmp_path)
    try:
        assert s.stats()["replayed_records"] == 0
        for e in range(nxt):
            assert s.read_entry(9, e) == body(e), e
    finally:
        s.close()
