"""`bkspark shell` commands against real bookies (which run autorecovery in-process:
`bkspark bookie --autorecovery`). Tables by default, JSON with --json, exit 1 + a clear
message on errors."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

import pytest

from bkspark.cli.main import main
from bkspark.client import BookKeeper
from bkspark.errors import UnauthorizedError
from bkspark.log import EARLIEST, LogStore
from bkspark.testing.cluster import BookieCluster
from metadata import registry

pytestmark = [pytest.mark.integration]
PW = b"pw"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("shell-cluster")
    with BookieCluster(f"sqlite://{d}/meta.db", num_bookies=3, data_dir=d,
                       extra_args=["--autorecovery"]) as c:
        yield c


@pytest.fixture(scope="module")
def ledgers(cluster):
    with BookKeeper(cluster.metadata_uri) as bk:
        closed = bk.create_ledger(3, 2, 2, password=PW)
        for i in range(10):
            closed.append(b"entry-%d" % i)
        closed.close()
        opened = bk.create_ledger(3, 2, 2, password=PW)
        opened.append(b"only")
        return closed.ledger_id, opened.ledger_id


def sh(capsys, cluster, *args, as_json=False):
    argv = ["shell", *args, "--metadata", cluster.metadata_uri] + (["--json"] if as_json else [])
    code = main(argv)
    out = capsys.readouterr()
    if as_json and code == 0:
        return code, json.loads(out.out), out.err
    return code, out.out, out.err


def test_listbookies(cluster, capsys):
    code, doc, _ = sh(capsys, cluster, "listbookies", as_json=True)
    assert code == 0
    assert sorted(d["bookie_id"] for d in doc) == sorted(cluster.bookie_ids)
    code, out, _ = sh(capsys, cluster, "listbookies")
    assert code == 0 and all(b in out for b in cluster.bookie_ids)
    code, doc, _ = sh(capsys, cluster, "listbookies", "--readonly", as_json=True)
    assert code == 0 and doc == []


def test_ledger_commands(cluster, ledgers, capsys):
    closed, opened = ledgers
    code, doc, _ = sh(capsys, cluster, "listledgers", as_json=True)
    assert code == 0
    states = {d["ledger_id"]: d["state"] for d in doc}
    assert states[closed] == "CLOSED" and states[opened] == "OPEN"
    code, out, _ = sh(capsys, cluster, "listledgers")
    assert code == 0 and str(closed) in out

    code, doc, _ = sh(capsys, cluster, "ledgermetadata", str(closed), as_json=True)
    assert code == 0 and doc["last_entry_id"] == 9 and doc["state"] == "CLOSED"
    assert doc["keys"] == {"scheme": "pbkdf2-sha256-ledger", "iterations": 10_000}   # no key shown
    assert "password" not in doc and "master_key" not in json.dumps(doc)
    code, out, _ = sh(capsys, cluster, "ledgermetadata", str(closed))
    assert code == 0 and "last_entry_id=9" in out

    code, doc, _ = sh(capsys, cluster, "readledger", str(closed), "--from", "2", "--to", "4",
                      as_json=True)
    assert code == 0
    assert [e["entry_id"] for e in doc["entries"]] == [2, 3, 4]
    import base64
    assert base64.b64decode(doc["entries"][0]["data_b64"]) == b"entry-2"
    code, out, _ = sh(capsys, cluster, "readledger", str(closed))
    assert code == 0 and "entry-9" in out

    # errors: clear message, exit 1
    code, out, err = sh(capsys, cluster, "ledgermetadata", "987654321")
    assert code == 1 and "no such ledger: 987654321" in err
    code, out, err = sh(capsys, cluster, "deleteledger", str(opened))
    assert code == 1 and "--force" in err


def test_readledger_force_recovery_and_delete(cluster, capsys):
    with BookKeeper(cluster.metadata_uri) as bk:
        lh = bk.create_ledger(3, 2, 2, password=PW)
        for i in range(3):
            lh.append(b"x%d" % i)
        lid = lh.ledger_id
    code, doc, _ = sh(capsys, cluster, "readledger", str(lid), "--force-recovery", as_json=True)
    assert code == 0 and [e["entry_id"] for e in doc["entries"]] == [0, 1, 2]
    code, doc, _ = sh(capsys, cluster, "ledgermetadata", str(lid), as_json=True)
    assert doc["state"] == "CLOSED" and doc["last_entry_id"] == 2
    code, doc, _ = sh(capsys, cluster, "deleteledger", str(lid), as_json=True)
    assert code == 0 and doc == {"deleted": lid, "removed_from_logs": []}
    code, _, err = sh(capsys, cluster, "readledger", str(lid))
    assert code == 1 and "no such ledger" in err


def test_an_admin_recovers_and_reads_an_hmac_ledger_without_its_password(cluster, capsys):
    """The metadata keeps no password: the shell fences, recovers, verifies and reads with
    the keys its record stores."""
    with BookKeeper(cluster.metadata_uri) as bk:
        lh = bk.create_ledger(3, 2, 2, digest="hmac", password=b"only the writer knows")
        for i in range(4):
            lh.append(b"h%d" % i)
        lid = lh.ledger_id
    code, doc, err = sh(capsys, cluster, "readledger", str(lid), "--force-recovery",
                        as_json=True)
    assert code == 0, err
    assert [e["entry_id"] for e in doc["entries"]] == [0, 1, 2, 3]
    code, out, _ = sh(capsys, cluster, "readledger", str(lid))
    assert code == 0 and "h3" in out
    with BookKeeper(cluster.metadata_uri) as bk:
        rh = bk.open_ledger(lid, password=b"only the writer knows")
        assert rh.is_closed and [e.data for e in rh.read(0, 3)] == [b"h0", b"h1", b"h2", b"h3"]
        with pytest.raises(UnauthorizedError, match="wrong password"):
            bk.open_ledger(lid, password=b"")


def test_recovery_without_the_password_repairs_a_corrupt_hmac_replica(cluster, capsys):
    """A replica of the last entry (beyond the LAC: recovery reads and writes it back) holds
    a body whose MAC is wrong: recovery with the record's keys (the shell's, autorecovery's)
    must skip it -- never adopt the corrupt one and copy it over the good replicas (which a
    recovery that checked headers only did, in review). The corrupt copy stays (an entry is
    never replaced); readers skip it."""
    from bkspark.client import quorum
    from bkspark.proto import wire
    with BookKeeper(cluster.metadata_uri) as writer, BookKeeper(cluster.metadata_uri) as bk:
        lh = writer.create_ledger(3, 3, 2, digest="hmac", password=PW)
        for i in range(9):
            lh.append(b"entry-%d" % i)
        lid, md = lh.ledger_id, bk.ledger_metadata(lh.ledger_id)
        first, *others = quorum.write_set_bookies(9, md.last_ensemble(), 3)
        # entry 9 never reaches `first` (acknowledged by the two others); then a corrupt copy
        # is written there (an entry once stored is never replaced: it must be absent)
        cluster.set_faults(cluster.bookie_ids.index(first), [dict(
            op="add", action="drop", ledger_id=lid, entry_id=9, count=1)])
        lh.append(b"entry-9")
        good = bytes(bk.ctx.pool.get(others[0]).read(lid, 9).result().body)
        bad = good[:-1] + bytes([good[-1] ^ 0x01])
        assert bk.ctx.pool.get(first).add(lid, 9, bad, md.keys.master_key,
                                          flags=wire.RECOVERY_ADD).result().status == 0
        code, doc, err = sh(capsys, cluster, "readledger", str(lid), "--force-recovery",
                            as_json=True)
        assert code == 0, err
        assert [e["entry_id"] for e in doc["entries"]] == list(range(10))
        for b in others:                    # the good replicas stay good; the corrupt one
            assert bytes(bk.ctx.pool.get(b).read(lid, 9).result().body) == good, b
        assert bytes(bk.ctx.pool.get(first).read(lid, 9).result().body) == bad    # is kept
        rh = bk.open_ledger(lid, password=PW)
        assert [e.data for e in rh.read(0, 9)] == [b"entry-%d" % i for i in range(10)]


def test_upgrade_ledgers_removes_the_passwords_of_format_1_records(cluster, capsys):
    """A ledger written by an older bkspark (format 1: the password in its record, keys by
    BookKeeper's unsalted rule) is rewritten as format 2 -- no password, the same keys --
    and reads on with its password."""
    import base64
    from bkspark.client.ledger_handle import LedgerHandle
    from metadata import ledgers as ls
    from metadata.layout import ledger_path
    from metadata.ledger_keys import KeyRecord
    from metadata.ledger_metadata import LedgerMetadata
    secret = b"old secret"
    with BookKeeper(cluster.metadata_uri) as bk:
        md = ls.create_ledger(bk.store, LedgerMetadata.new(
            cluster.bookie_ids[:3], 2, 2, digest_type="hmac").copy(keys=KeyRecord.legacy(secret)))
        lh = LedgerHandle(bk.ctx, md, ls.CREATED_VERSION, md.keys.derive(secret))
        for i in range(3):
            lh.append(b"v1-%d" % i)
        lh.close()
        closed, version = ls.read_ledger(bk.store, md.ledger_id)
        old = closed.to_dict()
        del old["keys"]
        old["password"] = base64.b64encode(secret).decode()
        bk.store.set(ledger_path(md.ledger_id),
                     b"bkspark-ledger-metadata\t1\n" + json.dumps(old).encode(), version=version)
        junk = bk.create_ledger(3, 2, 2)        # a corrupt record stops nothing
        junk.close()
        _, junk_version = ls.read_ledger(bk.store, junk.ledger_id)
        bk.store.set(ledger_path(junk.ledger_id), b"garbage", version=junk_version)
        code, out, err = sh(capsys, cluster, "upgrade-ledgers")
        assert code == 1 and f"[{junk.ledger_id}" in err and "1 ledger records" in out, (out, err)
        bk.store.delete(ledger_path(junk.ledger_id))
        raw, _ = bk.store.get(ledger_path(md.ledger_id))
        assert raw.startswith(b"bkspark-ledger-metadata\t2\n")
        assert secret not in raw and base64.b64encode(secret) not in raw
        rh = bk.open_ledger(md.ledger_id, password=secret)
        assert [e.data for e in rh.read(0, 2)] == [b"v1-0", b"v1-1", b"v1-2"]
        code, doc, _ = sh(capsys, cluster, "upgrade-ledgers", as_json=True)
        assert code == 0 and doc["upgraded"] == 0


def test_listledgers_shows_the_size_of_an_open_ledger_so_far(cluster, capsys):
    """An OPEN ledger's metadata has no end yet (length 0): the bookies know its size."""
    with BookKeeper(cluster.metadata_uri) as bk:
        lh = bk.create_ledger(3, 2, 2, password=PW)
        for i in range(5):
            lh.append(b"x" * 100)
        code, doc, err = sh(capsys, cluster, "listledgers", as_json=True)
        (d,) = [d for d in doc if d["ledger_id"] == lh.ledger_id]
        assert code == 0 and d["state"] == "OPEN", err
        assert d["last_entry_id"] == 4 and d["extent"].startswith("stored on bookies")
        assert d["length"] == 500                           # every byte the bookies hold
        lh.close()


def test_deleteledger_of_a_ledger_a_log_lists_needs_force(cluster, capsys):
    """Deleting a ledger that a log lists would leave the log naming a missing ledger."""
    with BookKeeper(cluster.metadata_uri) as bk:
        logs = LogStore(bk, password=PW)
        with logs.open_writer("listed-log") as w:
            w.append(b"kept")
            first = w.ledger_id
            w.roll()
            w.append(b"dropped")
        listed = logs.get("listed-log")[0].ledger_ids()
    assert first in listed
    code, _, err = sh(capsys, cluster, "deleteledger", str(first))
    assert code == 1 and "part of log 'listed-log'" in err and "--force" in err, err
    with BookKeeper(cluster.metadata_uri) as bk:
        assert LogStore(bk).get("listed-log")[0].ledger_ids() == listed   # nothing changed
        bk.ledger_metadata(first)
    code, doc, err = sh(capsys, cluster, "deleteledger", str(first), "--force", as_json=True)
    assert code == 0 and doc == {"deleted": first, "removed_from_logs": ["listed-log"]}, err
    with BookKeeper(cluster.metadata_uri) as bk:
        logs = LogStore(bk, password=PW)
        assert logs.get("listed-log")[0].ledger_ids() == [i for i in listed if i != first]
        assert [r.data for r in logs.open_reader("listed-log", "earliest", tail=False)] == \
            [b"dropped"]


@pytest.mark.parametrize("command", ["recover", "decommission"])
def test_recover_or_decommission_of_an_unknown_bookie_is_an_error(cluster, capsys, command):
    code, out, err = sh(capsys, cluster, command, "127.0.0.1:1")
    assert code == 1, out
    assert "bookie 127.0.0.1:1 is not known to this cluster" in err
    assert all(b in err for b in cluster.bookie_ids)      # names the bookies it does know


@pytest.mark.parametrize("command", ["recover", "decommission"])
def test_a_negative_copy_rate_is_refused_before_anything_moves(cluster, capsys, command):
    code, out, err = sh(capsys, cluster, command, cluster.bookie_ids[0], "--rate", "-5")
    assert code == 1, out
    assert "--rate" in err and "0 for unlimited" in err, err
    with BookKeeper(cluster.metadata_uri) as bk:        # still writable: nothing was started
        assert cluster.bookie_ids[0] in registry.list_bookies(bk.store)


@pytest.mark.parametrize("flag", ["--parallel", "--parallel-fragments"])
def test_recover_refuses_a_parallelism_below_one(cluster, capsys, flag):
    code, out, err = sh(capsys, cluster, "recover", cluster.bookie_ids[0], flag, "0")
    assert code == 1, out
    assert flag in err and "at least 1" in err, err


def test_autorecovery_commands(cluster, capsys):
    code, doc, _ = sh(capsys, cluster, "whoisauditor", as_json=True)
    assert code == 0
    assert any(doc["auditor"].startswith(b) for b in cluster.bookie_ids)   # in-bookie mode
    code, doc, _ = sh(capsys, cluster, "autorecovery", "--disable", "--delay", "120",
                      as_json=True)
    assert code == 0 and doc["enabled"] is False and doc["lost_bookie_recovery_delay"] == 120
    code, out, _ = sh(capsys, cluster, "autorecovery", "--status")
    assert code == 0 and "DISABLED" in out and "120s" in out
    code, doc, _ = sh(capsys, cluster, "autorecovery", "--enable", as_json=True)
    assert doc["enabled"] is True
    code, doc, _ = sh(capsys, cluster, "listunderreplicated", as_json=True)
    assert code == 0 and doc == []
    code, out, _ = sh(capsys, cluster, "listunderreplicated")
    assert code == 0 and "0 under-replicated" in out


def test_triggeraudit_makes_the_elected_auditor_audit(cluster, capsys):
    code, doc, _ = sh(capsys, cluster, "whoisauditor", as_json=True)
    auditor = doc["auditor"]
    bookie = next(b for b in cluster.bookie_ids if auditor.startswith(b + ":"))
    with BookKeeper(cluster.metadata_uri) as bk:
        port = registry.list_bookies(bk.store)[bookie]["http_port"]

    def audits():
        creds = cluster.credentials("client")
        status, doc = creds.http_json(creds.url("127.0.0.1", port,
                                                "/api/v1/autorecovery/process"))
        assert status == 200, doc
        return doc["auditor"]["auditsRequested"]
    before = audits()
    code, doc, err = sh(capsys, cluster, "triggeraudit", as_json=True)
    assert code == 0 and doc["auditor"] == auditor, err
    deadline = time.monotonic() + 30
    while audits() == before:
        assert time.monotonic() < deadline, "the auditor never ran the requested audit"
        time.sleep(0.2)


def test_simpletest_and_bookiesanity(cluster, capsys):
    code, doc, _ = sh(capsys, cluster, "simpletest", "--entries", "50", as_json=True)
    assert code == 0 and doc["verified"] and doc["entries"] == 50
    code, out, _ = sh(capsys, cluster, "simpletest", "--entries", "5")
    assert code == 0 and "simpletest OK" in out
    code, doc, _ = sh(capsys, cluster, "bookiesanity", as_json=True)
    assert code == 0 and sorted(r["bookie"] for r in doc) == sorted(cluster.bookie_ids)
    assert all(r["ok"] for r in doc)
    code, out, err = sh(capsys, cluster, "bookiesanity", "--bookie", "127.0.0.1:1")
    assert code == 1 and "not a registered writable bookie" in err


def test_offline_tools(cluster, ledgers, capsys):
    closed, _ = ledgers
    bdir = cluster.bookies[0].dir
    code, doc, _ = sh(capsys, cluster, "lastmark", os.path.join(bdir, "ledgers"), as_json=True)
    assert code == 0 and doc["valid"] and doc["journal_file"].endswith(".txn")
    code, doc, _ = sh(capsys, cluster, "readjournal", os.path.join(bdir, "journal"),
                      "--ledger", str(closed), as_json=True)
    assert code == 0
    adds = sorted(r["entry_id"] for r in doc if r["type"] == "add")
    assert adds and set(adds) <= set(range(10))
    code, out, _ = sh(capsys, cluster, "readjournal", os.path.join(bdir, "journal"))
    assert code == 0 and "masterkey" in out
    # entry logs appear once the write cache is flushed (checkpoint); may not exist yet
    for log in glob.glob(os.path.join(bdir, "ledgers", "*.log")):
        code, doc, _ = sh(capsys, cluster, "readlog", log, as_json=True)
        assert code == 0 and all(r["crc_ok"] for r in doc)
    code, out, err = sh(capsys, cluster, "readlog", os.path.join(bdir, "nope.log"))
    assert code == 1 and "cannot read" in err


def test_logs(cluster, capsys):
    from bkspark.log.position import Position
    with BookKeeper(cluster.metadata_uri) as bk:
        logs = LogStore(bk, password=PW)
        with logs.open_writer("shell-log") as w:
            for i in range(5):
                w.append(b"r%d" % i)
        first = logs.get("shell-log")[0].ledgers[0].ledger_id
        logs.commit_cursor("shell-log", "c1", Position(first, 1))
        code, doc, _ = sh(capsys, cluster, "logs", "--ledgers", as_json=True)
        assert code == 0
        (entry,) = [d for d in doc if d["log"] == "shell-log"]
        assert entry["ledgers"] == [first] and entry["cursors"]["c1"]["lag"] == 4
        assert entry["entries"] == 5 and entry["segments"] == 1 and entry["retention"] is None
        code, out, _ = sh(capsys, cluster, "logs")
        assert code == 0 and "shell-log" in out and "c1=4" in out
        # a cursor of a query given up for good: deleted by name
        code, out, err = sh(capsys, cluster, "delete-cursor", "shell-log", "c2")
        assert code != 0 and "has no cursor 'c2'" in err and "its cursors: c1" in err
        code, doc, _ = sh(capsys, cluster, "delete-cursor", "shell-log", "c1", as_json=True)
        assert code == 0 and doc["cursor"] == "c1"
        assert logs.cursors("shell-log") == {}


def test_retention_commands(cluster, capsys):
    with BookKeeper(cluster.metadata_uri) as bk:
        logs = LogStore(bk, password=PW)
        ids = []
        for i in range(3):
            lh = bk.create_ledger(3, 2, 2, password=PW)
            lh.append(b"y" * 100)
            lh.close()
            logs.append_ledgers("shell-retained", [lh.ledger_id])
            ids.append(lh.ledger_id)
        code, out, err = sh(capsys, cluster, "set-retention", "shell-retained")
        assert code != 0 and "give --time and/or --size" in err
        code, out, err = sh(capsys, cluster, "set-retention", "shell-retaind", "--size", "1k")
        assert code != 0 and "did you mean 'shell-retained'" in err
        code, out, err = sh(capsys, cluster, "set-retention", "shell-retained", "--time", "soon")
        assert code != 0 and "--time 'soon'" in err
        code, doc, _ = sh(capsys, cluster, "set-retention", "shell-retained", "--size", "100",
                          "--time", "7d", "--pass-cursors", as_json=True)
        assert code == 0 and doc["retention"]["bytes"] == 100 and doc["retention"]["pass_cursors"]
        code, out, _ = sh(capsys, cluster, "logs", "shell-retained")
        assert code == 0 and "shell-retained" in out and "300 B" in out
        assert logs.retention("shell-retained").describe() == "1w, 100B, passes cursors"
        code, doc, _ = sh(capsys, cluster, "apply-retention", "shell-retained", as_json=True)
        assert code == 0 and doc == [{"log": "shell-retained", "removed": ids[:2],
                                      "held_by_cursor": None,
                                      "retention": logs.retention("shell-retained").to_property()}]
        code, (d,), _ = sh(capsys, cluster, "logs", "shell-retained", as_json=True)
        assert (d["segments"], d["entries"], d["bytes"]) == (1, 1, 100)
        code, doc, _ = sh(capsys, cluster, "set-retention", "shell-retained", "--keep-everything",
                          as_json=True)
        assert code == 0 and doc["retention"] is None and logs.retention("shell-retained") is None
        logs.delete("shell-retained")       # (the autorecovery tests count ledgers)


def test_offload_commands(cluster, capsys, tmp_path):
    import pyarrow.parquet as pq
    from bkspark.spark.codec import encode_record
    with BookKeeper(cluster.metadata_uri) as bk:
        logs = LogStore(bk, password=PW)
        for i in range(2):
            lh = bk.create_ledger(3, 2, 2, password=PW)
            lh.append(encode_record(f"row{i}".encode()))
            lh.close()
            logs.append_ledgers("shell-offloaded", [lh.ledger_id])
        code, _, err = sh(capsys, cluster, "set-offload", "shell-offloaded", "--after", "1h")
        assert code != 0 and "give --location and --after and/or --beyond" in err
        code, _, err = sh(capsys, cluster, "set-offload", "shell-offloaded", "--location",
                          "relative/dir", "--after", "1h")
        assert code != 0 and "is relative: give an absolute path or a URI" in err
        code, _, err = sh(capsys, cluster, "offload", "shell-offloaded")
        assert code != 0 and "has no offload policy: set one with" in err
        code, doc, _ = sh(capsys, cluster, "set-offload", "shell-offloaded", "--location",
                          f"file://{tmp_path}", "--after", "1ms", as_json=True)
        assert code == 0 and doc["offload"]["after_ms"] == 1
        time.sleep(0.01)
        code, (d,), _ = sh(capsys, cluster, "logs", "shell-offloaded", as_json=True)
        assert (d["offloaded_entries"], d["offload_lag"]) == (0, 2)
        code, (d,), _ = sh(capsys, cluster, "offload", "shell-offloaded", as_json=True)
        assert code == 0 and (d["rows"], d["files"], d["error"]) == (2, 2, None)
        code, (d,), _ = sh(capsys, cluster, "logs", "shell-offloaded", as_json=True)
        assert (d["offloaded_entries"], d["offload_lag"]) == (2, 0) and d["offloaded_bytes"] > 0
        code, out, _ = sh(capsys, cluster, "logs", "shell-offloaded")
        assert "offloaded" in out and "(0)" in out
        t = pq.read_table(str(tmp_path / "log=shell-offloaded"))
        assert sorted(t.column("value").to_pylist()) == [b"row0", b"row1"]
        # the bookies' copy dropped (all but the last listed ledger), the log read the same
        code, _, err = sh(capsys, cluster, "set-offload", "shell-offloaded", "--location",
                          f"file://{tmp_path}", "--after", "1ms", "--keep-on-bookies=-1s")
        assert code != 0 and "keep-on-bookies '-1s': give" in err
        code, doc, _ = sh(capsys, cluster, "set-offload", "shell-offloaded", "--location",
                          f"file://{tmp_path}", "--after", "1ms", "--keep-on-bookies", "0",
                          as_json=True)
        assert code == 0 and doc["offload"]["keep_on_bookies_ms"] == 0
        code, (d,), _ = sh(capsys, cluster, "offload", "shell-offloaded", as_json=True)
        assert code == 0 and len(d["dropped_from_bookies"]) == 1 and d["ledgers"] == []
        code, (d,), _ = sh(capsys, cluster, "logs", "shell-offloaded", as_json=True)
        assert (d["dropped_entries"], d["dropped_bytes"]) == (1, d["offloaded_bytes"] // 2)
        code, out, _ = sh(capsys, cluster, "logs", "shell-offloaded")
        assert "only" in out and "there" in out             # (the table wraps the cell)
        with logs.open_reader("shell-offloaded", EARLIEST, tail=False) as r:
            assert [x.data for x in r] == [encode_record(b"row0"), encode_record(b"row1")]
        code, doc, _ = sh(capsys, cluster, "set-offload", "shell-offloaded", "--off", as_json=True)
        assert code == 0 and doc["offload"] is None and logs.offload_policy("shell-offloaded") is None
        logs.delete("shell-offloaded")      # (the autorecovery tests count ledgers)


def test_convert_logs(cluster, capsys):
    # a log kept as one record by the format-1 code, converted by the shell; the rest untouched
    from metadata.layout import log_path
    from metadata.log_metadata import LogMetadata
    from metadata.log_segments import format_version
    with BookKeeper(cluster.metadata_uri) as bk:
        logs = LogStore(bk, password=PW)
        lh = bk.create_ledger(3, 2, 2, password=PW)
        lh.append(b"v1")
        lh.close()
        v1 = LogMetadata("old-log").with_ledger(lh.ledger_id, state="closed", last_entry_id=0, length=2)
        bk.store.create(log_path("old-log"), v1.serialize())
        logs.create("new-log")
        code, out, err = sh(capsys, cluster, "convert-logs", "old-lg")
        assert code == 1 and "no log named 'old-lg'" in err and "old-log" in err
        code, doc, _ = sh(capsys, cluster, "convert-logs", "old-log", "new-log", as_json=True)
        assert code == 0 and doc == [{"log": "old-log", "converted": True},
                                     {"log": "new-log", "converted": False}]
        assert format_version(bk.store.get(log_path("old-log"))[0]) == 2
        assert logs.get("old-log")[0].ledger_ids() == [lh.ledger_id]
        with logs.open_reader("old-log", "earliest", tail=False) as reader:
            assert [r.data for r in reader] == [b"v1"]
        logs.delete("old-log")          # (the module's later tests count its ledgers)
        logs.delete("new-log")


def test_usage_errors_and_subprocess(cluster):
    env = dict(os.environ, BKSPARK_METADATA_URI=cluster.metadata_uri)
    r = subprocess.run([sys.executable, "-m", "bkspark.cli.main", "shell", "listbookies",
                        "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(d["bookie_id"] for d in json.loads(r.stdout)) == sorted(cluster.bookie_ids)
    env.pop("BKSPARK_METADATA_URI")
    env["BKSPARK_HOME"] = "/nonexistent-bkspark-home"
    r = subprocess.run([sys.executable, "-m", "bkspark.cli.main", "shell", "listledgers"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "--metadata" in r.stderr


def test_zz_in_bookie_autorecovery_after_a_bookie_dies(cluster, ledgers, capsys):
    """`bkspark bookie --autorecovery`: the bookies' own auditor and workers repair the
    ledgers of a killed bookie (runs last: it changes the module's cluster)."""
    try:
        from tests.recovery.helpers import replication_problems, wait_until
    except ImportError:                                   # rootdir not on sys.path
        from recovery.helpers import replication_problems, wait_until
    closed, opened = ledgers
    code, doc, _ = sh(capsys, cluster, "autorecovery", "--enable", "--delay", "1", as_json=True)
    assert code == 0 and doc["lost_bookie_recovery_delay"] == 1
    cluster.add_bookie()                          # E=3 needs a 4th bookie to replace one
    with BookKeeper(cluster.metadata_uri) as bk:
        victim = bk.ledger_metadata(closed).ensembles[0][1][0]
        cluster.kill(cluster.bookie_ids.index(victim))

        def repaired() -> bool:
            """No closed ledger on the victim any more (this module's other tests made some:
            the workers repair them one at a time, in no set order) and none listed as
            under-replicated but the open one, which waits for its grace period."""
            code, doc, _ = sh(capsys, cluster, "listunderreplicated", as_json=True)
            assert code == 0
            on_victim = [lid for lid in bk.list_ledgers()
                         if (m := bk.ledger_metadata(lid)).is_closed and victim in m.all_bookies()]
            return not on_victim and {d["ledger_id"] for d in doc} <= {opened}
        wait_until(repaired, 90, interval=0.5,
                   what="in-bookie autorecovery to replace the dead bookie")
        assert victim not in bk.ledger_metadata(closed).all_bookies()
        assert not replication_problems(bk, closed, 10)
        code, doc, _ = sh(capsys, cluster, "whoisauditor", as_json=True)
        assert code == 0 and not doc["auditor"].startswith(victim + ":")
