"""The bookie's data port (adds and range reads over TCP frames), against a real bookie process.

Raw sockets speak the protocol here, so every framing error path is reachable; the client's
use of the port is covered by every client test (it is the default add transport).
"""
import itertools
import socket
import struct

import pytest

from bkspark import errors
from bkspark.proto import wire
from bkspark.proto import bookie_pb2 as pb

from .conftest import add_request, frame, stub_for

_ids = itertools.count(7000)


@pytest.fixture
def data_address(one_bookie):
    stub, channel = stub_for(one_bookie.bookie_ids[0])
    port = stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10).data_port
    channel.close()
    assert port > 0
    return DataAddress(one_bookie.bookie_ids[0].rsplit(":", 1)[0], port,
                       one_bookie.credentials("client").token)


class DataAddress(tuple):
    """``(host, port)`` of a data port, and the token its hello presents."""

    def __new__(cls, host, port, token):
        self = super().__new__(cls, (host, port))
        self.token = token
        return self


def connect(address, hello=None):
    """A connection to a data port that sent ``hello`` (default: the protocol's, with the
    address's token)."""
    sock = socket.create_connection(address, timeout=20)
    sock.sendall(wire.hello(address.token) if hello is None else hello)
    return sock


recv_exact = wire.recv_exact


def read_frame(sock):
    head = recv_exact(sock, wire.FRAME.size)
    if len(head) < wire.FRAME.size:
        return None
    size, kind = wire.FRAME.unpack(head)
    return kind, recv_exact(sock, size)


def closed_by_peer(sock) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def add_batch(lid, entries):
    return pb.AddBatch(adds=[add_request(lid, e, b"data-%d" % e, lac=e - 1) for e in entries])


def test_adds_are_answered_in_order_of_their_batches(data_address, stub):
    lid = next(_ids)
    sock = connect(data_address)
    assert recv_exact(sock, 4) == wire.DATA_MAGIC
    for first in (0, 3):
        sock.sendall(wire.frame(wire.KIND_ADD_BATCH, [add_batch(lid, range(first, first + 3))
                                                     .SerializeToString()]))
    answered = []
    while len(answered) < 6:
        kind, payload = read_frame(sock)
        assert kind == wire.KIND_ADD_RESPONSES
        answered += [(r.entry_id, r.status) for r in pb.AddBatchResponse.FromString(payload).responses]
    assert answered == [(e, errors.EOK) for e in range(6)]
    sock.close()
    reply = stub.Read(pb.ReadRequest(ledger_id=lid, entry_id=5), timeout=10)
    assert reply.status == errors.EOK and reply.body == frame(lid, 5, b"data-5", 4)


def test_range_read_matches_grpc(data_address, stub):
    lid = next(_ids)
    for e in range(20):
        assert stub.Add(add_request(lid, e, b"r" * (e * 100)), timeout=10).status == errors.EOK
    request = pb.ReadRangeRequest(ledger_id=lid, first_entry_id=2, last_entry_id=25,
                                  max_bytes_per_message=700)
    via_grpc = list(stub.ReadRange(request, timeout=20))
    sock = connect(data_address)
    recv_exact(sock, 4)
    sock.sendall(wire.frame(wire.KIND_READ_RANGE, [request.SerializeToString()]))
    via_port = []
    while True:
        kind, payload = read_frame(sock)
        if kind == wire.KIND_READ_END:
            break
        assert kind == wire.KIND_READ_CHUNK
        via_port.append(pb.ReadRangeResponse.FromString(payload))
    sock.close()
    assert via_port == via_grpc
    assert [e.entry_id for m in via_port for e in m.entries] == list(range(2, 20))
    assert via_port[-1].status == errors.ENOENTRY and via_port[-1].next_entry_id == 20


def range_frame(lid, first, last, *, more=False, max_bytes=0):
    return wire.frame(wire.KIND_READ_RANGE, [pb.ReadRangeRequest(
        ledger_id=lid, first_entry_id=first, last_entry_id=last, more=more,
        max_bytes_per_message=max_bytes).SerializeToString()])


def range_answers(sock, n):
    """The entry ids of each of the next ``n`` range answers (chunks up to the end frame)."""
    out = []
    for _ in range(n):
        ids = []
        while (item := read_frame(sock))[0] == wire.KIND_READ_CHUNK:
            ids += [e.entry_id for e in pb.ReadRangeResponse.FromString(item[1]).entries]
        assert item[0] == wire.KIND_READ_END
        out.append(ids)
    return out


def nothing_within(sock, seconds) -> bool:
    sock.settimeout(seconds)
    try:
        sock.recv(1, socket.MSG_PEEK)
        return False
    except socket.timeout:
        return True
    finally:
        sock.settimeout(20)


def test_answers_to_requests_marked_more_wait_for_the_one_that_is_not(data_address, stub):
    """A pipelined batch marks every range request but its last ``more``: the bookie holds
    those answers and sends them, in order, with the last one's; an add batch behind them
    sends them first; an answer too large to hold (HOLD_BYTES) is not held whole."""
    from bkspark.bookie.data_port import HOLD_BYTES
    lid, big = next(_ids), next(_ids)
    for e in range(10):
        assert stub.Add(add_request(lid, e, b"r" * 100), timeout=10).status == errors.EOK
    for e in range(8):
        assert stub.Add(add_request(big, e, b"b" * (HOLD_BYTES // 4)),
                        timeout=10).status == errors.EOK
    sock = connect(data_address)
    assert recv_exact(sock, 4) == wire.DATA_MAGIC
    sock.sendall(range_frame(lid, 0, 2, more=True) + range_frame(lid, 3, 5, more=True))
    assert nothing_within(sock, 0.5)                    # held: more was promised
    sock.sendall(range_frame(lid, 6, 9))
    assert range_answers(sock, 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]

    add_lid = next(_ids)
    sock.sendall(range_frame(lid, 0, 0, more=True)
                 + wire.frame(wire.KIND_ADD_BATCH, [add_batch(add_lid, [0]).SerializeToString()]))
    assert range_answers(sock, 1) == [[0]]              # sent before the add's answer
    kind, payload = read_frame(sock)
    assert kind == wire.KIND_ADD_RESPONSES
    assert [r.status for r in pb.AddBatchResponse.FromString(payload).responses] == [errors.EOK]

    sock.sendall(range_frame(big, 0, 7, more=True, max_bytes=HOLD_BYTES // 2))
    assert range_answers(sock, 1) == [list(range(8))]   # too large to hold: sent as read
    sock.sendall(range_frame(lid, 9, 9))
    assert range_answers(sock, 1) == [[9]]
    sock.close()


@pytest.mark.parametrize("bad", ["hello", "kind", "oversized", "truncated", "garbage-batch"])
def test_broken_framing_closes_only_that_connection(data_address, stub, bad):
    sock = connect(data_address, b"HTTP" if bad == "hello" else None)
    if bad != "hello":
        assert recv_exact(sock, 4) == wire.DATA_MAGIC
        if bad == "kind":
            sock.sendall(wire.frame(99, [b"x"]))
        elif bad == "oversized":
            sock.sendall(wire.FRAME.pack(1 << 31, wire.KIND_ADD_BATCH))
        elif bad == "truncated":
            sock.sendall(wire.FRAME.pack(100, wire.KIND_ADD_BATCH) + b"x" * 10)
            sock.shutdown(socket.SHUT_WR)
        else:
            sock.sendall(wire.frame(wire.KIND_ADD_BATCH, [b"\xff" * 64]))
    assert closed_by_peer(sock)
    sock.close()
    # the bookie is unharmed: another connection stores and answers
    lid = next(_ids)
    good = connect(data_address)
    recv_exact(good, 4)
    good.sendall(wire.frame(wire.KIND_ADD_BATCH, [add_batch(lid, [0]).SerializeToString()]))
    kind, payload = read_frame(good)
    assert [r.status for r in pb.AddBatchResponse.FromString(payload).responses] == [errors.EOK]
    good.close()


def test_invalid_adds_get_statuses_not_a_closed_connection(data_address):
    lid = next(_ids)
    batch = pb.AddBatch(adds=[add_request(lid, 0), add_request(lid, 1, key=b"short")])
    sock = connect(data_address)
    recv_exact(sock, 4)
    sock.sendall(wire.frame(wire.KIND_ADD_BATCH, [batch.SerializeToString()]))
    kind, payload = read_frame(sock)
    statuses = {r.entry_id: r.status for r in pb.AddBatchResponse.FromString(payload).responses}
    assert statuses == {0: errors.EOK, 1: errors.EBADREQ}
    sock.close()


def test_frame_reader_errors():
    import io
    good = wire.frame(wire.KIND_ADD_BATCH, [b"abc", b"de"])
    assert wire.read_frame(io.BytesIO(good), 100) == (wire.KIND_ADD_BATCH, b"abcde")
    assert wire.read_frame(io.BytesIO(b""), 100) is None
    for broken, limit in [(good[:3], 100), (good[:-1], 100), (good, 4)]:
        with pytest.raises(wire.FrameError):
            wire.read_frame(io.BytesIO(broken), limit)
    assert struct.unpack(">I", good[:4])[0] == 5


def test_bookies_without_a_data_port_take_adds_over_grpc(tmp_path):
    from bkspark.client import BookKeeper
    from bkspark.testing.cluster import BookieCluster

    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=2, data_dir=tmp_path,
                       extra_args=["--data-port", "-1"]) as cluster, \
            BookKeeper(cluster.metadata_uri) as bk:
        stub, channel = stub_for(cluster.bookie_ids[0])
        assert stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10).data_port == 0
        channel.close()
        lh = bk.create_ledger(2, 2, 2, password=b"pw")
        lh.append_many([b"grpc-%d" % i for i in range(50)])
        lh.close()
        streams = [c._stream for c in bk.ctx.pool.clients()]
        assert all(st is not None and st.linger == 0.002 for st in streams)  # gRPC spacing
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.data for e in rh.read(0, 49)] == [b"grpc-%d" % i for i in range(50)]


def test_bad_data_port_setting_is_refused():
    from bkspark.bookie.config import BookieConfig
    from bkspark.errors import BadRequestError

    with pytest.raises(BadRequestError, match="data_port"):
        BookieConfig(metadata_uri="sqlite:///tmp/x.db", journal_dir="/tmp/j", ledger_dirs=["/tmp/l"],
                     data_port=70000).finalize()


def test_range_reads_reuse_connections_and_survive_a_bookie_restart(tmp_path):
    from bkspark.client import BookKeeper
    from bkspark.testing.cluster import BookieCluster

    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path) as cluster, \
            BookKeeper(cluster.metadata_uri) as bk:
        lh = bk.create_ledger(1, 1, 1, password=b"pw")
        lh.append_many([b"e-%d" % i for i in range(30)])
        lh.close()
        client = bk.ctx.pool.get(cluster.bookie_ids[0])
        assert [b[-4:] for _, b in client.read_range(lh.ledger_id, 0, 29)][-1] == b"e-29"
        assert len(client._idle_reads) == 1
        idle = client._idle_reads[0]
        assert len(list(client.read_range(lh.ledger_id, 5, 9))) == 5
        assert client._idle_reads == [idle]                     # reused
        old_port = client._data_port
        cluster.restart(0)
        entries = list(client.read_range(lh.ledger_id, 0, 29))  # stale connection dropped
        assert [e for e, _ in entries] == list(range(30))
        assert client._data_port != old_port and idle not in client._idle_reads


def test_range_reads_from_the_connection_buffer_keep_every_body_intact(tmp_path):
    """The bookie reads a range chunk's bodies into its connection's reused buffer and sends
    them from there: chunks after chunks, strided ranges, and an entry larger than the buffer
    (sent from its own copy) all arrive intact, twice over the same connection."""
    import os

    from bkspark.client import BookKeeper
    from bkspark.testing.cluster import BookieCluster

    sizes = [1, 70_000, 300_000, 4_500_000, 5, 1 << 20, 2_000_000, 9, 123_456, 4 << 20]
    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path) as cluster, \
            BookKeeper(cluster.metadata_uri) as bk:
        lh = bk.create_ledger(1, 1, 1, password=b"pw")
        payloads = [os.urandom(n) for n in sizes]
        lh.append_many(payloads)
        lh.close()
        client = bk.ctx.pool.get(cluster.bookie_ids[0])
        for _ in range(2):
            for step, max_bytes in ((1, 4 << 20), (1, 256 << 10), (2, 4 << 20), (3, 1 << 20)):
                got = list(client.read_range(lh.ledger_id, 0, len(sizes) - 1, step=step,
                                             max_bytes=max_bytes))
                assert [e for e, _ in got] == list(range(0, len(sizes), step))
                for e, body in got:
                    assert bytes(body[-len(payloads[e]):]) == payloads[e]
            assert len(client._idle_reads) == 1             # one connection, its buffer reused
        with bk.open_ledger(lh.ledger_id, password=b"pw") as rh:
            assert [bytes(e.data) for e in rh.read(0, len(sizes) - 1)] == payloads


def test_send_frame_survives_partial_sends_and_matches_frame():
    import threading

    a, b = socket.socketpair()
    parts = [b"h" * 7, b"", b"x" * (5 << 20), b"y" * 3, memoryview(b"z" * 100000)]
    expected = wire.frame(wire.KIND_READ_CHUNK, parts)
    got = []
    reader = threading.Thread(target=lambda: got.append(recv_exact(b, len(expected))))
    reader.start()                  # reads slowly enough that sendmsg sends partially
    wire.send_frame(a, wire.KIND_READ_CHUNK, parts)
    reader.join(30)
    assert got == [expected]
    a.close()
    b.close()


def test_a_connection_that_ends_sends_the_answers_it_held_first():
    """Credentials that expire between a held answer and the request that would send it end
    the connection; the held answer is sent before it closes (a unit test of DataConnection
    over a socket pair, its storage a stub serving any range)."""
    import threading
    import time
    import types

    from bkspark.bookie import data_port
    from bkspark.bookie.service import BookieService

    svc = types.SimpleNamespace(_stopping=False, metrics=None, _injected=lambda *a: 0,
                                config=types.SimpleNamespace(max_message_bytes=1 << 20))
    svc.storage = types.SimpleNamespace(read_range=lambda lid, first, last, max_bytes, step: [
        (e, b"body%d" % e) for e in range(first, last + 1)])
    svc._range_error = lambda *a, **kw: BookieService._range_error(svc, *a, **kw)
    svc.read_range_chunks = lambda r, alive, buf=None: BookieService.read_range_chunks(
        svc, r, alive, None)
    server = types.SimpleNamespace(service=svc, send_timeout=5.0, max_frame_bytes=1 << 20)
    bookie_end, client_end = socket.socketpair()
    connection = data_port.DataConnection(server, bookie_end, bookie_end.makefile("rb"),
                                          expires=time.time() + 0.5)
    serving = threading.Thread(target=connection.run)
    serving.start()
    client_end.sendall(range_frame(7, 0, 2, more=True))
    assert nothing_within(client_end, 0.2)              # held
    time.sleep(0.5)
    client_end.sendall(range_frame(7, 3, 4))            # read after the credentials' end
    serving.join(5)
    assert not serving.is_alive()                       # it ended the connection
    connection.rfile.close()
    bookie_end.close()
    assert range_answers(client_end, 1) == [[0, 1, 2]]
    assert closed_by_peer(client_end)
