"""Bookie configuration: the sample file documents every setting; bad settings are named."""
import dataclasses
import pathlib

import pytest

from bkspark.bookie.config import BookieConfig
from bkspark.cli.main import build_parser
from bkspark.bookie.command import config_from_args
from bkspark.errors import BadRequestError

SAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "bookie.conf"


def test_sample_config_documents_every_setting_and_loads():
    text = SAMPLE.read_text()
    for field in dataclasses.fields(BookieConfig):
        assert f"\n{field.name} = " in text, f"examples/bookie.conf misses {field.name}"
    config = BookieConfig.from_file(str(SAMPLE)).finalize()
    assert config.bookie_id == "127.0.0.1:3181"
    assert config.journal_sync is True


def test_unknown_setting_in_file_is_named(tmp_path):
    path = tmp_path / "b.conf"
    path.write_text("[bookie]\njournal_dir=/tmp/j\nledger_dir=/tmp/l\n")
    with pytest.raises(BadRequestError, match="ledger_dir"):
        BookieConfig.from_file(str(path))


def test_bad_value_is_named(tmp_path):
    path = tmp_path / "b.conf"
    path.write_text("[bookie]\nport=abc\n")
    with pytest.raises(BadRequestError, match="port"):
        BookieConfig.from_file(str(path))


def test_missing_required_settings(tmp_path):
    with pytest.raises(BadRequestError, match="metadata_uri"):
        BookieConfig(journal_dir="j", ledger_dirs=["l"]).finalize()
    with pytest.raises(BadRequestError, match="journal_dir"):
        BookieConfig(metadata_uri="sqlite:///x.db", ledger_dirs=["l"]).finalize()


def test_negative_compaction_rate_is_named():
    base = dict(metadata_uri="sqlite:///x.db", journal_dir="j", ledger_dirs=["l"])
    with pytest.raises(BadRequestError, match="compaction_rate_mb_per_s"):
        BookieConfig(compaction_rate_mb_per_s=-1, **base).finalize()
    assert BookieConfig(compaction_rate_mb_per_s=0, **base).finalize().compaction_rate_mb_per_s == 0


def test_index_memtable_below_one_mib_is_named():
    base = dict(metadata_uri="sqlite:///x.db", journal_dir="j", ledger_dirs=["l"])
    with pytest.raises(BadRequestError, match="index_memtable_mb"):
        BookieConfig(index_memtable_mb=0, **base).finalize()


def test_flags_override_file(tmp_path):
    args = build_parser().parse_args(["bookie", "--config", str(SAMPLE), "--port", "4000",
                                      "--ledger-dirs", "/a,/b", "--no-journal-sync"])
    config = config_from_args(args)
    assert config.port == 4000 and config.bookie_id == "127.0.0.1:4000"
    assert config.ledger_dirs == ["/a", "/b"]
    assert config.journal_sync is False


# ---- the address a bookie on 0.0.0.0 advertises ----------------------------------------------

def test_wildcard_listen_advertises_the_default_route_interface():
    from bkspark.bookie.netaddr import routable_address
    address, why = routable_address({"lo": "127.0.0.1", "eth0": "10.77.0.3", "eth1": "10.9.0.1"},
                                    "eth0")
    assert address == "10.77.0.3" and "eth0" in why


def test_wildcard_listen_takes_the_only_address_besides_loopback():
    from bkspark.bookie.netaddr import routable_address
    assert routable_address({"lo": "127.0.0.1", "eth0": "10.77.0.3"}, None)[0] == "10.77.0.3"


@pytest.mark.parametrize("addresses", [{"lo": "127.0.0.1"},
                                       {"lo": "127.0.0.1", "a": "10.1.0.1", "b": "10.2.0.1"}],
                         ids=["loopback-only", "ambiguous"])
def test_wildcard_listen_refuses_when_no_address_is_clear(addresses):
    from bkspark.bookie.netaddr import routable_address
    with pytest.raises(BadRequestError, match="--advertised-address"):
        routable_address(addresses, None)


def test_client_config_of_in_bookie_autorecovery(tmp_path, caplog):
    """`client_config`: the settings of the client the bookie's autorecovery uses (TLS
    bookies: tls_ca_file), read and checked when the bookie starts."""
    from bkspark.testing.tls import self_signed
    key, cert = self_signed(tmp_path, "bookie")
    client = tmp_path / "client.conf"
    client.write_text(f"tlsCaFile = {cert}\nadd_timeout = 20\n")
    base = ["bookie", "--metadata", "sqlite:///tmp/m.db", "--journal-dir", "j", "--ledger-dirs",
            "l", "--autorecovery", "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    config = config_from_args(build_parser().parse_args([*base, "--client-config", str(client)]))
    assert config.client_settings() == {"tls_ca_file": str(cert), "add_timeout": 20.0}
    with caplog.at_level("WARNING", logger="bkspark.bookie"):
        assert config_from_args(build_parser().parse_args(base)).client_settings() == {}
    assert "its client has no tls_ca_file" in caplog.text
    client.write_text("tls_ca_fil = /x.pem\n")
    with pytest.raises(BadRequestError, match=f"unknown client setting 'tls_ca_fil' "
                                              f"\\(in {client}\\): did you mean 'tls_ca_file'"):
        config_from_args(build_parser().parse_args([*base, "--client-config", str(client)]))


def test_max_long_polls_defaults_to_half_the_grpc_workers():
    """A configuration of before issue 49 with few workers still starts."""
    config = BookieConfig(metadata_uri="sqlite:///x", journal_dir="j", ledger_dirs=["l"],
                          grpc_workers=16).finalize()
    assert config.max_long_polls == 8
    with pytest.raises(BadRequestError, match="below grpc_workers"):
        BookieConfig(metadata_uri="sqlite:///x", journal_dir="j", ledger_dirs=["l"],
                     grpc_workers=16, max_long_polls=16).finalize()
