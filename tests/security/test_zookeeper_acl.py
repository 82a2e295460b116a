"""Issue 48, "delete data for good through ZooKeeper": a cluster whose metadata URI names
credentials (``?digest_file=``) creates every record as its own (ZooKeeper's CREATOR_ALL), so
an outsider's plain kazoo client -- as the review's -- reads no ledger metadata (passwords
included), registers no fake bookie and deletes nothing. ``bkspark shell zk-acl`` secures a
tree created before the credentials were set. Before, every record was ``world:anyone:cdrwa``
(and a URI with settings was refused).
"""
from __future__ import annotations

import base64

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl_credential

from bkspark.cli.main import main as bkspark
from bkspark.client import BookKeeper
from bkspark.errors import UnauthorizedError
from bkspark.localcluster import LocalCluster
from metadata import layout, open_store, registry
from metadata.ledger_metadata import LedgerMetadata
from metadata.testing import unique_root


def _kazoo(zookeeper, auth=None) -> KazooClient:
    client = KazooClient(hosts=zookeeper.address, auth_data=auth or [])
    client.start(timeout=15)
    return client


def _secured_uri(zookeeper, tmp_path, root, *extra):
    digest = tmp_path / "zk.digest"
    digest.write_text("bkspark:s3cret-zk\n")
    digest.chmod(0o600)
    return zookeeper.uri(root) + "?" + "&".join([f"digest_file={digest}", *extra])


def _every_path(client, root) -> list[str]:
    out, todo = [], [root]
    while todo:
        path = todo.pop()
        out.append(path)
        todo += [f"{path}/{c}" for c in client.get_children(path)]
    return out


def test_an_outsider_reads_writes_and_deletes_nothing_of_a_secured_cluster(zookeeper, tmp_path):
    root = unique_root("zkacl")
    uri = _secured_uri(zookeeper, tmp_path, root)
    with LocalCluster(uri, 3, str(tmp_path / "cluster")) as cluster, BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"ledger password")
        for i in range(10):
            lh.append(b"entry %d" % i)
        lh.close()
        owner = _kazoo(zookeeper, [("digest", "bkspark:s3cret-zk")])
        paths = _every_path(owner, root)
        ledger = root + layout.ledger_path(lh.ledger_id)
        assert ledger in paths and any("/available/" in p for p in paths), paths
        outsider = _kazoo(zookeeper)
        try:
            for path in paths:
                with pytest.raises(NoAuthError):
                    outsider.get(path)
            with pytest.raises(NoAuthError):
                outsider.get_children(root)
            with pytest.raises(NoAuthError):
                outsider.create(root + layout.bookie_path("10.9.9.9:3181"), b"{}")
            with pytest.raises(NoAuthError):
                outsider.delete(ledger)
            with pytest.raises(NoAuthError):
                outsider.set(ledger, b"{}")
        finally:
            outsider.stop()
        acls, _ = owner.get_acls(ledger)
        assert [(a.id.scheme, a.perms) for a in acls] == [("digest", 31)], acls
        owner.stop()
        # the cluster itself works on: a reader with the credentials reads every entry
        rh = bk.open_ledger(lh.ledger_id, password=b"ledger password")
        assert [e.data for e in rh.read(0, 9)] == [b"entry %d" % i for i in range(10)]
        assert set(registry.list_bookies(bk.store)) == set(cluster.bookie_ids)


def test_wrong_credentials_are_refused_with_a_clear_error(zookeeper, tmp_path):
    root = unique_root("zkacl")
    uri = _secured_uri(zookeeper, tmp_path, root)
    with open_store(uri) as store:
        registry.ensure_layout(store)
    wrong = tmp_path / "wrong.digest"
    wrong.write_text("bkspark:guess\n")
    with open_store(zookeeper.uri(root) + f"?digest_file={wrong}") as store:
        with pytest.raises(UnauthorizedError, match="not authorized"):
            registry.list_bookies(store)


def test_a_read_identity_reads_but_does_not_write(zookeeper, tmp_path):
    root = unique_root("zkacl")
    reader = make_digest_acl_credential("monitor", "look-only")
    uri = _secured_uri(zookeeper, tmp_path, root, f"read_acl=digest:{reader}")
    with open_store(uri) as store:
        registry.ensure_layout(store)
    monitor = _kazoo(zookeeper, [("digest", "monitor:look-only")])
    try:
        assert monitor.get_children(root)
        with pytest.raises(NoAuthError):
            monitor.create(root + "/available/evil", b"")
    finally:
        monitor.stop()


def test_a_reader_of_the_metadata_learns_no_ledger_password(zookeeper, tmp_path):
    """Ledger metadata keeps a salted key record (metadata/ledger_keys.py), not the password:
    an identity allowed to read the metadata (read_acl) finds no password in a ledger's
    record, and the keys stored for one ledger open no other ledger of the same password.
    Before, the record held the password in base64."""
    root = unique_root("zkacl")
    reader = make_digest_acl_credential("monitor", "look-only")
    uri = _secured_uri(zookeeper, tmp_path, root, f"read_acl=digest:{reader}")
    password = b"ledger password"
    with LocalCluster(uri, 3, str(tmp_path / "cluster")), BookKeeper(uri) as bk:
        ledgers = [bk.create_ledger(3, 2, 2, digest="hmac", password=password)
                   for _ in range(2)]
        for lh in ledgers:
            lh.append(b"entry")
            lh.close()
        monitor = _kazoo(zookeeper, [("digest", "monitor:look-only")])
        try:
            records = [monitor.get(root + layout.ledger_path(lh.ledger_id))[0]
                       for lh in ledgers]
        finally:
            monitor.stop()
        for record in records:
            assert password not in record and base64.b64encode(password) not in record
        a, b = (LedgerMetadata.deserialize(r).keys for r in records)
        assert a.salt != b.salt and a.master_key != b.master_key and a.mac_key != b.mac_key
        assert a.derive(password) is not None and a.derive(b"") is None


def test_zk_acl_secures_a_tree_created_open(zookeeper, tmp_path, capsys):
    root = unique_root("zkacl")
    with open_store(zookeeper.uri(root)) as store:      # no credentials: world:anyone
        registry.ensure_layout(store)
        store.create("/ledgers/extra", b"x")
    outsider = _kazoo(zookeeper)
    try:
        assert outsider.get(root + "/ledgers/extra")[0] == b"x"     # open, as before
        uri = _secured_uri(zookeeper, tmp_path, root)
        assert bkspark(["shell", "zk-acl", "--metadata", uri, "--json"]) == 0
        assert '"records":' in capsys.readouterr().out
        owner = _kazoo(zookeeper, [("digest", "bkspark:s3cret-zk")])
        for path in _every_path(owner, root):
            with pytest.raises(NoAuthError):
                outsider.get(path)
        owner.stop()
    finally:
        outsider.stop()


@pytest.fixture(scope="module")
def tls_zookeeper(tmp_path_factory):
    from bkspark.auth.certs import CertificateAuthority
    from metadata.testing import ZooKeeperServer
    d = tmp_path_factory.mktemp("zk-tls")
    ca = CertificateAuthority(str(d)).create()
    key, cert = ca.issue("zookeeper", hosts=["127.0.0.1"])
    key_cert = d / "zookeeper-key-cert.pem"
    key_cert.write_text(open(key).read() + open(cert).read())
    server = ZooKeeperServer(tls=(str(key_cert), ca.cert_file)).start()
    try:
        yield server, ca
    finally:
        server.stop()


def test_a_cluster_talks_to_zookeeper_over_tls_only_with_a_certificate(tls_zookeeper, tmp_path):
    server, ca = tls_zookeeper
    key, cert = ca.issue("bkspark-zk-client", role="client")
    root = unique_root("zktls")
    uri = _secured_uri(zookeeper_at(server.host, server.secure_port), tmp_path, root,
                       f"tls_ca_file={ca.cert_file}", f"tls_cert_file={cert}",
                       f"tls_key_file={key}")
    with LocalCluster(uri, 3, str(tmp_path / "cluster")), BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"pw")
        lh.append(b"metadata over TLS")
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.data for e in rh.read(0, 0)] == [b"metadata over TLS"]
    secure = f"127.0.0.1:{server.secure_port}"
    for how in ({}, {"use_ssl": True, "verify_certs": True, "ca": ca.cert_file}):
        client = KazooClient(hosts=secure, **how)        # plaintext; TLS without a certificate
        with pytest.raises(Exception):
            client.start(timeout=5)
        client.stop()
        client.close()


class zookeeper_at:
    """``uri(root)`` of a ZooKeeper address (the secure port of a server)."""

    def __init__(self, host: str, port: int) -> None:
        self.address = f"{host}:{port}"

    def uri(self, root: str = "/") -> str:
        return f"zk://{self.address}{root}"


def test_sasl_credentials_protect_the_tree_like_digest_ones(tmp_path):
    """``?sasl_file=`` against a ZooKeeper that authenticates with SASL DIGEST-MD5: records
    are the SASL user's alone (sasl:<user> ACL), an outsider reads nothing, a wrong password
    is refused with a clear error."""
    from metadata.testing import ZooKeeperServer
    server = ZooKeeperServer(sasl_users={"bkspark": "s3cret-sasl"}).start()
    try:
        sasl = tmp_path / "zk.sasl"
        sasl.write_text("bkspark:s3cret-sasl\n")
        root = unique_root("zksasl")
        with open_store(server.uri(root) + f"?sasl_file={sasl}") as store:
            registry.ensure_layout(store)
            store.create("/ledgers/probe", b"mine")
            assert store.get("/ledgers/probe")[0] == b"mine"
        owner = KazooClient(hosts=server.address, sasl_options={
            "mechanism": "DIGEST-MD5", "username": "bkspark", "password": "s3cret-sasl"})
        owner.start(timeout=15)
        try:
            acls, _ = owner.get_acls(root + "/ledgers/probe")
            assert [(a.id.scheme, a.id.id, a.perms) for a in acls] == [("sasl", "bkspark", 31)]
        finally:
            owner.stop()
        outsider = _kazoo(server)
        try:
            with pytest.raises(NoAuthError):
                outsider.get(root + "/ledgers/probe")
        finally:
            outsider.stop()
        wrong = tmp_path / "wrong.sasl"
        wrong.write_text("bkspark:guess\n")
        with pytest.raises(UnauthorizedError, match="sasl_file"):
            with open_store(server.uri(root) + f"?sasl_file={wrong}") as store:
                store.get("/ledgers/probe")
    finally:
        server.stop()
