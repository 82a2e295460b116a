"""A bookie whose ledger directory's writes fail (issue 46), on a real failing device
(:mod:`bkspark.testing.faildisk`): it goes read-only and says which directory (registration,
admin state, /metrics); once the space is back it reopens its storage (the journal replays what
was lost) and is writable again; nothing it acknowledged is lost."""
import json
import os
import time

from bkspark import errors
from bkspark.proto import bookie_pb2 as pb
from bkspark.testing import faildisk
from bkspark.testing.cluster import BookieCluster, bookie_http
from metadata import open_store, registry
from metadata.testing import skip_or_fail

from .conftest import add_request, stub_for

BODY = 64 << 10


def _get(bookie, path):
    status, raw = bookie_http(bookie, path)
    assert status == 200, raw
    return raw


def _wait(what, cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} ({got!r:.2000})")


def test_a_full_ledger_directory_makes_the_bookie_read_only_then_writable_losing_nothing(tmp_path):
    why = faildisk.unavailable()
    if why:
        skip_or_fail(f"real failing device: {why}")
    with faildisk.FailingDevice(size_mb=256, backing_mb=12) as dev:
        ldir = os.path.join(dev.mountpoint, "ledgers")
        os.makedirs(ldir)
        os.makedirs(tmp_path / "bookie-0")
        os.symlink(ldir, tmp_path / "bookie-0" / "ledgers")
        named = str(tmp_path / "bookie-0" / "ledgers")      # (the bookie's name for it)
        args = ["--disk-check-interval-s", "0.2", "--checkpoint-interval-s", "0.5",
                "--write-cache-mb", "4"]
        with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path,
                           extra_args=args) as cluster:
            bookie = cluster.bookies[0]
            stub, channel = stub_for(bookie.bookie_id)
            store = open_store(cluster.metadata_uri)
            try:
                acked = []
                for e in range(4):
                    assert stub.Add(add_request(7, e, bytes([e]) * BODY), timeout=10).status == errors.EOK
                    acked.append(e)
                dev.starve(leave_bytes=256 << 10)
                # adds go on (the journal is on the normal disk) until the bookie refuses them:
                # read-only, or EIO once the write cache that cannot be flushed is full
                e = 4
                while e < 200:
                    status = stub.Add(add_request(7, e, bytes([e % 256]) * BODY), timeout=10).status
                    if status in (errors.EREADONLY, errors.EIO):
                        break
                    assert status == errors.EOK, status
                    acked.append(e)
                    e += 1
                assert status in (errors.EREADONLY, errors.EIO), "the bookie took every add"
                state = _wait("read-only", lambda: (lambda s: s if s["readOnly"] else None)(
                    json.loads(_get(bookie, "/api/v1/bookie/state"))))
                assert stub.Add(add_request(7, e, b"no"), timeout=10).status == errors.EREADONLY
                assert state["readOnly"] and [d["dir"] for d in state["diskErrors"]] == [named]
                assert state["diskErrors"][0]["full"], state
                _wait("registered read-only",
                      lambda: bookie.bookie_id in registry.list_bookies(store, readonly=True))
                line = f'bookie_dir_state{{dir="{named}",kind="ledger"}} 1.0'   # (1: full)
                _wait("/metrics: the directory full", lambda: line in _get(bookie, "/metrics").decode())
                dev.feed()
                _wait("writable again", lambda: not json.loads(
                    _get(bookie, "/api/v1/bookie/state"))["readOnly"])
                assert stub.Add(add_request(7, e, b"after"), timeout=10).status == errors.EOK
                dev_files = os.listdir(ldir)
                assert any(n.endswith(".log") for n in dev_files)
                for a in acked:
                    r = stub.Read(pb.ReadRequest(ledger_id=7, entry_id=a), timeout=10)
                    assert r.status == errors.EOK and r.body.endswith(bytes([a % 256]) * BODY), a
            finally:
                channel.close()
                store.close()
            cluster.stop(0)
        dev.remount()                                   # (what the device holds, not the cache)
        with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path,
                           extra_args=args) as cluster:
            stub, channel = stub_for(cluster.bookie_ids[0])
            try:
                for a in acked:
                    r = stub.Read(pb.ReadRequest(ledger_id=7, entry_id=a), timeout=10)
                    assert r.status == errors.EOK and r.body.endswith(bytes([a % 256]) * BODY), a
            finally:
                channel.close()
