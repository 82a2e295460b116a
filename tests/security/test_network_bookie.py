"""Issue 48: a bookie on a network address (a host of its own: a network namespace).

* Without authentication it refuses to start, naming the flag that allows it; with tokens but
  no TLS too (a token sent in clear can be replayed).
* With mutual TLS (client certificates signed by the cluster's CA, the role in their OU) an
  outsider on the network -- this test process, on the same bridge -- gets no answer without
  a certificate, nor with one of another CA, nor with one that names no role; a client
  certificate reads and writes; the admin endpoint (HTTPS) lets only an admin switch the
  bookie to read-only.

Needs root, iproute2 and nftables (``.ci/run`` installs them); elsewhere it skips, or fails
under ``BKSPARK_REQUIRE_ALL=1``.
"""
from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time

import grpc
import pytest

from bkspark.auth import tokens
from bkspark.auth.certs import CertificateAuthority
from bkspark.auth.credentials import Credentials
from bkspark.client import BookKeeper
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc
from bkspark.testing import netns
from metadata import open_store, registry
from metadata.testing import skip_or_fail

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    why = netns.available()
    if why:
        skip_or_fail(f"a bookie on a network address: {why}")
    with netns.Network() as net:
        yield net, net.add_host("b0"), tmp_path_factory.mktemp("netbookie")


def _bookie_argv(d, address: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bkspark.bookie", "--metadata", f"sqlite://{d}/meta.db",
            "--listen-address", address, "--port", "3181", "--http-port", "8000",
            "--journal-dir", str(d / "journal"), "--ledger-dirs", str(d / "ledgers"), *extra]


@pytest.mark.parametrize("extra, names", [
    ((), "--allow-insecure-network"),
    (("--auth-token-public-key-file", "TOKEN_PUB"), "tls_cert_file"),
])
def test_a_bookie_on_a_network_address_refuses_to_start_unprotected(host, extra, names):
    net, b0, d = host
    key = tokens.new_signing_key()
    (d / "token.pub").write_bytes(tokens.public_key_of(key))
    extra = [str(d / "token.pub") if x == "TOKEN_PUB" else x for x in extra]
    done = subprocess.run(net.launcher(b0) + _bookie_argv(d, b0.address, *extra),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert names in done.stderr and b0.address in done.stderr, done.stderr


@pytest.fixture(scope="module")
def mtls_bookie(host):
    net, b0, d = host
    ca = CertificateAuthority(str(d / "ca")).create()
    key, cert = ca.issue("bookie", hosts=[b0.address])
    proc = net.popen(b0, _bookie_argv(d, b0.address, "--tls-cert-file", cert,
                                      "--tls-key-file", key, "--tls-client-ca-file",
                                      ca.cert_file),
                     stdout=open(d / "bookie.log", "ab"), stderr=subprocess.STDOUT)
    bookie_id = f"{b0.address}:3181"
    deadline = time.monotonic() + 60
    with open_store(f"sqlite://{d}/meta.db", create=True) as store:
        while bookie_id not in registry.list_bookies(store):
            assert proc.poll() is None and time.monotonic() < deadline, \
                (d / "bookie.log").read_text()
            time.sleep(0.2)
    yield ca, bookie_id, d
    proc.terminate()
    proc.wait(20)


def _client_files(ca, role):
    key, cert = ca.issue(f"client-{role or 'norole'}", role=role)
    return {"tls_ca_file": ca.cert_file, "tls_cert_file": cert, "tls_key_file": key}


def test_an_outsider_on_the_network_gets_nothing_from_a_mutual_tls_bookie(host, mtls_bookie):
    net, b0, d = host
    ca, bookie_id, _ = mtls_bookie
    other = CertificateAuthority(str(d / "other-ca")).create()
    attempts = {
        "plaintext": grpc.insecure_channel(bookie_id),
        "TLS, no certificate": Credentials(ca_file=ca.cert_file).channel(bookie_id),
        "a certificate of another CA": _channel(ca.cert_file, _client_files(other, "admin"),
                                                bookie_id),
    }
    for what, channel in attempts.items():
        with channel, pytest.raises(grpc.RpcError) as info:
            pb_grpc.BookieStub(channel).Read(pb.ReadRequest(ledger_id=1, entry_id=0), timeout=5)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE,
                                     grpc.StatusCode.DEADLINE_EXCEEDED), what
    # a certificate of the right CA that names no role: authenticated by TLS, refused by role
    with _channel(ca.cert_file, _client_files(ca, None), bookie_id) as channel, \
            pytest.raises(grpc.RpcError) as info:
        pb_grpc.BookieStub(channel).Read(pb.ReadRequest(ledger_id=1, entry_id=0), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "names no role" in info.value.details()
    # the data port: no TLS session without a certificate
    with _channel(ca.cert_file, _client_files(ca, "client"), bookie_id) as channel:
        port = pb_grpc.BookieStub(channel).GetBookieInfo(pb.BookieInfoRequest(),
                                                         timeout=10).data_port
    context = ssl.create_default_context(cafile=ca.cert_file)
    with socket.create_connection((b0.address, port), timeout=10) as raw, \
            pytest.raises((ssl.SSLError, ConnectionError)):
        with context.wrap_socket(raw, server_hostname=b0.address) as sock:
            sock.sendall(b"BKD2")
            if not sock.recv(4):
                raise ConnectionError("closed")


def _channel(ca_file, files, bookie_id):
    return Credentials(ca_file=ca_file, cert_file=files["tls_cert_file"],
                       key_file=files["tls_key_file"]).channel(bookie_id)


def test_a_client_certificate_writes_and_reads_and_only_an_admin_switches_read_only(
        host, mtls_bookie):
    net, b0, d = host
    ca, bookie_id, _ = mtls_bookie
    client = _client_files(ca, "client")
    with BookKeeper(f"sqlite://{d}/meta.db", **client) as bk:
        lh = bk.create_ledger(1, 1, 1, password=b"pw")
        for i in range(20):
            lh.append(b"over mutual TLS %d" % i)
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.data for e in rh.read(0, 19)] == [b"over mutual TLS %d" % i for i in range(20)]
    url = f"https://{b0.address}:8000/api/v1/bookie/state/readonly"
    as_client = Credentials(ca_file=ca.cert_file, cert_file=client["tls_cert_file"],
                            key_file=client["tls_key_file"])
    assert as_client.http_json(url, "PUT", {"readOnly": True})[0] == 403
    assert Credentials(ca_file=ca.cert_file).http_json(url, "PUT", {"readOnly": True})[0] == 401
    admin = _client_files(ca, "admin")
    as_admin = Credentials(ca_file=ca.cert_file, cert_file=admin["tls_cert_file"],
                           key_file=admin["tls_key_file"])
    assert as_admin.http_json(url, "PUT", {"readOnly": True}) == (200, {"readOnly": True})
    assert as_admin.http_json(url, "PUT", {"readOnly": False}) == (200, {"readOnly": False})
    assert os.path.exists(d / "bookie.log")
