"""The invariant checker of a fault run: heals the cluster, then verifies every ledger and
log against the writers' ack files (the violations are listed in the package docstring)."""
from __future__ import annotations

import collections
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from bkspark import errors
from bkspark.client import quorum

from .common import CLIENT_CONF, LOG_NAME, PASSWORD, bookie_rpc, parse_record, wait_serving


@dataclass
class Acks:
    ledgers: dict = field(default_factory=dict)          # lid -> {"worker", "acked": {eid: seq}}
    closed_by_writer: dict = field(default_factory=dict)  # lid -> last
    recovered: dict = field(default_factory=dict)         # lid -> [last, ...]
    log_acks: list = field(default_factory=list)          # (worker, lid, eid, seq)
    entries_acked: int = 0
    expiries: int = 0


def read_acks(workdir: str) -> Acks:
    acks = Acks()
    for name in sorted(os.listdir(workdir)):
        if not (name.startswith("worker-") and name.endswith(".acks")):
            continue
        wid = int(name[len("worker-"):-len(".acks")])
        with open(os.path.join(workdir, name)) as f:
            for line in f:
                p = line.split()
                if not p or not line.endswith("\n"):
                    continue
                if p[0] == "L":
                    acks.ledgers[int(p[1])] = {"worker": wid, "acked": {},
                                               "quorum": tuple(map(int, p[2:5]))}
                elif p[0] == "A":
                    acks.ledgers[int(p[1])]["acked"][int(p[2])] = int(p[3])
                    acks.entries_acked += 1
                elif p[0] == "C":
                    acks.closed_by_writer[int(p[1])] = int(p[2])
                elif p[0] == "P":
                    acks.log_acks.append((wid, int(p[1]), int(p[2]), int(p[3])))
                    acks.entries_acked += 1
                elif p[0] == "S" and p[1] == "expired":
                    acks.expiries += 1
    events = os.path.join(workdir, "runner.events")
    if os.path.exists(events):
        with open(events) as f:
            for line in f:
                p = line.split()
                if p and p[0] == "R" and line.endswith("\n"):
                    acks.recovered.setdefault(int(p[1]), []).append(int(p[2]))
    return acks


class Checker:
    """Verifies the invariants (package docstring) of one run's ledgers and log."""

    def __init__(self, uri: str, workdir: str, cluster, log_snapshots=(), say=print):
        self.uri, self.workdir, self.cluster = uri, workdir, cluster
        self.log_snapshots = list(log_snapshots)
        self.say = say
        self.violations: list[dict] = []

    def violation(self, kind: str, **details) -> None:
        v = {"invariant": kind, **details}
        if len(self.violations) < 200:
            self.violations.append(v)
        self.say("VIOLATION", v)

    def _open(self, bk, lid: int, attempts: int = 20):
        last_exc = None
        for _ in range(attempts):
            try:
                return bk.open_ledger(lid, password=PASSWORD, recovery=True)
            except (errors.LedgerRecoveryError, errors.BookieUnavailableError) as exc:
                last_exc = exc
                time.sleep(0.5)
        raise last_exc

    def check(self) -> dict:
        from bkspark.client import BookKeeper
        acks = read_acks(self.workdir)
        ends: dict[int, int] = {}
        contents: dict[int, list[bytes]] = {}
        log_ledgers: list[int] = []
        with BookKeeper(self.uri, **CLIENT_CONF) as a, BookKeeper(self.uri, **CLIENT_CONF) as b:
            log_ledgers = self._check_log(a, b, acks, ends, contents)
            for lid in sorted(acks.ledgers):
                self._check_ledger(a, b, lid, acks, ends, contents)
        # a closed ledger's end never moves: SIGKILL every bookie, restart, re-open, compare
        for i in range(len(self.cluster.bookies)):
            self.cluster.kill(i)
        for i in range(len(self.cluster.bookies)):
            self.cluster.start(i, wait=False)
        for i in range(len(self.cluster.bookies)):
            self.cluster.wait_ready(i)
        wait_serving(self.cluster)
        with BookKeeper(self.uri, **CLIENT_CONF) as c:
            for lid, last in sorted(ends.items()):
                try:
                    rh = self._open(c, lid)
                    if rh.last_add_confirmed != last:
                        self.violation("end-moved", ledger=lid, before=last,
                                       after=rh.last_add_confirmed)
                    elif last >= 0:
                        got = _retry(lambda: [e.data for e in rh.read(0, last)])
                        if got != contents[lid]:
                            self.violation("reader-divergence", ledger=lid,
                                           detail="content changed after restarting bookies")
                    rh.close()
                except errors.BKError as exc:
                    self.violation("acked-entry-lost", ledger=lid,
                                   detail=f"re-open after restart failed: {exc!r}")
        return {"violations": self.violations, "entries_acked": acks.entries_acked,
                "ledgers_checked": len(ends), "log_ledgers": len(log_ledgers),
                "session_expiries": acks.expiries, "log_entries_acked": len(acks.log_acks),
                "entries_read": sum(len(v) for v in contents.values())}

    # -- ledgers
    def _check_ledger(self, a, b, lid, acks: Acks, ends, contents) -> None:
        info = acks.ledgers[lid]
        acked: dict = info["acked"]
        try:
            rh = self._open(a, lid)
        except errors.NoSuchLedgerError:
            if acked:
                self.violation("acked-entry-lost", ledger=lid, detail="ledger metadata gone")
            return
        except errors.BKError as exc:
            self.violation("acked-entry-lost", ledger=lid, detail=f"cannot recover: {exc!r}")
            return
        last = rh.last_add_confirmed
        ends[lid] = last
        md = rh.metadata
        for eid, seq in acked.items():
            if eid > last:
                fenced = acks.recovered.get(lid, [])
                kind = "fenced-writer-success" if fenced else "acked-entry-lost"
                self.violation(kind, ledger=lid, entry=eid, closed_end=last,
                               recovered_ends=fenced)
        for who, end in ([("writer-close", acks.closed_by_writer[lid])]
                         if lid in acks.closed_by_writer else []) + \
                [("recoverer", e) for e in acks.recovered.get(lid, [])]:
            if end != last:
                self.violation("end-moved", ledger=lid, recorded_by=who, recorded=end, now=last)
        data = self._read_all(rh, lid, last)
        rh.close()
        if data is None:
            return
        contents[lid] = data
        prev = -1
        for eid, payload in enumerate(data):
            try:
                worker, seq = parse_record(payload)
            except ValueError as exc:
                self.violation("bad-record", ledger=lid, entry=eid, detail=str(exc))
                continue
            if worker != info["worker"]:
                self.violation("bad-record", ledger=lid, entry=eid,
                               detail=f"record of worker {worker} in worker {info['worker']}'s ledger")
            if seq <= prev:
                self.violation("out-of-order", ledger=lid, entry=eid, seq=seq, previous=prev)
            prev = seq
            if eid in acked and acked[eid] != seq:
                self.violation("ack-mismatch", ledger=lid, entry=eid, acked_seq=acked[eid],
                               read_seq=seq)
        # a second client, reading every entry from a different replica than the first
        self._check_replicas(b, lid, md, last, data)

    def _read_all(self, rh, lid, last):
        if last < 0:
            return []
        try:
            return _retry(lambda: [e.data for e in rh.read(0, last)])
        except errors.BKError as exc:
            self.violation("acked-entry-lost", ledger=lid,
                           detail=f"read 0..{last} failed: {exc!r}")
            return None

    def _check_replicas(self, b, lid, md, last, data) -> None:
        from bkspark.client.digest import DigestManager
        from bkspark.proto import bookie_pb2 as pb
        if last < 0:
            return
        dm = DigestManager(lid, md.digest_type, md.keys.derive(PASSWORD).mac_key)
        ensembles = _ensembles(md)
        holdings: dict[str, set] = {}
        stubs = {}
        for ens_first, ens in ensembles:
            for bid in ens:
                if bid in holdings:
                    continue
                channel, stub = bookie_rpc(b._resolve_address(bid),
                                           self.cluster.credentials("admin"))
                stubs[bid] = (channel, stub)
                try:
                    resp = stub.ListEntries(pb.ListEntriesRequest(ledger_id=lid), timeout=10)
                    held = set()
                    if resp.status == errors.EOK:
                        for r in resp.ranges:
                            held.update(range(r.first, r.last + 1))
                    holdings[bid] = held
                except grpc.RpcError as exc:
                    holdings[bid] = set()
                    self.violation("under-replicated", ledger=lid, bookie=bid,
                                   detail=f"ListEntries failed: {exc.code()}")
        qw, qa = md.write_quorum, md.ack_quorum
        reads = []
        for eid in range(last + 1):
            ens = _ensemble_for(ensembles, eid)
            ws = quorum.write_set_bookies(eid, ens, qw)
            holders = [bid for bid in ws if eid in holdings.get(bid, ())]
            if len(holders) < qa:
                self.violation("under-replicated", ledger=lid, entry=eid, holders=holders,
                               write_set=ws, ack_quorum=qa)
            if holders:
                reads.append((eid, holders[-1]))

        def read_one(item):
            eid, bid = item
            resp = stubs[bid][1].Read(pb.ReadRequest(ledger_id=lid, entry_id=eid), timeout=10)
            return eid, bid, resp

        with ThreadPoolExecutor(8) as pool:
            for eid, bid, resp in pool.map(read_one, reads):
                if resp.status != errors.EOK:
                    self.violation("replica-divergence", ledger=lid, entry=eid, bookie=bid,
                                   detail=f"listed entry read gives status {resp.status}")
                    continue
                try:
                    _, _, _, payload = dm.verify(resp.body, eid)
                except errors.BKError as exc:
                    self.violation("replica-divergence", ledger=lid, entry=eid, bookie=bid,
                                   detail=f"digest: {exc}")
                    continue
                if payload != data[eid]:
                    self.violation("reader-divergence", ledger=lid, entry=eid, bookie=bid)
        for channel, _ in stubs.values():
            channel.close()

    # -- log
    def _check_log(self, a, b, acks: Acks, ends=None, contents=None) -> list[int]:
        from bkspark.log import LogStore
        logs = LogStore(a, password=PASSWORD)
        if not logs.exists(LOG_NAME):
            if acks.log_acks:
                self.violation("log-acked-lost", detail="log record missing")
            return []
        # snapshots taken during the run: at most one open ledger (the last); every
        # non-empty closed ledger stays, in order
        seen_nonempty: list[int] = []
        for snap in self.log_snapshots:
            ids = [e.ledger_id for e in snap]
            opened = [i for i, e in enumerate(snap) if not e.closed]
            if len(opened) > 1 or (opened and opened[0] != len(snap) - 1):
                self.violation("log-open-ledgers", ledgers=[e.to_dict() for e in snap])
            present = [lid for lid in seen_nonempty if lid in ids]
            if present != seen_nonempty:
                self.violation("log-ledger-vanished",
                               missing=sorted(set(seen_nonempty) - set(ids)))
            elif [lid for lid in ids if lid in set(seen_nonempty)] != seen_nonempty:
                self.violation("log-order-changed", before=seen_nonempty, now=ids)
            for e in snap:
                if (e.entry_count() or 0) > 0 \
                        and e.ledger_id not in seen_nonempty:
                    seen_nonempty = [lid for lid in ids if lid in set(seen_nonempty)
                                     or lid == e.ledger_id]
        # seal the tail as a new owner would, then read it twice
        raw = logs.get(LOG_NAME)[0]
        md = raw.copy(ledgers=[e if e.closed else e.with_end(logs.closed_ledger_entry(e.ledger_id))
                               for e in raw.ledgers])
        self._dump_log_state(a, raw, md)
        ids = [e.ledger_id for e in md.ledgers]
        present = [lid for lid in seen_nonempty if lid in ids]
        if present != seen_nonempty:
            self.violation("log-ledger-vanished", missing=sorted(set(seen_nonempty) - set(ids)))
        first = [(r.position.ledger_id, r.position.entry_id, r.data)
                 for r in logs.open_reader(LOG_NAME, "earliest", tail=False)]
        second = [(r.position.ledger_id, r.position.entry_id, r.data)
                  for r in LogStore(b, password=PASSWORD).open_reader(LOG_NAME, "earliest",
                                                                      tail=False)]
        if first != second:
            self.violation("reader-divergence", log=LOG_NAME, first=len(first), second=len(second))
        index = {(lid, eid): data for lid, eid, data in first}
        last_seq: dict[int, int] = {}
        for lid, eid, data in first:
            try:
                worker, seq = parse_record(data)
            except ValueError as exc:
                self.violation("bad-record", log=LOG_NAME, ledger=lid, entry=eid, detail=str(exc))
                continue
            if seq <= last_seq.get(worker, -1):
                self.violation("out-of-order", log=LOG_NAME, ledger=lid, entry=eid,
                               worker=worker, seq=seq, previous=last_seq[worker])
            last_seq[worker] = seq
        for wid, lid, eid, seq in acks.log_acks:
            data = index.get((lid, eid))
            if data is None:
                self.violation("log-acked-lost", ledger=lid, entry=eid, worker=wid, seq=seq,
                               in_list=lid in ids)
                continue
            try:
                if parse_record(data) != (wid, seq):
                    self.violation("ack-mismatch", log=LOG_NAME, ledger=lid, entry=eid,
                                   acked=(wid, seq), read=parse_record(data))
            except ValueError:
                pass
        # the log's ledgers: replicas agree and hold Qa copies; their ends are re-checked
        # after the bookies restart
        per_ledger: dict[int, list[bytes]] = collections.defaultdict(list)
        for lid, eid, data in first:
            per_ledger[lid].append(data)
        for entry in md.ledgers:
            lid = entry.ledger_id
            data = per_ledger.get(lid, [])
            if len(data) != entry.last_entry_id + 1:
                self.violation("log-acked-lost", ledger=lid, detail=f"read {len(data)} entries, "
                               f"list says end {entry.last_entry_id}")
                continue
            if ends is not None:
                ends[lid], contents[lid] = entry.last_entry_id, data
            self._check_replicas(b, lid, a.ledger_metadata(lid), entry.last_entry_id, data)
        return ids


    def _dump_log_state(self, bk, raw, sealed) -> None:
        """Write the log list (as found and as sealed), every snapshot taken during the run
        and each listed ledger's metadata to ``log-state.json``: a violation's post-mortem."""
        ledgers = {}
        for entry in sealed.ledgers:
            try:
                ledgers[entry.ledger_id] = bk.ledger_metadata(entry.ledger_id).to_public_dict()
            except errors.BKError as exc:
                ledgers[entry.ledger_id] = repr(exc)
        with open(os.path.join(self.workdir, "log-state.json"), "w") as f:
            json.dump({"found": [e.to_dict() for e in raw.ledgers],
                       "sealed": [e.to_dict() for e in sealed.ledgers],
                       "snapshots": [[e.to_dict() for e in snap] for snap in self.log_snapshots],
                       "ledger_metadata": ledgers},
                      f, indent=1, default=str)


def _retry(fn, attempts: int = 15, pause: float = 1.0):
    """``fn()``, retried while bookies are transiently unreachable (a client that just saw
    them restart may fail fast for a while); a persistent failure is raised."""
    for i in range(attempts):
        try:
            return fn()
        except errors.BookieUnavailableError:
            if i == attempts - 1:
                raise
            time.sleep(pause)


def _ensembles(md) -> list[tuple[int, list[str]]]:
    """[(first entry id, ensemble)] of a ledger's metadata, in order."""
    for attr in ("ensembles", "segments"):
        segs = getattr(md, attr, None)
        if segs is None:
            continue
        if isinstance(segs, dict):
            return sorted((int(k), list(v)) for k, v in segs.items())
        out = []
        for s in segs:
            if isinstance(s, tuple):
                out.append((int(s[0]), list(s[1])))
            else:
                out.append((int(getattr(s, "first_entry_id")), list(getattr(s, "ensemble"))))
        return sorted(out)
    raise AttributeError("ledger metadata without ensembles")


def _ensemble_for(ensembles, eid: int) -> list[str]:
    chosen = ensembles[0][1]
    for first, ens in ensembles:
        if first <= eid:
            chosen = ens
    return chosen
