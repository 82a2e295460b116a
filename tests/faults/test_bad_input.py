"""Bad-input campaign: random and mutated protocol messages, corrupted files, corrupted digests.

* random bytes on every gRPC method path (a raw channel with identity serializers) and
  structurally valid protobufs with random field values: the bookie answers an error status
  (or a gRPC error for undecodable bytes), never crashes, and its RSS stays bounded;
* random bytes, truncations and bit flips in the journal and entry-log files of a stopped
  bookie: startup succeeds or fails with a clear message, and an acknowledged entry is then
  read back intact or reported as EIO -- never as a missing entry (ENOENTRY/ENOLEDGER), except
  the newest entries of a killed bookie whose journal was cut short or zeroed from some point
  on (what a torn write leaves; bit flips or random bytes in its acknowledged groups refuse
  startup);
* one replica serving a corrupt entry (a wrong digest on the wire, or a corrupt stored entry):
  the reader detects it and serves the entry from another replica.
"""
import glob
import os
import random
import time


import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bkspark import errors
from bkspark.client import BookKeeper
from bkspark.client.digest import DigestManager
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.testing.cluster import BookieCluster, bookie_channel
from metadata.ledgers import write_ledger

SERVICE = "/bkspark.bookie.v1.Bookie/"
UNARY = {"Add": pb.AddResponse, "Read": pb.ReadResponse, "ReadLac": pb.ReadLacResponse,
         "WriteLac": pb.WriteLacResponse, "GetBookieInfo": pb.BookieInfoResponse,
         "ListEntries": pb.ListEntriesResponse, "Force": pb.ForceResponse,
         "SetFaults": pb.SetFaultsResponse}
VALID_STATUS = {errors.EOK, errors.ENOLEDGER, errors.ENOENTRY, errors.EBADREQ, errors.EIO,
                errors.EUA, errors.EBADVERSION, errors.EFENCED, errors.EREADONLY,
                errors.ETOOMANYREQUESTS, errors.EUNKNOWNLEDGERSTATE}
# a gRPC error is an acceptable answer to undecodable bytes; a dead or hung bookie is not
BAD_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
PASSWORD = b"fuzz"
MASTER_KEY = b"fuzz-master-key-0020"    # 20 bytes, a bookie's key length
FUZZ = settings(max_examples=int(os.environ.get("BKSPARK_FUZZ_EXAMPLES", "100")), deadline=None,
                suppress_health_check=list(HealthCheck), derandomize=True)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@pytest.fixture(scope="module")
def fuzz_bookie(tmp_path_factory):
    data = tmp_path_factory.mktemp("fuzz-bookie")
    uri = f"sqlite:///{data}/meta.db"
    with BookieCluster(uri, raw_ledgers=True, num_bookies=1, data_dir=data, fault_injection=False,
                       extra_args=["--long-poll-max-ms", "100", "--max-entry-bytes", str(1 << 20)],
                       session_timeout=1.0) as cluster:
        channel = bookie_channel(cluster.bookie_ids[0])
        stub = pb_grpc.BookieStub(channel)
        # a real ledger with entries, so mutated requests also hit existing state
        mkey = MASTER_KEY       # ledger 1 has no metadata: the bookie takes any key first
        dm = DigestManager(1, "crc32c")
        for e in range(20):
            r = stub.Add(pb.AddRequest(ledger_id=1, entry_id=e, master_key=mkey,
                                       body=dm.frame(e, e - 1, e + 1, b"x")), timeout=10)
            assert r.status == errors.EOK
        cluster.channel, cluster.stub = channel, stub
        cluster.rss0 = rss_kb(cluster.bookies[0].proc.pid)
        yield cluster
        channel.close()


def assert_alive(cluster):
    assert cluster.bookies[0].alive, cluster.bookies[0].log_tail()
    info = cluster.stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10)
    assert info.status == errors.EOK
    r = cluster.stub.Read(pb.ReadRequest(ledger_id=1, entry_id=5), timeout=10)
    assert r.status == errors.EOK


def call_raw(cluster, method: str, data: bytes):
    fn = cluster.channel.unary_unary(SERVICE + method, request_serializer=None,
                                     response_deserializer=None)
    try:
        return fn(data, timeout=10), None
    except grpc.RpcError as exc:
        return None, exc.code()


@FUZZ
@given(method=st.sampled_from(sorted(UNARY)), data=st.binary(max_size=512))
def test_random_bytes_on_every_unary_method(fuzz_bookie, method, data):
    reply, code = call_raw(fuzz_bookie, method, data)
    assert code not in BAD_CODES, (method, data, code, fuzz_bookie.bookies[0].log_tail())
    if reply is not None:
        resp = UNARY[method].FromString(reply)
        assert resp.status in VALID_STATUS, (method, data, resp)


@FUZZ
@given(data=st.lists(st.binary(max_size=300), max_size=5),
       method=st.sampled_from(["AddStream", "ReadRange"]))
def test_random_bytes_on_streaming_methods(fuzz_bookie, data, method):
    ch = fuzz_bookie.channel
    try:
        if method == "AddStream":
            fn = ch.stream_stream(SERVICE + method, request_serializer=None,
                                  response_deserializer=None)
            replies = list(fn(iter(data), timeout=10))
            for raw in replies:
                for r in pb.AddBatchResponse.FromString(raw).responses:
                    assert r.status in VALID_STATUS
        else:
            fn = ch.unary_stream(SERVICE + method, request_serializer=None,
                                 response_deserializer=None)
            for raw in fn(b"".join(data), timeout=10):
                assert pb.ReadRangeResponse.FromString(raw).status in VALID_STATUS
    except grpc.RpcError as exc:
        assert exc.code() not in BAD_CODES, (method, data, exc.code())


ids = st.one_of(st.integers(-3, 30), st.integers(-(1 << 63), (1 << 63) - 1))
keys = st.one_of(st.just(MASTER_KEY), st.binary(max_size=40))
bodies = st.binary(max_size=400)


@st.composite
def requests(draw):
    kind = draw(st.sampled_from(["Add", "Read", "ReadLac", "WriteLac", "ListEntries", "Force",
                                 "ReadRange", "AddStream"]))
    lid, eid = draw(ids), draw(ids)
    if kind == "Add":
        return kind, pb.AddRequest(ledger_id=lid, entry_id=eid, master_key=draw(keys),
                                   flags=draw(st.integers(0, (1 << 32) - 1)), body=draw(bodies),
                                   request_id=draw(st.integers(0, (1 << 64) - 1)))
    if kind == "Read":
        return kind, pb.ReadRequest(ledger_id=lid, entry_id=eid,
                                    flags=draw(st.integers(0, (1 << 32) - 1)),
                                    master_key=draw(keys), has_previous_lac=draw(st.booleans()),
                                    previous_lac=draw(ids), timeout_ms=draw(st.integers(0, 300)))
    if kind == "ReadLac":
        return kind, pb.ReadLacRequest(ledger_id=lid)
    if kind == "WriteLac":
        return kind, pb.WriteLacRequest(ledger_id=lid, lac=eid, master_key=draw(keys),
                                        lac_body=draw(bodies))
    if kind == "ListEntries":
        return kind, pb.ListEntriesRequest(ledger_id=lid)
    if kind == "Force":
        return kind, pb.ForceRequest(ledger_id=lid)
    if kind == "ReadRange":
        return kind, pb.ReadRangeRequest(ledger_id=lid, first_entry_id=eid,
                                         last_entry_id=draw(ids),
                                         max_bytes_per_message=draw(st.integers(0, (1 << 32) - 1)))
    adds = draw(st.lists(st.builds(pb.AddRequest, ledger_id=ids, entry_id=ids, master_key=keys,
                                   flags=st.integers(0, 3), body=bodies), max_size=4))
    return kind, pb.AddBatch(adds=adds)


@FUZZ
@given(req=requests())
def test_valid_protobufs_with_random_fields(fuzz_bookie, req):
    kind, msg = req
    stub = fuzz_bookie.stub
    try:
        if kind == "ReadRange":
            statuses = [r.status for r in stub.ReadRange(msg, timeout=10)]
        elif kind == "AddStream":
            statuses = [r.status for b in stub.AddStream(iter([msg]), timeout=10)
                        for r in b.responses]
        else:
            statuses = [getattr(stub, kind)(msg, timeout=10).status]
    except grpc.RpcError as exc:
        # a structurally valid request deserves a status, not an exception
        pytest.fail(f"{kind} {msg!r}: gRPC error {exc.code()} {exc.details()}\n"
                    + fuzz_bookie.bookies[0].log_tail())
    assert all(s in VALID_STATUS for s in statuses), (kind, msg, statuses)
    if kind == "Add" and len(msg.master_key) != 20:
        assert statuses == [errors.EBADREQ], (msg, statuses)


def test_bookie_survived_the_fuzzing_with_bounded_memory(fuzz_bookie):
    """Runs after the fuzz tests of this module (same bookie process)."""
    assert_alive(fuzz_bookie)
    grown = rss_kb(fuzz_bookie.bookies[0].proc.pid) - fuzz_bookie.rss0
    assert grown < 200_000, f"bookie RSS grew by {grown} kB while fuzzed"


# ---- corrupted files ----------------------------------------------------------------------

def _mutate(rng: random.Random, path: str) -> str:
    size = os.path.getsize(path)
    how = rng.choice(["bitflip", "random", "truncate", "zero-tail"])
    with open(path, "r+b") as f:
        if size == 0:
            f.write(rng.randbytes(rng.randint(1, 64)))
            return "random-grow"
        if how == "bitflip":
            for _ in range(rng.randint(1, 16)):
                pos = rng.randrange(size)
                f.seek(pos)
                b = f.read(1)[0]
                f.seek(pos)
                f.write(bytes([b ^ (1 << rng.randrange(8))]))
        elif how == "random":
            pos = rng.randrange(size)
            f.seek(pos)
            f.write(rng.randbytes(rng.randint(1, min(4096, size - pos))))
        elif how == "truncate":
            f.truncate(rng.randrange(size))
        else:
            pos = rng.randrange(size)
            f.seek(pos)
            f.write(bytes(size - pos))
    return how


@pytest.mark.parametrize("case", range(int(os.environ.get("BKSPARK_CORRUPT_CASES", "8"))))
def test_corrupted_journal_and_entry_logs(tmp_path, case, faults_seed):
    rng = random.Random(faults_seed * 100 + case)
    uri = f"sqlite:///{tmp_path}/meta.db"
    killed = rng.random() < 0.5     # SIGKILL: the journal holds the newest entries
    with BookieCluster(uri, raw_ledgers=True, num_bookies=1, data_dir=tmp_path, fault_injection=False,
                       extra_args=["--write-cache-mb", "1", "--journal-max-size-mb", "1",
                                   "--entry-log-max-size-mb", "1"],
                       session_timeout=1.0) as c, BookKeeper(uri) as bk:
        lh = bk.create_ledger(1, 1, 1, password=PASSWORD)
        lid, mkey = lh.ledger_id, lh.metadata.keys.derive(PASSWORD).master_key
        dm = DigestManager(lid, "crc32c")
        bodies = {}
        with bookie_channel(c.bookie_ids[0]) as ch:
            stub = pb_grpc.BookieStub(ch)
            for e in range(rng.randint(50, 600)):
                body = dm.frame(e, e - 1, e, rng.randbytes(rng.randint(10, 3000)))
                assert stub.Add(pb.AddRequest(ledger_id=lid, entry_id=e, master_key=mkey,
                                              body=body), timeout=10).status == errors.EOK
                bodies[e] = body
        c.kill(0) if killed else c.stop(0)
        bdir = c.bookies[0].dir
        files = sorted(glob.glob(f"{bdir}/journal/*.txn") + glob.glob(f"{bdir}/ledgers/*.log"))
        assert files
        target = rng.choice(files)
        how = _mutate(rng, target)
        what = f"case {case}: {how} in {os.path.basename(target)} after {'SIGKILL' if killed else 'SIGTERM'}"
        b = c.bookies[0]
        b.start()
        deadline = time.monotonic() + 60
        from bkspark.localcluster import bookie_state
        while b.alive and time.monotonic() < deadline and not bookie_state(b.http_port, b.address, b.credentials).get("registeredAs"):
            time.sleep(0.1)
        if not b.alive:
            log = b.log_tail(15)
            assert b.proc.returncode != 0
            assert "Traceback" not in log and ("level=ERROR" in log or "level=CRITICAL" in log
                                               or "error" in log.lower() or "refusing to start" in log), \
                f"{what}: startup failed without a clear message:\n{log}"
            return
        assert bookie_state(b.http_port, b.address, b.credentials).get("registeredAs"), f"{what}: bookie neither up nor down"
        journal_hit = target.endswith(".txn")
        with bookie_channel(c.bookie_ids[0]) as ch:
            stub = pb_grpc.BookieStub(ch)
            for e, body in bodies.items():
                r = stub.Read(pb.ReadRequest(ledger_id=lid, entry_id=e), timeout=10)
                if r.status == errors.EOK:
                    assert r.body == body, f"{what}: entry {e} served corrupt with EOK"
                elif r.status in (errors.ENOENTRY, errors.ENOLEDGER):
                    # only a journal tail of a killed bookie cut or zeroed like a torn write can
                    # lose the newest entries (their only copy); a bit flip or random bytes
                    # there refuse startup, and a corrupt entry log never loses one
                    assert killed and journal_hit and how in ("truncate", "zero-tail"), \
                        f"{what}: entry {e} reported missing ({r.status})"
                else:
                    assert r.status == errors.EIO, f"{what}: entry {e} status {r.status}"


# ---- corrupt replicas: the reader falls over to another replica ---------------------------

def test_wrong_digest_on_one_replica_is_detected_and_served_from_another(tmp_path):
    uri = f"sqlite:///{tmp_path}/meta.db"
    with BookieCluster(uri, raw_ledgers=True, num_bookies=3, data_dir=tmp_path, session_timeout=3.0) as c, \
            BookKeeper(uri, speculative_read_timeout=0) as bk:
        lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
        lid, ens = lh.ledger_id, lh.metadata.ensembles[0][1]
        dm = DigestManager(lid, "crc32c")
        mkey = lh.metadata.keys.derive(PASSWORD).master_key
        payloads = [f"entry-{e}-".encode() * 20 for e in range(30)]
        length = 0
        stubs = {b: pb_grpc.BookieStub(bookie_channel(b)) for b in ens}
        for e, p in enumerate(payloads):
            length += len(p)
            good = dm.frame(e, e - 1, length, p)
            bad = good[:-5] + bytes(x ^ 0x55 for x in good[-5:])     # payload changed, digest not
            first = ens[e % 3]          # the replica a reader asks first
            for b, stub in stubs.items():
                body = bad if b == first else good
                r = stub.Add(pb.AddRequest(ledger_id=lid, entry_id=e, master_key=mkey, body=body),
                             timeout=10)
                assert r.status == errors.EOK
        md, version = bk.ctx.read_metadata(lid)
        write_ledger(bk.store, md.with_closed(29, length), version)
        # the corrupt replica really serves a body whose digest fails
        r = stubs[ens[0]].Read(pb.ReadRequest(ledger_id=lid, entry_id=0), timeout=10)
        with pytest.raises(errors.DigestMismatchError):
            dm.verify(r.body, 0)
        for use_range in (False, True):
            with BookKeeper(uri, use_read_range=use_range, speculative_read_timeout=0) as reader:
                rh = reader.open_ledger(lid, password=PASSWORD)
                assert [x.data for x in rh.read(0, 29)] == payloads


def test_corrupt_stored_entry_on_one_replica_is_served_from_another(tmp_path):
    uri = f"sqlite:///{tmp_path}/meta.db"
    with BookieCluster(uri, raw_ledgers=True, num_bookies=3, data_dir=tmp_path, session_timeout=3.0) as c, \
            BookKeeper(uri, speculative_read_timeout=0) as bk:
        lh = bk.create_ledger(3, 3, 3, password=PASSWORD)
        ens = lh.metadata.ensembles[0][1]
        payloads = [(f"<{e:04d}>" + "payload" * 30).encode() for e in range(30)]
        for p in payloads:
            lh.append(p)
        lh.close()
        victim = c.bookie_ids.index(ens[0])       # first replica of entries 0, 3, 6, ...
        c.stop(victim)                             # graceful: entries land in entry logs
        hits = 0
        for path in glob.glob(f"{c.bookies[victim].dir}/ledgers/*.log"):
            with open(path, "r+b") as f:
                data = bytearray(f.read())
                for e in range(0, 30, 3):
                    i = data.find(f"<{e:04d}>".encode())
                    if i >= 0:
                        data[i + 20] ^= 0xFF
                        hits += 1
                f.seek(0)
                f.write(data)
        assert hits >= 5, "the entries were not found in the entry logs"
        c.start(victim)
        with bookie_channel(ens[0]) as ch:
            r = pb_grpc.BookieStub(ch).Read(pb.ReadRequest(ledger_id=lh.ledger_id, entry_id=0),
                                            timeout=10)
            assert r.status == errors.EIO, "a corrupt stored entry must be EIO, never ENOENTRY"
        for use_range in (False, True):
            with BookKeeper(uri, use_read_range=use_range, speculative_read_timeout=0) as reader:
                rh = reader.open_ledger(lh.ledger_id, password=PASSWORD)
                assert [x.data for x in rh.read(0, 29)] == payloads
