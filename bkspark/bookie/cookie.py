"""Bookie cookies: the identity stamp that ties a bookie id to its disks and its cluster.

A cookie (bookie id, journal dir(s), ledger dirs, cluster instance id) is written in every
directory and in the metadata store at ``/cookies/<bookie-id>`` when a bookie first starts.
On every later start they must agree: a bookie whose disks were replaced, swapped or
belong to another cluster refuses to start, because serving "no such entry" for entries it
once acknowledged could truncate ledgers during recovery.

With several journal directories the cookie also lists them all (``journal_dirs``, in order):
ledger L's journal records live in journal ``L % len(journal_dirs)``, so a bookie whose list
changed (count or order) would look for them in the wrong journal -- refused here.  A
single-journal bookie's cookie has only ``journal_dir`` (as before the list existed); an old
cookie stands for the list ``[journal_dir]``.
"""
from __future__ import annotations

import json
import os

from bkspark import private
from bkspark.errors import BKError, BadVersionError, NoNodeError, NodeExistsError
from metadata import registry

COOKIE_FILE = "COOKIE"


class CookieMismatchError(BKError):
    """The bookie's directories or metadata disagree with its identity: refuse to start."""


def _journal_dirs(config) -> list[str]:
    return list(getattr(config, "journal_dirs", None) or [config.journal_dir])


def expected_cookie(config, instance_id: str) -> dict:
    journals = [os.path.abspath(d) for d in _journal_dirs(config)]
    cookie = {"version": 1, "bookie_id": config.bookie_id, "instance_id": instance_id,
              "journal_dir": journals[0],
              "ledger_dirs": [os.path.abspath(d) for d in config.ledger_dirs]}
    if len(journals) > 1:
        cookie["journal_dirs"] = journals
    return cookie


def _cookie_journals(cookie: dict) -> list:
    """A cookie's journal directories (an old or single-journal cookie: [journal_dir])."""
    return list(cookie.get("journal_dirs") or [cookie.get("journal_dir")])


def _address(config) -> str:
    return f"{config.advertised_address}:{config.port}"


def _read_local(directory: str) -> dict | None:
    path = os.path.join(directory, COOKIE_FILE)
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CookieMismatchError(f"cookie file {path} is unreadable: {exc}") from None


def _write_local(directory: str, cookie: dict) -> None:
    private.make_dir(directory)
    path = os.path.join(directory, COOKIE_FILE)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(json.dumps(cookie, sort_keys=True).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _differences(found: dict, expected: dict) -> list[str]:
    diffs = [f"{key}: found {found.get(key)!r}, expected {expected.get(key)!r}"
             for key in ("bookie_id", "instance_id", "ledger_dirs")
             if found.get(key) != expected.get(key)]
    if _cookie_journals(found) != _cookie_journals(expected):
        diffs.insert(2, f"journal_dirs: found {_cookie_journals(found)!r}, expected {_cookie_journals(expected)!r}")
    return diffs


def _fix(found: dict, expected: dict) -> str:
    """What to do about a directory cookie that differs from this bookie's."""
    if found.get("instance_id") != expected.get("instance_id"):
        return ("the directory belongs to another cluster (another metadata store): start the "
                "bookie with the --metadata URI it was made with, or give it empty directories")
    if found.get("bookie_id") != expected.get("bookie_id"):
        address, _, port = str(found.get("bookie_id")).rpartition(":")
        return (f"the directory belongs to bookie {found.get('bookie_id')}: start it with that "
                f"identity (--advertised-address {address} --port {port}), or give this bookie "
                "empty directories")
    old, new = _cookie_journals(found), _cookie_journals(expected)
    if old != new and (len(old) != len(new) or sorted(old) == sorted(new)):
        return (f"the journal directories changed from {old} to {new}: each ledger's journal "
                "records are in journal (ledger id mod the number of journal directories), so the "
                "number and order of journal directories of a bookie cannot change; start it with "
                f"--journal-dirs {','.join(old)} (the list it was made with), or decommission it "
                "(bkspark shell decommission) and start it on empty directories")
    return ("the directories were moved or swapped: start the bookie with the --journal-dir(s) "
            f"and --ledger-dirs it was made with (journals {','.join(map(str, old))}, ledgers "
            f"{found.get('ledger_dirs')})")


def validate_or_create(store, config) -> dict:
    """Check the cookies of every directory and of the metadata store; create them on first start.

    The metadata store's cookie also records the bookie's advertised address (``address``,
    updated when it changes; not part of the identity check), so that clients can resolve a
    bookie whose id is not its address while it is down.

    Raises CookieMismatchError with a message naming the directory and the field that differ.
    """
    instance_id = registry.instance_id(store)
    expected = expected_cookie(config, instance_id)
    directories = _journal_dirs(config) + list(config.ledger_dirs)
    local = {d: _read_local(d) for d in directories}
    try:
        remote, version = registry.read_cookie(store, config.bookie_id)
    except NoNodeError:
        remote, version = None, None

    for directory, cookie in local.items():
        if cookie is not None and _differences(cookie, expected):
            raise CookieMismatchError(
                f"cookie in {directory} does not match this bookie ("
                + "; ".join(_differences(cookie, expected))
                + f"); refusing to start: {_fix(cookie, expected)}")
    missing = [d for d, c in local.items() if c is None]
    if remote is not None:
        diffs = _differences(remote, expected)
        if diffs:
            raise CookieMismatchError(
                f"cookie of {config.bookie_id} in the metadata store does not match ("
                + "; ".join(diffs) + f"); refusing to start: {_fix(remote, expected)}")
        if missing:
            raise CookieMismatchError(
                f"bookie {config.bookie_id} is known to the cluster but directories {missing} have "
                "no cookie: its disks were replaced or emptied. Entries it acknowledged are gone; "
                "decommission the bookie (bkspark shell decommission) before reusing its id")
        if remote.get("address") != _address(config):
            try:
                registry.write_cookie(store, config.bookie_id,
                                      dict(remote, address=_address(config)), version=version)
            except BadVersionError:
                raise CookieMismatchError(
                    f"cookie of {config.bookie_id} changed while this bookie started: is it "
                    "already running elsewhere?") from None
        return expected
    if len(missing) != len(directories):
        raise CookieMismatchError(
            f"directories {[d for d in directories if d not in missing]} carry a cookie for "
            f"{config.bookie_id} but the metadata store has none: wrong cluster or wiped metadata; "
            "refusing to start")
    try:
        registry.write_cookie(store, config.bookie_id, dict(expected, address=_address(config)),
                              version=None)
    except (NodeExistsError, BadVersionError):
        raise CookieMismatchError(f"another bookie registered cookie {config.bookie_id} concurrently") from None
    for directory in directories:
        _write_local(directory, expected)
    return expected
