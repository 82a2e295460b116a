"""Fixtures for bookie tests: real bookie processes on an embedded metadata store."""
import hashlib
import struct

import pytest

from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.testing.cluster import BookieCluster, bookie_channel

MASTER_KEY = hashlib.sha1(b"ledger" + b"pw").digest()
OTHER_KEY = hashlib.sha1(b"ledger" + b"other").digest()


def frame(ledger_id: int, entry_id: int, payload: bytes, lac: int = -1) -> bytes:
    """A framed entry as a client sends it (digest-free: the bookie does not check digests)."""
    return struct.pack(">qqqq", ledger_id, entry_id, lac, len(payload)) + payload


def add_request(ledger_id, entry_id, payload=b"x", key=MASTER_KEY, recovery=False, lac=-1):
    return pb.AddRequest(ledger_id=ledger_id, entry_id=entry_id, master_key=key,
                         flags=pb.AddRequest.RECOVERY_ADD if recovery else 0,
                         body=frame(ledger_id, entry_id, payload, lac), request_id=entry_id)


def stub_for(bookie_id: str):
    channel = bookie_channel(bookie_id, options=[("grpc.max_receive_message_length", 64 << 20),
                                                 ("grpc.max_send_message_length", 64 << 20)])
    return pb_grpc.BookieStub(channel), channel


@pytest.fixture(scope="module")
def one_bookie(tmp_path_factory):
    data = tmp_path_factory.mktemp("one-bookie")
    with BookieCluster(f"sqlite:///{data}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=data,
                       extra_args=["--max-inflight-add-mb", "2", "--max-entry-bytes", str(1 << 20)]) as cluster:
        yield cluster


@pytest.fixture
def stub(one_bookie):
    s, channel = stub_for(one_bookie.bookie_ids[0])
    yield s
    channel.close()
