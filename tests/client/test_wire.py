from hypothesis import given, strategies as st

from bkspark.client import wire
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


def test_varint_negative():
    m = pb.ReadRequest(entry_id=-1)
    assert m.SerializeToString() == b"\x10" + wire.varint(-1)
