"""BookKeeper's metadata layout, used by both stores (paths are relative to the store root).

With the canonical URI ``zk://host:port/ledgers`` the store root is ZooKeeper's ``/ledgers``,
so operators find what BookKeeper puts there:

=====================================  ===================================================
``/ledgers/00/0000/L0001``             ledger 1 (``ledger_path(1) == "/00/0000/L0001"``)
``/ledgers/000/0000/0000/0000/L0000``  long ids (>= 10**10), ``%019d`` split 3-4-4-4-4
``/ledgers/available/<bookie>``        writable bookies (ephemeral)
``/ledgers/available/readonly/<b>``    read-only bookies (ephemeral)
``/ledgers/cookies/<bookie>``          bookie cookies
``/ledgers/INSTANCEID``, ``LAYOUT``    cluster identity and layout version
``/ledgers/idgen``                     ledger-id counter
``/ledgers/clock``                     written to read ZooKeeper's time (metadata.clock)
``/ledgers/underreplication/...``      ledgers/, locks/, auditorelection/, endpoints/, disable
``/ledgers/logs/<name>``               bkspark logs (head; segments/, ledgers/, cursors/)
``/ledgers/logs-retention/election``   the process applying logs' retention policies
=====================================  ===================================================

The ledger hierarchy sits directly under the root, as in BookKeeper; its top-level
directories are all-digit names (2 digits short form, 3 digits long form), which never
collide with the named nodes above.
"""
from __future__ import annotations

import re
import urllib.parse

from bkspark.errors import BadRequestError

AVAILABLE = "/available"
READONLY = "/available/readonly"
COOKIES = "/cookies"
INSTANCEID = "/INSTANCEID"
LAYOUT = "/LAYOUT"
IDGEN = "/idgen"
#: written to learn the store's time: ZooKeeper stamps the write (metadata.clock)
CLOCK = "/clock"
LOGS = "/logs"
UNDERREPLICATION = "/underreplication"
UR_LEDGERS = UNDERREPLICATION + "/ledgers"
UR_LOCKS = UNDERREPLICATION + "/locks"
AUDITOR_ELECTION = UNDERREPLICATION + "/auditorelection"
UR_DISABLE = UNDERREPLICATION + "/disable"
LOST_BOOKIE_RECOVERY_DELAY = UNDERREPLICATION + "/lostBookieRecoveryDelay"
#: a request for a full audit now (``bkspark shell triggeraudit``): each change is one request
AUDIT_REQUEST = UNDERREPLICATION + "/auditRequest"
#: changed after the auditor published records: the replication workers watch it
UR_PUBLISHED = UNDERREPLICATION + "/published"
#: what elected auditors recorded of their periodic checks, so the next one goes on from there
AUDITOR_CHECKS = UNDERREPLICATION + "/auditorChecks"
#: HTTP endpoints of running ``bkspark autorecovery`` processes (ephemeral, one per process)
AUTORECOVERY_ENDPOINTS = UNDERREPLICATION + "/endpoints"
#: the Spark connector's records of write jobs under way (bkspark/spark/pending.py)
SPARK_PENDING = "/spark/pending"
#: election of the one process that applies logs' retention policies
RETENTION_ELECTION = LOGS + "-retention/election"
#: where the ledger hierarchy starts ("" = directly under the store root, like BookKeeper)
LEDGERS_ROOT = ""

#: persistent nodes created by :func:`metadata.registry.ensure_layout`
LAYOUT_NODES = (AVAILABLE, READONLY, COOKIES, LOGS, UNDERREPLICATION, UR_LEDGERS, UR_LOCKS,
                AUDITOR_ELECTION)
#: node names directly under the root that are not part of the ledger hierarchy
RESERVED_NAMES = frozenset(p.strip("/").split("/")[0] for p in (
    AVAILABLE, COOKIES, INSTANCEID, LAYOUT, IDGEN, LOGS, UNDERREPLICATION,
    RETENTION_ELECTION, SPARK_PENDING)) | {"idgen-long"}

SHORT_ID_LIMIT = 10 ** 10
MAX_LEDGER_ID = 2 ** 63 - 1

_SHORT = re.compile(r"^/(\d{2})/(\d{4})/L(\d{4})$")
_LONG = re.compile(r"^/(\d{3})/(\d{4})/(\d{4})/(\d{4})/L(\d{4})$")
SHORT_LEVELS = (re.compile(r"^\d{2}$"), re.compile(r"^\d{4}$"), re.compile(r"^L\d{4}$"))
LONG_LEVELS = (re.compile(r"^\d{3}$"), re.compile(r"^\d{4}$"), re.compile(r"^\d{4}$"),
               re.compile(r"^\d{4}$"), re.compile(r"^L\d{4}$"))
_BOOKIE_ID = re.compile(r"^[A-Za-z0-9_.:\[\]-]+$")
_LOG_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")


def check_ledger_id(ledger_id) -> int:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int):
        raise BadRequestError(f"ledger id must be an int, got {ledger_id!r}")
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise BadRequestError(f"ledger id {ledger_id} out of range [0, 2**63-1]")
    return ledger_id


def ledger_path(ledger_id: int) -> str:
    """BookKeeper's hierarchical path of a ledger: ``%010d`` split 2-4-4 below 10**10
    (``1 -> /00/0000/L0001``), else ``%019d`` split 3-4-4-4-4."""
    check_ledger_id(ledger_id)
    if ledger_id < SHORT_ID_LIMIT:
        s = f"{ledger_id:010d}"
        return f"{LEDGERS_ROOT}/{s[0:2]}/{s[2:6]}/L{s[6:10]}"
    s = f"{ledger_id:019d}"
    return f"{LEDGERS_ROOT}/{s[0:3]}/{s[3:7]}/{s[7:11]}/{s[11:15]}/L{s[15:19]}"


def ledger_id_from_path(path: str) -> int:
    """Inverse of :func:`ledger_path`. :raises BadRequestError: not a canonical ledger path."""
    if not isinstance(path, str) or not path.startswith(LEDGERS_ROOT):
        raise BadRequestError(f"not a ledger path: {path!r}")
    rel = path[len(LEDGERS_ROOT):]
    m = _SHORT.match(rel) or _LONG.match(rel)
    if not m:
        raise BadRequestError(f"not a ledger path: {path!r}")
    lid = int("".join(m.groups()))
    if ledger_path(lid) != path:
        raise BadRequestError(f"non-canonical ledger path {path!r} (ledger {lid} lives at "
                              f"{ledger_path(lid)})")
    return lid


def check_bookie_id(bookie_id) -> str:
    if not isinstance(bookie_id, str) or not _BOOKIE_ID.match(bookie_id) \
            or bookie_id in ("readonly", ".", ".."):
        raise BadRequestError(
            f"invalid bookie id {bookie_id!r} (expected e.g. '127.0.0.1:3181'; letters, digits, "
            "'.', ':', '-', '_' only)")
    return bookie_id


def bookie_path(bookie_id: str, readonly: bool = False) -> str:
    return f"{READONLY if readonly else AVAILABLE}/{check_bookie_id(bookie_id)}"


def cookie_path(bookie_id: str) -> str:
    return f"{COOKIES}/{check_bookie_id(bookie_id)}"


#: names of logs that hold the store's own state (checkpoint stores, routed writers' keys):
#: hidden from log patterns, never a routed row's log
INTERNAL_LOG_PREFIX = "__"


def is_log_name(name) -> bool:
    """Whether ``name`` follows :func:`check_log_name`'s rule (a child of ``/logs`` that does
    not -- written there by another tool -- is not a log: listings leave it out)."""
    return isinstance(name, str) and _LOG_NAME.match(name) is not None


def check_log_name(name: str) -> str:
    """The one rule for names of logs (and of their cursors): a path component of at most 200
    letters, digits, '.', '_' or '-', not starting with '.' or '-'."""
    if not is_log_name(name):
        raise BadRequestError(f"invalid log name {name!r}: use letters, digits, '.', '_' or '-' "
                              "(at most 200, not starting with . or -)")
    return name


def log_path(name: str) -> str:
    return f"{LOGS}/{check_log_name(name)}"


def underreplicated_path(ledger_id: int) -> str:
    """BookKeeper's ``/underreplication/ledgers/<hex 4>/<hex 4>/<hex 4>/<hex 4>/urL%010d``."""
    check_ledger_id(ledger_id)
    h = f"{ledger_id:016x}"
    return f"{UR_LEDGERS}/{h[0:4]}/{h[4:8]}/{h[8:12]}/{h[12:16]}/urL{ledger_id:010d}"


def autorecovery_endpoint_path(identifier: str) -> str:
    """The endpoint record of the autorecovery process ``identifier`` (any text: quoted into
    one node name)."""
    if not identifier:
        raise BadRequestError("an autorecovery identifier must not be empty")
    return f"{AUTORECOVERY_ENDPOINTS}/{urllib.parse.quote(identifier, safe=':@-_.')}"


def underreplication_lock_path(ledger_id: int) -> str:
    check_ledger_id(ledger_id)
    return f"{UR_LOCKS}/urL{ledger_id:010d}"
