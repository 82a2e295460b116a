"""``client.*`` options of format("bookkeeper"): ClientConfig fields for every client the
connector makes (pure: no cluster, no Spark)."""
import pytest

from bkspark.errors import BadRequestError
from bkspark.spark import conn
from bkspark.spark.options import parse_options
from bkspark.testing.tls import self_signed

URI = "sqlite:///tmp/x.db"


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory):
    return str(self_signed(tmp_path_factory.mktemp("ca"), "ca")[1])


def test_client_options_in_any_spelling_become_client_settings(ca_file):
    # Spark hands a Python data source its option names lower-cased
    o = parse_options({"metadataServiceUri": URI, "log": "a", "client.tlscafile": ca_file,
                       "client.addTimeout": "30", "CLIENT.read_timeout": "2.5",
                       "client.useReadRange": "false"})
    assert o.client_settings == {"tls_ca_file": ca_file, "add_timeout": 30.0,
                                 "read_timeout": 2.5, "use_read_range": False}
    assert parse_options({"metadataServiceUri": URI, "log": "a"}).client_settings == {}


@pytest.mark.parametrize("key,value,match", [
    ("client.tlscafil", "/x.pem",
     r"unknown option 'client\.tlscafil': did you mean 'client\.tlsCaFile'\?"),
    ("client.addtimout", "3",
     r"unknown option 'client\.addtimout': did you mean 'client\.addTimeout'\?"),
    ("client.addtimeout", "soon", r"option 'client\.addtimeout' must be a number >= 0, got 'soon'"),
    ("client.readwindow", "1.5", r"option 'client\.readwindow' must be an integer >= 0"),
    ("client.tlscafile", "/nonexistent/ca.pem",
     r"option 'client\.tlscafile': cannot read the CA file '/nonexistent/ca\.pem'"),
])
def test_unknown_or_invalid_client_options_fail_at_planning(key, value, match):
    with pytest.raises(BadRequestError, match=match):
        parse_options({"metadataServiceUri": URI, "log": "a", key: value})


def test_a_client_setting_without_the_prefix_is_pointed_to_it():
    with pytest.raises(BadRequestError, match=r"unknown option 'tlscafile' .*did you mean "
                                              r"'client\.tlsCaFile'\?"):
        parse_options({"metadataServiceUri": URI, "log": "a", "tlscafile": "/x.pem"})


def test_clients_are_cached_per_uri_and_settings(monkeypatch):
    made = []

    class FakeBookKeeper:
        def __init__(self, uri, **settings):
            made.append((uri, settings))
            self._closed = False

        def close(self):
            self._closed = True

    import bkspark.client
    monkeypatch.setattr(bkspark.client, "BookKeeper", FakeBookKeeper)
    monkeypatch.setattr(conn, "_clients", {})
    a = conn.bookkeeper(URI)
    assert conn.bookkeeper(URI, {}) is a
    b = conn.bookkeeper(URI, {"add_timeout": 3.0, "read_timeout": 2.0})
    assert b is not a and conn.bookkeeper(URI, {"read_timeout": 2.0, "add_timeout": 3.0}) is b
    assert made == [(URI, {}), (URI, {"add_timeout": 3.0, "read_timeout": 2.0})]
    conn.drop(URI, {"add_timeout": 3.0, "read_timeout": 2.0})
    assert b._closed and conn.bookkeeper(URI) is a
