"""Under-replication records, their locks and the cluster-wide autorecovery switch.

Layout (BookKeeper's, relative to the metadata root)::

    /underreplication/ledgers/<hex4>/<hex4>/<hex4>/<hex4>/urL%010d   one record per ledger
    /underreplication/locks/urL%010d                                 ephemeral worker lock
    /underreplication/disable                                        present = autorecovery off
    /underreplication/lostBookieRecoveryDelay                        seconds (ASCII int)
    /underreplication/auditRequest                                   a full audit requested
    /underreplication/auditorChecks                                  the auditors' check times
    /underreplication/published                                      changed: records published
    /underreplication/auditorelection/...                            auditor election
    /underreplication/endpoints/<identifier>                         ephemeral: a process's HTTP

A record's data is JSON ``{"missing": [bookie ids], "ctime_ms": ..., "by": ...}``. The
auditor creates a record or merges more lost bookies into it (a CAS, which bumps the
record's version). A worker locks a record (ephemeral node: it vanishes with the worker's
session), remembers the version it saw *after* locking, and deletes the record with that
version once the ledger is fully replicated: if the auditor re-marked the ledger
meanwhile the delete fails and the record stays for another pass.
"""
from __future__ import annotations

import json
import re
import time
import urllib.parse
from typing import Callable

from bkspark.errors import BadVersionError, MetadataFormatError, NodeExistsError, NoNodeError
from metadata.layout import (
    AUDIT_REQUEST,
    AUDITOR_CHECKS,
    AUDITOR_ELECTION,
    AUTORECOVERY_ENDPOINTS,
    LOST_BOOKIE_RECOVERY_DELAY,
    UR_DISABLE,
    UR_LEDGERS,
    UR_LOCKS,
    UR_PUBLISHED,
    autorecovery_endpoint_path,
    underreplicated_path,
    underreplication_lock_path,
)
from metadata.update import NoChange, update_record

_HEX4 = re.compile(r"^[0-9a-f]{4}$")
_URL = re.compile(r"^urL(\d{10,19})$")
_SEQ = re.compile(r"(\d{10})$")


class UnderReplicationManager:
    """Records, locks and switches on one metadata store (thread-safe: the store is)."""

    def __init__(self, store, owner: str = ""):
        self.store = store
        self.owner = owner

    # ---- records ---------------------------------------------------------------------
    def mark(self, ledger_id: int, missing=(), by: str = "") -> bool:
        """Publish (or merge into) the record of ``ledger_id``. Returns True when the record
        was created or changed."""
        missing = sorted(set(missing))

        def merge(doc: dict) -> dict:
            if not doc:                 # a new record
                return {"missing": missing, "ctime_ms": int(time.time() * 1000), "by": by}
            merged = sorted(set(doc.get("missing", [])) | set(missing))
            if merged == doc.get("missing", []):
                raise NoChange
            return {**doc, "missing": merged}
        return update_record(self.store, underreplicated_path(ledger_id), decode=_loads,
                             encode=_dumps, transform=merge, missing=dict,
                             what=f"under-replication record of ledger {ledger_id}").changed

    def get(self, ledger_id: int) -> tuple[dict, int] | None:
        try:
            data, version = self.store.get(underreplicated_path(ledger_id))
        except NoNodeError:
            return None
        return _loads(data), version

    def is_marked(self, ledger_id: int) -> bool:
        return self.store.exists(underreplicated_path(ledger_id)) is not None

    def list(self) -> list[int]:
        """Ledger ids with a record, ascending."""
        out: list[int] = []
        self._walk(UR_LEDGERS, 0, out)
        return sorted(out)

    def _walk(self, path, depth, out):
        try:
            names = self.store.children(path)
        except NoNodeError:
            return
        for name in names:
            if depth < 4:
                if _HEX4.match(name):
                    self._walk(f"{path}/{name}", depth + 1, out)
            else:
                m = _URL.match(name)
                if m:
                    out.append(int(m.group(1)))

    def delete_record(self, ledger_id: int, version: int = -1) -> bool:
        """Delete the record (with ``version``, -1 = any); False if it changed or is gone.
        Empty parent directories are pruned (best effort) so listing stays cheap."""
        path = underreplicated_path(ledger_id)
        try:
            self.store.delete(path, version=version)
        except (BadVersionError, NoNodeError):
            return False
        for _ in range(4):
            path = path.rsplit("/", 1)[0]
            try:
                self.store.delete(path)
            except Exception:  # noqa: BLE001 - not empty (NotEmpty), raced, ...: stop
                break
        return True

    def announce(self) -> None:
        """Tell the replication workers that records were published: a change of
        ``/underreplication/published``, which they watch (:meth:`watch_published`), so they
        look at once rather than at their next poll. A hint only -- the records are the
        truth --, so a conflict means another change already told them."""
        doc = _dumps({"at_ms": int(time.time() * 1000), "by": self.owner})
        try:
            _, version = self.store.get(UR_PUBLISHED)
        except NoNodeError:
            try:
                self.store.create(UR_PUBLISHED, doc, makepath=True)
            except NodeExistsError:
                pass
            return
        try:
            self.store.set(UR_PUBLISHED, doc, version)
        except (BadVersionError, NoNodeError):
            pass

    def watch_published(self, callback) -> Callable[[], None]:
        """Call ``callback()`` now and after every :meth:`announce`; returns a cancel function."""
        return self.store.watch_data(UR_PUBLISHED, lambda _data, _version: callback())

    # ---- locks -------------------------------------------------------------------------
    def try_lock(self, ledger_id: int) -> int | None:
        """Take the ledger's lock; return the record's version, or None when another worker
        holds the lock or the record is gone (then nothing is held)."""
        lock = underreplication_lock_path(ledger_id)
        try:
            self.store.create(lock, _dumps({"owner": self.owner}), ephemeral=True, makepath=True)
        except NodeExistsError:
            return None
        version = self.store.exists(underreplicated_path(ledger_id))
        if version is None:
            self.release(ledger_id)
            return None
        return version

    def release(self, ledger_id: int) -> None:
        try:
            self.store.delete(underreplication_lock_path(ledger_id))
        except NoNodeError:
            pass

    def mark_replicated(self, ledger_id: int, version: int) -> bool:
        """Delete the record if unchanged since it was locked, then release the lock.
        Returns False when the record was re-marked meanwhile (it stays)."""
        try:
            return self.delete_record(ledger_id, version)
        finally:
            self.release(ledger_id)

    def lock_holder(self, ledger_id: int) -> str | None:
        try:
            data, _ = self.store.get(underreplication_lock_path(ledger_id))
        except NoNodeError:
            return None
        return _loads(data).get("owner", "")

    def locked(self) -> list[int]:
        try:
            names = self.store.children(UR_LOCKS)
        except NoNodeError:
            return []
        return sorted(int(m.group(1)) for m in map(_URL.match, names) if m)

    # ---- switch and delay -----------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self.store.exists(UR_DISABLE) is None

    def disable(self) -> None:
        try:
            self.store.create(UR_DISABLE, b"", makepath=True)
        except NodeExistsError:
            pass

    def enable(self) -> None:
        try:
            self.store.delete(UR_DISABLE)
        except NoNodeError:
            pass

    def lost_bookie_recovery_delay(self, default: float) -> float:
        try:
            data, _ = self.store.get(LOST_BOOKIE_RECOVERY_DELAY)
            return max(0.0, float(data.decode().strip()))
        except (NoNodeError, ValueError, UnicodeDecodeError):
            return default

    def set_lost_bookie_recovery_delay(self, seconds: float) -> None:
        data = (f"{seconds:g}").encode()
        update_record(self.store, LOST_BOOKIE_RECOVERY_DELAY, decode=bytes, encode=bytes,
                      transform=lambda _old: data, missing=bytes,
                      what="lostBookieRecoveryDelay")

    def clear_lost_bookie_recovery_delay(self) -> None:
        try:
            self.store.delete(LOST_BOOKIE_RECOVERY_DELAY)
        except NoNodeError:
            pass

    # ---- audit requests -------------------------------------------------------------------
    def request_audit(self, by: str = "") -> int:
        """Ask the auditor for a full audit now (its every check, lost bookies published
        without waiting for the recovery delay); returns the request's version. Each change
        of the record is one request; an answer lost after the write applied at most causes
        one audit more."""
        doc = {"requested_ms": int(time.time() * 1000), "by": by}
        return update_record(self.store, AUDIT_REQUEST, decode=_loads, encode=_dumps,
                             transform=lambda _old: doc, missing=dict,
                             what="audit request").version

    def audit_request(self) -> int | None:
        """The version of the latest audit request (None: never requested)."""
        return self.store.exists(AUDIT_REQUEST)

    # ---- what the auditors recorded of their checks ---------------------------------------
    def auditor_checks(self) -> dict:
        """What elected auditors recorded, so that a newly elected one goes on from there
        (BookKeeper keeps its checks' ``ctime`` in ZooKeeper likewise): check name -> when it
        last ran (epoch ms); ``since`` -> when the first auditor began counting the periods;
        ``auditRequestServed`` -> the version of the last audit request served. ``{}``: none."""
        try:
            data, _ = self.store.get(AUDITOR_CHECKS)
        except NoNodeError:
            return {}
        return _loads(data)

    def record_auditor_checks(self, **values) -> dict:
        """Merge ``values`` into the record (re-read and retried on a conflict) and return it.
        Advisory: a record that did not land makes a check run once more, never less."""
        return update_record(self.store, AUDITOR_CHECKS, decode=_loads, encode=_dumps,
                             transform=lambda doc: {**doc, **values}, missing=dict,
                             what="record of the auditor's checks").value

    # ---- auditor --------------------------------------------------------------------------
    def auditor(self) -> str | None:
        """Identifier of the elected auditor (lowest election sequence), or None."""
        return current_leader(self.store, AUDITOR_ELECTION)

    # ---- where autorecovery processes answer ----------------------------------------------
    def publish_endpoint(self, identifier: str, info: dict) -> None:
        """Announce the HTTP endpoint of the autorecovery process ``identifier`` (``info``:
        ``host``, ``http_port``) as an ephemeral record of this store's session, so that the
        dashboard finds standalone processes as it finds bookies; it vanishes with the session
        (re-publish from ``store.on_session_lost``).

        A record already there is either this session's (a create whose answer was lost, a
        second publication: it stays, and is kept) or another live session's under the same
        identifier (:class:`NodeExistsError` naming it)."""
        path = autorecovery_endpoint_path(identifier)
        mine = str(self.store.session_id)
        for _ in range(3):
            try:
                self.store.create(path, _dumps({**info, "session": mine}), ephemeral=True,
                                  makepath=True)
                return
            except NodeExistsError:
                try:
                    data, _ = self.store.get(path)
                except NoNodeError:
                    continue                    # the other session ended meanwhile: again
                if _loads(data).get("session") == mine:
                    return
                raise NodeExistsError(
                    f"an autorecovery process with identifier {identifier!r} is already "
                    f"published at {path} by another live session; give each process its own "
                    f"--id") from None
        raise NodeExistsError(f"could not publish {path}: it kept reappearing")

    def endpoints(self) -> dict[str, dict]:
        """Published autorecovery endpoints: identifier -> ``{"host", "http_port", ...}``."""
        try:
            names = self.store.children(AUTORECOVERY_ENDPOINTS)
        except NoNodeError:
            return {}
        out = {}
        for name, item in zip(names, self.store.get_many(
                [f"{AUTORECOVERY_ENDPOINTS}/{n}" for n in names])):
            if item is not None:                # (gone since the listing)
                out[urllib.parse.unquote(name)] = _loads(item[0])
        return out


def election_contenders(store, path: str) -> list[tuple[str, str]]:
    """``[(node name, identifier)]`` of the election at ``path``, leader first. Works for
    kazoo's Election recipe (``<uuid>__lock__<seq>``) and our lease nodes (``V_<seq>``)."""
    try:
        names = store.children(path)
    except NoNodeError:
        return []
    seq = []
    for n in names:
        m = _SEQ.search(n)
        if m:
            seq.append((int(m.group(1)), n))
    out = []
    for _, name in sorted(seq):
        try:
            data, _ = store.get(f"{path}/{name}")
        except NoNodeError:
            continue
        out.append((name, data.decode("utf-8", "replace")))
    return out


def current_leader(store, path: str) -> str | None:
    c = election_contenders(store, path)
    return c[0][1] if c else None


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _loads(data: bytes) -> dict:
    if not data:
        return {}
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise MetadataFormatError(f"corrupt under-replication record: {e}") from None
    return doc if isinstance(doc, dict) else {}
