"""Bookie lifecycle with real processes: restarts, kill -9, cookies, read-only, GC, SIGTERM."""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from bkspark import errors
from bkspark.proto import bookie_pb2 as pb
from bkspark.testing.cluster import BookieCluster, bookie_http
from metadata import open_store, registry
from metadata.ledger_metadata import LedgerMetadata
from metadata import ledgers as ledger_store

from .conftest import MASTER_KEY, add_request, frame, stub_for


@pytest.fixture
def cluster(tmp_path):
    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path) as c:
        yield c


def _http(cluster, path, method="GET", body=None, timeout=10):
    status, raw = bookie_http(cluster.bookies[0], path, method, body, timeout=timeout)
    assert status == 200, raw
    return json.loads(raw)


def test_fence_survives_kill_and_restart(cluster):
    stub, channel = stub_for(cluster.bookie_ids[0])
    assert stub.Add(add_request(7, 0), timeout=10).status == errors.EOK
    fence = stub.Read(pb.ReadRequest(ledger_id=7, entry_id=-1, flags=pb.ReadRequest.FENCE_LEDGER,
                                     master_key=MASTER_KEY), timeout=10)
    assert fence.status == errors.EOK
    channel.close()
    cluster.kill(0)
    cluster.start(0)
    stub, channel = stub_for(cluster.bookie_ids[0])
    assert stub.Add(add_request(7, 1), timeout=10).status == errors.EFENCED
    assert stub.Read(pb.ReadRequest(ledger_id=7, entry_id=0), timeout=10).status == errors.EOK
    channel.close()


def test_kill_9_under_load_loses_nothing_acknowledged(cluster):
    stub, channel = stub_for(cluster.bookie_ids[0])
    acked: list[int] = []
    stop = threading.Event()

    def batches():
        e = 0
        while not stop.is_set():
            yield pb.AddBatch(adds=[add_request(11, e + i, b"%d" % (e + i) * 50) for i in range(50)])
            e += 50

    def writer():
        try:
            for reply in stub.AddStream(batches(), timeout=60):
                acked.extend(r.entry_id for r in reply.responses if r.status == errors.EOK)
        except Exception:  # noqa: BLE001 - the bookie dies under us: expected
            pass

    thread = threading.Thread(target=writer)
    thread.start()
    deadline = time.monotonic() + 30
    while len(acked) < 2000 and time.monotonic() < deadline:
        time.sleep(0.01)
    cluster.kill(0)
    stop.set()
    thread.join(30)
    channel.close()
    assert len(acked) >= 2000
    snapshot = sorted(acked)
    cluster.start(0)
    stub, channel = stub_for(cluster.bookie_ids[0])
    for e in snapshot:
        reply = stub.Read(pb.ReadRequest(ledger_id=11, entry_id=e), timeout=10)
        assert reply.status == errors.EOK, f"acknowledged entry {e} lost after kill -9"
        assert reply.body == frame(11, e, b"%d" % e * 50)
    channel.close()


def test_replaced_disk_refuses_to_start(cluster):
    cluster.stop(0)
    journal = os.path.join(cluster.bookies[0].dir, "journal")
    shutil.rmtree(journal)
    os.makedirs(journal)
    with pytest.raises(errors.BKError, match="disks were replaced"):
        cluster.start(0)


def test_bitflip_in_last_journal_group_refuses_to_start(tmp_path):
    """The newest acknowledged entries of a killed bookie exist only in its journal's last group;
    a bit flip there is damage, not a torn write: the bookie exits naming the file and offset
    instead of starting without those entries (and answering NoSuchEntry for them)."""
    import glob
    import struct
    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path,
                       extra_args=["--checkpoint-interval-s", "3600"]) as c:
        stub, channel = stub_for(c.bookie_ids[0])
        for e in range(20):
            assert stub.Add(add_request(9, e, b"%d" % e * 40), timeout=10).status == errors.EOK
        channel.close()
        c.kill(0)
        groups = []  # (journal file, group offset, group end) of every group, in order
        for path in sorted(glob.glob(os.path.join(c.bookies[0].dir, "journal", "*.txn"))):
            data = open(path, "rb").read()
            off = 512
            while data[off:off + 4] == b"BKSG":
                end = off + 24 + struct.unpack_from("<I", data, off + 4)[0]
                groups.append((path, off, end))
                off = end
        path, g0, g1 = groups[-1]
        with open(path, "r+b") as f:  # flip a bit inside the last entry's body
            f.seek(g1 - 10)
            b = f.read(1)[0]
            f.seek(g1 - 10)
            f.write(bytes([b ^ 4]))
        with pytest.raises(errors.BKError, match="refusing to start") as ex:
            c.start(0)
        assert c.bookies[0].proc.returncode != 0
        assert f"journal {path} is corrupt at offset {g0}" in str(ex.value), str(ex.value)


def test_swapped_directories_refuse_to_start(tmp_path):
    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=2, data_dir=tmp_path) as c:
        c.stop(0)
        c.stop(1)
        a, b = c.bookies[0].dir, c.bookies[1].dir
        os.rename(a, a + ".tmp")
        os.rename(b, a)
        os.rename(a + ".tmp", b)
        with pytest.raises(errors.BKError, match="cookie in .* does not match"):
            c.start(0)


def test_read_only_switch_moves_registration_and_refuses_adds(cluster):
    store = open_store(cluster.metadata_uri)
    bookie_id = cluster.bookie_ids[0]
    stub, channel = stub_for(bookie_id)
    try:
        assert _http(cluster, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": True})["readOnly"]
        assert bookie_id in registry.list_bookies(store, readonly=True)
        assert bookie_id not in registry.list_bookies(store)
        assert stub.Add(add_request(21, 0), timeout=10).status == errors.EREADONLY
        assert stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10).read_only
        assert not _http(cluster, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": False})["readOnly"]
        assert bookie_id in registry.list_bookies(store)
        assert stub.Add(add_request(21, 0), timeout=10).status == errors.EOK
    finally:
        channel.close()
        store.close()


def test_disk_usage_threshold_makes_bookie_read_only(tmp_path):
    args = ["--disk-usage-threshold", "0.0001", "--disk-usage-lwm", "0.00005", "--disk-check-interval-s", "0.2"]
    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path, extra_args=args) as c:
        store = open_store(c.metadata_uri)
        assert c.bookie_ids[0] in registry.list_bookies(store, readonly=True)
        store.close()
        stub, channel = stub_for(c.bookie_ids[0])
        assert stub.Add(add_request(5, 0), timeout=10).status == errors.EREADONLY
        channel.close()
        from bkspark.client import BookKeeper
        with BookKeeper(c.metadata_uri) as bk:      # the client says which bookies, and why
            with pytest.raises(errors.NotEnoughBookiesError,
                               match=r"only 0 available: \[\]; 1 more registered read-only: "
                                     r".*disk_usage_threshold"):
                bk.create_ledger(1, 1, 1)


def test_gc_deletes_only_ledgers_missing_from_metadata(cluster):
    store = open_store(cluster.metadata_uri)
    bookie_id = cluster.bookie_ids[0]
    live = ledger_store.create_ledger(store, LedgerMetadata.new([bookie_id], 1, 1))
    dead = live.ledger_id + 1_000_000
    stub, channel = stub_for(bookie_id)
    for lid in (live.ledger_id, dead):
        assert stub.Add(add_request(lid, 0), timeout=10).status == errors.EOK
    deleted = _http(cluster, "/api/v1/bookie/gc", "POST", {})["deletedLedgers"]
    assert deleted == [dead]
    assert stub.Read(pb.ReadRequest(ledger_id=live.ledger_id, entry_id=0), timeout=10).status == errors.EOK
    assert stub.Read(pb.ReadRequest(ledger_id=dead, entry_id=0), timeout=10).status == errors.ENOLEDGER
    channel.close()
    store.close()


def test_gc_deletes_nothing_while_the_metadata_store_is_unreachable(tmp_path):
    """A listing that fails must not look like an empty store: the pass deletes nothing, and
    the next one, with ZooKeeper back, deletes only what is really gone."""
    from metadata.testing import ZooKeeperServer, unique_root
    zk = ZooKeeperServer()
    zk.start()
    try:
        uri = zk.uri(unique_root("gc"))
        with BookieCluster(uri, raw_ledgers=True, num_bookies=1, data_dir=tmp_path, session_timeout=20.0) as c:
            store = open_store(uri)
            live = ledger_store.create_ledger(store, LedgerMetadata.new([c.bookie_ids[0]], 1, 1))
            store.close()
            dead = live.ledger_id + 1_000_000           # data without metadata
            stub, channel = stub_for(c.bookie_ids[0])
            for lid in (live.ledger_id, dead):
                assert stub.Add(add_request(lid, 0), timeout=10).status == errors.EOK
            zk.stop(cleanup=False)      # its data stays for the restart below
            assert _http(c, "/api/v1/bookie/gc", "POST", {}, timeout=120)["deletedLedgers"] == []
            for lid in (live.ledger_id, dead):
                assert stub.Read(pb.ReadRequest(ledger_id=lid, entry_id=0),
                                 timeout=10).status == errors.EOK
            zk.start()
            deadline = time.monotonic() + 60
            while (deleted := _http(c, "/api/v1/bookie/gc", "POST", {},
                                    timeout=120)["deletedLedgers"]) != [dead]:
                assert deleted == [] and time.monotonic() < deadline, deleted
                time.sleep(0.5)
            channel.close()
    finally:
        zk.stop()


def test_sigterm_is_graceful_and_unregisters(cluster):
    store = open_store(cluster.metadata_uri)
    assert cluster.bookie_ids[0] in registry.list_bookies(store)
    cluster.stop(0)
    assert cluster.bookies[0].proc.returncode == 0
    assert cluster.bookie_ids[0] not in registry.list_bookies(store)
    store.close()


def test_bad_flags_exit_with_a_clear_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bkspark.bookie", "--metadata", f"sqlite:///{tmp_path}/m.db",
                           "--journal-dir", str(tmp_path / "j")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "ledger_dirs" in proc.stderr


def test_cluster_takes_other_ports_when_its_free_port_was_taken(tmp_path):
    """A port chosen free can be taken by another process before the bookie binds it (test
    suites on a busy machine): a bookie that never started takes fresh ports and starts."""
    import socket
    cluster = BookieCluster(f"sqlite:///{tmp_path}/m.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    cluster.bookies[0].port = taken.getsockname()[1]
    cluster.bookies[0].bookie_id = f"127.0.0.1:{cluster.bookies[0].port}"
    try:
        with cluster:
            assert cluster.bookies[0].port != taken.getsockname()[1]
            with open_store(cluster.metadata_uri) as store:
                assert sorted(registry.list_bookies(store)) == cluster.bookie_ids
    finally:
        taken.close()


def test_cluster_ports_lie_outside_the_ephemeral_range():
    """A bookie keeps its port across restarts; while it is down, any outgoing connection on
    the machine could take a port of the ephemeral range as its local port and the restart
    would fail with "address already in use" (seen in the crash campaign). Ports are chosen
    where only an explicit bind can take them, and never twice."""
    import socket
    from bkspark.ports import _ephemeral_range, free_port
    low, high = _ephemeral_range()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low or high < p <= 65535 for p in ports), (low, high, ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


def test_cluster_that_cannot_start_leaves_no_bookie_running(tmp_path):
    cluster = BookieCluster(f"sqlite:///{tmp_path}/m.db", raw_ledgers=True, num_bookies=2, data_dir=tmp_path)
    cluster.bookies[1].extra_args = ["--no-such-flag"]
    with pytest.raises(errors.BKError, match="no-such-flag"):
        cluster.start_all()
    assert not any(b.alive for b in cluster.bookies)


def test_custom_bookie_id_resolves_to_its_address_while_down(tmp_path):
    """A bookie whose id is not its address: clients find its address in the metadata while
    it runs (registration) and while it is down (the cookie records its last address), not
    the bare id, which nothing can dial."""
    from bkspark.client import BookKeeper
    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path,
                       extra_args=["--bookie-id", "bookie-one"]) as c:
        address = c.bookie_ids[0]
        with BookKeeper(c.metadata_uri) as bk:
            assert bk._resolve_address("bookie-one") == address
            c.kill(0)
            deadline = time.monotonic() + 30
            while "bookie-one" in registry.list_bookies(bk.store):
                assert time.monotonic() < deadline, "the dead bookie stayed registered"
                time.sleep(0.2)
            bk._bookie_cache = (0.0, {})
            assert bk._resolve_address("bookie-one") == address
