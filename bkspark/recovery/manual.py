"""Manual bookie recovery and decommissioning (the seed's "Manual Bookie Recovery process").

``recover_bookie(bk, bookie)``: read every ledger's metadata, select the ledgers with a
fragment on ``bookie`` and run the ledger re-replication process on each (entries copied
from the surviving replicas to a random bookie per fragment, or to ``target``; then the
fragment's membership is swapped by CAS). Open ledgers whose last fragment uses the bookie
are fenced and recovered first (``fence_open``), or skipped.

``decommission_bookie(bk, bookie)``: the safe path to retire a bookie ("migrate the data
first, then bring down the bookie"): if it is still registered writable it is switched to
read-only through its admin endpoint (no new ledger lands on it), every fragment on it is
re-replicated -- reading from the bookie itself too while it is alive --, the metadata is
re-scanned to prove nothing references it any more, and its cookie is deleted once it is
stopped so that it can later rejoin with fresh disks as a new bookie.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from bkspark.errors import (
    BKError,
    NoNodeError,
    NoSuchLedgerError,
    RecoveryFailedError,
    UnknownBookieError,
)
from metadata import ledgers as ledger_store
from metadata import registry

from .replicator import FULL, LedgerReplicator, fragments

log = logging.getLogger("bkspark.recovery.manual")


@dataclass
class RecoverySummary:
    bookie: str
    ledgers: list = field(default_factory=list)         # ledgers that used the bookie
    replicated: list = field(default_factory=list)      # fully moved away
    failed: dict = field(default_factory=dict)          # ledger -> reason
    skipped_open: list = field(default_factory=list)
    entries: int = 0
    bytes: int = 0
    seconds: float = 0.0
    cookie: str = ""

    def to_dict(self) -> dict:
        return {"bookie": self.bookie, "ledgers": self.ledgers, "replicated": self.replicated,
                "failed": {str(k): v for k, v in self.failed.items()},
                "skipped_open": self.skipped_open, "entries": self.entries,
                "bytes": self.bytes, "seconds": round(self.seconds, 3),
                **({"cookie": self.cookie} if self.cookie else {})}


def ledgers_on(bk, bookie: str) -> list[tuple[int, int, int]]:
    """``[(ledger id, entries to copy, estimated bytes)]`` of the ledgers using ``bookie``."""
    out = []
    for lid in ledger_store.list_ledgers(bk.store):
        try:
            md, _ = ledger_store.read_ledger(bk.store, lid)
        except NoSuchLedgerError:
            continue
        if bookie not in md.all_bookies():
            continue
        n = 0
        for frag in fragments(md):
            if bookie in frag.ensemble and not frag.is_open:
                n += len(frag.entries_of(frag.ensemble.index(bookie), md.ensemble_size,
                                         md.write_quorum))
        avg = md.length / (md.last_entry_id + 1) if md.last_entry_id >= 0 and md.length else 0
        overhead = 32 + {"crc32c": 4, "crc32": 8, "hmac": 20}.get(md.digest_type, 0)
        out.append((lid, n, int(n * (avg + overhead))))
    return out


def require_known(store, bookie: str) -> None:
    """UnknownBookieError unless the cluster has a cookie or a registration for ``bookie``
    (the callers also accept a bookie that some ledger's ensemble names)."""
    try:
        registry.read_cookie(store, bookie)
        return
    except NoNodeError:
        pass
    if bookie in registry.list_bookies(store) or bookie in registry.list_bookies(store, readonly=True):
        return
    known = sorted(set(registry.list_bookies(store)) | set(registry.list_bookies(store, readonly=True)))
    raise UnknownBookieError(
        f"bookie {bookie} is not known to this cluster: no cookie, not registered, and no "
        f"ledger uses it. Check the id and the metadata URI (registered now: {known}; "
        "`bkspark shell listbookies --all`)")


def recover_bookie(bk, bookie: str, *, target: str | None = None, fence_open: bool = True,
                   read_from_bookie: bool = False, progress=None,
                   parallel: int = 4, fragments_at_once: int = 2,
                   throttle=None) -> RecoverySummary:
    """Re-replicate everything that was on ``bookie`` (see the module docstring).

    ``parallel``: ledgers re-replicated at once; ``fragments_at_once``: fragments of each
    ledger copied at once (so at most ``parallel x fragments_at_once`` copies run). ``throttle``: the run's rate limit
    (:class:`~.throttle.Throttle`, shared by those ledgers; default unlimited). ``progress``: an object with ``start(ledgers, entries, bytes)``, ``advance(entries,
    bytes)`` and ``ledger_done()`` (the shell's progress bar), or None.
    """
    t0 = time.monotonic()
    summary = RecoverySummary(bookie)
    if target is not None:
        writable = registry.list_bookies(bk.store)
        if target not in writable:
            raise BKError(f"target bookie {target} is not a registered writable bookie "
                          f"(writable: {sorted(writable)})")
        if target == bookie:
            raise BKError("the target bookie is the bookie being recovered")
    plan = ledgers_on(bk, bookie)
    if not plan:
        require_known(bk.store, bookie)
    summary.ledgers = [lid for lid, _, _ in plan]
    if progress is not None:
        progress.start(len(plan), sum(n for _, n, _ in plan), sum(b for _, _, b in plan))
    rep = LedgerReplicator(bk, progress=(progress.advance if progress is not None else None),
                           throttle=throttle, fragments_at_once=fragments_at_once)

    def one(lid):
        try:
            return lid, rep.replicate_ledger(lid, bad={bookie}, target=target,
                                             read_from_bad=read_from_bookie,
                                             fence_open=fence_open), None
        except NoSuchLedgerError:
            return lid, None, None              # deleted meanwhile: nothing to keep
        except BKError as exc:
            return lid, None, str(exc)
        finally:
            if progress is not None:
                progress.ledger_done()

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, parallel), thread_name_prefix="recover") as pool:
        results = list(pool.map(one, [lid for lid, _, _ in plan]))
    for lid, res, err in results:
        if err is not None:
            summary.failed[lid] = err
            continue
        if res is None:
            summary.replicated.append(lid)
            continue
        summary.entries += res.entries
        summary.bytes += res.bytes
        if res.status == FULL:
            summary.replicated.append(lid)
        elif res.status == "open":
            summary.skipped_open.append(lid)
        else:
            summary.failed[lid] = "; ".join(res.notes) or res.status
    summary.seconds = time.monotonic() - t0
    return summary


def set_read_only(info: dict, bookie: str, value: bool = True, timeout: float = 5.0, *,
                  credentials) -> None:
    """Switch ``bookie`` (registered with ``info``) to read-only through its admin endpoint,
    presenting ``credentials`` (an admin's)."""
    port = info.get("http_port", -1) if isinstance(info, dict) else -1
    host = (info.get("address") or bookie).rsplit(":", 1)[0]
    if not isinstance(port, int) or port <= 0:
        raise BKError(f"bookie {bookie} has no admin endpoint to switch it to read-only; stop "
                      "it (or make it read-only) before decommissioning")
    url = credentials.url(host, port, "/api/v1/bookie/state/readonly", bool(info.get("tls")))
    try:
        status, answer = credentials.http_json(url, "PUT", {"readOnly": value}, timeout)
    except OSError as exc:
        raise BKError(f"cannot switch bookie {bookie} to read-only through {url}: {exc}") \
            from None
    if status != 200:
        raise BKError(f"bookie {bookie} refused to switch to read-only ({url}: {status} "
                      f"{answer}); decommissioning needs an admin's credentials")


def decommission_bookie(bk, bookie: str, *, progress=None, wait_readonly: float = 30.0,
                        delete_cookie: bool = True, open_ledger_grace: float = 30.0,
                        throttle=None) -> RecoverySummary:
    """Retire ``bookie`` safely (see the module docstring). Open ledgers whose last
    fragment uses the bookie get ``open_ledger_grace`` seconds to move on before they are
    fenced. ``throttle``: the copy's rate limit (default unlimited).

    :raises RecoveryFailedError: some ledger still uses the bookie afterwards.
    """
    t0 = time.monotonic()
    writable = registry.list_bookies(bk.store)
    if bookie in writable:
        log.info("decommission: switching %s to read-only", bookie)
        set_read_only(writable[bookie], bookie, True, credentials=bk.credentials)
        deadline = time.monotonic() + wait_readonly
        while bookie in registry.list_bookies(bk.store) and time.monotonic() < deadline:
            time.sleep(0.2)
        if bookie in registry.list_bookies(bk.store):
            raise BKError(f"bookie {bookie} did not switch to read-only within "
                          f"{wait_readonly:g}s")
    alive = bookie in registry.list_bookies(bk.store, readonly=True)
    # open ledgers are left to their writers for a grace period (a writer's next add to the
    # read-only/dead bookie fails and it moves to a new fragment); only then fenced
    summary = recover_bookie(bk, bookie, fence_open=open_ledger_grace <= 0,
                             read_from_bookie=alive, progress=progress, throttle=throttle)
    deadline = time.monotonic() + max(0.0, open_ledger_grace)
    while summary.skipped_open:
        fence = time.monotonic() >= deadline
        if not fence:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        again = recover_bookie(bk, bookie, fence_open=fence, read_from_bookie=alive,
                               throttle=throttle)
        summary.entries += again.entries
        summary.bytes += again.bytes
        summary.replicated = sorted(set(summary.replicated) | set(again.replicated))
        summary.failed.update(again.failed)
        summary.skipped_open = again.skipped_open
        if fence:
            break
    summary.seconds = time.monotonic() - t0
    left = [lid for lid, _, _ in ledgers_on(bk, bookie)]
    if left:
        raise RecoveryFailedError(
            f"decommission of {bookie} incomplete: {len(left)} ledgers still use it "
            f"({left[:20]}{'...' if len(left) > 20 else ''}); failures: "
            f"{dict(list(summary.failed.items())[:5])}. Nothing was deleted; run it again")
    still_registered = bookie in registry.list_bookies(bk.store) or \
        bookie in registry.list_bookies(bk.store, readonly=True)
    summary_cookie = "kept (bookie still running: stop it, then run decommission again to " \
                     "delete its cookie)" if still_registered else "deleted"
    if delete_cookie and not still_registered:
        try:
            registry.delete_cookie(bk.store, bookie)
        except NoNodeError:
            summary_cookie = "absent"
    summary.cookie = summary_cookie
    return summary
