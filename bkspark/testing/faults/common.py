"""What every part of a fault run shares: its settings, its numbered and checksummed
records, and gRPC access to a bookie."""
from __future__ import annotations

import os
import random
import struct
import zlib


#: the repository (the fault run's processes put it first on their PYTHONPATH)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
PASSWORD = b"faults"
LOG_NAME = "chaos-log"
BOOKIE_ARGS = ["--write-cache-mb", "1", "--checkpoint-interval-s", "0.5",
               "--journal-max-size-mb", "1", "--entry-log-max-size-mb", "2",
               "--gc-interval-s", "2", "--disk-check-interval-s", "0.3"]
CLIENT_CONF = dict(add_timeout=3.0, read_timeout=3.0, speculative_read_timeout=0.5,
                   metadata_retries=40)
LEDGER_CONFIGS = [(3, 2, 2), (3, 3, 2), (3, 3, 3), (4, 3, 2), (3, 2, 1)]

# ---- records ------------------------------------------------------------------------------

_REC = struct.Struct(">4sIQI")     # magic, worker, seq, payload length
_MAGIC = b"BKSR"


def make_record(worker: int, seq: int, size: int) -> bytes:
    """A self-checking record: header, deterministic filler, CRC32 of both."""
    rng = random.Random(worker * 1_000_003 + seq)
    filler = rng.randbytes(size)
    head = _REC.pack(_MAGIC, worker, seq, size)
    return head + filler + struct.pack(">I", zlib.crc32(head + filler))


def parse_record(data: bytes) -> tuple[int, int]:
    """(worker, seq) of a record; ValueError if it is not an intact record."""
    if len(data) < _REC.size + 4:
        raise ValueError(f"record too short ({len(data)} bytes)")
    magic, worker, seq, size = _REC.unpack_from(data, 0)
    if magic != _MAGIC or len(data) != _REC.size + size + 4:
        raise ValueError("bad record header")
    if struct.unpack(">I", data[-4:])[0] != zlib.crc32(data[:-4]):
        raise ValueError(f"record checksum mismatch (worker {worker} seq {seq})")
    return worker, seq


def wait_serving(cluster, timeout: float = 60.0) -> None:
    """Wait until every bookie answers gRPC (through any reconnect backoff of this process)."""
    from bkspark.proto import bookie_pb2 as pb
    for address in cluster.bookie_ids:
        channel, stub = bookie_rpc(address, cluster.credentials("admin"))
        try:
            stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=timeout, wait_for_ready=True)
        finally:
            channel.close()


def bookie_rpc(address: str, credentials):
    """A channel to ``address`` presenting ``credentials``, and its Bookie stub."""
    from bkspark.proto import bookie_pb2_grpc as pb_grpc
    channel = credentials.channel(address)
    return channel, pb_grpc.BookieStub(channel)
