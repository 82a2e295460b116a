"""Every status-code path of the bookie service, against a real bookie process."""
import itertools
import json
import os
import threading
import time

import pytest

from bkspark import errors
from bkspark.bookie import mounts
from bkspark.client.digest import DigestManager
from bkspark.proto import bookie_pb2 as pb
from bkspark.testing.cluster import BookieCluster, bookie_http

from .conftest import MASTER_KEY, OTHER_KEY, add_request, frame, stub_for

_ids = itertools.count(1000)


def new_ledger_id():
    return next(_ids)


def read(stub, lid, eid, **kw):
    return stub.Read(pb.ReadRequest(ledger_id=lid, entry_id=eid, **kw), timeout=20)


def test_add_then_read_and_read_last(stub):
    lid = new_ledger_id()
    for e in range(3):
        assert stub.Add(add_request(lid, e, b"payload-%d" % e, lac=e - 1), timeout=10).status == errors.EOK
    reply = read(stub, lid, 1)
    assert reply.status == errors.EOK and reply.body == frame(lid, 1, b"payload-1", 0)
    last = read(stub, lid, -1)
    assert last.status == errors.EOK and last.entry_id == 2 and last.body.endswith(b"payload-2")
    assert last.max_lac == 1


def test_missing_entry_and_missing_ledger(stub):
    lid = new_ledger_id()
    assert stub.Add(add_request(lid, 0), timeout=10).status == errors.EOK
    assert read(stub, lid, 5).status == errors.ENOENTRY
    assert read(stub, new_ledger_id(), 0).status == errors.ENOLEDGER


def test_wrong_master_key_is_unauthorized(stub):
    lid = new_ledger_id()
    assert stub.Add(add_request(lid, 0), timeout=10).status == errors.EOK
    assert stub.Add(add_request(lid, 1, key=OTHER_KEY), timeout=10).status == errors.EUA
    fence = read(stub, lid, -1, flags=pb.ReadRequest.FENCE_LEDGER, master_key=OTHER_KEY)
    assert fence.status == errors.EUA
    # the failed fence did not fence: the right writer can still add
    assert stub.Add(add_request(lid, 1), timeout=10).status == errors.EOK


def test_fenced_ledger_rejects_adds_but_accepts_recovery_adds(stub):
    lid = new_ledger_id()
    assert stub.Add(add_request(lid, 0), timeout=10).status == errors.EOK
    fence = read(stub, lid, -1, flags=pb.ReadRequest.FENCE_LEDGER, master_key=MASTER_KEY)
    assert fence.status == errors.EOK and fence.entry_id == 0
    assert stub.Add(add_request(lid, 1), timeout=10).status == errors.EFENCED
    assert stub.Add(add_request(lid, 1, recovery=True), timeout=10).status == errors.EOK


def test_fault_op_fence_is_the_fencing_read_and_read_lac_is_not(one_bookie, stub):
    """Fault rules name what they hit (issue 27, item 8): "fence" matches recovery's fencing
    read (Read of entry -1 with FENCE) and nothing else; "read_lac" does not touch fencing."""
    lid = new_ledger_id()
    assert stub.Add(add_request(lid, 0), timeout=10).status == errors.EOK
    fence_req = dict(flags=pb.ReadRequest.FENCE_LEDGER, master_key=MASTER_KEY)
    try:
        one_bookie.set_faults(0, [dict(op="fence", action="fail", error=errors.EIO,
                                       ledger_id=lid)])
        assert read(stub, lid, 0).status == errors.EOK            # a plain read passes
        assert read(stub, lid, -1).status == errors.EOK           # so does reading the last
        assert read(stub, lid, -1, **fence_req).status == errors.EIO
        assert stub.Add(add_request(lid, 1), timeout=10).status == errors.EOK   # not fenced
        one_bookie.set_faults(0, [dict(op="read_lac", action="fail", error=errors.EIO,
                                       ledger_id=lid)])
        fence = read(stub, lid, -1, **fence_req)
        assert fence.status == errors.EOK and fence.entry_id == 1
        assert stub.Add(add_request(lid, 2), timeout=10).status == errors.EFENCED
    finally:
        one_bookie.clear_faults(0)


@pytest.mark.parametrize("mutate, reason", [
    (lambda r: r.__setattr__("master_key", b"short"), "master key"),
    (lambda r: r.__setattr__("body", b"tiny"), "header"),
    (lambda r: r.__setattr__("entry_id", -5), "negative"),
    (lambda r: r.__setattr__("flags", 0x80), "flags"),
    (lambda r: r.__setattr__("body", frame(1, 0, b"z" * (2 << 20))), "max_entry_bytes"),
])
def test_malformed_adds_are_bad_requests_and_bookie_stays_up(stub, mutate, reason):
    req = add_request(new_ledger_id(), 0)
    mutate(req)
    reply = stub.Add(req, timeout=10)
    assert reply.status == errors.EBADREQ and reason in reply.message
    assert stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10).status == errors.EOK


def test_bad_reads_are_bad_requests(stub):
    assert read(stub, -1, 0).status == errors.EBADREQ
    assert read(stub, 1, -7).status == errors.EBADREQ
    fence_without_key = read(stub, 1, -1, flags=pb.ReadRequest.FENCE_LEDGER)
    assert fence_without_key.status == errors.EBADREQ


def test_streaming_add_acks_every_entry_once(stub):
    lid = new_ledger_id()
    batches = [pb.AddBatch(adds=[add_request(lid, b * 100 + i, b"v%d" % (b * 100 + i))
                                 for i in range(100)]) for b in range(10)]
    acked = []
    for reply in stub.AddStream(iter(batches), timeout=60):
        acked.extend((r.entry_id, r.status) for r in reply.responses)
    assert sorted(acked) == [(e, errors.EOK) for e in range(1000)]
    listed = stub.ListEntries(pb.ListEntriesRequest(ledger_id=lid), timeout=10)
    assert [(r.first, r.last) for r in listed.ranges] == [(0, 999)]


def test_streaming_range_read_in_large_messages(stub):
    lid = new_ledger_id()
    batch = pb.AddBatch(adds=[add_request(lid, e, bytes([e % 256]) * 4096) for e in range(200)])
    list(stub.AddStream(iter([batch]), timeout=60))
    chunks = list(stub.ReadRange(pb.ReadRangeRequest(ledger_id=lid, first_entry_id=10, last_entry_id=199,
                                                     max_bytes_per_message=100_000), timeout=30))
    assert all(c.status == errors.EOK for c in chunks)
    assert 1 < len(chunks) < 190, "entries should travel many per message"
    entries = [e for c in chunks for e in c.entries]
    assert [e.entry_id for e in entries] == list(range(10, 200))
    assert entries[5].body == frame(lid, 15, bytes([15]) * 4096)
    # a range past the end stops with ENOENTRY at the first missing entry
    tail = list(stub.ReadRange(pb.ReadRangeRequest(ledger_id=lid, first_entry_id=195, last_entry_id=205),
                               timeout=30))
    assert tail[-1].status == errors.ENOENTRY and tail[-1].next_entry_id == 200


def test_long_poll_waits_for_lac_to_advance(stub):
    lid = new_ledger_id()
    assert stub.Add(add_request(lid, 0, lac=-1), timeout=10).status == errors.EOK
    result = {}

    def poll():
        result["reply"] = read(stub, lid, 1, has_previous_lac=True, previous_lac=-1, timeout_ms=10_000,
                               flags=pb.ReadRequest.ENTRY_PIGGYBACK)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.3)
    assert poller.is_alive(), "long poll returned before the LAC advanced"
    assert stub.Add(add_request(lid, 1, b"next", lac=0), timeout=10).status == errors.EOK
    poller.join(15)
    reply = result["reply"]
    assert reply.status == errors.EOK and reply.max_lac == 0
    assert reply.body == frame(lid, 1, b"next", 0)
    # nothing new: the poll times out with the old LAC
    expired = read(stub, lid, 2, has_previous_lac=True, previous_lac=0, timeout_ms=200)
    assert expired.status == errors.EOK and expired.max_lac == 0 and not expired.body


def test_explicit_lac_round_trip(stub):
    lid = new_ledger_id()
    assert stub.Add(add_request(lid, 0), timeout=10).status == errors.EOK
    lac_body = DigestManager(lid, "crc32c", b"pw").frame_lac(0)    # as the client frames it
    reply = stub.WriteLac(pb.WriteLacRequest(ledger_id=lid, lac=0, master_key=MASTER_KEY, lac_body=lac_body),
                          timeout=10)
    assert reply.status == errors.EOK
    got = stub.ReadLac(pb.ReadLacRequest(ledger_id=lid), timeout=10)
    assert got.status == errors.EOK and got.lac_body == lac_body and got.last_entry_body.endswith(b"x")
    bad = stub.WriteLac(pb.WriteLacRequest(ledger_id=lid, lac=0, master_key=OTHER_KEY, lac_body=lac_body),
                        timeout=10)
    assert bad.status == errors.EUA
    assert stub.ReadLac(pb.ReadLacRequest(ledger_id=new_ledger_id()), timeout=10).status == errors.ENOLEDGER
    # the LAC is the body's: a number beside it, or another ledger's body, is refused (a
    # client holding the key set readers' LAC to 1,000,000 this way, issue 49)
    for lac, body in ((1_000_000, lac_body),
                      (5, DigestManager(lid + 1, "crc32c").frame_lac(5)), (0, b"short")):
        refused = stub.WriteLac(pb.WriteLacRequest(ledger_id=lid, lac=lac, master_key=MASTER_KEY,
                                                   lac_body=body), timeout=10)
        assert refused.status == errors.EBADREQ, (lac, body)
    assert read(stub, lid, -1).max_lac == 0


@pytest.mark.parametrize("digest", ["crc32c", "crc32", "hmac"])
def test_explicit_lac_is_the_bookies_lac_after_a_kill(tmp_path, digest):
    """A bookie killed after storing an explicit LAC knows the ledger's LAC from it when it
    starts again: the LAC of the body as the client frames it (ledger id, LAC, digest), not
    eight bytes of the digest, nothing for a short digest."""
    lid = 77
    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path) as c:
        s, channel = stub_for(c.bookie_ids[0])
        assert s.Add(add_request(lid, 0, lac=-1), timeout=10).status == errors.EOK
        body = DigestManager(lid, digest, b"pw").frame_lac(0)
        reply = s.WriteLac(pb.WriteLacRequest(ledger_id=lid, lac=0, master_key=MASTER_KEY,
                                              lac_body=body), timeout=10)
        assert reply.status == errors.EOK and read(s, lid, -1).max_lac == 0
        channel.close()
        c.restart(0, kill=True)
        s, channel = stub_for(c.bookie_ids[0])
        try:
            reply = s.Read(pb.ReadRequest(ledger_id=lid, entry_id=-1), timeout=60,
                           wait_for_ready=True)
            assert reply.status == errors.EOK and reply.max_lac == 0
        finally:
            channel.close()


def test_overload_answers_too_many_requests(one_bookie, stub):
    lid = new_ledger_id()
    one_bookie.set_faults(0, [dict(op="add", action="delay", delay_ms=1500, ledger_id=lid, count=1)])
    batch = pb.AddBatch(adds=[add_request(lid, e, b"a" * 900_000) for e in range(2)])
    slow = threading.Thread(target=lambda: list(stub.AddStream(iter([batch]), timeout=30)))
    slow.start()
    try:
        deadline = time.monotonic() + 10
        while _metric(one_bookie, "bookie_inflight_add_bytes") <= 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        reply = stub.Add(add_request(lid + 1, 0, b"b" * 900_000), timeout=30)
        assert reply.status == errors.ETOOMANYREQUESTS
    finally:
        slow.join()
    assert stub.Add(add_request(lid + 1, 0, b"b" * 1000), timeout=30).status == errors.EOK


def test_injected_faults_need_the_flag(tmp_path):
    from bkspark.localcluster import LocalCluster
    with LocalCluster(f"sqlite:///{tmp_path}/m.db", 1, str(tmp_path)) as cluster:
        s, channel = stub_for(cluster.bookie_ids[0])
        reply = s.SetFaults(pb.SetFaultsRequest(rules=[pb.FaultRule(op="add", action="fail")]), timeout=10)
        assert reply.status == errors.EBADREQ
        channel.close()


def _metric(cluster, name):
    body = bookie_http(cluster.bookies[0], "/metrics")[1]
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_admin_endpoint_and_metrics(one_bookie, stub):
    bookie = one_bookie.bookies[0]
    assert bookie_http(bookie, "/heartbeat") == (200, b"OK\n")
    info = json.loads(bookie_http(bookie, "/api/v1/bookie/info")[1])
    assert info["totalSpace"] >= info["freeSpace"] > 0
    stub.Add(add_request(new_ledger_id(), 0), timeout=10)
    assert _metric(one_bookie, "bookie_adds_total") >= 1
    assert _metric(one_bookie, "bookie_add_bytes_total") > 0


def _samples(cluster, name):
    """{frozenset(labels): value} of metric sample ``name`` on the bookie's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    body = bookie_http(cluster.bookies[0], "/metrics")[1].decode()
    return {frozenset(s.labels.items()): s.value
            for family in text_string_to_metric_families(body) for s in family.samples
            if s.name == name}


def test_metrics_of_reads_errors_and_directories(one_bookie, stub):
    """What a dashboard plots: read latency by kind of read, answers other than EOK by RPC
    and status, and each directory's use and free space."""
    lid = new_ledger_id()
    for e in range(3):
        assert stub.Add(add_request(lid, e), timeout=10).status == errors.EOK
    before = _samples(one_bookie, "bookie_rpc_errors_total")
    key = frozenset({"rpc": "Read", "status": "ENOLEDGER"}.items())
    assert read(stub, lid, 1).status == errors.EOK
    assert read(stub, new_ledger_id(), 0).status == errors.ENOLEDGER
    list(stub.ReadRange(pb.ReadRangeRequest(ledger_id=lid, first_entry_id=0, last_entry_id=2),
                        timeout=10))
    missing = list(stub.ReadRange(pb.ReadRangeRequest(ledger_id=lid, first_entry_id=5,
                                                      last_entry_id=6), timeout=10))
    assert missing[-1].status == errors.ENOENTRY
    errors_now = _samples(one_bookie, "bookie_rpc_errors_total")
    assert errors_now[key] == before.get(key, 0) + 1
    range_key = frozenset({"rpc": "ReadRange", "status": "ENOENTRY"}.items())
    assert errors_now[range_key] >= before.get(range_key, 0) + 1
    counts = _samples(one_bookie, "bookie_read_seconds_count")
    assert counts[frozenset({"op": "read"}.items())] >= 1
    assert counts[frozenset({"op": "range"}.items())] >= 1
    used = _samples(one_bookie, "bookie_dir_bytes")
    free = _samples(one_bookie, "bookie_dir_free_bytes")
    total = _samples(one_bookie, "bookie_dir_total_bytes")
    assert {dict(k)["kind"] for k in used} == {"journal", "ledger"}
    for k in used:
        assert used[k] > 0 and 0 < free[k] <= total[k]


def test_a_bookies_threads_carry_their_names_to_the_os(one_bookie, stub):
    """``top -H`` and bench/procstat.py name a stall's thread: the Python ones are not all
    ``python3`` (bkspark/bookie/threads.py), the engine's and RocksDB's name themselves."""
    lid = new_ledger_id()
    assert stub.Add(add_request(lid, 0), timeout=20).status == errors.EOK
    pid = one_bookie.bookies[0].proc.pid
    names = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            names.add(f.read().strip())
    assert {"bookie-gc", "bookie-disk-mon", "bookie-grpc", "bks-ckpt"} <= names, names
    assert any(n.startswith("rocksdb:") for n in names), names


def test_a_bookie_on_a_filesystem_with_online_discard_says_so_at_start(one_bookie):
    """The warning is logged exactly when the bookie's directory's real mount has online
    discard (this machine's / has; a CI host may not): no false alarm, no silence."""
    bookie = one_bookie.bookies[0]
    expected = mounts.online_discard_dirs([bookie.dir])
    with open(bookie.log_path) as f:
        log_text = f.read()
    assert ("mounted with online discard" in log_text) == bool(expected), expected
    if expected:
        assert "fstrim" in log_text and expected[0][1].device in log_text
