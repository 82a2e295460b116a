"""Bookie-process crash campaign: SIGKILL bookies at random points under load (issue 9).

    python -m bkspark.testing.faults crash --seed 7 --kills 300 --report crash.json

Three bookies run with a 1 MiB write cache, a checkpoint every 100 ms, 1 MiB journal and
entry-log files and a GC/compaction pass every 0.5 s, so that a random kill lands in journal
group commits, write-cache flushes (checkpoints), journal rolls, entry-log rolls and
compaction alike. One loader thread per bookie sends raw ``Add`` requests (digest-framed
entries, pipelined) straight to its bookie and records each EOK answer — an
acknowledgement means "durable on this bookie". Loaders rotate ledgers; finished ledgers
are periodically deleted from the metadata (the bookies' GC deletes them and compaction
rewrites the entry logs), and some are fenced (the fence must survive crashes).

Each iteration: wait a random 50-1500 ms under load, SIGKILL a random bookie, restart it
(``bookie-failed-to-start`` if it does not come up), then check on that bookie:

* ``acked-entry-missing``: every acknowledged entry of a live ledger is listed
  (ListEntries) and a sample reads back byte-identical (``acked-entry-corrupt`` otherwise,
  ``acked-entry-unreadable`` for a non-EOK read);
* ``fence-lost``: an add to a fenced ledger is refused with EFENCED.

The kills are a pure function of the seed (the timing of the load is not).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time

import grpc

from bkspark import errors
from bkspark.client.digest import DigestManager

PASSWORD = b"crash"
CRASH_BOOKIE_ARGS = ["--write-cache-mb", "1", "--checkpoint-interval-s", "0.1",
                     "--journal-max-size-mb", "1", "--entry-log-max-size-mb", "1",
                     "--gc-interval-s", "0.5", "--compaction-threshold", "0.6",
                     "--journal-max-backups", "1"]


class Loader(threading.Thread):
    """Raw adds to one bookie; ``acked[lid][eid] = body`` only after an EOK answer."""

    def __init__(self, campaign: "CrashCampaign", index: int, seed: int):
        super().__init__(daemon=True, name=f"loader-{index}")
        self.c = campaign
        self.index = index
        self.rng = random.Random(seed)
        self.acked: dict[int, dict[int, bytes]] = {}
        self.finished: list[int] = []
        self.fenced: dict[int, bytes] = {}      # ledger id -> its master key
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.adds = 0
        self.errors = 0

    def run(self) -> None:
        from bkspark.proto import bookie_pb2 as pb
        from bkspark.proto import bookie_pb2_grpc as pb_grpc
        address = self.c.cluster.bookie_ids[self.index]
        channel = self.c.cluster.credentials("client").channel(address)
        stub = pb_grpc.BookieStub(channel)
        while not self.stop.is_set():
            try:
                lh = self.c.bk.create_ledger(1, 1, 1, password=PASSWORD)
            except errors.BKError:
                time.sleep(0.2)
                continue
            lid = lh.ledger_id
            keys = lh.metadata.keys.derive(PASSWORD)
            mkey = keys.master_key
            dm = DigestManager(lid, "crc32c", keys.mac_key)
            with self.lock:
                self.acked[lid] = {}
            length, eid, n = 0, 0, self.rng.randint(100, 600)
            while eid < n and not self.stop.is_set():
                batch = []
                for _ in range(16):
                    payload = self.rng.randbytes(self.rng.randint(100, 4000))
                    length += len(payload)
                    body = dm.frame(eid, eid - 1, length, payload)
                    req = pb.AddRequest(ledger_id=lid, entry_id=eid, master_key=mkey, body=body)
                    batch.append((eid, body, stub.Add.future(req, timeout=5)))
                    eid += 1
                for e, body, fut in batch:
                    try:
                        resp = fut.result()
                    except grpc.RpcError:
                        self.errors += 1
                        continue
                    if resp.status == errors.EOK:
                        with self.lock:
                            self.acked[lid][e] = body
                        self.adds += 1
                    else:
                        self.errors += 1
                if not any(e in self.acked.get(lid, {}) for e, _, _ in batch):
                    time.sleep(0.1)     # the bookie is down (being restarted)
            if self.rng.random() < self.c.fence_probability:
                req = pb.ReadRequest(ledger_id=lid, entry_id=-1, flags=pb.ReadRequest.FENCE_LEDGER,
                                     master_key=mkey)
                try:
                    resp = stub.Read(req, timeout=5)
                    if resp.status in (errors.EOK, errors.ENOENTRY, errors.ENOLEDGER):
                        with self.lock:
                            self.fenced[lid] = mkey
                except grpc.RpcError:
                    pass
            with self.lock:
                self.finished.append(lid)
                # delete old ledgers: GC deletes their data, compaction rewrites entry logs
                while len(self.finished) > 6:
                    old = self.finished.pop(0)
                    self.acked.pop(old, None)
                    self.fenced.pop(old, None)
                    self.c.retired.add(old)     # before its metadata can be deleted
                    self.c.to_delete.append(old)
        channel.close()

    def snapshot(self):
        with self.lock:
            return ({lid: dict(e) for lid, e in self.acked.items()}, dict(self.fenced))


class CrashCampaign:
    def __init__(self, seed: int, kills: int, workdir: str, num_bookies: int = 3,
                 verbose: bool = False, max_seconds: float | None = None,
                 fence_probability: float = 0.3):
        self.fence_probability = fence_probability
        self.seed, self.kills, self.workdir = seed, kills, workdir
        self.num_bookies = num_bookies
        self.verbose = verbose
        self.max_seconds = max_seconds
        self.violations: list[dict] = []
        self.to_delete: list[int] = []
        self.retired: set[int] = set()    # ledgers deleted (or about to be): not checked
        self.stats = collections.Counter()

    def violation(self, kind: str, **details) -> None:
        if details.get("ledger") in self.retired:
            return      # deleted by the campaign itself after the snapshot: GC may drop it
        v = {"invariant": kind, **details}
        self.violations.append(v)     # list.append is atomic; kill loops stop at the first
        print("VIOLATION", json.dumps(v, default=str), flush=True)

    def run(self) -> dict:
        from bkspark.client import BookKeeper
        from bkspark.testing.cluster import BookieCluster
        uri = f"sqlite:///{os.path.join(self.workdir, 'meta.db')}"
        self.cluster = BookieCluster(uri, raw_ledgers=True, num_bookies=self.num_bookies,
                                     data_dir=os.path.join(self.workdir, "bookies"),
                                     fault_injection=False, extra_args=CRASH_BOOKIE_ARGS,
                                     session_timeout=1.0)
        self.started = started = time.monotonic()
        self._lock = threading.Lock()
        self._kills_left = self.kills
        self._done = 0
        with self.cluster, BookKeeper(uri, add_timeout=3, read_timeout=3) as bk:
            self.bk = bk
            loaders = [Loader(self, i, self.seed * 31 + i) for i in range(self.num_bookies)]
            for ld in loaders:
                ld.start()
            # one kill loop per bookie (kills of different bookies overlap); each loop's
            # sequence of pauses is a function of (seed, bookie)
            killers = [threading.Thread(target=self._kill_loop, args=(i, loaders), daemon=True)
                       for i in range(self.num_bookies)]
            try:
                for t in killers:
                    t.start()
                for t in killers:
                    t.join()
            finally:
                for ld in loaders:
                    ld.stop.set()
                for ld in loaders:
                    ld.join(30)
            self._delete_some(bk)
        done = self._done
        return {"seed": self.seed, "kills": done, "entries_acked": sum(l.adds for l in loaders),
                "entries_verified": self.stats["verified"], "reads_compared": self.stats["read"],
                "fences_verified": self.stats["fences"],
                "checkpoints": self.stats["checkpoints"], "compactions": self.stats["compactions"],
                "compacted_logs": self.stats["compacted_logs"],
                "violations": self.violations, "wall_seconds": round(time.monotonic() - started, 1)}

    def _take_kill(self) -> int | None:
        with self._lock:
            if self._kills_left <= 0 or self.violations or (
                    self.max_seconds and time.monotonic() - self.started > self.max_seconds):
                return None
            self._kills_left -= 1
            return self.kills - self._kills_left - 1

    def _kill_loop(self, i: int, loaders) -> None:
        rng = random.Random(self.seed * 1009 + i)
        while True:
            time.sleep(rng.uniform(0.05, 1.5))
            k = self._take_kill()
            if k is None:
                return
            with self._lock:
                self._delete_some(self.bk)
            self._scrape(i)
            acked, fenced = loaders[i].snapshot()
            self.cluster.kill(i)
            try:
                self.cluster.start(i)
            except errors.BKError as exc:
                self.violation("bookie-failed-to-start", kill=k, bookie=i, detail=str(exc)[-2000:])
                return
            self._verify(i, k, acked, fenced, rng)
            with self._lock:
                self._done += 1
                done = self._done
            if self.verbose and done % 10 == 0:
                print(f"crash campaign: {done} kills, {sum(x.adds for x in loaders)} adds "
                      f"acked, {len(self.violations)} violations", flush=True)

    def _delete_some(self, bk) -> None:
        while self.to_delete:
            lid = self.to_delete.pop(0)
            try:
                bk.delete_ledger(lid)
            except errors.BKError:
                pass

    def _scrape(self, i: int) -> None:
        """Add the bookie's checkpoint/compaction counters (they reset at restart)."""
        port = self.cluster.bookies[i].http_port
        try:
            creds = self.cluster.credentials("client")
            status, raw, _ = creds.http_request(creds.url("127.0.0.1", port, "/metrics"),
                                                timeout=2)
            text = raw.decode()
        except OSError:
            return
        for key in ("checkpoints", "compactions", "compacted_logs"):
            m = re.search(rf"^bookie_storage_{key}(?:_total)?\s+([0-9.e+]+)$", text, re.M)
            if m:
                self.stats[key] += int(float(m.group(1)))

    def _verify(self, i: int, k: int, acked: dict, fenced: dict, rng: random.Random) -> None:
        from bkspark.proto import bookie_pb2 as pb
        from bkspark.proto import bookie_pb2_grpc as pb_grpc
        with self.cluster.credentials("client").channel(self.cluster.bookie_ids[i]) as channel:
            stub = pb_grpc.BookieStub(channel)
            try:
                stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=30, wait_for_ready=True)
            except grpc.RpcError as exc:
                self.violation("bookie-failed-to-start", kill=k, bookie=i,
                               detail=f"not serving after restart: {exc.code()}",
                               alive=self.cluster.bookies[i].alive,
                               log=self.cluster.bookies[i].log_tail(20))
                return
            for lid, entries in acked.items():
                if not entries:
                    continue
                resp = stub.ListEntries(pb.ListEntriesRequest(ledger_id=lid), timeout=10)
                held = set()
                for r in resp.ranges:
                    held.update(range(r.first, r.last + 1))
                missing = sorted(set(entries) - held)
                if missing:
                    self.violation("acked-entry-missing", kill=k, bookie=i, ledger=lid,
                                   missing=missing[:20], count=len(missing), status=resp.status)
                self.stats["verified"] += len(entries) - len(missing)
                eids = sorted(entries)
                sample = set(eids[-8:]) | set(rng.sample(eids, min(8, len(eids))))
                for eid in sorted(sample):
                    r = stub.Read(pb.ReadRequest(ledger_id=lid, entry_id=eid), timeout=10)
                    self.stats["read"] += 1
                    if r.status != errors.EOK:
                        self.violation("acked-entry-unreadable", kill=k, bookie=i, ledger=lid,
                                       entry=eid, status=r.status)
                    elif r.body != entries[eid]:
                        self.violation("acked-entry-corrupt", kill=k, bookie=i, ledger=lid, entry=eid)
            for lid, mkey in fenced.items():
                dm = DigestManager(lid, "crc32c")
                body = dm.frame(10_000_000, -1, 1, b"x")
                r = stub.Add(pb.AddRequest(ledger_id=lid, entry_id=10_000_000,
                                           master_key=mkey, body=body), timeout=10)
                self.stats["fences"] += 1
                if r.status != errors.EFENCED:
                    self.violation("fence-lost", kill=k, bookie=i, ledger=lid, status=r.status)


def format_crash(r: dict) -> str:
    lines = [f"crash campaign: seed={r['seed']} kills={r['kills']} entries_acked={r['entries_acked']} "
             f"entries_verified={r['entries_verified']} reads_compared={r['reads_compared']} "
             f"fences_verified={r['fences_verified']} checkpoints={r['checkpoints']} "
             f"compactions={r['compactions']} compacted_logs={r['compacted_logs']} "
             f"violations={len(r['violations'])} ({r['wall_seconds']}s)"]
    lines += [f"VIOLATION {json.dumps(v, default=str)}" for v in r["violations"][:20]]
    if r["violations"]:
        lines.append(f"replay: python -m bkspark.testing.faults crash --seed {r['seed']} "
                     f"--kills {r['kills']}")
    return "\n".join(lines)


def run_crash_campaign(seed: int, kills: int, workdir: str | None = None, keep: bool = False,
                       verbose: bool = False, max_seconds: float | None = None) -> dict:
    base = workdir or tempfile.mkdtemp(prefix="bkspark-crash-")
    os.makedirs(base, exist_ok=True)
    result = CrashCampaign(seed, kills, base, verbose=verbose, max_seconds=max_seconds).run()
    result["workdir"] = base
    if not keep and not result["violations"]:
        shutil.rmtree(base, ignore_errors=True)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bkspark.testing.faults crash")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--kills", type=int, default=100)
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--report", default=None)
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    r = run_crash_campaign(seed, a.kills, a.workdir, a.keep, verbose=True, max_seconds=a.max_seconds)
    print(format_crash(r), flush=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(r, f, indent=1, default=str)
    return 1 if r["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
