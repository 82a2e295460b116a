"""Which ledgers a Spark write job created, whether the job is alive, and reclaiming the
ledgers of jobs that are gone.

Every task ledger is registered before rows go into it, so that a job that never commits --
failed, aborted, or its driver killed (Ctrl-C, SIGKILL, a lost machine) -- leaves nothing
behind for good. Layout in the metadata store::

    /spark/pending/<job>                 the job record: {"log", "state", "created_ms"}
    /spark/pending/<job>/<ledger id>     a registered ledger: {"partition", "attempt", ...}
    /spark/pending/<job>/alive-<id>      ephemeral: a task of the job is writing right now
    /spark/pending/<job>/committed       created by the job's commit transaction (batch jobs)

``<job>`` is ``batch-<uuid>`` for a batch write and ``sink-<query>`` for a streaming sink.

Rules (one place for each):

* **Liveness.** A task holds an ``alive-*`` record, owned by its process's metadata session,
  while it writes; it disappears when the task ends or its process dies (session expiry).
  A job is *abandoned* when none of its tasks is alive and none started or ended for
  ``grace`` seconds (covering the gap between a job's last task and its driver's commit). A
  job whose next tasks wait longer than that for executors may be judged abandoned: its
  commit then fails cleanly (nothing half-written reaches the log); a larger grace
  (option ``reclaimAbandonedAfter``) is the remedy.
* **Registration** is a transaction ``check(job record, version) + create(ledger)`` with the
  job in state ``writing``: once the job commits or is reclaimed, no ledger registers any
  more (the late task deletes its own ledger and fails).
* **Commit.** The driver moves the job ``writing -> committing`` and appends to the log with
  a compare-and-set guarded by that version of the job record (one transaction,
  :func:`metadata.update.update_record`'s ``guard``), which also creates the job's
  ``committed`` record (:func:`commit_mark`): a commit whose answer was lost is applied
  exactly when that record exists, whatever changed in the log since.
* **Reclaim** (:func:`reclaim`: the next write to the log at planning, and ``bkspark shell
  gc-pending``) moves an abandoned batch job to ``reclaimed`` by compare-and-set -- after
  which its commit can no longer be stored -- then deletes the registered ledgers the log
  does not list (proven: :meth:`LogStore.delete_unreferenced`) and their registrations. A
  job whose commit was stored keeps its ledgers: they are the log's. The job record stays
  as a tombstone (a task or commit of the job arriving late is refused by it, not by a
  missing record) for :data:`TOMBSTONE_TTL_S`, then a later reclaim deletes it.

Streaming sink jobs live as long as their query and are cleaned batch by batch by the sink's
commits; :func:`reclaim` reports their leftovers but leaves them to the query. Their tasks
therefore skip the liveness and state records: a registration is one create, as every
micro-batch pays it.
"""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field

from bkspark import errors
from bkspark.errors import BadVersionError, NodeExistsError, NoNodeError
from metadata.layout import SPARK_PENDING as PENDING_ROOT
from metadata.update import MAX_CONFLICTS, NoChange, update_record

log = logging.getLogger("bkspark.spark")

ALIVE_PREFIX = "alive-"
WRITING, COMMITTING, RECLAIMED = "writing", "committing", "reclaimed"
#: the ``log`` of a job that routes rows by a column: each registration names its own log
#: (not a valid log name, so it matches no log's jobs)
ROUTED = "(routed)"
#: default seconds a job with no live task may stay silent before it counts as abandoned
DEFAULT_GRACE_S = 600.0
#: how long the record of a reclaimed job stays to refuse its late tasks and commit
TOMBSTONE_TTL_S = 86400.0


class JobReclaimedError(errors.BKError):
    """The write job was reclaimed as abandoned (or has committed): it may not register or
    commit ledgers any more."""


def job_path(key: str) -> str:
    return f"{PENDING_ROOT}/{key}"


def _now_ms(store) -> int:
    """The store's time (ms): the one clock that stamps and judges jobs (metadata.clock)."""
    return store.clock.now_ms()


def _decode(data: bytes) -> dict:
    try:
        doc = json.loads(data or b"{}")
    except ValueError:
        doc = {}
    return doc if isinstance(doc, dict) else {}


def _encode(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True).encode()


# ---- the task side ----------------------------------------------------------------------

def _reclaimable(key: str) -> bool:
    """Batch jobs are reclaimed when abandoned; sink jobs are the query's (module docstring)."""
    return not key.startswith("sink-")


def begin_task(store, key: str, log_name: str | None) -> str | None:
    """Create the job record if needed and this task's ``alive-*`` record; its path (None
    for a sink job). ``log_name`` None: the job routes rows by a column (:data:`ROUTED`)."""
    if not _reclaimable(key):
        return None
    if store.exists(job_path(key)) is None:        # the job's first task (a read for the others)
        try:
            store.create(job_path(key), _encode({"log": log_name or ROUTED, "state": WRITING,
                                                 "created_ms": _now_ms(store)}), makepath=True)
        except NodeExistsError:
            pass
    path = f"{job_path(key)}/{ALIVE_PREFIX}{uuid.uuid4().hex}"
    store.create(path, b"", ephemeral=True)
    return path


def end_task(store, key: str, alive_path: str | None, ledger_ids) -> None:
    """Note when the task's ledgers were finished (a job's silence is counted from its last
    task's end) and drop the task's ``alive-*`` record. Best effort: the end of the task's
    session drops the record too."""
    if not _reclaimable(key) or alive_path is None:
        return
    txn = store.transaction()
    try:
        paths = [f"{job_path(key)}/{lid}" for lid in ledger_ids]
        for path, record in zip(paths, store.get_many(paths)):
            if record is not None:
                txn.set(path, _encode(dict(_decode(record[0]), finished_ms=_now_ms(store))),
                        version=record[1])
        txn.delete(alive_path)
        txn.commit()
    except errors.BKError:                          # unregistered meanwhile: just drop the record
        try:
            store.delete(alive_path)
        except errors.BKError:
            pass


def register(store, key: str, ledger_id: int, info: dict) -> None:
    """Register a task's new ledger while the job is writing (see the module docstring).

    :raises JobReclaimedError: the job committed or was reclaimed: the caller deletes the
        ledger and fails.
    """
    data = _encode(dict(info, registered_ms=_now_ms(store)))
    if not _reclaimable(key):
        try:
            store.create(f"{job_path(key)}/{ledger_id}", data, makepath=True)
        except NodeExistsError:
            pass
        return
    for _ in range(MAX_CONFLICTS):
        try:
            raw, version = store.get(job_path(key))
        except NoNodeError:
            raise JobReclaimedError(f"write job {key} is gone (reclaimed as abandoned)") from None
        state = _decode(raw).get("state", WRITING)
        if state != WRITING:
            raise JobReclaimedError(f"write job {key} is {state}: ledger {ledger_id} cannot "
                                    "join it")
        txn = store.transaction()
        txn.check(job_path(key), version)
        txn.create(f"{job_path(key)}/{ledger_id}", data)
        try:
            txn.commit()
            return
        except NodeExistsError:
            return
        except BadVersionError:
            continue            # the job record changed (its commit began?): decide again
    raise errors.MetadataError(f"write job {key}: ledger {ledger_id} not registered: the job "
                               f"record changed {MAX_CONFLICTS} times in a row")


COMMITTED = "committed"


def commit_mark(key: str) -> str:
    """The record the job's commit transaction creates (module docstring, "Commit")."""
    return f"{job_path(key)}/{COMMITTED}"


def unregister(store, key: str, ledger_id: int) -> None:
    try:
        store.delete(f"{job_path(key)}/{ledger_id}")
    except NoNodeError:
        pass


#: registrations removed by one transaction (a ZooKeeper multi's request stays far below 1 MB)
UNREGISTER_BATCH = 256


def unregister_all(store, key: str, ledger_ids) -> None:
    """Remove the registrations of ``ledger_ids``: a transaction per
    :data:`UNREGISTER_BATCH` (one round trip instead of one each); when one fails -- a
    registration was removed meanwhile, or the answer was lost -- that batch one at a time
    (a registration already gone is what was wanted).

    :raises MetadataConnectionError: the store did not answer; what remains is removed by a
        later cleanup."""
    ids = list(ledger_ids)
    for i in range(0, len(ids), UNREGISTER_BATCH):
        chunk = ids[i:i + UNREGISTER_BATCH]
        if len(chunk) > 1:
            txn = store.transaction()
            for lid in chunk:
                txn.delete(f"{job_path(key)}/{lid}")
            try:
                txn.commit()
                continue
            except errors.BKError:
                pass
        for lid in chunk:
            unregister(store, key, lid)


# ---- the driver side --------------------------------------------------------------------

def begin_commit(store, key: str, ledger_ids) -> tuple[str, int] | None:
    """Move the job to ``committing``; the guard ``(path, version)`` for the log's CAS, or
    None when there is nothing to guard (no ledgers to commit).

    :raises JobReclaimedError: the job was reclaimed as abandoned (its record says so, or is
        gone while tasks reported ledgers): nothing may be committed.
    """
    def change(doc: dict) -> dict:
        state = doc.get("state", WRITING)
        if state == RECLAIMED:
            raise JobReclaimedError(
                f"write job {key} was reclaimed as abandoned (no task alive and no progress "
                "for the grace period) before its commit; its ledgers are deleted. Run the "
                "write again (a larger option 'reclaimAbandonedAfter' gives slow jobs more time)")
        if state == COMMITTING:
            raise NoChange
        return dict(doc, state=COMMITTING, committing_ms=_now_ms(store))
    if not ledger_ids:
        return None
    try:
        done = update_record(store, job_path(key), decode=_decode, encode=_encode,
                             transform=change, what=f"write job {key}")
    except NoNodeError:
        raise JobReclaimedError(f"write job {key} has no record although its tasks wrote "
                                f"ledgers {sorted(ledger_ids)}: it was reclaimed as abandoned; "
                                "run the write again") from None
    return job_path(key), done.version


def clean(logs, key: str, log_name: str, keep=(), upto_batch: int | None = None,
          remove_job: bool = False) -> list[int]:
    """Delete registered ledgers of ``key`` that ``log_name`` does not list (nor ``keep``);
    with ``upto_batch`` only those registered for batches <= it. Returns the deleted ids.
    A ledger whose registration names a log (a routed task's) is checked against that log;
    under a routed job (``log_name`` is :data:`ROUTED`) one without is left alone.

    "Does not list" is proven, not read (:meth:`LogStore.delete_unreferenced`): a commit whose
    answer was lost may have listed them. When the metadata store does not answer, nothing is
    deleted and the registrations stay for the next cleanup. ``remove_job``: then delete the
    job record (kept while a straggling task is still alive under it)."""
    store = logs.store
    try:
        children = store.children(job_path(key))
    except NoNodeError:
        return []
    keep = set(keep)
    candidates = [int(c) for c in children if c.isdigit() and int(c) not in keep]
    by_log: dict[str, list[int]] = {}
    records = store.get_many([f"{job_path(key)}/{lid}" for lid in candidates])
    for lid, record in zip(candidates, records):
        info = _decode(record[0] if record else b"")
        if upto_batch is not None and info.get("batch", -1) > upto_batch:
            continue
        # a routed task's registration names its log (a sink may change between routed and
        # one log under the same query: each ledger is judged by the log it was written for)
        name = info.get("log", None if log_name == ROUTED else log_name)
        if isinstance(name, str):
            by_log.setdefault(name, []).append(lid)
    deleted: list[int] = []
    for name, ids in by_log.items():
        try:
            deleted += logs.delete_unreferenced(name, ids)
        except errors.BKError as exc:
            log.warning("log %s: pending ledgers of %s left for a later cleanup: %s", name,
                        key, exc)
            return deleted
        unregister_all(store, key, ids)     # deleted, or listed by the log: no longer pending
    if remove_job:
        _remove_job_record(store, key)
    return deleted


def _remove_job_record(store, key: str) -> None:
    """Delete the job record and its commit record (kept while a straggling task is still
    alive under it, or a registration remains). Only once the job's commit has returned or
    raised: the commit record settles nothing else, and a commit request whose answer was
    lost is ordered before this delete on the same session (or dropped with it)."""
    try:
        store.delete(commit_mark(key))
    except NoNodeError:
        pass
    try:
        store.delete(job_path(key))
    except (NoNodeError, errors.NotEmptyError):
        pass


# ---- reclaiming abandoned jobs ----------------------------------------------------------

@dataclass
class JobStatus:
    key: str
    log: str | None
    state: str
    ledgers: list = field(default_factory=list)
    alive_tasks: int = 0
    idle_s: float = 0.0
    verdict: str = ""                   # "alive", "recent", "abandoned", "sink", "unknown log"
    deleted: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"job": self.key, "log": self.log, "state": self.state, "ledgers": self.ledgers,
                "alive_tasks": self.alive_tasks,
                "idle_s": round(self.idle_s, 1) if self.idle_s != float("inf") else None,
                "verdict": self.verdict, "deleted": self.deleted}


def status(store, key: str, grace: float, now_ms: int | None = None) -> JobStatus | None:
    """What the job's records say about it (None if it is gone); its silence judged at
    ``now_ms`` (default: the store's time now -- never this host's clock: the stamps are the
    store's too)."""
    now_s = (_now_ms(store) if now_ms is None else now_ms) / 1000
    try:
        raw, _ = store.get(job_path(key))
        children = store.children(job_path(key))
    except NoNodeError:
        return None
    doc = _decode(raw)
    job = JobStatus(key, doc.get("log"), doc.get("state", WRITING))
    last_ms = doc.get("committing_ms") or doc.get("created_ms") or 0
    for child in children:
        if child.startswith(ALIVE_PREFIX):
            job.alive_tasks += 1
        elif child.isdigit():
            job.ledgers.append(int(child))
            try:
                info = _decode(store.get(f"{job_path(key)}/{child}")[0])
            except NoNodeError:
                continue
            last_ms = max(last_ms, info.get("registered_ms", 0), info.get("finished_ms", 0))
    job.ledgers.sort()
    job.idle_s = max(0.0, now_s - last_ms / 1000) if last_ms else float("inf")
    if not _reclaimable(key):
        job.verdict = "sink"
    elif job.state == RECLAIMED:
        job.verdict = "tombstone"
        job.idle_s = max(0.0, now_s - doc.get("reclaimed_ms", 0) / 1000)
    elif job.log is None:
        job.verdict = "unknown log"     # a record written before jobs named their log
    elif job.alive_tasks:
        job.verdict = "alive"
    elif job.idle_s < grace:
        job.verdict = "recent"
    else:
        job.verdict = "abandoned"
    return job


def reclaim(logs, *, grace: float = DEFAULT_GRACE_S, log_name: str | None = None,
            dry_run: bool = False) -> list[JobStatus]:
    """Reclaim abandoned batch jobs (of ``log_name`` only, if given); every job's status.

    A job is reclaimed by moving it to ``reclaimed`` (compare-and-set, so a commit racing
    with it either stored first -- and its ledgers are the log's -- or can never store),
    deleting its registered ledgers that the log does not list, then its records. A metadata
    store that stops answering leaves the rest for the next reclaim. Silence is judged on the
    store's clock; a reclaim (not a ``dry_run``) on a host whose clock is off the store's by
    more than the tolerance is refused (:class:`ClockSkewError`, metadata.clock)."""
    store = logs.store
    try:
        keys = sorted(store.children(PENDING_ROOT))
    except NoNodeError:
        return []
    now = store.clock.now_ms() if dry_run else store.clock.check_skew(
        "reclaim of abandoned Spark write jobs")
    out = []
    for key in keys:
        job = status(store, key, grace, now)
        if job is None or (log_name is not None and job.log != log_name):
            continue
        out.append(job)
        if job.verdict == "tombstone" and not dry_run and job.idle_s > TOMBSTONE_TTL_S:
            _remove_job_record(store, key)
        if job.verdict != "abandoned" or dry_run:
            continue
        try:
            _mark_reclaimed(store, job)
        except _CameAlive:
            job.verdict = "alive"
            continue
        except NoNodeError:             # cleaned up by its own driver meanwhile
            continue
        job.deleted = clean(logs, key, job.log)
        job.verdict = "reclaimed"
        log.info("log %s: reclaimed abandoned write job %s: deleted ledgers %s", job.log, key,
                 job.deleted)
    return out


class _CameAlive(Exception):
    """A task of a job judged abandoned started meanwhile: leave the job alone."""


def _mark_reclaimed(store, job: JobStatus) -> None:
    """``-> reclaimed`` by compare-and-set, unless a task of the job is alive by then."""
    def change(doc: dict) -> dict:
        if doc.get("state", WRITING) == RECLAIMED:
            raise NoChange
        if any(c.startswith(ALIVE_PREFIX) for c in store.children(job_path(job.key))):
            raise _CameAlive
        return dict(doc, state=RECLAIMED, reclaimed_ms=_now_ms(store))
    update_record(store, job_path(job.key), decode=_decode, encode=_encode, transform=change,
                  what=f"write job {job.key}")
