"""Optional TLS on the bookie's gRPC port: the client verifies the bookie's certificate."""
import subprocess

import grpc
import pytest

from bkspark.client import BookKeeper
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.testing.cluster import BookieCluster


def self_signed(directory, name):
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key, cert


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    key, cert = self_signed(d, "bookie")
    _, other = self_signed(d, "other")
    with BookieCluster(f"sqlite:///{d}/meta.db", num_bookies=1, data_dir=d, fault_injection=False,
                       extra_args=["--tls-cert-file", str(cert), "--tls-key-file", str(key)]) as c:
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
