"""The v1 store fixture: a bookie storage directory written by the storage format of commit
687d145 ("v1": ``ledgers.state`` + one ``.idx`` per entry log), for tests that convert it.

``data/v1-store.tar.gz`` holds ``journal/`` and ``ledgers/`` exactly as a writer killed without
close left them (the last adds and a fence exist only in the journal); ``data/v1-store.json``
is what a correct reader must return.  ``data/make_v1_store.py`` generated both (provenance;
not run by the tests).  Open the extracted store with the configuration of :func:`v1_config`
(the journal and ledger dirs are what matter; the sizes are the writer's).
"""
from __future__ import annotations

import hashlib
import json
import os
import tarfile

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
TARBALL = os.path.join(DATA, "v1-store.tar.gz")
MANIFEST = os.path.join(DATA, "v1-store.json")


def load_v1_manifest() -> dict:
    with open(MANIFEST) as f:
        return json.load(f)


def extract_v1_store(dest_dir) -> tuple[str, str]:
    """Extract the v1 store into ``dest_dir``; return ``(journal_dir, ledger_dir)``."""
    dest_dir = os.fspath(dest_dir)
    os.makedirs(dest_dir, exist_ok=True)
    with tarfile.open(TARBALL, "r:gz") as t:
        for m in t.getmembers():
            assert not m.name.startswith("/") and ".." not in m.name.split("/"), m.name
        t.extractall(dest_dir)
    return os.path.join(dest_dir, "journal"), os.path.join(dest_dir, "ledgers")


def v1_config(journal_dir, ledger_dir):
    """The writer's StorageConfig (small logs, checkpoints only when asked)."""
    from bkspark.bookie.storage import StorageConfig
    return StorageConfig(journal_dir=str(journal_dir), ledger_dirs=[str(ledger_dir)],
                         write_cache_bytes=256 << 10, entry_log_max_size=64 << 10,
                         journal_max_size_mb=1, journal_max_backups=1,
                         checkpoint_interval_s=3600.0, compaction_rate_bytes_per_s=0)


def check_store_matches_v1_manifest(storage, manifest: dict | None = None) -> None:
    """Assert that ``storage`` (a :class:`bkspark.bookie.storage.Storage`) returns exactly the
    manifest's content: the set of ledgers, and for each one its entry ranges, every entry's
    body (sha256), nothing past its last entry, fence, master key and explicit LAC; the absent
    (deleted) ledgers are unknown."""
    from bkspark.errors import NoSuchEntryError
    if manifest is None:
        manifest = load_v1_manifest()
    want = manifest["ledgers"]
    assert sorted(storage.ledgers()) == sorted(int(lid) for lid in want), \
        (sorted(storage.ledgers()), sorted(int(lid) for lid in want))
    for lid, m in want.items():
        led = int(lid)
        assert storage.has_ledger(led), led
        got = [list(r) for r in storage.list_entries(led)]
        assert got == m["entries"], (led, got, m["entries"])
        assert bool(storage.is_fenced(led)) == m["fenced"], (led, "fenced")
        assert storage.master_key(led) == bytes.fromhex(m["master_key"]), (led, "master_key")
        lac = storage.explicit_lac(led)
        assert (None if lac is None else bytes(lac).hex()) == m["explicit_lac"], (led, lac)
        want_ids = {e for first, last in m["entries"] for e in range(first, last + 1)}
        assert want_ids == {int(e) for e in m["bodies_sha256"]}, (led, "manifest ranges vs bodies")
        for e, digest in m["bodies_sha256"].items():
            got_digest = hashlib.sha256(bytes(storage.read_entry(led, int(e)))).hexdigest()
            assert got_digest == digest, (led, int(e))
        if m["entries"]:
            past = m["entries"][-1][1] + 1
            try:
                storage.read_entry(led, past)
            except NoSuchEntryError:
                pass
            else:
                raise AssertionError(f"ledger {led}: entry {past} should not exist")
    for led in manifest["absent"]:
        assert not storage.has_ledger(led), (led, "should be absent")
