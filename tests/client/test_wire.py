import pytest
from hypothesis import given, strategies as st

from bkspark.proto import wire
from bkspark.proto import bookie_pb2 as pb


@given(lid=st.integers(0, 2**63 - 1), eid=st.integers(0, 2**63 - 1),
       flags=st.sampled_from([0, 1]), body=st.binary(max_size=300), mk=st.binary(max_size=20))
def test_encode_add_matches_protobuf(lid, eid, flags, body, mk):
    prefix = wire.request_prefix(lid, mk)
    elem = wire.encode_add(prefix, eid, flags, [body[:5], body[5:]])
    batch = pb.AddBatch.FromString(elem + elem)
    assert len(batch.adds) == 2
    want = pb.AddRequest(ledger_id=lid, entry_id=eid, master_key=mk, flags=flags, body=body)
    assert batch.adds[0] == want and batch.adds[1] == want
    # same size as the generated encoder (field order differs: per-ledger fields first)
    if lid and mk and eid and body:
        assert len(elem) == len(pb.AddBatch(adds=[want]).SerializeToString())


def _reference_elements(d, prefix, first, lac, length, payloads):
    """add_elements spelled out with the Python framing and encoder."""
    out = []
    for entry_id, payload in enumerate(payloads, first):
        length += len(payload)
        out.append(wire.encode_add(prefix, entry_id, 0, [d.frame(entry_id, lac, length, payload)]))
    return out


@pytest.mark.parametrize("kind", ["crc32c", "dummy", "crc32", "hmac"])
@given(lid=st.integers(0, 2**63 - 1), first=st.integers(0, 2**62), lac=st.integers(-1, 2**62),
       length=st.integers(0, 2**40), payloads=st.lists(st.binary(max_size=300), max_size=6))
def test_add_elements_are_the_framed_bodies_encoded(kind, lid, first, lac, length, payloads):
    """crc32c and dummy go through the C encoder (bkspark._native.encode_adds), the others
    through Python: both give the bytes of the reference encoder, and each element parses as
    an AddRequest whose body verifies."""
    from bkspark.client.digest import DigestManager
    d = DigestManager(lid, kind, b"m" * 20)
    prefix = wire.request_prefix(lid, b"k" * 20)
    elems = d.add_elements(prefix, first, lac, length, payloads)
    assert elems == _reference_elements(d, prefix, first, lac, length, payloads)
    for i, r in enumerate(pb.AddBatch.FromString(b"".join(elems)).adds):
        length += len(payloads[i])
        assert (r.ledger_id, r.entry_id) == (lid, first + i)
        assert d.verify(r.body, first + i) == (first + i, lac, length, payloads[i])


def test_native_encoder_takes_any_buffer_and_large_batches_and_refuses_bad_arguments():
    """Over 256 KiB a batch is encoded without the GIL: same bytes; bytearray and memoryview
    payloads are framed like bytes; wrong arguments raise naming the problem."""
    from bkspark import _native
    from bkspark.client.digest import DigestManager
    d = DigestManager(9, "crc32c")
    prefix = wire.request_prefix(9, b"k" * 20)
    payloads = [bytes(range(256)) * 400, bytearray(b"x" * 70_000), memoryview(b"y" * 5000)[1:]]
    assert (d.add_elements(prefix, 3, 2, 10, payloads)
            == _reference_elements(d, prefix, 3, 2, 10, [bytes(p) for p in payloads]))
    with pytest.raises(TypeError, match="bytes-like"):
        _native.encode_adds(prefix, 9, 0, -1, 0, [b"a", 5], 4)
    with pytest.raises(ValueError, match="digest size 8"):
        _native.encode_adds(prefix, 9, 0, -1, 0, [b"a"], 8)
    with pytest.raises(ValueError, match="negative"):
        _native.encode_adds(prefix, 9, -1, -1, 0, [b"a"], 4)
    with pytest.raises(TypeError, match="sequence"):
        _native.encode_adds(prefix, 9, 0, -1, 0, 5, 4)


def test_varint_negative():
    m = pb.ReadRequest(entry_id=-1)
    assert m.SerializeToString() == b"\x10" + wire.varint(-1)


def test_ledger_handle_encodes_valid_add_batches():
    """The write path's inlined encoder produces AddBatch elements protobuf parses, with
    the framed body, master key and write sets of the round-robin schedule."""
    from types import SimpleNamespace

    from bkspark.client.api import ClientConfig
    from bkspark.client.digest import DigestManager
    from bkspark.client.ledger_handle import LedgerHandle
    from metadata.ledger_metadata import LedgerMetadata

    sent = {}

    class Pool:
        sinks = {}

        def register(self, *a):
            pass

        def get(self, b):
            return SimpleNamespace(send_adds=lambda elems: sent.setdefault(b, []).extend(elems))

    ctx = SimpleNamespace(conf=ClientConfig(), pool=Pool(), register_writer=lambda h: None,
                          add_trace=None)
    md = LedgerMetadata.new(["a", "b", "c", "d"], 3, 2, ledger_id=300, password=b"pw")
    keys = md.keys.derive(b"pw")
    lh = LedgerHandle(ctx, md, 0, keys)
    payloads = [bytes([i]) * (i * 37 % 300) for i in range(40)]
    lh.append_many_async(payloads[:10])
    for p in payloads[10:]:
        lh.append_async(p)
    d = DigestManager(300, "crc32c")
    for i, b in enumerate("abcd"):
        batch = pb.AddBatch.FromString(b"".join(sent[b]))
        ids = [r.entry_id for r in batch.adds]
        assert ids == [e for e in range(40) if (i - e) % 4 < 3]
        length = 0
        for r in batch.adds:
            assert r.ledger_id == 300 and r.master_key == keys.master_key and r.flags == 0
            eid, lac, ln, payload = d.verify(r.body, r.entry_id)
            assert payload == payloads[eid] and lac == -1
            assert ln == sum(len(p) for p in payloads[:eid + 1])


def test_add_runs_stay_under_the_message_limit():
    from bkspark.client.bookie_client import _runs
    elems = [b"a" * 300, b"b" * 500, b"c" * 300, b"d" * 2000, b"e" * 10]
    assert _runs(elems, limit=10_000) == [elems]                  # small: one run, as given
    runs = _runs(elems, limit=800)
    assert runs == [[b"a" * 300, b"b" * 500], [b"c" * 300], [b"d" * 2000], [b"e" * 10]]
    assert [e for r in runs for e in r] == elems                  # order kept, nothing lost


def test_frame_pool_reuses_a_buffer_only_once_nothing_references_it():
    """A range chunk's buffer comes back for a later frame only when every view decoded from
    it is gone; a frame while views live gets another buffer, so no body is overwritten."""
    import io

    def frames(*payloads):
        return io.BufferedReader(io.BytesIO(b"".join(
            wire.frame(wire.KIND_READ_CHUNK, (p,)) for p in payloads)))

    pool = wire.FramePool(keep=2)
    rfile = frames(b"a" * 300, b"b" * 200, b"c" * 100, b"d" * 50)
    kind, first = wire.read_frame_into(rfile, 1 << 20, pool)
    assert kind == wire.KIND_READ_CHUNK and bytes(first) == b"a" * 300 and first.readonly
    body = first[10:20]                       # a decoded body: a view of the same buffer
    del first
    _, second = wire.read_frame_into(rfile, 1 << 20, pool)
    assert bytes(second) == b"b" * 200 and bytes(body) == b"a" * 10   # not overwritten
    assert second.obj is not body.obj
    pooled = {id(body.obj), id(second.obj)}
    del body, second
    _, third = wire.read_frame_into(rfile, 1 << 20, pool)         # a free buffer again
    assert bytes(third) == b"c" * 100 and id(third.obj) in pooled
    with pytest.raises(wire.FrameError, match="exceeds"):
        wire.read_frame_into(frames(b"x" * 100), 99, pool)
    with pytest.raises(wire.FrameError, match="inside a frame"):
        wire.read_frame_into(io.BufferedReader(io.BytesIO(
            wire.frame(wire.KIND_READ_CHUNK, (b"x" * 100,))[:50])), 1 << 20, pool)
    assert wire.read_frame_into(frames(), 1 << 20, pool) is None
    del third


def test_frame_pool_keeps_the_larger_buffer_once_frames_outgrow_its_free_ones():
    """A full pool whose free buffers are all too small replaces one with the new, larger
    buffer, so later frames of that size reuse it instead of allocating one each."""
    import io
    mib = 1 << 20
    pool = wire.FramePool(keep=1)
    rfile = io.BufferedReader(io.BytesIO(b"".join(
        wire.frame(wire.KIND_READ_CHUNK, (bytes([i]) * n,))
        for i, n in enumerate((100, 3 * mib, 3 * mib, 2 * mib)))))
    _, v = wire.read_frame_into(rfile, 8 * mib, pool)    # fills the pool with a 1 MiB buffer
    del v
    for want in (b"\x01", b"\x02", b"\x03"):           # larger frames: the pool keeps theirs
        _, v = wire.read_frame_into(rfile, 8 * mib, pool)
        assert bytes(v[:1]) == want and len(v) >= 2 * mib
        assert [b for b in pool._bufs if b is v.obj], "a larger frame's buffer was not kept"
        del v


@given(adds=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
                               st.sampled_from([0, 1]), st.binary(max_size=200)), max_size=20),
       junk=st.binary(max_size=8))
def test_the_bookies_walk_counts_what_the_client_encodes_and_refuses_what_protobuf_does(adds, junk):
    """The client's encoder against the bookie's C walk (``_native.scan_add_batch``) and
    refusal path (``_native.answer_adds``): every add counted and answered; bytes appended to
    the message are refused by the walk whenever protobuf refuses them."""
    from bkspark import _native
    from bkspark.bookie import storage  # noqa: F401 - maps _native's errors to bkspark's
    from bkspark.errors import BadRequestError
    key = b"k" * 20
    payload = b"".join(wire.encode_add(wire.request_prefix(lid, key), eid, flags, [body])
                       for lid, eid, flags, body in adds)
    assert _native.scan_add_batch(payload, 1000) == len(adds)
    answered = pb.AddBatchResponse.FromString(_native.answer_adds(payload, 1 << 20, 503, "no"))
    assert [(r.ledger_id, r.entry_id) for r in answered.responses] == \
        [(lid, eid) for lid, eid, _, _ in adds]
    try:
        parsed = len(pb.AddBatch.FromString(payload + junk).adds)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError
        parsed = None
    try:
        walked = _native.scan_add_batch(payload + junk, 1000)
    except BadRequestError:
        walked = None
    if parsed is None:
        assert walked is None, junk
    elif walked is not None:
        assert walked == parsed


@given(frames=st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=300)), max_size=8))
def test_frames_read_back_as_written(frames):
    import io
    data = b"".join(wire.frame(kind, [payload[:7], payload[7:]]) for kind, payload in frames)
    rfile = io.BytesIO(data)
    assert [wire.read_frame(rfile, 1 << 20) for _ in frames] == frames
    assert wire.read_frame(rfile, 1 << 20) is None
