"""The independent checker of a user-level fault run.

After the runner killed every workload and healed the cluster, it reads every log back
through a fresh client (each listed ledger's metadata, then its entries, recovering the open
tail), and verifies the records the workloads wrote down (ack files, flushed per line) and
the cuts the runner made (``runner.events``):

* ``log-names-deleted-ledger`` -- a log lists a ledger whose metadata is gone, or that cannot
  be read;
* ``acked-missing`` -- an acknowledged append (a LogWriter's) is not in its log, and no
  retention, truncation or overwrite of that log ended after it was acknowledged (those cut a
  prefix or the whole list: only such a cut may remove it); a committed Spark job's rows are
  absent while an earlier job of the same log (one driver commits them in order) is present,
  or a committed writer key of the keys log is absent (nothing cuts that log);
* ``superseded-write-acked`` -- an acknowledged append lies past the end its ledger was
  closed at, and another writer had opened the log by then (it was fenced, yet acknowledged);
  or it was acknowledged after an overwrite that committed while its ledger was being written
  (the overwrite replaced a list holding that ledger: its writer had to be fenced first);
* ``duplicate`` -- a record (an appended payload, a row of a job without a writer id) is in
  its log more than once;
* ``batch-not-exactly-once`` -- a job with a writer id (or its re-run) applied twice, or a
  job's rows partly present (all or nothing; the oldest job left may be cut partly);
* ``stream-skip`` / ``stream-repeat`` -- the sink log of the streaming query lacks a record of
  the source it read before one it has, or that a micro-batch the query reported committed
  covered; or holds one twice;
* ``out-of-order`` -- a writer's records, a tailing reader's records, or the sink's rows of
  one source ledger are not in log order (or a reader saw other content than the log holds);
* ``reader-skip`` -- a tailing reader jumped over records of the log;
* ``retention-too-early`` -- (seen by the runner, ``clock_skew``) retention applied from a host
  whose wall clock is off removed a ledger closed more recently than the log's retention time.

Each violation names the run's seed (added by the runner), the log, the ids, and ``t``: the
seconds from the run's start to the event it is about (the first one: the time to find).
"""
from __future__ import annotations

import collections
import json
import math
import os
import time

from bkspark import errors

from .workloads import (BATCH_LOG, CLIENT_CONF, KEYS_LOG, OVERWRITE_LOG, PASSWORD,
                        STREAM_SINK, STREAM_SOURCE, APP_LOGS, _payload_id)

#: what the runner saw while the run went on (``V`` events), by kind
RUN_VIOLATIONS = {
    "log-names-deleted-ledger": "listed while its metadata was gone (seen during the run)",
    "retention-too-early": "removed by retention from a host with a wrong clock before it was "
                           "closed for the log's retention time (true clock)",
}
CUT_MARGIN_S = 0.5      # an ack recorded this long after a cut ended may still predate it
#: an ack recorded this long after an overwrite committed may still predate it (a busy
#: machine may delay the writer's record of an acknowledgement that came before the fence)
OVERWRITE_MARGIN_S = 2.0


def _lines(path: str):
    with open(path) as f:
        for line in f:
            if line.endswith("\n") and line.strip():
                yield line.split()


class Checker:
    def __init__(self, uri: str, workdir: str, say=print):
        self.uri, self.workdir, self.say = uri, workdir, say
        self.violations: list[dict] = []
        self.counts: collections.Counter = collections.Counter()
        self.t0 = 0.0
        self.end_t = time.time()

    def violation(self, kind: str, t: float | None = None, **details) -> None:
        v = {"kind": kind, "t": round((t if t is not None else self.end_t) - self.t0, 2),
             **details}
        self.counts[kind] += 1
        if sum(1 for x in self.violations if x["kind"] == kind) < 25:
            self.violations.append(v)
        self.say("VIOLATION", json.dumps(v, default=str)[:400])

    # ---- reading back -----------------------------------------------------------------------
    def read_log(self, bk, logs, name: str) -> list[tuple]:
        """[(ledger, entry, key, id)] of the log, in order; lists violations of its ledgers."""
        from bkspark.spark.codec import decode_record
        out = []
        try:
            md, _ = logs.get(name)
        except errors.NoSuchLogError:
            return out
        for e in md.ledgers:
            lid = e.ledger_id
            try:
                bk.ledger_metadata(lid)
            except errors.NoSuchLedgerError:
                self.violation("log-names-deleted-ledger", log=name, ledger=lid,
                               detail="listed, metadata gone")
                continue
            handle = None
            for attempt in range(20):
                try:
                    handle = bk.open_ledger(lid, password=PASSWORD, recovery=True)
                    break
                except (errors.LedgerRecoveryError, errors.BookieUnavailableError):
                    time.sleep(0.5)
                except errors.BKError as exc:
                    self.violation("log-names-deleted-ledger", log=name, ledger=lid,
                                   detail=f"cannot open: {exc!r}"[:200])
                    break
            if handle is None:
                continue
            try:
                last = handle.last_add_confirmed
                if e.closed and e.last_entry_id != last:
                    self.violation("acked-missing" if e.last_entry_id > last else "out-of-order",
                                   log=name, ledger=lid,
                                   detail=f"list says end {e.last_entry_id}, ledger {last}")
                entries = []
                lo = 0
                while lo <= last:
                    hi = min(last, lo + 999)
                    entries.extend(handle.read(lo, hi))
                    lo = hi + 1
                for ent in entries:
                    key, value, _, _ = decode_record(ent.data)
                    out.append((lid, ent.entry_id, bytes(key).decode("ascii", "replace")
                                if key is not None else None, _payload_id(value)))
            except errors.BKError as exc:
                self.violation("log-names-deleted-ledger", log=name, ledger=lid,
                               detail=f"unreadable: {exc!r}"[:200])
            finally:
                handle.close()
        return out

    # ---- the run's records ------------------------------------------------------------------
    def _load(self):
        acks = {}
        for name in sorted(os.listdir(self.workdir)):
            if name.endswith(".acks"):
                acks[name[:-len(".acks")]] = list(_lines(os.path.join(self.workdir, name)))
        events = list(_lines(os.path.join(self.workdir, "runner.events")))
        for p in events:
            if p[0] == "T0":
                self.t0 = float(p[1])
        return acks, events

    def check(self) -> dict:
        from bkspark.client import BookKeeper
        from bkspark.log import LogStore
        acks, events = self._load()
        contents = {}
        with BookKeeper(self.uri, **CLIENT_CONF) as bk:
            logs = LogStore(bk, password=PASSWORD)
            for name in APP_LOGS + (BATCH_LOG, STREAM_SINK, KEYS_LOG):
                contents[name] = self.read_log(bk, logs, name)
            ends = {}
            for name in APP_LOGS:
                for lid, eid, _, _ in contents[name]:
                    ends[(name, lid)] = max(ends.get((name, lid), -1), eid)
        cuts = self._cuts(acks, events)
        for p in events:            # seen by the runner's monitor while the run went on
            if p[0] == "V":
                self.violation(p[1], t=float(p[4]), log=p[2], ledger=int(p[3]),
                               detail=RUN_VIOLATIONS.get(p[1], p[1]))
        rows = collections.Counter()
        self._check_appends(acks, contents, cuts, ends, rows)
        self._check_tailer(acks, contents[STREAM_SOURCE], rows)
        self._check_jobs(acks, contents, rows)
        stream = self._check_stream(acks, contents[STREAM_SOURCE], contents[STREAM_SINK], rows)
        for p in events:            # queries run twice, the second time on a new checkpoint
            if p[0] == "LC":
                sink = contents[p[2]] = self.read_log_named(p[2])
                stream[p[2]] = self._check_stream(acks, contents[STREAM_SOURCE], sink, rows,
                                                  runs_prefix=f"lc{p[1]}-", sink_name=p[2])
        firsts = [v["t"] for v in self.violations]
        return {"violations": self.violations, "violations_by_kind": dict(self.counts),
                "rows_checked": dict(rows), "rows_checked_total": sum(rows.values()),
                "log_entries": {k: len(v) for k, v in contents.items()},
                "time_to_first_violation": min(firsts) if firsts else None,
                "stream": stream}

    def _cuts(self, acks, events) -> dict:
        """log -> [(t_start, t_end)] of every cut: retention, truncation, overwrite jobs; and
        ``self.overwrites``: log -> [(t_start, t_end)] of the overwrite jobs that committed."""
        cuts = collections.defaultdict(list)
        self.overwrites = collections.defaultdict(list)
        for p in events:
            if p[0] == "C":
                cuts[p[1]].append((float(p[3]), float(p[4])))
        spawns = sorted(float(p[4]) for p in events if p[0] == "P" and p[1] == "batch")
        for name, lines in acks.items():
            if not name.startswith("batch-"):
                continue
            open_ow = None
            for p in lines:
                if p[0] != "J":
                    continue
                if p[2].endswith("start") and p[4] in ("overwrite-live", "overwrite-batch"):
                    open_ow = (p[3], float(p[6]))
                elif open_ow and (p[2].endswith("committed") or p[2].endswith("failed")):
                    cuts[open_ow[0]].append((open_ow[1], float(p[3])))
                    if p[2].endswith("committed"):
                        self.overwrites[open_ow[0]].append((open_ow[1], float(p[3])))
                    open_ow = None
                elif p[2].endswith("start"):
                    open_ow = None
            if open_ow:             # killed mid-job: it may have committed until the kill
                later = [t for t in spawns if t > open_ow[1]]
                cuts[open_ow[0]].append((open_ow[1], later[0] if later else math.inf))
        return cuts

    # ---- appenders ----------------------------------------------------------------------------
    def _check_appends(self, acks, contents, cuts, ends, rows) -> None:
        opens = collections.defaultdict(list)       # log -> [(t, file)]
        for name, lines in acks.items():
            for p in lines:
                if p[0] == "O":
                    opens[p[1]].append((float(p[4]), name))
        for log in APP_LOGS:
            where = {}
            for i, (lid, eid, _, pid) in enumerate(contents[log]):
                if pid in where:
                    self.violation("duplicate", log=log, id=pid, positions=[where[pid], [lid, eid]])
                where[pid] = [lid, eid]
            listed = {lid for lid, _, _, _ in contents[log]}
            order = {pid: i for i, (_, _, _, pid) in enumerate(contents[log])}
            first_ack = {}                  # ledger -> when an append to it was first acked
            for lines in acks.values():
                for p in lines:
                    if p[0] == "A" and p[1] == log:
                        lid, t = int(p[2]), float(p[5])
                        first_ack[lid] = min(first_ack.get(lid, t), t)
            for name, lines in acks.items():
                last_seen = {}
                for p in lines:
                    if p[0] != "A" or p[1] != log:
                        continue
                    lid, eid, pid, t = int(p[2]), int(p[3]), p[4], float(p[5])
                    rows["appends"] += 1
                    writer = pid.rsplit(":", 1)[0]
                    if pid in where:
                        if where[pid] != [lid, eid]:
                            self.violation("out-of-order", t=t, log=log, id=pid,
                                           detail=f"acked at {lid}:{eid}, found at {where[pid]}")
                        i = order[pid]
                        if writer in last_seen and last_seen[writer] > i:
                            self.violation("out-of-order", t=t, log=log, id=pid,
                                           detail="a writer's records out of its order")
                        last_seen[writer] = i
                        continue
                    # an overwrite that committed while this ledger was written replaced a
                    # list holding it: an append acknowledged after that was never in the log
                    # (its writer must have been fenced first)
                    replaced = [(a, b) for a, b in self.overwrites.get(log, [])
                                if first_ack.get(lid, t) < a and b < t - OVERWRITE_MARGIN_S]
                    if replaced:
                        self.violation("superseded-write-acked", t=t, log=log, id=pid,
                                       ledger=lid, entry=eid, writer=name,
                                       detail=f"acknowledged {t - replaced[0][1]:.2f} s after an "
                                              "overwrite replaced the list holding its ledger")
                        continue
                    if any(end > t - CUT_MARGIN_S for _, end in cuts.get(log, [])):
                        rows["appends-cut"] += 1
                        continue
                    newer = [o for o in opens[log] if o[1] != name and o[0] < t]
                    if lid in listed and eid > ends.get((log, lid), -1) and newer:
                        self.violation("superseded-write-acked", t=t, log=log, id=pid,
                                       ledger=lid, entry=eid, end=ends.get((log, lid)),
                                       writer=name)
                    else:
                        self.violation("acked-missing", t=t, log=log, id=pid, ledger=lid,
                                       entry=eid, listed=lid in listed, writer=name,
                                       last_cut=max((c for c in cuts.get(log, [])),
                                                    default=None, key=lambda c: c[1]))

    # ---- the tailing reader ------------------------------------------------------------------
    def _check_tailer(self, acks, content, rows) -> None:
        index = {(lid, eid): i for i, (lid, eid, _, _) in enumerate(content)}
        for name, lines in acks.items():
            if not name.startswith("tailer-"):
                continue
            prev = None
            for p in lines:
                if p[0] == "B":
                    prev = -1 if "earliest" in p[2] else prev
                    continue
                if p[0] != "R":
                    continue
                rows["reader"] += 1
                pos, pid = (int(p[1]), int(p[2])), p[3]
                i = index.get(pos)
                if i is None or content[i][3] != pid:
                    self.violation("out-of-order", log=STREAM_SOURCE, reader=name, position=pos,
                                   id=pid, detail="the reader read what the log does not hold")
                    prev = None
                    continue
                if prev is not None and i != prev + 1:
                    self.violation("reader-skip" if i > prev + 1 else "out-of-order",
                                   log=STREAM_SOURCE, reader=name, position=pos, id=pid,
                                   detail=f"read index {i} after {prev}")
                prev = i

    # ---- Spark jobs and writer keys ------------------------------------------------------------
    def _check_jobs(self, acks, contents, rows) -> None:
        jobs: dict[str, dict] = {}
        for name, lines in acks.items():
            for p in lines:
                if p[0] != "J":
                    continue
                job, ev = p[1], p[2]
                j = jobs.setdefault(job, {"events": [], "log": None, "rows": 0, "kind": None,
                                          "start": None, "committed": False, "end": None})
                j["events"].append(ev)
                if ev.endswith("start"):
                    j["log"], j["kind"], j["rows"] = p[3], p[4], int(p[5])
                    j["start"] = min(j["start"] or math.inf, float(p[6]))
                else:
                    t = float(p[3])
                    j["end"] = max(j["end"] or 0.0, t)
                    if ev.endswith("committed"):
                        j["committed"] = True
        for log in (BATCH_LOG, OVERWRITE_LOG, KEYS_LOG):
            count = collections.defaultdict(collections.Counter)
            first_at = {}
            for i, (_, _, _, pid) in enumerate(contents[log]):
                if pid.startswith("j:"):
                    _, job, n = pid.split(":")
                    count[job][n] += 1
                    first_at.setdefault(job, i)
            oldest = min(first_at, key=first_at.get) if first_at else None
            mine = {k: j for k, j in jobs.items() if j["log"] == log}
            for job in count:
                if job not in mine:
                    self.violation("out-of-order", log=log, job=job,
                                   detail="rows of a job nobody recorded")
            for job, j in mine.items():
                c = count.get(job, collections.Counter())
                rows["job-rows"] += sum(c.values())
                idempotent = j["kind"] in ("append-id", "commit-raise", "keys", "keys-rerun") \
                    or any(e.startswith("rerun") for e in j["events"])
                twice = [n for n, k in c.items() if k > 1]
                if twice:
                    self.violation("batch-not-exactly-once" if idempotent else "duplicate",
                                   t=j["end"] or j["start"], log=log, job=job,
                                   job_kind=j["kind"], rows_twice=len(twice), events=j["events"])
                present = len(c)
                if 0 < present < j["rows"] and job != oldest:
                    self.violation("batch-not-exactly-once", t=j["end"] or j["start"], log=log,
                                   job=job, job_kind=j["kind"], present=present, rows=j["rows"],
                                   detail="partly present", events=j["events"])
                if present == 0 and j["committed"]:
                    if log == KEYS_LOG:
                        self.violation("acked-missing", t=j["end"], log=log, job=job,
                                       detail="a committed writer key's row is absent")
                    else:
                        earlier = [k for k, o in mine.items() if k != job and o["end"]
                                   and o["end"] < j["start"] and count.get(k)]
                        if earlier:
                            self.violation("acked-missing", t=j["end"], log=log, job=job,
                                           job_kind=j["kind"], events=j["events"],
                                           detail=f"committed, absent, while earlier job "
                                                  f"{earlier[-1]} is present")

    # ---- the streaming query ----------------------------------------------------------------
    def read_log_named(self, name: str) -> list[tuple]:
        from bkspark.client import BookKeeper
        from bkspark.log import LogStore
        with BookKeeper(self.uri, **CLIENT_CONF) as bk:
            return self.read_log(bk, LogStore(bk, password=PASSWORD), name)

    def _check_stream(self, acks, source, sink, rows, runs_prefix: str = "stream-",
                      sink_name: str = STREAM_SINK) -> dict:
        index = {(lid, eid): i for i, (lid, eid, _, _) in enumerate(source)}
        last_of = {}
        for i, (lid, eid, _, _) in enumerate(source):
            last_of[lid] = i
        seen = collections.Counter()
        prev_in_ledger = {}
        for lid, eid, key, pid in sink:
            rows["stream-rows"] += 1
            try:
                sl, se = (int(x) for x in (key or "").split(":"))
            except ValueError:
                self.violation("out-of-order", log=sink_name, position=[lid, eid],
                               detail=f"a sink row without a source position (key {key!r})")
                continue
            i = index.get((sl, se))
            if i is None or source[i][3] != pid:
                self.violation("out-of-order", log=sink_name, source=[sl, se], id=pid,
                               detail="a sink row that is not the source's record there")
                continue
            seen[i] += 1
            if seen[i] == 2:
                self.violation("stream-repeat", log=sink_name, source=[sl, se], id=pid)
            elif sl in prev_in_ledger and se < prev_in_ledger[sl] and seen[i] == 1:
                self.violation("out-of-order", log=sink_name, source=[sl, se], id=pid,
                               detail=f"after entry {prev_in_ledger[sl]} of the same ledger")
            prev_in_ledger[sl] = max(se, prev_in_ledger.get(sl, -1))
        # committed micro-batches: everything before the highest reported end is in the sink
        runs, outcome = {}, {}
        committed_end, end_run, end_t = -1, None, None
        for name, lines in acks.items():
            if not name.startswith(runs_prefix):
                continue
            for p in lines:
                if p[0] == "Q" and p[2] == "start":
                    runs[p[1]] = p[3]
                elif p[0] == "Q":
                    outcome[p[1]] = " ".join(p[2:3] + p[4:5])
                elif p[0] == "P":
                    try:
                        end = json.loads(p[4]).get(STREAM_SOURCE)
                    except (ValueError, AttributeError):
                        end = None
                    if not end:
                        continue
                    pos = (int(end["ledger"]), int(end["entry"]))
                    if pos in index:
                        e = index[pos]
                    elif pos[0] in last_of:
                        e = last_of[pos[0]] + 1
                    else:
                        continue
                    if e > committed_end:
                        committed_end, end_run, end_t = e, p[1], float(p[5])
        top = max(max(seen, default=-1) + 1, committed_end)
        missing = [i for i in range(top) if not seen[i]]
        if missing:
            gap_kind = "stream-skip"
            self.violation(gap_kind, t=end_t, log=sink_name, missing=len(missing),
                           first_missing=list(source[missing[0]][:2]),
                           committed_through=committed_end, reported_by=end_run,
                           lost_checkpoint_runs=[r for r, m in runs.items() if m == "lost"])
        return {"runs": runs, "outcomes": outcome, "committed_through": committed_end,
                "sink_rows": len(sink), "source_records": len(source)}
