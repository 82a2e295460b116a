"""Optional TLS on the bookie's gRPC port: the client verifies the bookie's certificate."""
import grpc
import pytest

from bkspark.client import BookKeeper
from bkspark.errors import BadRequestError
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.testing.cluster import BookieCluster
from bkspark.testing.tls import self_signed, tls_bookie_args
from metadata import open_store, registry


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    key, cert = self_signed(d, "bookie")
    _, other = self_signed(d, "other")
    with BookieCluster(f"sqlite:///{d}/meta.db", num_bookies=1, data_dir=d, fault_injection=False,
                       extra_args=tls_bookie_args(key, cert)) as c:
        yield c, cert, other


def test_client_with_the_ca_writes_and_reads(tls_cluster):
    cluster, cert, _ = tls_cluster
    with BookKeeper(cluster.metadata_uri, tls_ca_file=str(cert)) as bk:
        lh = bk.create_ledger(1, 1, 1, password=b"pw")
        lh.append_many([b"secret-%d" % i for i in range(10)])
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.data for e in rh.read(0, 9)] == [b"secret-%d" % i for i in range(10)]


@pytest.mark.parametrize("which", ["plaintext", "wrong-ca"])
def test_plaintext_or_unverified_clients_are_refused(tls_cluster, which):
    cluster, _, other = tls_cluster
    address = cluster.bookie_ids[0]
    if which == "plaintext":
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(other.read_bytes()))
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.BookieStub(channel).GetBookieInfo(pb.BookieInfoRequest(), timeout=5)
    assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_missing_ca_file_is_a_clear_error(tls_cluster, tmp_path):
    cluster, _, _ = tls_cluster
    with pytest.raises(Exception, match="tls_ca_file"):
        BookKeeper(cluster.metadata_uri, tls_ca_file=str(tmp_path / "nope.pem"))


def test_a_client_without_the_ca_is_told_the_bookies_serve_tls(tls_cluster):
    """The bookie registers whether it serves TLS: a client without tls_ca_file fails at once
    with an error saying so (not a bare "socket closed", nor "not enough bookies")."""
    cluster, cert, _ = tls_cluster
    with open_store(cluster.metadata_uri) as store:
        assert registry.list_bookies(store)[cluster.bookie_ids[0]]["tls"] is True
    with BookKeeper(cluster.metadata_uri, tls_ca_file=str(cert)) as bk:
        lh = bk.create_ledger(1, 1, 1, password=b"pw")
        lh.append(b"x")
        lh.close()
    with BookKeeper(cluster.metadata_uri, read_timeout=3) as bk:
        with pytest.raises(BadRequestError, match="none of the 1 writable bookies.*accepts TLS "
                                                  "connections only.*client.tlsCaFile"):
            bk.create_ledger(1, 1, 1)
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        with pytest.raises(Exception, match="Socket closed -- it accepts TLS connections only "
                                            "and this client has no tls_ca_file"):
            list(rh.read(0, 0))


def test_bookies_of_the_other_transport_are_left_out(tmp_path, tls_cluster):
    """Registrations say TLS or not: a client uses only bookies of its own transport (and
    those that do not say), and names TLS when that leaves none."""
    _, cert, _ = tls_cluster
    uri = f"sqlite://{tmp_path}/meta.db"
    with open_store(uri, create=True) as store:
        registry.ensure_layout(store)
        for bookie, tls in [("10.0.0.1:3181", True), ("10.0.0.2:3181", False),
                            ("10.0.0.3:3181", None)]:
            info = {"address": bookie} | ({} if tls is None else {"tls": tls})
            registry.register_bookie(store, bookie, info)
        with BookKeeper(uri) as bk:
            assert sorted(bk.ctx.writable_bookies()) == ["10.0.0.2:3181", "10.0.0.3:3181"]
        with BookKeeper(uri, tls_ca_file=str(cert)) as bk:
            assert sorted(bk.ctx.writable_bookies()) == ["10.0.0.1:3181", "10.0.0.3:3181"]
        registry.unregister_bookie(store, "10.0.0.3:3181")
        registry.unregister_bookie(store, "10.0.0.2:3181")
        with BookKeeper(uri) as bk, pytest.raises(BadRequestError, match=(
                "bookie 10.0.0.1:3181: it accepts TLS connections only")):
            bk.create_ledger(1, 1, 1)
        registry.unregister_bookie(store, "10.0.0.1:3181")
        registry.register_bookie(store, "10.0.0.2:3181", {"address": "10.0.0.2:3181",
                                                          "tls": False})
        with BookKeeper(uri, tls_ca_file=str(cert)) as bk, pytest.raises(BadRequestError, match=(
                "it does not serve TLS and this client, given tls_ca_file .*, connects with "
                "TLS only")):
            bk.create_ledger(1, 1, 1)
