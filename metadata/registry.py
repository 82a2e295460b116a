"""Bookie registration, cookies, cluster identity and layout initialisation.

* A bookie registers as an *ephemeral* JSON record at ``/available/<bookie_id>`` (or
  ``/available/readonly/<bookie_id>``): it vanishes when the bookie's store session ends, so
  clients see dead bookies disappear. Re-register from ``store.on_session_lost``.
* A cookie is a persistent JSON record at ``/cookies/<bookie_id>`` describing the bookie's
  disks and instance id, written with compare-and-set.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Callable

from bkspark.errors import (
    BadRequestError,
    MetadataFormatError,
    NodeExistsError,
    NoNodeError,
)

from .layout import (
    AVAILABLE,
    INSTANCEID,
    LAYOUT,
    LAYOUT_NODES,
    READONLY,
    bookie_path,
    check_bookie_id,
    cookie_path,
)
from .store import MetadataStore

#: content of /LAYOUT (BookKeeper writes "<layout version>\n<manager factory>:<version>")
LAYOUT_DATA = b"2\nbkspark.metadata.HierarchicalLedgerManager:1\n"


def _dumps(obj, what: str) -> bytes:
    if not isinstance(obj, dict):
        raise BadRequestError(f"{what} must be a dict, got {type(obj).__name__}")
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    except (TypeError, ValueError) as e:
        raise BadRequestError(f"{what} is not JSON-serialisable: {e}") from None


def _loads(data: bytes, what: str) -> dict:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise MetadataFormatError(f"corrupt {what}: {e}") from None
    if not isinstance(obj, dict):
        raise MetadataFormatError(f"corrupt {what}: not a JSON object")
    return obj


# ---- cluster layout -----------------------------------------------------------------------

def ensure_layout(store: MetadataStore) -> str:
    """Create BookKeeper's persistent layout nodes and the instance id if missing
    (idempotent, safe to race). Returns the instance id."""
    for path in LAYOUT_NODES:
        store.ensure_path(path)
    try:
        store.create(LAYOUT, LAYOUT_DATA)
    except NodeExistsError:
        pass
    return instance_id(store)


def read_instance_id(store: MetadataStore) -> str | None:
    """The cluster's instance id, None when no bookie has created it yet (nothing is
    created)."""
    try:
        data, _ = store.get(INSTANCEID)
    except NoNodeError:
        return None
    return data.decode("ascii", errors="replace")


def instance_id(store: MetadataStore) -> str:
    """The cluster's instance id, created once (the first creator wins; everyone reads it)."""
    try:
        data, _ = store.get(INSTANCEID)
    except NoNodeError:
        try:
            store.create(INSTANCEID, uuid.uuid4().hex.encode())
        except NodeExistsError:
            pass
        data, _ = store.get(INSTANCEID)
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise MetadataFormatError(f"corrupt {INSTANCEID}: {data[:40]!r}") from None


# ---- bookie registration ------------------------------------------------------------------

def register_bookie(store: MetadataStore, bookie_id: str, info: dict, readonly: bool = False,
                    *, wait: float = 0.0) -> str:
    """Register ``bookie_id`` with ``info`` (JSON-able dict: address, rack, ...) as an ephemeral
    record of this store's session; return its path.

    If a record already exists (e.g. left by a previous, not yet expired session of a
    restarted bookie) wait up to ``wait`` seconds for it to vanish, then raise
    :class:`NodeExistsError`.
    """
    path = bookie_path(bookie_id, readonly)
    data = _dumps(info, "bookie info")
    deadline = time.monotonic() + max(0.0, wait)
    while True:
        try:
            return store.create(path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            if time.monotonic() >= deadline:
                raise NodeExistsError(
                    f"bookie {bookie_id} is already registered at {path} (another live session, "
                    f"or a previous one that has not expired yet)") from None
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def unregister_bookie(store: MetadataStore, bookie_id: str, readonly: bool = False) -> bool:
    """Remove the registration; return False if it was not there."""
    try:
        store.delete(bookie_path(bookie_id, readonly))
        return True
    except NoNodeError:
        return False


def list_bookies(store: MetadataStore, readonly: bool = False) -> dict[str, dict]:
    """Registered bookies -> info. :raises MetadataFormatError: a record is corrupt."""
    base = READONLY if readonly else AVAILABLE
    try:
        names = store.children(base)
    except NoNodeError:
        return {}
    out = {}
    for name in names:
        if name == "readonly" and not readonly:
            continue
        try:
            data, _ = store.get(f"{base}/{name}")
        except NoNodeError:  # went away while listing
            continue
        out[name] = _loads(data, f"registration of bookie {name}")
    return out


def watch_bookies(store: MetadataStore, callback: Callable[[dict[str, dict]], None],
                  readonly: bool = False) -> Callable[[], None]:
    """Call ``callback({bookie_id: info})`` now and whenever the set of registered bookies
    changes. Returns a cancel function."""
    base = READONLY if readonly else AVAILABLE

    def on_children(_names):
        callback(list_bookies(store, readonly))

    return store.watch_children(base, on_children)


# ---- cookies -------------------------------------------------------------------------------

def read_cookie(store: MetadataStore, bookie_id: str) -> tuple[dict, int]:
    """Return ``(cookie, version)``. :raises NoNodeError: the bookie has no cookie."""
    path = cookie_path(bookie_id)
    data, version = store.get(path)
    return _loads(data, f"cookie of bookie {bookie_id}"), version


def write_cookie(store: MetadataStore, bookie_id: str, cookie: dict,
                 version: int | None = None) -> int:
    """Write the cookie; return its new version. ``version=None`` creates it
    (:class:`NodeExistsError` if present); an int is a compare-and-set (``-1``: any)."""
    path = cookie_path(bookie_id)
    data = _dumps(cookie, "cookie")
    if version is None:
        store.create(path, data, makepath=True)
        return 0
    return store.set(path, data, version=version)


def bookie_address(store: MetadataStore, bookie_id: str) -> str | None:
    """Where ``bookie_id`` serves: its registration's address, else (while it is down) the
    address its cookie recorded at its last start; None if neither says."""
    for readonly in (False, True):
        info = list_bookies(store, readonly=readonly).get(bookie_id)
        if isinstance(info, dict) and info.get("address"):
            return info["address"]
    try:
        cookie, _ = read_cookie(store, bookie_id)
    except NoNodeError:
        return None
    return cookie.get("address") or None


def delete_cookie(store: MetadataStore, bookie_id: str, version: int = -1) -> None:
    store.delete(cookie_path(check_bookie_id(bookie_id)), version=version)
