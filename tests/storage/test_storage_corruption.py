"""Random bytes, truncations and bit flips in journals, entry logs, indexes and state files.

Opening either succeeds or raises BookieIOError with a clear message; an entry the index holds
but whose bytes are damaged reads as BookieIOError -- never NoSuchEntryError.
"""
import glob
import os
import random
import shutil
import struct

import pytest

from bkspark import errors
from bkspark.bookie.storage import Storage, StorageConfig


def cfg(d, **kw):
    return StorageConfig(journal_dir=os.path.join(d, "j"), ledger_dirs=[os.path.join(d, "l")], journal_max_size_mb=1, **kw)


def body(l, e):
    return bytes([(l * 31 + e) % 251]) * (50 + (e * 37) % 400) + f"{l}/{e}".encode()


def populate(d, n=60, checkpoint=False):
    s = Storage(cfg(d))
    for lid in (1, 2):
        s.add_entries([(lid, e, b"k", False, body(lid, e)) for e in range(n)])
    s.fence(2, b"k")
    if checkpoint:
        s.checkpoint()
        s.close()
    else:
        s._store.close(checkpoint=False)  # everything since the open-time checkpoint is only in the journal


def parse_journal(path):
    """Reference reader of the journal format (bookie_native/README.md).

    Returns the valid groups from the start: [(group_start, group_end, [(type, payload), ...])].
    """
    import crc32c
    data = open(path, "rb").read()
    assert data[:4] == b"BKSJ" and struct.unpack_from("<I", data, 20)[0] == crc32c.crc32c(data[:20])
    jid = data[8:16]
    off = 512
    groups = []
    while off + 24 <= len(data):
        magic, ln, crc, goff, hcrc = struct.unpack_from("<4sIIQI", data, off)
        if magic != b"BKSG" or goff != off or hcrc != crc32c.crc32c(jid + data[off:off + 20]) \
                or off + 24 + ln > len(data) or crc32c.crc32c(data[off + 24:off + 24 + ln]) != crc:
            break
        recs = []
        r, end = off + 24, off + 24 + ln
        while r < end:
            rl, typ, rcrc = struct.unpack_from("<III", data, r)
            assert crc32c.crc32c(data[r:r + 8] + data[r + 12:r + 12 + rl]) == rcrc
            recs.append((typ, data[r + 12:r + 12 + rl]))
            r += 12 + rl
        groups.append((off, end, recs))
        off = end
    return groups


def newest_journal(d):
    js = sorted(glob.glob(os.path.join(d, "j", "*.txn")))
    for p in reversed(js):
        if os.path.getsize(p) > 512 and parse_journal(p):
            return p
    raise AssertionError("no journal with records")


SECTOR = 512  # what a torn write leaves unwritten: whole sectors, still reading as zeros


def tear(path, group_start, sectors):
    """Zero the given 512-byte sectors of a group at ``group_start``: what a crash leaves of a
    group whose write reached the disk only in part (the journal's space is zeroed ahead, and the
    bytes before the group belong to the previous, synced one)."""
    with open(path, "r+b") as f:
        for n in sectors:
            lo = max(n * SECTOR, group_start)
            f.seek(lo)
            f.write(bytes((n + 1) * SECTOR - lo))


def flip(path, at, bit=0x10):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ bit]))


def test_journal_reference_parser_sees_adds(tmp_path):
    d = str(tmp_path)
    populate(d, n=10)
    groups = parse_journal(newest_journal(d))
    recs = [r for g in groups for r in g[2]]
    adds = [(struct.unpack_from("<Qq", p)) for t, p in recs if t == 1]
    assert sorted(adds) == sorted([(l, e) for l in (1, 2) for e in range(10)])
    assert any(t == 3 for t, _ in recs)  # fence record
    assert any(t == 2 for t, _ in recs)  # master key record


@pytest.mark.parametrize("seed", range(4))
def test_journal_fuzz(tmp_path, seed):
    rnd = random.Random(seed)
    base = str(tmp_path / "base")
    populate(base, n=40)
    jpath = newest_journal(base)
    groups = parse_journal(jpath)
    assert len(groups) >= 2
    size = os.path.getsize(jpath)
    for it in range(12):
        d = str(tmp_path / f"c{it}")
        shutil.copytree(base, d)
        p = os.path.join(d, "j", os.path.basename(jpath))
        data = bytearray(open(p, "rb").read())
        kind = rnd.choice(["flip", "truncate", "garbage", "zeros", "badlen", "append"])
        at = rnd.randrange(512, groups[-1][1])
        if kind == "flip":
            data[at] ^= 1 << rnd.randrange(8)
        elif kind == "truncate":
            del data[at:]
        elif kind == "garbage":
            n = rnd.randint(1, 5000)
            data[at:at + n] = rnd.randbytes(n)
        elif kind == "zeros":
            n = rnd.randint(1, 5000)
            data[at:at + n] = bytes(n)
        elif kind == "badlen":
            at = rnd.choice([g[0] for g in groups])  # a group's length field
            struct.pack_into("<I", data, at + 4, rnd.choice([0xFFFFFFFF, 0x7FFFFFFF, 3, size * 2]))
        else:
            at = groups[-1][1]
            data[at:at] = rnd.randbytes(rnd.randint(1, 3000))
        open(p, "wb").write(bytes(data))
        try:
            s = Storage(cfg(d))
        except errors.BookieIOError as e:  # a synced group damaged, not torn (README, "Replay")
            assert "journal" in str(e) and "refusing to start" in str(e), str(e)
            assert kind != "truncate", (kind, at, str(e))  # a cut-off file is what a tear leaves
            continue
        assert kind not in ("flip", "badlen"), (kind, at)  # a written group that fails its checksum
        try:
            intact = {struct.unpack_from("<Qq", pl) for g in groups if g[1] <= at for t, pl in g[2] if t == 1}
            fence_ok = any(t == 3 for g in groups if g[1] <= at for t, _ in g[2])
            for lid in (1, 2):
                for e in range(40):
                    try:
                        got = s.read_entry(lid, e)
                        assert got == body(lid, e), (kind, lid, e)  # never wrong bytes
                    except errors.NoSuchEntryError:
                        assert (lid, e) not in intact, (kind, at, lid, e)
                    except errors.NoSuchLedgerError:
                        assert not any(x[0] == lid for x in intact), (kind, lid)
            if fence_ok:
                assert s.is_fenced(2)
            # still writable after the repair
            assert s.add_entries([(7, 0, b"z", False, b"after")]) == [0]
        finally:
            s.close()
        s = Storage(cfg(d))  # and reopens cleanly
        assert s.read_entry(7, 0) == b"after"
        s.close()


def test_journal_torn_last_group_is_cut_and_earlier_groups_kept(tmp_path):
    d = str(tmp_path)
    populate(d, n=30)
    jp = newest_journal(d)
    groups = parse_journal(jp)
    last = groups[-1]
    os.truncate(jp, last[0] + (last[1] - last[0]) // 2)  # torn in the middle of the last group
    s = Storage(cfg(d))
    try:
        for g in groups[:-1]:
            for t, pl in g[2]:
                if t == 1:
                    l, e = struct.unpack_from("<Qq", pl)
                    assert s.read_entry(l, e) == body(l, e)
        assert s.stats()["replay_truncated_bytes"] > 0
    finally:
        s.close()


def assert_every_entry_back(d):
    """The 20 entries of newest_in_last_group all read back intact."""
    s = Storage(cfg(d))
    try:
        for e in range(20):
            assert s.read_entry(1, e) == body(1, e)
    finally:
        s.close()


def newest_in_last_group(d):
    """Ledger 1's entries 0-9 in one group, 10-19 in the last one; the LastLogMark below both
    (closed without a checkpoint, as a kill leaves it): entries 10-19 exist only in that group."""
    s = Storage(cfg(d))
    s.add_entries([(1, e, b"k", False, body(1, e)) for e in range(10)])
    s.add_entries([(1, e, b"k", False, body(1, e)) for e in range(10, 20)])
    s._store.close(checkpoint=False)
    jp = newest_journal(d)
    groups = parse_journal(jp)
    last = groups[-1]
    assert sorted(struct.unpack_from("<Qq", pl)[1] for t, pl in last[2] if t == 1) == list(range(10, 20))
    assert last[1] - last[0] > 4 * SECTOR
    return jp, groups


def assert_refused_naming(d, jp, offset):
    with pytest.raises(errors.BookieIOError, match="refusing to start") as ex:
        Storage(cfg(d))
    msg = str(ex.value)
    assert jp in msg and f"offset {offset}" in msg, msg
    return msg


@pytest.mark.parametrize("where", ["record body", "record header", "group checksum", "magic", "length"])
def test_journal_bitflip_in_last_group_refuses_start_and_cuts_nothing(tmp_path, where):
    # A bit flip in the last group is corruption, not a torn write: the bookie had acknowledged
    # that group's entries, and they exist nowhere else.  Opening must refuse (an unknown answer)
    # rather than cut the group and answer NoSuchEntry for them.
    d = str(tmp_path)
    jp, groups = newest_in_last_group(d)
    g0, g1, _ = groups[-1]
    at = {"record body": (g0 + g1) // 2, "record header": g0 + 24 + 1, "group checksum": g0 + 9,
          "magic": g0 + 1, "length": g0 + 5}[where]
    size = os.path.getsize(jp)
    flip(jp, at)
    msg = assert_refused_naming(d, jp, g0)
    assert "torn" in msg
    assert os.path.getsize(jp) == size  # nothing cut: restored, every entry is back
    flip(jp, at)
    assert_every_entry_back(d)


def test_journal_bitflip_in_a_torn_last_group_refuses_start(tmp_path):
    # unwritten sectors explain only the records they overlap: a bad record elsewhere is damage
    d = str(tmp_path)
    jp, groups = newest_in_last_group(d)
    g0, g1, _ = groups[-1]
    tear(jp, g0, [(g1 - 1) // SECTOR])
    flip(jp, g0 + 24 + 12 + 16 + 3)  # the first record's body, in the group's first sector
    assert_refused_naming(d, jp, g0)


@pytest.mark.parametrize("torn", ["suffix", "hole", "header sector", "cut short"])
def test_journal_torn_last_group_is_cut(tmp_path, torn):
    # A crash leaves the sectors of the last group's write that it did not reach as they were:
    # zeros.  Such a group was never acknowledged (its fdatasync did not return): it is cut, and
    # startup goes on with every earlier group.
    d = str(tmp_path)
    jp, groups = newest_in_last_group(d)
    g0, g1, _ = groups[-1]
    first, last = g0 // SECTOR, (g1 - 1) // SECTOR
    if torn == "suffix":
        tear(jp, g0, range(first + 2, last + 1))
    elif torn == "hole":
        tear(jp, g0, [first + 2])
    elif torn == "header sector":
        tear(jp, g0, [first])
    else:
        os.truncate(jp, (first + 3) * SECTOR)
    s = Storage(cfg(d))
    try:
        for e in range(10):
            assert s.read_entry(1, e) == body(1, e)
        for e in range(10, 20):
            with pytest.raises(errors.NoSuchEntryError):
                s.read_entry(1, e)
        assert s.stats()["replay_truncated_bytes"] > 0
        s.add_entries([(1, 10, b"k", False, b"again")])
    finally:
        s.close()
    s = Storage(cfg(d))
    try:
        assert s.read_entry(1, 10) == b"again"
    finally:
        s.close()


def test_journal_bitflip_in_file_header_refuses_start(tmp_path):
    # a file header that fails its checks was never synced only if no group follows it (groups
    # are written once it is); with valid groups after it, it was damaged: skipping the file
    # would drop every record in it
    d = str(tmp_path)
    jp, groups = newest_in_last_group(d)
    flip(jp, 2)
    assert_refused_naming(d, jp, groups[0][0])
    flip(jp, 2)
    assert_every_entry_back(d)


def test_journal_file_with_torn_header_and_no_group_is_skipped(tmp_path):
    # killed while creating a journal file: its header never reached the disk, nothing follows
    d = str(tmp_path)
    jp, groups = newest_in_last_group(d)
    torn = os.path.join(d, "j", "%016x.txn" % (int(os.path.basename(jp)[:16], 16) + 1))
    with open(torn, "wb") as f:
        f.write(bytes(1 << 16))
    assert_every_entry_back(d)


@pytest.mark.parametrize("damage", ["flip", "cut short"])
def test_journal_damage_below_the_last_log_mark_is_cut(tmp_path, damage):
    # the last group's records are in the entry logs once the mark has passed them (a file cut
    # short below the mark, too, lost nothing)
    d = str(tmp_path)
    s = Storage(cfg(d))
    s.add_entries([(1, e, b"k", False, body(1, e)) for e in range(10)])
    s.add_entries([(1, e, b"k", False, body(1, e)) for e in range(10, 20)])
    s.checkpoint()
    s._store.close(checkpoint=False)
    jp = newest_journal(d)
    g0, g1, _ = parse_journal(jp)[-1]
    if damage == "flip":
        flip(jp, (g0 + g1) // 2)
    else:
        os.truncate(jp, (g0 + g1) // 2)
    assert_every_entry_back(d)


def test_journal_damage_before_valid_synced_group_refuses_start(tmp_path):
    d = str(tmp_path)
    populate(d, n=30)
    jp = newest_journal(d)
    groups = parse_journal(jp)
    g = groups[0]
    with open(jp, "r+b") as f:  # flip a bit inside the first group's records
        f.seek(g[0] + 24 + 40)
        b = f.read(1)
        f.seek(g[0] + 24 + 40)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(errors.BookieIOError, match="refusing to start"):
        Storage(cfg(d))


def test_group_copy_inside_an_entry_body_does_not_block_startup(tmp_path):
    # an entry body may contain journal bytes (say, a backup of a journal); after a torn tail the
    # reader must not mistake such a copy for a later synced group and refuse to start
    a = str(tmp_path / "a")
    populate(a, n=5)
    ja = newest_journal(a)
    g0 = parse_journal(ja)[0]
    raw = open(ja, "rb").read()[g0[0]:g0[1]]
    b = str(tmp_path / "b")
    s = Storage(cfg(b))
    s.add_entries([(5, 0, b"k", False, b"first")])
    s.add_entries([(5, 1, b"k", False, b"x" * 64 + raw + raw)])
    s._store.close(checkpoint=False)
    jb = newest_journal(b)
    last = parse_journal(jb)[-1]
    tear(jb, last[0], [last[0] // SECTOR])  # torn ahead of the embedded copies: its first sector unwritten
    s = Storage(cfg(b))
    try:
        assert s.read_entry(5, 0) == b"first"
        with pytest.raises(errors.NoSuchEntryError):  # its group was torn: never acknowledged
            s.read_entry(5, 1)
    finally:
        s.close()


def entry_offsets(d):
    """(ledger, entry) -> (log path, record offset, body len) via the .idx reference format."""
    res = {}
    for ip in sorted(glob.glob(os.path.join(d, "l", "*.idx"))):
        data = open(ip, "rb").read()
        off = 64
        while off + 8 <= len(data):
            cnt, _crc = struct.unpack_from("<II", data, off)
            if cnt == 0 or off + 8 + cnt * 40 > len(data):
                break
            for k in range(cnt):
                l, e, _inc, o, ln, _z = struct.unpack_from("<QqQQII", data, off + 8 + 40 * k)
                res[(l, e)] = (ip[:-4] + ".log", o, ln)
            off += 8 + cnt * 40
    return res


@pytest.mark.parametrize("page_cache", [False, True], ids=["direct-reads", "page-cache"])
def test_entry_log_bitflip_is_eio_never_noentry(tmp_path, page_cache):
    d = str(tmp_path)
    populate(d, checkpoint=True)
    offs = entry_offsets(d)
    assert len(offs) == 120
    (lp, o, ln) = offs[(1, 7)]
    with open(lp, "r+b") as f:
        f.seek(o + 24 + ln // 2)
        b = f.read(1)
        f.seek(o + 24 + ln // 2)
        f.write(bytes([b[0] ^ 0x40]))
    s = Storage(cfg(d, entry_log_page_cache=page_cache))
    try:
        with pytest.raises(errors.BookieIOError, match="corrupt"):
            s.read_entry(1, 7)
        with pytest.raises(errors.BookieIOError):
            s.read_range(1, 7, 10, 1 << 20)
        assert s.read_range(1, 5, 10, 1 << 20) == [(5, body(1, 5)), (6, body(1, 6))]  # stops before it
        assert s.read_entry(1, 8) == body(1, 8)
        assert s.list_entries(1) == [(0, 59)]
        st = s.compact()
        assert st["corrupt_entries"] in (0, 1)
        with pytest.raises(errors.BookieIOError):
            s.read_entry(1, 7)
    finally:
        s.close()


@pytest.mark.parametrize("page_cache", [False, True], ids=["direct-reads", "page-cache"])
@pytest.mark.parametrize("seed", range(3))
def test_entry_log_random_damage(tmp_path, seed, page_cache):
    rnd = random.Random(100 + seed)
    base = str(tmp_path / "base")
    populate(base, checkpoint=True)
    for it in range(8):
        d = str(tmp_path / f"c{it}")
        shutil.copytree(base, d)
        lp = sorted(glob.glob(os.path.join(d, "l", "*.log")))[0]
        data = bytearray(open(lp, "rb").read())
        kind = rnd.choice(["truncate", "garbage", "flips"])
        if kind == "truncate":
            del data[rnd.randrange(0, len(data)):]
        elif kind == "garbage":
            at = rnd.randrange(len(data))
            n = rnd.randint(1, 4000)
            data[at:at + n] = rnd.randbytes(n)
        else:
            for _ in range(rnd.randint(1, 20)):
                data[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
        open(lp, "wb").write(bytes(data))
        try:
            s = Storage(cfg(d, entry_log_page_cache=page_cache))
        except errors.BookieIOError as e:
            assert "entry log" in str(e)
            continue
        try:
            for lid in (1, 2):
                assert s.list_entries(lid) == [(0, 59)]
                for e in range(60):
                    try:
                        assert s.read_entry(lid, e) == body(lid, e)
                    except errors.NoSuchEntryError:  # pragma: no cover - the failure this test exists for
                        pytest.fail(f"{kind}: indexed entry {lid}:{e} answered NoSuchEntry")
                    except errors.BookieIOError:
                        pass
        finally:
            s.close()


def _flip(path, at):
    data = bytearray(open(path, "rb").read())
    data[at] ^= 0xFF
    open(path, "wb").write(bytes(data))


def test_index_damage_fails_clearly(tmp_path):
    base = str(tmp_path / "base")
    populate(base, checkpoint=True)
    # a damaged .idx (the per-log record list compaction reads) loses nothing: reads use the index
    d = str(tmp_path / "idx")
    shutil.copytree(base, d)
    for ip in glob.glob(os.path.join(d, "l", "*.idx")):
        _flip(ip, 64 + 8 + 5)
    s = Storage(cfg(d))
    try:
        for lid in (1, 2):
            for e in range(60):
                assert s.read_entry(lid, e) == body(lid, e)
        s.compact()  # (and compaction leaves what it cannot list where it is)
        assert s.read_entry(1, 59) == body(1, 59)
    finally:
        s.close()
    # missing entry log
    d = str(tmp_path / "nolog")
    shutil.copytree(base, d)
    os.unlink(sorted(glob.glob(os.path.join(d, "l", "*.log")))[0])
    with pytest.raises(errors.BookieIOError, match="entry log"):
        Storage(cfg(d))
    # the index gone under a lastMark: refuse rather than start without the fences and locations
    d = str(tmp_path / "noindex")
    shutil.copytree(base, d)
    shutil.rmtree(os.path.join(d, "l", "index"))
    with pytest.raises(errors.BookieIOError, match="index .* is missing"):
        Storage(cfg(d))
    # damage inside the index's files (its manifest, its write-ahead log): refuse, naming the index
    for victim in ("MANIFEST-*", "*.log"):
        d = str(tmp_path / ("damaged-" + victim.strip("*.-")))
        shutil.copytree(base, d)
        files = [p for p in glob.glob(os.path.join(d, "l", "index", victim)) if os.path.getsize(p) > 16]
        assert files, os.listdir(os.path.join(d, "l", "index"))
        _flip(files[0], os.path.getsize(files[0]) // 2)
        with pytest.raises(errors.BookieIOError, match="index"):
            s = Storage(cfg(d))
            try:  # (a damaged record the open did not read fails the read that meets it)
                for lid in (1, 2):
                    for e in range(60):
                        assert s.read_entry(lid, e) == body(lid, e)
            finally:
                s.close()
    # corrupt lastMark: replays every journal instead, nothing lost
    d = str(tmp_path / "mark")
    shutil.copytree(base, d)
    open(os.path.join(d, "l", "lastMark"), "wb").write(os.urandom(32))
    s = Storage(cfg(d))
    try:
        for lid in (1, 2):
            for e in range(60):
                assert s.read_entry(lid, e) == body(lid, e)
        assert s.is_fenced(2)
    finally:
        s.close()


def _log_header(magic: bytes, log_id: int) -> bytes:
    import crc32c
    h = bytearray(64)
    h[0:4] = magic
    struct.pack_into("<II", h, 4, 1, log_id)
    struct.pack_into("<I", h, 60, crc32c.crc32c(bytes(h[:60])))
    return bytes(h)


@pytest.mark.parametrize("torn", ["index-empty", "index-missing", "log-empty"])
def test_log_torn_at_creation_is_discarded_and_restarts_stay_clean(tmp_path, torn):
    # kill -9 inside log creation leaves a log whose header (or whose index's header) never got
    # written; the ledger state does not list it and the journal still holds everything.  Opening
    # must neither refuse nor adopt it (adopting it listed an index it never wrote, and the next
    # restart refused to start: "index ... truncated (0 < 64 bytes)").
    d = str(tmp_path)
    populate(d, checkpoint=True)
    ldir = os.path.join(d, "l")
    ids = [int(os.path.basename(p)[:8], 16) for p in glob.glob(os.path.join(ldir, "*.log"))]
    torn_id = max(ids) + 1
    lp, ip = (os.path.join(ldir, f"{torn_id:08x}.{x}") for x in ("log", "idx"))
    with open(lp, "wb") as f:
        f.write(b"" if torn == "log-empty" else _log_header(b"BKSL", torn_id))
    if torn == "index-empty" or torn == "log-empty":
        open(ip, "wb").close()
    for reopen in range(3):  # replay, checkpoint, more adds into new logs, clean close; again
        s = Storage(cfg(d))
        try:
            for lid, n in ((1, 60 + 40 * reopen), (2, 60)):
                for e in range(n):
                    assert s.read_entry(lid, e) == body(lid, e)
            assert s.is_fenced(2)
            s.add_entries([(1, e, b"k", False, body(1, e)) for e in range(60 + 40 * reopen, 100 + 40 * reopen)])
            s.checkpoint()
        finally:
            s.close()
        assert not os.path.exists(ip) or os.path.getsize(ip) >= 64
