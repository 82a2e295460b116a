"""The bookie hand-encodes AddBatchResponse bodies (no AddResponse object per entry): pin them
against the generated protobuf code."""
import pytest

from bkspark import errors
from bkspark.proto.wire import encode_add_oks, encode_add_responses, encode_range_chunk
from bkspark.proto import bookie_pb2 as pb


def _fields(raw):
    return [(r.status, r.ledger_id, r.entry_id, r.request_id, r.message)
            for r in pb.AddBatchResponse.FromString(raw).responses]


@pytest.mark.parametrize("lid", [0, 1, 127, 128, 300, 2**31, 2**62 + 5])
def test_ok_acks_parse_like_generated_messages(lid):
    entries = [0, 1, 127, 128, 16383, 16384, 2**40, 2**63 - 1]
    accepted = [(lid, e, b"k" * 20, False, b"body") for e in entries]
    raw = encode_add_oks(accepted)
    assert _fields(raw) == [(errors.EOK, lid, e, 0, "") for e in entries]
    # every element with non-zero ids is byte-identical to the generated encoding
    if lid == 0:
        return
    expected = pb.AddBatchResponse(responses=[pb.AddResponse(ledger_id=lid, entry_id=e)
                                              for e in entries if e]).SerializeToString()
    assert encode_add_oks([a for a in accepted if a[1]]) == expected


def test_mixed_ledgers_in_one_batch():
    accepted = [(7, 1, b"", False, b""), (7, 2, b"", False, b""), (9, 1, b"", False, b""),
                (7, 3, b"", False, b"")]
    assert _fields(encode_add_oks(accepted)) == [(0, 7, 1, 0, ""), (0, 7, 2, 0, ""),
                                                 (0, 9, 1, 0, ""), (0, 7, 3, 0, "")]
    assert encode_add_oks([]) == b""


def test_error_responses_are_byte_identical_to_generated_messages():
    items = [(errors.EFENCED, 5, 10, 0, ""), (errors.EBADREQ, -1, -3, 77, "negative ledger"),
             (errors.ETOOMANYREQUESTS, 2**40, 0, 2**64 - 1, "bookie overloaded ü"),
             (errors.EOK, 1, 2, 3, "")]
    raw = encode_add_responses(items)
    expected = pb.AddBatchResponse(responses=[
        pb.AddResponse(status=s, ledger_id=l, entry_id=e, request_id=r, message=m)
        for s, l, e, r, m in items]).SerializeToString()
    assert raw == expected
    assert _fields(raw) == items
    # concatenated bodies are one message: the stream coalesces batches this way
    assert _fields(raw + encode_add_oks([(4, 4, b"", False, b"")])) == items + [(0, 4, 4, 0, "")]


@pytest.mark.parametrize("status,next_id,message", [(errors.EOK, 5, ""), (errors.EOK, 0, ""),
                                                    (errors.ENOENTRY, 2**40, ""),
                                                    (errors.EIO, 3, "bad crc ü")])
def test_range_chunks_parse_like_generated_messages(status, next_id, message):
    def generated(entries):
        return pb.ReadRangeResponse(
            status=status, next_entry_id=next_id, message=message,
            entries=[pb.EntryBody(entry_id=e, body=b) for e, b in entries]).SerializeToString()

    entries = [(1, b"x"), (127, b"y" * 200), (2**33, b"z" * 20000)]
    assert encode_range_chunk(status, next_id, entries, message) == generated(entries)
    # a zero id or empty body is encoded where the generated code omits it: same message
    with_defaults = [(0, b""), *entries]
    assert (pb.ReadRangeResponse.FromString(encode_range_chunk(status, next_id, with_defaults, message))
            == pb.ReadRangeResponse.FromString(generated(with_defaults)))


@pytest.mark.parametrize("status,next_id,message", [(errors.EOK, 5, ""), (errors.ENOENTRY, -1, "x"),
                                                    (errors.EIO, 2**40, "bad crc ü")])
def test_range_chunk_decoder_reads_generated_and_hand_encoded_messages(status, next_id, message):
    from bkspark.proto.wire import decode_range_chunk
    entries = [(0, b""), (1, b"x"), (300, b"y" * 200), (2**33, b"z" * 20000)]
    generated = pb.ReadRangeResponse(
        status=status, next_entry_id=next_id, message=message,
        entries=[pb.EntryBody(entry_id=e, body=b) for e, b in entries]).SerializeToString()
    for raw in (generated, encode_range_chunk(status, next_id, entries, message)):
        got = decode_range_chunk(raw)
        assert got[:3] == (status, next_id, message)
        assert [(e, bytes(b)) for e, b in got[3]] == entries


def test_range_chunk_decoder_rejects_malformed_messages():
    from bkspark.proto.wire import FrameError, decode_range_chunk
    good = encode_range_chunk(errors.EOK, 3, [(1, b"abc"), (2, b"defg")])
    for bad in (good[:-1], good[:5], b"\x12\x7f" + good, b"\x0d\x00\x00\x00\x00", b"\xff" * 11):
        with pytest.raises(FrameError):
            decode_range_chunk(bad)
    assert decode_range_chunk(b"\x28\x07" + good)[3] == [(1, b"abc"), (2, b"defg")]  # unknown varint field


def test_only_response_is_the_add_response_of_a_one_add_batch():
    from bkspark.proto.wire import FrameError, only_response
    for raw in (encode_add_oks([(7, 300, b"k", False, b"")]),
                encode_add_responses([(errors.EFENCED, 7, 301, 9, "fenced")])):
        one = pb.AddBatchResponse.FromString(raw).responses[0]
        assert pb.AddResponse.FromString(only_response(raw)) == one
    two = encode_add_oks([(7, 1, b"", False, b""), (7, 2, b"", False, b"")])
    with pytest.raises(FrameError):
        only_response(two)
