"""Bad input to open_store: malformed URIs, unknown schemes, unreachable ZooKeeper."""
from __future__ import annotations

import os
import socket
import time

import pytest

from bkspark.errors import (
    BadRequestError,
    MetadataConnectionError,
    MetadataFormatError,
    NoMetadataStoreError,
)
from metadata import InvalidUriError, MetadataError, open_store, parse_uri
from metadata.uri import SqliteUri, ZkUri


@pytest.mark.parametrize("uri,expected", [
    ("zk://127.0.0.1:2181/ledgers", ZkUri((("127.0.0.1", 2181),), "/ledgers")),
    ("zk://a:1,b:2/x/y", ZkUri((("a", 1), ("b", 2)), "/x/y")),
    ("zk://zk1/", ZkUri((("zk1", 2181),), "/")),
    ("zk://zk1", ZkUri((("zk1", 2181),), "/")),
    ("zk://[::1]:2181/bk", ZkUri((("::1", 2181),), "/bk")),
    ("ZK://h:1/r/", ZkUri((("h", 1),), "/r")),
    ("sqlite:///tmp/meta.db", SqliteUri("/tmp/meta.db")),
    ("sqlite:////tmp/meta.db", SqliteUri("/tmp/meta.db")),
])
def test_valid_uris(uri, expected):
    assert parse_uri(uri) == expected


@pytest.mark.parametrize("uri,message", [
    ("", "empty"),
    ("   ", "empty"),
    (None, "must be a string"),
    (42, "must be a string"),
    ("/tmp/meta.db", "malformed"),
    ("localhost:2181", "malformed"),
    ("etcd://h:2379/x", "unknown metadata URI scheme 'etcd'"),
    ("http://h/x", "unknown metadata URI scheme 'http'"),
    ("zk:///ledgers", "names no host"),
    ("zk://h:abc/x", "not a number"),
    ("zk://h:0/x", "out of range"),
    ("zk://h:70000/x", "out of range"),
    ("zk://h:/x", "empty port"),
    ("zk://a:1,,b:2/x", "empty host"),
    ("zk://bad host:1/x", "malformed host"),
    ("zk://ho$t:1/x", "malformed host"),
    ("zk://user@h:1/x", "credentials"),
    ("zk://h:1/a//b", "invalid root"),
    ("zk://h:1/a/../b", "invalid root"),
    ("zk://h:1/x?opt=1", "unknown setting 'opt'"),
    ("zk://h:1/x?digest_file=a&sasl_file=b", "not both"),
    ("zk://h:1/x?tls_cert_file=c", "go together"),
    ("zk://[::1:2181/x", "IPv6"),
    ("sqlite://relative.db", "absolute"),
    ("sqlite://host/tmp/x.db", "absolute"),
    ("sqlite:///tmp/dir/", "directory"),
    ("sqlite:///tmp/a//b.db", "empty path component"),
    ("sqlite:///tmp/x.db?mode=ro", "query"),
    (" sqlite:///tmp/x.db", "whitespace"),
])
def test_invalid_uris(uri, message):
    with pytest.raises(InvalidUriError, match=message) as info:
        open_store(uri)
    assert isinstance(info.value, ValueError) and isinstance(info.value, MetadataError)


def test_bad_timeouts():
    with pytest.raises(BadRequestError):
        open_store("sqlite:///tmp/x.db", session_timeout=0)
    with pytest.raises(BadRequestError):
        open_store("sqlite:///tmp/x.db", connect_timeout=-1)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_zookeeper_is_bounded_and_names_address():
    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(MetadataConnectionError, match=f"127.0.0.1:{port}"):
        open_store(f"zk://127.0.0.1:{port}/bk", connect_timeout=1.0)
    assert time.monotonic() - start < 5


def test_unresolvable_zookeeper_host_is_bounded():
    start = time.monotonic()
    with pytest.raises(MetadataConnectionError, match="no-such-host.invalid:2181"):
        open_store("zk://no-such-host.invalid:2181/bk", connect_timeout=1.0)
    assert time.monotonic() - start < 10


def test_silent_server_is_bounded():
    """A peer that accepts TCP but never speaks ZooKeeper."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(MetadataConnectionError, match=str(port)):
            open_store(f"zk://127.0.0.1:{port}/bk", connect_timeout=1.0)
        assert time.monotonic() - start < 5


def test_sqlite_garbage_file_is_format_error(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(MetadataFormatError, match=str(path)):
        open_store(f"sqlite://{path}")


def test_sqlite_foreign_database_is_rejected(tmp_path):
    import sqlite3
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '99')")
    with pytest.raises(MetadataFormatError, match="schema version"):
        open_store(f"sqlite://{path}")


def test_sqlite_unwritable_location(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(NoMetadataStoreError, match="does not exist"):
        open_store(f"sqlite://{blocker}/sub/meta.db", create=True)


def test_a_missing_sqlite_store_is_an_error_unless_created(tmp_path):
    """A mistyped path must not open a new, empty cluster: no file, no directory is made."""
    with pytest.raises(NoMetadataStoreError, match=f"no metadata store at {tmp_path}/a/b/meta.db: "
                       f"directory {tmp_path}/a/b does not exist"):
        open_store(f"sqlite://{tmp_path}/a/b/meta.db", create=True)
    assert not (tmp_path / "a").exists()                 # no mkdir -p
    with pytest.raises(NoMetadataStoreError, match="the file does not exist"):
        open_store(f"sqlite://{tmp_path}/meta.db")
    assert not (tmp_path / "meta.db").exists()
    from bkspark.client import BookKeeper
    with pytest.raises(NoMetadataStoreError, match="no metadata store at"):
        BookKeeper(f"sqlite://{tmp_path}/meta.db")
    with open_store(f"sqlite://{tmp_path}/meta.db", create=True) as s:   # what a bookie does
        s.create("/x", b"")
    with open_store(f"sqlite://{tmp_path}/meta.db") as s:
        assert s.get("/x")[0] == b""
