"""`bkspark shell` and `bkspark autorecovery` against bookies that serve TLS only: the client
settings reach them through --tls-ca-file, --client-config FILE ($BKSPARK_CLIENT_CONFIG) and
--client-option KEY=VALUE."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bkspark.cli.main import main
from bkspark.client import BookKeeper
from bkspark.testing.cluster import BookieCluster
from bkspark.testing.tls import self_signed, tls_bookie_args

pytestmark = [pytest.mark.integration]
PW = b"pw"


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """(cluster of 3 TLS bookies, CA file, a closed ledger of 10 entries on 2 of them)."""
    d = tmp_path_factory.mktemp("cli-tls")
    key, cert = self_signed(d, "bookies")
    with BookieCluster(f"sqlite://{d}/meta.db", num_bookies=3, data_dir=d, fault_injection=False,
                       extra_args=tls_bookie_args(key, cert)) as c:
        with BookKeeper(c.metadata_uri, tls_ca_file=str(cert)) as bk:
            lh = bk.create_ledger(2, 2, 2, password=PW)
            lh.append_many([b"entry-%d" % i for i in range(10)])
            lh.close()
        yield c, str(cert), lh.ledger_id


def sh(capsys, cluster, *args):
    code = main(["shell", *args, "--metadata", cluster.metadata_uri, "--json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else out.out), out.err


def test_shell_reads_and_writes_with_tls_ca_file(tls, capsys):
    cluster, ca, lid = tls
    code, doc, err = sh(capsys, cluster, "readledger", str(lid), "--tls-ca-file", ca)
    assert code == 0, err
    assert [e["entry_id"] for e in doc["entries"]] == list(range(10))
    code, doc, err = sh(capsys, cluster, "--tls-ca-file", ca, "simpletest", "--entries", "20",
                        "--ensemble", "3")
    assert code == 0, err


def test_shell_client_config_file_and_environment(tls, capsys, tmp_path, monkeypatch):
    cluster, ca, lid = tls
    conf = tmp_path / "client.conf"
    conf.write_text(f"# the TLS cluster\ntlsCaFile = {ca}\nread_timeout = 5\n")
    code, doc, err = sh(capsys, cluster, "readledger", str(lid), "--client-config", str(conf))
    assert code == 0, err
    assert len(doc["entries"]) == 10
    monkeypatch.setenv("BKSPARK_CLIENT_CONFIG", str(conf))
    code, doc, err = sh(capsys, cluster, "readledger", str(lid), "--to", "3",
                        "--client-option", "readTimeout=4")
    assert code == 0, err
    assert len(doc["entries"]) == 4


def test_shell_without_the_ca_file_says_the_bookies_serve_tls(tls, capsys):
    cluster, _, lid = tls
    code, _, err = sh(capsys, cluster, "readledger", str(lid), "--client-option",
                      "read_timeout=3")
    assert code == 1
    assert "accepts TLS connections only" in err and "--tls-ca-file" in err, err
    code, _, err = sh(capsys, cluster, "simpletest", "--entries", "2")
    assert code == 1 and "accepts TLS connections only" in err, err


@pytest.mark.parametrize("args,match", [
    (["--client-option", "add_timout=3"],
     "unknown --client-option 'add_timout': did you mean 'add_timeout'?"),
    (["--client-option", "add_timeout"],
     "--client-option: expected KEY=VALUE, got a line starting 'add_timeout'"),
    (["--client-option", "auth_token=eyJsecret"], "a token on the command line"),
    (["--client-option", "read_window=many"], "--client-option 'read_window' must be an integer"),
    (["--tls-ca-file", "/nonexistent/ca.pem"],
     "flag '--tls-ca-file': cannot read the CA file '/nonexistent/ca.pem'"),
    (["--client-config", "/nonexistent/client.conf"],
     "cannot read client config file /nonexistent/client.conf"),
])
def test_shell_bad_client_settings_are_usage_errors(tls, capsys, args, match):
    cluster, _, lid = tls
    code, _, err = sh(capsys, cluster, "readledger", str(lid), *args)
    assert code == 2 and match in err, err


def test_autorecovery_bad_client_settings(tls, capsys):
    cluster, _, _ = tls
    code = main(["autorecovery", "--metadata", cluster.metadata_uri, "--client-option",
                 "addTimout=3"])
    assert code == 2
    assert "did you mean 'add_timeout'?" in capsys.readouterr().err


def test_zz_autorecovery_repairs_tls_bookies(tls, tmp_path):
    """`bkspark autorecovery --tls-ca-file`: a killed bookie's copies are made again on the
    third bookie over TLS (runs last: it kills a bookie of the module's cluster)."""
    try:
        from tests.recovery.helpers import replication_problems, wait_until
    except ImportError:                                   # rootdir not on sys.path
        from recovery.helpers import replication_problems, wait_until
    cluster, ca, lid = tls
    log = open(tmp_path / "autorecovery.log", "wb")       # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "bkspark.cli.main", "autorecovery", "--metadata",
         cluster.metadata_uri, "--tls-ca-file", ca, "--client-option", "read_timeout=5",
         "--lost-bookie-recovery-delay", "1", "--audit-interval", "1", "--session-timeout", "3",
         "--periodic-check-interval", "0"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        with BookKeeper(cluster.metadata_uri, tls_ca_file=ca) as bk:
            victim = bk.ledger_metadata(lid).ensembles[0][1][0]
            cluster.kill(cluster.bookie_ids.index(victim))
            wait_until(lambda: victim not in bk.ledger_metadata(lid).all_bookies(), 90,
                       interval=0.5, what="autorecovery to replace the dead bookie")
            assert not replication_problems(bk, lid, 10)
            rh = bk.open_ledger(lid, password=PW)
            assert [e.data for e in rh.read(0, 9)] == [b"entry-%d" % i for i in range(10)]
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    assert "accepts TLS connections only" not in (tmp_path / "autorecovery.log").read_text()
