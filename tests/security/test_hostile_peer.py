"""Issue 49: a peer -- authenticated, so past the guard of issue 48 -- cannot exhaust a bookie.
One test per finding of the review, each against a real bookie process:

* a message of empty adds (gRPC ``AddStream``, a data-port ``AddBatch`` frame) is refused
  whole before any per-add work: the stream ends, the bookie's memory does not move (it grew
  ~410x the message's size before);
* a message with more adds than ``max_adds_per_message`` is refused whole;
* a range read asking ``max_bytes_per_message = 0xFFFFFFFF`` of a ledger that does not exist
  pins no buffer (16 MiB a connection before);
* long-poll reads beyond ``max_long_polls`` are answered ETOOMANYREQUESTS at once, so the
  gRPC workers stay free for the other calls (``GetBookieInfo`` took 9.5 s before);
* malformed gRPC requests are logged a few lines a minute, without tracebacks.
"""
from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest

from bkspark import errors
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.proto import wire
from bkspark.testing.cluster import BookieCluster, bookie_channel, credentials_of_bookie

MAX_ADDS = 1000
MAX_LONG_POLLS = 4
GRPC_WORKERS = 8
ADD_STREAM = "/bkspark.bookie.v1.Bookie/AddStream"


@pytest.fixture(scope="module")
def bookie(tmp_path_factory):
    data = tmp_path_factory.mktemp("hostile")
    with BookieCluster(f"sqlite:///{data}/meta.db", num_bookies=1, data_dir=data,
                       fault_injection=False, raw_ledgers=True,      # (adds to ledger 7, 8 ...)
                       extra_args=["--max-adds-per-message", str(MAX_ADDS),
                                   "--max-long-polls", str(MAX_LONG_POLLS),
                                   "--grpc-workers", str(GRPC_WORKERS),
                                   "--long-poll-max-ms", "4000"]) as cluster:
        bid = cluster.bookie_ids[0]
        channel = bookie_channel(bid, role="client")
        cluster.stub = pb_grpc.BookieStub(channel)
        cluster.bid = bid
        cluster.pid = cluster.bookies[0].proc.pid
        cluster.data_port = cluster.stub.GetBookieInfo(pb.BookieInfoRequest(),
                                                       timeout=10).data_port
        yield cluster
        channel.close()


def _memory_kb(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _add(lid: int, eid: int, size: int = 64, key: bytes = b"h" * 20) -> pb.AddRequest:
    body = lid.to_bytes(8, "big") + eid.to_bytes(8, "big") + (-1).to_bytes(8, "big", signed=True) \
        + size.to_bytes(8, "big") + b"\0\0\0\0" + b"x" * (size - 36)
    return pb.AddRequest(ledger_id=lid, entry_id=eid, master_key=key, body=body)


def _listed_ledger(bookie) -> tuple[int, bytes]:
    """A ledger the metadata lists (on the module's bookie) and its master key; nothing
    written to it."""
    from bkspark.client import BookKeeper
    with BookKeeper(bookie.metadata_uri) as bk:
        lh = bk.create_ledger(1, 1, 1, password=b"pw")
        return lh.ledger_id, lh._master_key


def _data_conn(bookie) -> tuple[socket.socket, object]:
    sock = socket.create_connection((bookie.bid.rsplit(":", 1)[0], bookie.data_port), timeout=10)
    sock.sendall(wire.hello(credentials_of_bookie(bookie.bid, "client").token))
    rfile = sock.makefile("rb")
    assert rfile.read(4) == wire.DATA_MAGIC
    return sock, rfile


def _raw_add_stream(bookie, payload: bytes):
    """Send one AddStream message of ``payload`` bytes; the stream's outcome."""
    creds = credentials_of_bookie(bookie.bid, "client")
    with creds.channel(bookie.bid) as channel:
        call = channel.stream_stream(ADD_STREAM, request_serializer=lambda b: b,
                                     response_deserializer=pb.AddBatchResponse.FromString)
        try:
            return list(call(iter([payload]), timeout=30))
        except grpc.RpcError as exc:
            return exc


def test_a_stream_of_empty_adds_is_refused_before_any_per_add_work(bookie):
    empty = pb.AddBatch(adds=[pb.AddRequest()] * 500_000).SerializeToString()  # ~1 MiB
    before = _memory_kb(bookie.pid)
    outcome = _raw_add_stream(bookie, empty)
    assert isinstance(outcome, grpc.RpcError), outcome
    assert outcome.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "too short to hold a master key" in outcome.details()
    sock, rfile = _data_conn(bookie)
    with sock:
        sock.sendall(wire.frame(wire.KIND_ADD_BATCH, [empty]))
        assert rfile.read(1) == b""                     # closed, nothing answered
    grown = _memory_kb(bookie.pid) - before
    assert grown < 64 << 10, f"the bookie grew {grown} KiB for {len(empty) >> 10} KiB of adds"
    # a real add still goes through
    answer = _raw_add_stream(bookie, pb.AddBatch(adds=[_add(7, 0)]).SerializeToString())
    assert [r.status for m in answer for r in m.responses] == [errors.EOK]


def test_a_message_over_max_adds_per_message_is_refused_whole(bookie):
    many = pb.AddBatch(adds=[_add(8, e) for e in range(MAX_ADDS + 1)]).SerializeToString()
    outcome = _raw_add_stream(bookie, many)
    assert isinstance(outcome, grpc.RpcError) and "max_adds_per_message" in outcome.details()
    r = bookie.stub.Read(pb.ReadRequest(ledger_id=8, entry_id=0), timeout=10)
    assert r.status in (errors.ENOLEDGER, errors.ENOENTRY)          # nothing was stored
    fits = pb.AddBatch(adds=[_add(8, e) for e in range(MAX_ADDS)]).SerializeToString()
    answer = _raw_add_stream(bookie, fits)
    assert sum(r.status == errors.EOK for m in answer for r in m.responses) == MAX_ADDS


def test_range_reads_of_nothing_pin_no_buffer(bookie):
    request = pb.ReadRangeRequest(ledger_id=987_654_321, first_entry_id=0, last_entry_id=10,
                                  max_bytes_per_message=0xFFFFFFFF).SerializeToString()
    before = _memory_kb(bookie.pid)
    conns = []
    try:
        for _ in range(16):
            sock, rfile = _data_conn(bookie)
            conns.append(sock)
            sock.sendall(wire.frame(wire.KIND_READ_RANGE, [request]))
            kind, chunk = wire.read_frame(rfile, 1 << 20)
            assert kind == wire.KIND_READ_CHUNK
            assert pb.ReadRangeResponse.FromString(chunk).status in (errors.ENOENTRY,
                                                                     errors.ENOLEDGER)
        grown = _memory_kb(bookie.pid) - before
        assert grown < 32 << 10, f"16 empty range reads pinned {grown} KiB"
    finally:
        for sock in conns:
            sock.close()


def test_long_polls_beyond_the_limit_are_refused_and_workers_stay_free(bookie):
    """Twice as many long polls as workers: the first max_long_polls wait, the others are
    answered ETOOMANYREQUESTS at once, and another call is answered meanwhile."""
    answers: list = []
    started = time.monotonic()

    def poll():
        r = bookie.stub.Read(pb.ReadRequest(ledger_id=424_242, entry_id=0, has_previous_lac=True,
                                            previous_lac=5, timeout_ms=4000), timeout=20)
        answers.append((r.status, time.monotonic() - started))

    threads = [threading.Thread(target=poll) for _ in range(2 * GRPC_WORKERS)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    info = bookie.stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10)
    assert info.status == errors.EOK and time.monotonic() - t0 < 1.0
    for t in threads:
        t.join()
    refused = [at for status, at in answers if status == errors.ETOOMANYREQUESTS]
    waited = [at for status, at in answers if status == errors.EOK]
    assert len(waited) == MAX_LONG_POLLS and len(refused) == 2 * GRPC_WORKERS - MAX_LONG_POLLS
    assert max(refused) < 2.0 and min(waited) > 3.0, answers


def test_malformed_grpc_requests_are_answered_and_cost_nothing(bookie):
    """Undecodable bytes on a unary and a streaming method are answered EBADREQ; the bookie
    neither logs a traceback nor keeps memory for them (gRPC's own deserializer kept ~20 KB a
    request, 1 GB after 50,000; and logged each with its traceback)."""
    creds = credentials_of_bookie(bookie.bid, "client")
    before = _memory_kb(bookie.pid)
    with creds.channel(bookie.bid) as channel:
        read = channel.unary_unary("/bkspark.bookie.v1.Bookie/Read",
                                   request_serializer=lambda b: b,
                                   response_deserializer=pb.ReadResponse.FromString)
        ranged = channel.unary_stream("/bkspark.bookie.v1.Bookie/ReadRange",
                                      request_serializer=lambda b: b,
                                      response_deserializer=pb.ReadRangeResponse.FromString)
        for _ in range(3000):
            answer = read(b"\xff\xff\xff\xff not protobuf", timeout=10)
            assert answer.status == errors.EBADREQ and "malformed ReadRequest" in answer.message
        (chunk,) = list(ranged(b"\xff\xff\xff\xff", timeout=10))
        assert chunk.status == errors.EBADREQ
    grown = _memory_kb(bookie.pid) - before
    assert grown < 16 << 10, f"3,000 malformed requests kept {grown} KiB"
    log = open(bookie.bookies[0].log_path, errors="replace").read()
    assert "Traceback" not in log and "deserializ" not in log.lower()


def test_one_address_holds_at_most_max_per_peer_data_connections(bookie):
    """Admitted connections count too (an authenticated peer could fill the bookie's 1,024
    before): the address's next connection is closed at once, and served again once it
    holds fewer."""
    from bkspark.bookie.data_port import MAX_PER_PEER
    held = []
    try:
        for _ in range(MAX_PER_PEER):
            held.append(_data_conn(bookie)[0])
        extra = socket.create_connection((bookie.bid.rsplit(":", 1)[0], bookie.data_port),
                                         timeout=10)
        with extra:
            try:
                extra.sendall(wire.hello(credentials_of_bookie(bookie.bid, "client").token))
                answer = extra.recv(4)
            except ConnectionResetError:
                answer = b""
            assert answer == b""                        # closed, no hello answered
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            sock, _ = _data_conn(bookie)
            sock.close()
            break
        except (AssertionError, OSError):
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_an_entry_once_stored_is_never_replaced(bookie):
    """A second add of a stored entry with other bytes -- a normal add, a RECOVERY_ADD, over
    gRPC or the data port -- is refused (EBADREQ) and the entry keeps its bytes; the same
    bytes again are accepted (a recovery write-back is idempotent). Before, the last add won
    and readers got the forged bytes."""
    lid, key = _listed_ledger(bookie)
    first, forged = _add(lid, 0, 80, key), _add(lid, 0, 80, key)
    forged.body = forged.body[:-4] + b"evil"
    assert bookie.stub.Add(first, timeout=10).status == errors.EOK
    for add in (forged, pb.AddRequest(ledger_id=lid, entry_id=0, master_key=forged.master_key,
                                      body=forged.body, flags=pb.AddRequest.RECOVERY_ADD)):
        refused = bookie.stub.Add(add, timeout=10)
        assert refused.status == errors.EBADREQ and "never replaced" in refused.message
        answer = _raw_add_stream(bookie, pb.AddBatch(adds=[add]).SerializeToString())
        (r,) = [r for m in answer for r in m.responses]
        assert r.status == errors.EBADREQ and "never replaced" in r.message
    sock, rfile = _data_conn(bookie)
    with sock:
        sock.sendall(wire.frame(wire.KIND_ADD_BATCH, [pb.AddBatch(adds=[forged])
                                                      .SerializeToString()]))
        kind, payload = wire.read_frame(rfile, 1 << 20)
        (r,) = pb.AddBatchResponse.FromString(payload).responses
        assert r.status == errors.EBADREQ
    assert bookie.stub.Read(pb.ReadRequest(ledger_id=lid, entry_id=0), timeout=10).body \
        == first.body
    assert bookie.stub.Add(first, timeout=10).status == errors.EOK     # same bytes: idempotent
    # one new entry twice in one message (found by the add_batch fuzz target): the first is
    # stored, the other bytes refused -- before, both were acknowledged and the last one won
    again, other = _add(lid, 1, 80, key), _add(lid, 1, 80, key)
    other.body = other.body[:-4] + b"evil"
    answer = _raw_add_stream(bookie, pb.AddBatch(adds=[again, other, again]).SerializeToString())
    assert sorted(r.status for m in answer for r in m.responses) == \
        [errors.EOK, errors.EOK, errors.EBADREQ]
    assert bookie.stub.Read(pb.ReadRequest(ledger_id=lid, entry_id=1), timeout=10).body \
        == again.body


def test_a_reader_refused_by_every_bookie_waits_its_timeout_then_asks_again(bookie):
    """Every long-poll slot held by others: the tailing reader's wait is its timeout (its
    back-off), not timeout + read_timeout, and it learns an entry added meanwhile on the next
    wait."""
    from bkspark.client import BookKeeper
    with BookKeeper(bookie.metadata_uri, read_timeout=5.0) as bk:
        lh = bk.create_ledger(1, 1, 1)
        lh.append(b"first")
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        holders = [threading.Thread(target=lambda: bookie.stub.Read(pb.ReadRequest(
            ledger_id=515_151, entry_id=0, has_previous_lac=True, previous_lac=5,
            timeout_ms=4000), timeout=20)) for _ in range(MAX_LONG_POLLS)]
        for t in holders:
            t.start()
        time.sleep(0.5)
        lh.append(b"second")
        t0 = time.monotonic()
        rh.read_lac_long_poll(rh.last_add_confirmed, 1.0)
        waited = time.monotonic() - t0
        assert 0.9 < waited < 2.5, waited
        for t in holders:
            t.join()
        lh.append(b"third")
        assert rh.read_lac_long_poll(rh.last_add_confirmed, 3.0) >= 1
        lh.close()


def test_a_range_buffer_grows_to_the_chunks_asked_once_data_fills_it(bookie):
    """After a small range, a large one is served in chunks of the size asked, not the small
    buffer's (the buffer doubles while a chunk fills it)."""
    lid = 61_616
    size = 256 << 10
    for e in range(40):
        add = _add(lid, e, size)
        assert bookie.stub.Add(add, timeout=10).status == errors.EOK
    sock, rfile = _data_conn(bookie)
    with sock:
        def chunks(last, max_bytes):
            sock.sendall(wire.frame(wire.KIND_READ_RANGE, [pb.ReadRangeRequest(
                ledger_id=lid, first_entry_id=0, last_entry_id=last,
                max_bytes_per_message=max_bytes).SerializeToString()]))
            got = []
            while True:
                kind, payload = wire.read_frame(rfile, 64 << 20)
                if kind == wire.KIND_READ_END:
                    return got
                got.append(len(pb.ReadRangeResponse.FromString(payload).entries))
        assert chunks(0, 4 << 20) == [1]                        # a small range first
        big = chunks(39, 4 << 20)
        assert sum(big) == 40 and len(big) <= 20, big           # 16 a chunk once grown


def test_a_lac_no_digest_proves_is_counted_by_no_reader(bookie):
    """A peer holding the master key stores an explicit LAC of 1,000,000 whose digest no key
    made (a bookie cannot check digests: it holds no MAC key). Readers count only what they
    verified: a tailing reader's LAC stays at the acknowledged end, a long poll does not jump,
    and recovery closes the ledger at its last entry -- before, readers took the bookie's
    ``max_lac`` and recovery failed "cannot read entry 1000000 (at or below the LAC)"."""
    from bkspark.client import BookKeeper
    from bkspark.client.digest import DigestManager
    with BookKeeper(bookie.metadata_uri) as bk:
        lh = bk.create_ledger(1, 1, 1, password=b"pw")
        for i in range(5):
            lh.append(b"entry-%d" % i)
        key = lh._master_key
        forged = DigestManager(lh.ledger_id, "crc32c", b"pw").frame_lac(1_000_000)
        forged = forged[:-1] + bytes([forged[-1] ^ 1])
        assert bookie.stub.WriteLac(pb.WriteLacRequest(
            ledger_id=lh.ledger_id, lac=1_000_000, master_key=key, lac_body=forged),
            timeout=10).status == errors.EOK
        fence = bookie.stub.Read(pb.ReadRequest(ledger_id=lh.ledger_id, entry_id=-1),
                                 timeout=10)
        assert fence.max_lac == 1_000_000            # the bookie's word, unchecked
        tail = bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        # entry 4 carries LAC 3; the writer's own explicit LAC (4) may land after the forgery
        assert tail.last_add_confirmed in (3, 4)
        assert tail.read_lac_long_poll(4, 1.0) <= 4
        assert tail.read_last_add_confirmed() in (3, 4)
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.is_closed and rh.last_add_confirmed == 4
        assert [e.data for e in rh.read(0, 4)] == [b"entry-%d" % i for i in range(5)]


def test_calls_beyond_grpc_max_concurrent_rpcs_are_refused_at_once(bookie):
    """Streams that send nothing hold the gRPC workers and fill the queue behind them (its
    bound, ``grpc_max_concurrent_rpcs``, is 4 x grpc_workers here): the next call is refused
    RESOURCE_EXHAUSTED at once -- before, it waited in an unbounded queue until its deadline
    -- and once the streams end, calls are served again."""
    release = threading.Event()
    creds = credentials_of_bookie(bookie.bid, "client")
    channels, calls = [], []

    def nothing():
        release.wait(30)
        return
        yield  # noqa: unreachable - a request iterator that sends nothing

    try:
        for _ in range(4 * GRPC_WORKERS):
            ch = creds.channel(bookie.bid)
            channels.append(ch)
            call = ch.stream_stream(ADD_STREAM, request_serializer=lambda b: b,
                                    response_deserializer=pb.AddBatchResponse.FromString)(
                nothing(), timeout=60)
            calls.append(call)
        time.sleep(1.0)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            bookie.stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert time.monotonic() - t0 < 2.0
    finally:
        release.set()
        for call in calls:
            call.cancel()
        for ch in channels:
            ch.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            assert bookie.stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=5).status == \
                errors.EOK
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, "calls were not served again"
            time.sleep(0.2)


def test_a_data_port_peer_that_reads_no_answer_is_closed_after_the_send_timeout(tmp_path):
    """A peer asks a range read of more than socket buffers hold and never reads: the bookie
    gives its send ``data_port_send_timeout_s`` and closes the connection (the thread and
    the answers it held go with it)."""
    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", num_bookies=1, data_dir=tmp_path,
                       extra_args=["--data-port-send-timeout-s", "2"],
                       raw_ledgers=True) as cluster:
        bid = cluster.bookie_ids[0]
        with bookie_channel(bid, role="client") as ch:
            stub = pb_grpc.BookieStub(ch)
            port = stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10).data_port
            for e in range(48):                                       # 48 MiB to serve
                assert stub.Add(_add(77, e, 1 << 20), timeout=30).status == errors.EOK
        cluster.data_port = port
        cluster.bid = bid
        sock, rfile = _data_conn(cluster)
        with sock:
            sock.sendall(wire.frame(wire.KIND_READ_RANGE, [pb.ReadRangeRequest(
                ledger_id=77, first_entry_id=0, last_entry_id=47).SerializeToString()]))
            time.sleep(4.0)                                   # reads nothing: 2 s send timeout
            got, closed = 0, False
            sock.settimeout(1.0)
            end = time.monotonic() + 20
            while time.monotonic() < end:     # what the sockets held, then the end
                try:
                    chunk = sock.recv(1 << 20)
                except ConnectionResetError:
                    closed = True
                    break
                except socket.timeout:
                    continue
                if not chunk:
                    closed = True
                    break
                got += len(chunk)
            assert closed and got < 48 << 20, \
                f"the connection was {'closed' if closed else 'kept'}, {got} bytes sent"


def test_a_late_write_lac_of_an_earlier_round_does_not_take_the_lac_back(bookie):
    """A WriteLac that timed out on the writer's side and lands after the next round's (or
    one replayed by a key holder): the stored LAC -- the one readers verify and count --
    stays the highest (found in review: readers then saw 3 while 5 was acknowledged)."""
    from bkspark.client import BookKeeper
    with BookKeeper(bookie.metadata_uri) as bk:
        lh = bk.create_ledger(1, 1, 1, password=b"pw")
        lh.append_many([b"e%d" % i for i in range(6)])
        assert lh.flush_lac(5) == 5
        late = bk._pool.get(bookie.bid).write_lac(lh.ledger_id, 3, lh._master_key,
                                                 lh._digest.frame_lac(3)).result(10)
        assert late.status == errors.EOK
        rh = bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert rh.read_last_add_confirmed() == 5


@pytest.fixture(scope="module")
def checking_bookie(tmp_path_factory):
    """A bookie as deployed: it records a ledger it has no record of only if the metadata
    lists it (``check_new_ledgers``, on by default)."""
    data = tmp_path_factory.mktemp("checking")
    with BookieCluster(f"sqlite:///{data}/meta.db", num_bookies=1, data_dir=data,
                       fault_injection=False) as cluster:
        bid = cluster.bookie_ids[0]
        channel = bookie_channel(bid, role="client")
        cluster.stub = pb_grpc.BookieStub(channel)
        cluster.bid = bid
        cluster.data_port = cluster.stub.GetBookieInfo(pb.BookieInfoRequest(),
                                                       timeout=10).data_port
        yield cluster
        channel.close()


def test_no_request_claims_a_ledger_id_the_metadata_does_not_list(checking_bookie):
    """Adds (gRPC, AddStream, the data port) and fencing reads of a ledger id the metadata
    does not list -- the next ids, easy to guess -- are answered ENOLEDGER and leave no
    record; an add to a listed ledger under another key is answered EUA. The ledger then
    created with that id is written under its own key. Before, the first add or fence a
    bookie saw claimed the id for its key for good, and the real writer got "wrong
    password"."""
    from bkspark.client import BookKeeper
    probe, _ = _listed_ledger(checking_bookie)
    lid, squatter = probe + 1, b"s" * 20
    r = checking_bookie.stub.Add(_add(lid, 0, 64, squatter), timeout=10)
    assert r.status == errors.ENOLEDGER and "metadata" in r.message
    batch = pb.AddBatch(adds=[_add(lid, 0, 64, squatter)]).SerializeToString()
    (r,) = [r for m in _raw_add_stream(checking_bookie, batch) for r in m.responses]
    assert r.status == errors.ENOLEDGER
    sock, rfile = _data_conn(checking_bookie)
    with sock:
        sock.sendall(wire.frame(wire.KIND_ADD_BATCH, [batch]))
        (r,) = pb.AddBatchResponse.FromString(wire.read_frame(rfile, 1 << 20)[1]).responses
        assert r.status == errors.ENOLEDGER
    fence = checking_bookie.stub.Read(pb.ReadRequest(
        ledger_id=lid, entry_id=-1, master_key=squatter, flags=pb.ReadRequest.FENCE_LEDGER),
        timeout=10)
    assert fence.status == errors.ENOLEDGER
    with BookKeeper(checking_bookie.metadata_uri) as bk:
        lh = bk.create_ledger(1, 1, 1, password=b"pw")
        assert lh.ledger_id == lid
        r = checking_bookie.stub.Add(_add(lid, 0, 64, squatter), timeout=10)
        assert r.status == errors.EUA
        assert lh.append_many([b"mine-0", b"mine-1"]) == [0, 1]
        lh.close()
        assert [e.data for e in bk.open_ledger(lid, password=b"pw").read(0, 1)] == \
            [b"mine-0", b"mine-1"]
