"""Client settings from text (pure: no cluster): one mapping of names and values to a
ClientConfig, shared by the Spark connector's ``client.*`` options, the shell's and
``bkspark autorecovery``'s flags and config file, and ``BookKeeper(**kwargs)``."""
import os
import pathlib

import pytest

from bkspark.client import ClientConfig
from bkspark.client_settings import (
    client_config_from,
    client_settings,
    read_settings_file,
)
from bkspark.errors import BadRequestError


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("ca")
    from bkspark.testing.tls import self_signed
    _, cert = self_signed(d, "ca")
    return str(cert)


@pytest.mark.parametrize("key", ["tls_ca_file", "tlsCaFile", "tlscafile", "TLS_CA_FILE",
                                 "tls-ca-file"])
def test_names_in_any_case_snake_or_camel(key, ca_file):
    assert client_config_from({key: ca_file}).tls_ca_file == ca_file


def test_values_take_the_field_types():
    c = client_config_from({"addTimeout": "2.5", "read_window": "16", "useReadRange": "false",
                            "max_outstanding_bytes": " 1048576 ", "addLinger": "none",
                            "speculativeReadTimeout": "0"})
    assert c == ClientConfig(add_timeout=2.5, read_window=16, use_read_range=False,
                             max_outstanding_bytes=1 << 20, add_linger=None,
                             speculative_read_timeout=0.0)
    assert isinstance(c.read_window, int) and isinstance(c.add_timeout, float)
    assert client_config_from({"addlinger": "0.001"}).add_linger == 0.001
    for text, value in [("TRUE", True), ("yes", True), ("on", True), ("1", True), ("No", False),
                        ("off", False), ("0", False)]:
        assert client_config_from({"use_read_range": text}).use_read_range is value


def test_typed_values_are_accepted_as_they_are():
    c = client_config_from({"add_timeout": 3, "read_window": 8.0, "use_read_range": False,
                            "add_linger": None})
    assert (c.add_timeout, c.read_window, c.use_read_range, c.add_linger) == (3, 8, False, None)


def test_prefix_and_spelling_of_the_names_shown():
    got = client_settings({"client.addtimeout": "4", "CLIENT.Read_Timeout": "5"},
                          prefix="client.", camel_case=True, what="option")
    assert got == {"add_timeout": 4.0, "read_timeout": 5.0}
    with pytest.raises(BadRequestError, match=r"unknown option 'client\.tlscafil': did you mean "
                                              r"'client\.tlsCaFile'\?"):
        client_settings({"client.tlscafil": "x"}, prefix="client.", camel_case=True, what="option")
    with pytest.raises(BadRequestError, match=r"option 'client\.addtimeout' must be a number "
                                              r">= 0, got 'soon'"):
        client_settings({"client.addtimeout": "soon"}, prefix="client.", camel_case=True,
                        what="option")


@pytest.mark.parametrize("key,value,match", [
    ("add_timout", "3", r"unknown client setting 'add_timout': did you mean 'add_timeout'\?"),
    ("tlsCAfil", "x", r"unknown client setting 'tlsCAfil': did you mean 'tls_ca_file'\?"),
    ("zzz", "1", (r"unknown client setting 'zzz' \(known, the fields of ClientConfig: "
                  r"add_timeout, ")),
    ("add_timeout", "-1", r"client setting 'add_timeout' must be a number >= 0, got '-1'"),
    ("add_timeout", "nan", r"must be a number >= 0, got 'nan'"),
    ("read_window", "2.5", r"client setting 'read_window' must be an integer >= 0, got '2.5'"),
    ("use_read_range", "maybe", r"'use_read_range' must be true or false, got 'maybe'"),
    ("add_linger", "never", r"'add_linger' must be a number >= 0 or 'none', got 'never'"),
    ("add_timeout", True, r"'add_timeout' must be a number >= 0, got True"),
    ("use_read_range", 1, r"'use_read_range' must be true or false, got 1"),
    ("tls_ca_file", 3, r"'tls_ca_file' must be a file name, got 3"),
])
def test_unknown_or_invalid_settings_are_named(key, value, match):
    with pytest.raises(BadRequestError, match=match):
        client_settings({key: value})


def test_a_setting_given_twice_is_refused():
    with pytest.raises(BadRequestError, match="'addTimeout' and 'add_timeout' both set "
                                              "add_timeout"):
        client_settings([("addTimeout", "1"), ("add_timeout", "2")])


def test_the_ca_file_must_be_a_readable_pem_file(tmp_path, ca_file):
    missing = tmp_path / "nope.pem"
    with pytest.raises(BadRequestError, match=f"'tls_ca_file': cannot read the CA file "
                                              f"'{missing}'.*No such file"):
        client_settings({"tls_ca_file": str(missing)})
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(BadRequestError, match=f"cannot read the CA file '{junk}'"):
        client_settings({"tlsCaFile": str(junk)})
    if os.geteuid() != 0:
        unreadable = tmp_path / "secret.pem"
        unreadable.write_bytes(pathlib.Path(ca_file).read_bytes())
        unreadable.chmod(0)
        with pytest.raises(BadRequestError, match="Permission denied"):
            client_settings({"tls_ca_file": str(unreadable)})
    assert client_settings({"tls_ca_file": ""}) == {"tls_ca_file": ""}   # "" = no TLS


def test_a_relative_ca_file_is_made_absolute(tmp_path, ca_file, monkeypatch):
    import shutil
    shutil.copy(ca_file, tmp_path / "ca.pem")
    monkeypatch.chdir(tmp_path)
    assert client_settings({"tls_ca_file": "ca.pem"}) == {"tls_ca_file": str(tmp_path / "ca.pem")}


def test_settings_file_key_value_lines(tmp_path, ca_file):
    f = tmp_path / "client.conf"
    f.write_text(f"# bookies of the payments cluster\n\ntlsCaFile = {ca_file}\n"
                 "  add_timeout=30  \n  # a comment\nread_timeout = 7.5\n")
    assert read_settings_file(str(f)) == {"tls_ca_file": ca_file, "add_timeout": 30.0,
                                          "read_timeout": 7.5}
    f.write_text("add_timeout 30\n")
    with pytest.raises(BadRequestError,
                       match=f"{f}:1: expected KEY=VALUE, got a line starting 'add_timeout'"):
        read_settings_file(str(f))
    f.write_text("auth_token: eyJsecret\n")      # a secret mistyped is not echoed
    with pytest.raises(BadRequestError) as info:
        read_settings_file(str(f))
    assert "eyJsecret" not in str(info.value)
    f.write_text("add_timout = 30\n")
    with pytest.raises(BadRequestError, match=fr"unknown client setting 'add_timout' \(in {f}\)"
                                              r": did you mean 'add_timeout'\?"):
        read_settings_file(str(f))
    with pytest.raises(BadRequestError, match="cannot read client config file"):
        read_settings_file(str(tmp_path / "missing.conf"))


def test_bookkeeper_keyword_arguments_follow_the_same_rules():
    from bkspark.client import BookKeeper
    with pytest.raises(BadRequestError, match="unknown BookKeeper option 'add_timout': did you "
                                              "mean 'add_timeout'"):
        BookKeeper("sqlite:///nonexistent/x.db", add_timout=3)
    with pytest.raises(BadRequestError, match="BookKeeper option 'read_window' must be an "
                                              "integer >= 0"):
        BookKeeper("sqlite:///nonexistent/x.db", read_window=-4)
