"""Issue 48: an outsider who reaches a cluster's ports gets nothing.

Each test is one finding of the security review, tried as the reviewer tried it -- plain gRPC,
raw sockets, plain HTTP -- against a default local cluster (the embedded store, and
ZooKeeper): the bookies authenticate every peer (a local cluster makes its own token key and
tokens, :mod:`bkspark.auth.local`), so the outsider, who has no token or one signed by another
key, is refused (EUA: gRPC ``UNAUTHENTICATED``, a refused data-port hello, HTTP 401), and a
peer whose role is too low is refused too (``PERMISSION_DENIED``, HTTP 403). Before the change,
every request below was served.
"""
from __future__ import annotations

import glob
import socket
import time

import grpc
import pytest

from bkspark.auth import tokens
from bkspark.auth.credentials import Credentials
from bkspark.client import BookKeeper
from bkspark.localcluster import LocalCluster
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.proto import wire
from metadata.testing import unique_root

OUTSIDER_TOKENS = {
    "none": "",
    "garbage": "not-a-token",
    "signed by another key": tokens.mint(tokens.new_signing_key(), "outsider", "admin", 3600),
}


@pytest.fixture(scope="module", params=["sqlite", "zk"])
def cluster(request, tmp_path_factory):
    uri = None
    if request.param == "zk":
        uri = request.getfixturevalue("zookeeper").uri(unique_root("outsider"))
    with LocalCluster(uri, 3, str(tmp_path_factory.mktemp(f"outsider-{request.param}"))) as c:
        yield c


@pytest.fixture(scope="module")
def ledger(cluster):
    """A ledger of the default password (b"", a public master key) with 10 acknowledged
    entries, its writer still open; ``(handle, entries)``."""
    bk = BookKeeper(cluster.metadata_uri)
    lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"")
    entries = [b"secret-%d" % i for i in range(10)]
    for e in entries:
        lh.append(e)
    yield lh, entries
    bk.close()


def _stub(bookie_id: str, token: str):
    channel = Credentials(token=token).channel(bookie_id)
    return pb_grpc.BookieStub(channel), channel


def _refused(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


@pytest.mark.parametrize("token", sorted(OUTSIDER_TOKENS))
def test_an_outsider_reads_no_entry_over_grpc(cluster, ledger, token):
    lh, _ = ledger
    stub, channel = _stub(cluster.bookie_ids[0], OUTSIDER_TOKENS[token])
    with channel:
        calls = [
            lambda: stub.Read(pb.ReadRequest(ledger_id=lh.ledger_id, entry_id=0), timeout=10),
            lambda: list(stub.ReadRange(pb.ReadRangeRequest(
                ledger_id=lh.ledger_id, first_entry_id=0, last_entry_id=9), timeout=10)),
            lambda: stub.ReadLac(pb.ReadLacRequest(ledger_id=lh.ledger_id), timeout=10),
            lambda: stub.ListEntries(pb.ListEntriesRequest(ledger_id=lh.ledger_id), timeout=10),
            lambda: stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10),
        ]
        for call in calls:
            assert _refused(call) == grpc.StatusCode.UNAUTHENTICATED


def _data_port(cluster) -> tuple[str, int]:
    stub, channel = _stub(cluster.bookie_ids[0], cluster.credentials("client").token)
    with channel:
        port = stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10).data_port
    return cluster.bookie_ids[0].rsplit(":", 1)[0], port


@pytest.mark.parametrize("token", sorted(OUTSIDER_TOKENS))
def test_an_outsider_gets_no_data_port_connection(cluster, ledger, token):
    lh, _ = ledger
    with socket.create_connection(_data_port(cluster), timeout=10) as sock:
        sock.sendall(wire.hello(OUTSIDER_TOKENS[token]))
        # a range read sent at once, without waiting for the hello's answer, is never served
        sock.sendall(wire.frame(wire.KIND_READ_RANGE, [pb.ReadRangeRequest(
            ledger_id=lh.ledger_id, first_entry_id=0, last_entry_id=9).SerializeToString()]))
        rfile = sock.makefile("rb")
        assert rfile.read(4) == wire.DATA_REFUSED
        kind, why = wire.read_frame(rfile, wire.MAX_HELLO_BYTES)
        assert kind == wire.KIND_REFUSED and b"token" in why
        assert rfile.read() == b""          # closed: nothing of the ledger was sent


def test_the_old_hello_is_refused(cluster):
    with socket.create_connection(_data_port(cluster), timeout=10) as sock:
        sock.sendall(b"BKD1")               # a client of before (no credentials)
        assert sock.makefile("rb").read() == b""


def test_an_outsider_cannot_forge_an_entry_or_fence_the_writer(cluster, ledger):
    lh, entries = ledger
    key = lh.metadata.keys.master_key       # even the ledger's own key: refused all the same
    for bookie in lh.metadata.last_ensemble():
        stub, channel = _stub(bookie, OUTSIDER_TOKENS["signed by another key"])
        with channel:
            forged = pb.AddRequest(ledger_id=lh.ledger_id, entry_id=0, master_key=key,
                                   body=b"forged" * 10)
            assert _refused(lambda: stub.Add(forged, timeout=10)) == \
                grpc.StatusCode.UNAUTHENTICATED
            fence = pb.ReadRequest(ledger_id=lh.ledger_id, entry_id=-1, master_key=key,
                                   flags=pb.ReadRequest.FENCE_LEDGER)
            assert _refused(lambda: stub.Read(fence, timeout=10)) == \
                grpc.StatusCode.UNAUTHENTICATED
    entries.append(b"after the attack")
    lh.append(entries[-1])                  # not fenced
    with BookKeeper(cluster.metadata_uri) as reader:
        rh = reader.open_ledger(lh.ledger_id, password=b"", recovery=False)
        assert [e.data for e in rh.read(0, len(entries) - 2)] == entries[:-1]


def test_an_outsider_cannot_squat_ledger_ids(cluster):
    with BookKeeper(cluster.metadata_uri) as bk:
        probe = bk.create_ledger(3, 3, 2)
        probe.close()
        upcoming = range(probe.ledger_id + 1, probe.ledger_id + 40)
        for bookie in cluster.bookie_ids:
            stub, channel = _stub(bookie, "")
            with channel:
                for lid in upcoming:
                    fence = pb.ReadRequest(ledger_id=lid, entry_id=-1, master_key=b"x" * 20,
                                           flags=pb.ReadRequest.FENCE_LEDGER)
                    assert _refused(lambda: stub.Read(fence, timeout=10)) == \
                        grpc.StatusCode.UNAUTHENTICATED
        for _ in range(5):                  # the next ledgers are created and written
            lh = bk.create_ledger(3, 3, 2, password=b"pw")
            assert lh.ledger_id in upcoming
            lh.append(b"mine")
            lh.close()


def _http(cluster, i: int, path: str, method: str, role: str | None, body=None):
    creds = cluster.credentials(role) if role else Credentials()
    b = cluster.bookies[i]
    return creds.http_json(creds.url(b.address, b.http_port, path), method, body)


@pytest.mark.parametrize("method, path, body", [
    ("PUT", "/api/v1/bookie/state/readonly", {"readOnly": True}),
    ("POST", "/api/v1/bookie/gc", None),
    ("PUT", "/api/v1/autorecovery/status?enabled=false", {}),
    ("PUT", "/api/v1/autorecovery/trigger_audit", {}),
])
def test_admin_actions_need_an_admin(cluster, method, path, body):
    for i in range(len(cluster.bookies)):
        code, doc = _http(cluster, i, path, method, None, body)
        assert code == 401 and "token" in doc["error"], doc
        code, doc = _http(cluster, i, path, method, "client", body)
        assert code == 403 and "needs admin" in doc["error"], doc
    for i in range(len(cluster.bookies)):   # nothing changed: writable, repair enabled
        code, doc = _http(cluster, i, "/api/v1/bookie/state", "GET", "client")
        assert code == 200 and doc["registeredAs"] == "available" and not doc["readOnly"]
    code, doc = _http(cluster, 0, "/api/v1/autorecovery/status", "GET", "client")
    assert (code, doc) == (200, {"enabled": True})
    code, doc = _http(cluster, 0, "/heartbeat", "GET", None)     # liveness stays open
    assert (code, doc) == (200, "OK\n")


def test_an_admin_may_switch_a_bookie_read_only(cluster):
    code, doc = _http(cluster, 2, "/api/v1/bookie/state/readonly", "PUT", "admin",
                      {"readOnly": True})
    assert (code, doc) == (200, {"readOnly": True})
    code, doc = _http(cluster, 2, "/api/v1/bookie/state/readonly", "PUT", "admin",
                      {"readOnly": False})
    assert (code, doc) == (200, {"readOnly": False})


def test_autorecovery_may_not_act_as_an_admin(cluster):
    code, doc = _http(cluster, 0, "/api/v1/bookie/state/readonly", "PUT", "autorecovery",
                      {"readOnly": True})
    assert code == 403 and "needs admin" in doc["error"], doc


def test_refusals_are_logged_once_per_peer(cluster, ledger):
    lh, _ = ledger
    stub, channel = _stub(cluster.bookie_ids[1], "")
    with channel:
        for _ in range(50):
            _refused(lambda: stub.Read(pb.ReadRequest(ledger_id=lh.ledger_id, entry_id=0),
                                       timeout=10))
    for b in cluster.bookies:
        with open(b.log_path, errors="replace") as f:
            lines = [line for line in f if "refused a request from" in line]
        assert len(lines) <= 1, lines
    with open(cluster.bookies[1].log_path, errors="replace") as f:
        assert sum("refused a request from 127.0.0.1" in line for line in f) == 1
    code, text = _http(cluster, 1, "/metrics", "GET", "client")     # ... and all counted
    refused = [line for line in text.splitlines() if line.startswith("bookie_auth_refused_total")]
    assert refused and float(refused[0].split()[-1]) >= 50, refused


def test_credentials_are_private_files(cluster):
    import os
    import stat
    files = glob.glob(os.path.join(cluster.data_dir, "security", "*"))
    assert any(f.endswith("admin.token") for f in files) and \
        any(f.endswith("token.key") for f in files), files
    for f in files:
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f


def test_a_store_that_copies_a_clusters_instance_id_gets_none_of_its_credentials(cluster,
                                                                                 tmp_path):
    from bkspark.cluster_registry import local_credentials
    from metadata import open_store, registry
    from metadata.layout import INSTANCEID
    with open_store(cluster.metadata_uri) as store:
        instance = registry.read_instance_id(store)
        assert local_credentials(store)["auth_token_file"].endswith("client.token")
    with open_store(f"sqlite://{tmp_path}/elsewhere.db", create=True) as other:
        other.create(INSTANCEID, instance.encode())
        assert local_credentials(other) == {}


def test_connections_that_never_finish_their_hello_cannot_lock_clients_out(cluster):
    from bkspark.bookie import data_port
    address = _data_port(cluster)
    t0 = time.monotonic()
    silent = [socket.create_connection(address, timeout=30)
              for _ in range(data_port.MAX_UNADMITTED_PER_PEER)]
    trickle = silent[0]
    try:
        time.sleep(0.5)
        with socket.create_connection(address, timeout=10) as one_more:
            assert one_more.recv(1) == b""      # refused at once: too many waiting
        for _ in range(3):                      # a hello trickled byte by byte ...
            trickle.sendall(b"B")
            time.sleep(1)
        for s in silent:                        # ... is closed at the deadline like the rest
            s.settimeout(data_port.HELLO_DEADLINE_S + 10)
            assert s.recv(1) == b""
        assert time.monotonic() - t0 < data_port.HELLO_DEADLINE_S + 10
        with BookKeeper(cluster.metadata_uri) as bk:     # clients connect again
            lh = bk.create_ledger(3, 3, 2)
            lh.append(b"after the siege")
            lh.close()
    finally:
        for s in silent:
            s.close()


def test_http_connections_and_bodies_are_bounded(cluster):
    from bkspark import httpd
    b = cluster.bookies[0]
    idle = [socket.create_connection((b.address, b.http_port), timeout=10)
            for _ in range(httpd.MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)
        with socket.create_connection((b.address, b.http_port), timeout=10) as extra:
            assert extra.recv(1) == b""             # over the bound: closed at once
    finally:
        for s in idle:
            s.close()
    time.sleep(0.5)
    with socket.create_connection((b.address, b.http_port), timeout=10) as s:
        token = cluster.credentials("admin").token
        s.sendall(b"PUT /api/v1/bookie/state/readonly HTTP/1.1\r\nHost: x\r\n"
                  b"Authorization: Bearer " + token.encode() +
                  b"\r\nContent-Length: 100000000000000\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.0 400")
