"""Generator of ``v1-store.tar.gz`` + ``v1-store.json`` (kept for provenance; the tests do not run it).

It was run against commit 687d145, whose storage format is "v1": ``ledgers.state`` (per-ledger
state + the set of entry logs) and one ``.idx`` index file per entry log (bookie_native/README.md
of that commit).  The fixture lets a later format change test that it converts such a store.

Usage (from a checkout of 687d145 with the extension built in place)::

    PYTHONPATH=. python3 tests/storage/data/make_v1_store.py OUT [MANIFEST.json [TARBALL.tar.gz]]

OUT must not exist or be empty.  A child process creates the store in OUT/journal + OUT/ledgers
and dies with ``os._exit(0)`` (no close) right after its last adds are acknowledged, so the
tarball holds journaled-but-never-checkpointed records as well as checkpointed ones.  The store
is never reopened in place (reopening replays the journal and checkpoints, rewriting it): the
manifest is the model of what the child wrote, verified by opening a *copy* with the v1 code.

Content (bodies are deterministic, see ``body()``; ledgers 4, 7 and 8 repeat only 8 bytes of the
digest so that the tarball stays small):

* ledger 1: entries 0..299 (key k1) before the checkpoints, 300..349 after the last one
* ledger 2: entries 0..49, then fenced (key k2)
* ledger 3: entries 0..19, explicit LAC b"lac-3-bytes" (key k3)
* ledger 4: 300 entries, checkpointed, then deleted (absent)
* ledger 5: entries 0..9 variant A (key k5), checkpointed, deleted, re-created with entries
  0..4 variant B (key k5b): only variant B's 0..4 and key k5b must be visible
* ledger 6: entries 0..99, checkpointed, then 10..19 re-added with new bodies (the later wins)
* ledger 7: entries 0..1499 of 100 bytes
* ledger 8: 1200 entries filling whole entry logs, checkpointed, deleted, then ``compact()``
* ledger 9: entries 0..4 and 10..14 (a gap)
* after the last checkpoint (journal only): ledger 10 entries 0..49 (key k10), ledger 1
  entries 300..349, and a fence of ledger 11 (created by the fence, key k11, no entries)
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

EOK = 0


def body(ledger: int, entry: int, variant: str = "", size: int = 200, unique: int = 32) -> bytes:
    """``size`` bytes: the first ``unique`` bytes of sha256("ledger:entry<variant>"), repeated."""
    d = hashlib.sha256(f"{ledger}:{entry}{variant}".encode()).digest()[:unique]
    return (d * (size // len(d) + 1))[:size]


def config(out: str):
    from bkspark.bookie.storage import StorageConfig
    return StorageConfig(journal_dir=os.path.join(out, "journal"),
                         ledger_dirs=[os.path.join(out, "ledgers")],
                         write_cache_bytes=256 << 10, entry_log_max_size=64 << 10,
                         journal_max_size_mb=1, journal_max_backups=1,
                         checkpoint_interval_s=3600.0, compaction_rate_bytes_per_s=0)


def child(out: str) -> None:
    """Write the store; print one JSON line {"model": ..., "observed": ...}; os._exit(0)."""
    import bkspark
    from bkspark.bookie.storage import Storage
    s = Storage(config(out))
    model = {}      # ledger -> {"key": bytes, "fenced": bool, "lac": bytes|None, "bodies": {e: bytes}}
    observed = {"bkspark": bkspark.__file__}

    def ledger(lid, key):
        return model.setdefault(lid, {"key": key, "fenced": False, "lac": None, "bodies": {}})

    def add(lid, key, entries, variant="", size=200, unique=32):
        reqs = [(lid, e, key, False, body(lid, e, variant, size, unique)) for e in entries]
        st = s.add_entries(reqs)
        assert st == [EOK] * len(reqs), (lid, st)
        m = ledger(lid, key)
        for r in reqs:
            m["bodies"][r[1]] = r[4]

    def delete(lid):
        s.delete_ledger(lid)
        model.pop(lid, None)

    add(1, b"k1", range(300))
    add(2, b"k2", range(50))
    assert s.fence(2, b"k2") == EOK
    ledger(2, b"k2")["fenced"] = True
    observed["add_to_fenced_ledger_2"] = s.add_entries([(2, 50, b"k2", False, b"x")])
    observed["fence_2_wrong_key"] = s.fence(2, b"bad")
    add(3, b"k3", range(20))
    s.set_explicit_lac(3, b"lac-3-bytes")
    ledger(3, b"k3")["lac"] = b"lac-3-bytes"
    add(4, b"k4", range(300), unique=8)
    add(5, b"k5", range(10), variant="A")
    add(6, b"k6", range(100))
    add(7, b"k7", range(1500), size=100, unique=8)
    add(8, b"k8", range(1200), unique=8)
    add(9, b"k9", list(range(5)) + list(range(10, 15)))
    s.checkpoint()
    observed["logs_after_checkpoint_1"] = sorted(os.listdir(os.path.join(out, "ledgers")))

    # re-adds of 6's 10..19 with new bodies: status and what a read returns right after
    reqs = [(6, e, b"k6", False, body(6, e, "re")) for e in range(10, 20)]
    observed["readd_ledger_6_statuses"] = s.add_entries(reqs)
    observed["readd_ledger_6_read_returns_new_body"] = all(
        s.read_entry(6, e) == body(6, e, "re") for e in range(10, 20))
    for r in reqs:
        model[6]["bodies"][r[1]] = r[4]
    delete(4)
    delete(5)
    add(5, b"k5b", range(5), variant="B")
    s.checkpoint()
    delete(8)
    observed["compact"] = s.compact()
    s.checkpoint()
    observed["logs_after_compaction"] = sorted(os.listdir(os.path.join(out, "ledgers")))
    observed["mark_after_last_checkpoint"] = list(s.last_log_mark())

    line = {"model": {str(l): {"key": m["key"].hex(), "fenced": m["fenced"],
                               "lac": m["lac"].hex() if m["lac"] is not None else None,
                               "bodies": {str(e): b.hex() for e, b in m["bodies"].items()}}
                      for l, m in model.items()}}
    # never checkpointed: only in the journal (fdatasync'ed per add before add_entries returns)
    add(10, b"k10", range(50))
    add(1, b"k1", range(300, 350))
    assert s.fence(11, b"k11") == EOK
    observed["mark_at_exit"] = list(s.last_log_mark())
    for lid, key, ents in ((10, b"k10", range(50)), (1, b"k1", range(300, 350))):
        d = line["model"].setdefault(str(lid), {"key": key.hex(), "fenced": False, "lac": None, "bodies": {}})
        for e in ents:
            d["bodies"][str(e)] = body(lid, e).hex()
    line["model"]["11"] = {"key": b"k11".hex(), "fenced": True, "lac": None, "bodies": {}}
    line["observed"] = observed
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
    os._exit(0)


def ranges(ids):
    out = []
    for e in sorted(ids):
        if out and out[-1][1] == e - 1:
            out[-1][1] = e
        else:
            out.append([e, e])
    return out


def manifest_from_model(model: dict, observed: dict) -> dict:
    ledgers = {}
    for lid in sorted(model, key=int):
        m = model[lid]
        ledgers[lid] = {
            "entries": ranges(int(e) for e in m["bodies"]),
            "fenced": m["fenced"],
            "master_key": m["key"],
            "explicit_lac": m["lac"],
            "bodies_sha256": {e: hashlib.sha256(bytes.fromhex(b)).hexdigest()
                              for e, b in sorted(m["bodies"].items(), key=lambda kv: int(kv[0]))},
        }
    return {
        "format": "v1 (commit 687d145)",
        "ledgers": ledgers,
        "absent": [4, 8],
        "notes": ("Written by tests/storage/data/make_v1_store.py against 687d145 (ledgers.state + "
                  "per-log .idx). StorageConfig(journal_dir=journal, ledger_dirs=[ledgers], "
                  "write_cache_bytes=256<<10, entry_log_max_size=64<<10, journal_max_size_mb=1, "
                  "journal_max_backups=1, checkpoint_interval_s=3600). The writer was killed "
                  "(os._exit, no close) after ledger 10 0..49, ledger 1 300..349 and the fence of "
                  "ledger 11 were acknowledged: those exist only in the journal (after the "
                  "lastMark). Ledger 4 and 8 were deleted (8 after filling whole entry logs, then "
                  "compact()); ledger 5 was deleted and re-created (only entries 0..4 of the second "
                  "incarnation, key k5b); ledger 6 entries 10..19 were re-added with new bodies "
                  "(the later body is the expected one). master_key / explicit_lac are hex. "
                  "Observed while writing: " + json.dumps(observed, sort_keys=True)),
    }


def verify(storage, manifest: dict) -> None:
    """Assert that ``storage`` returns exactly the manifest's content."""
    from bkspark.errors import NoSuchEntryError
    want = manifest["ledgers"]
    assert sorted(storage.ledgers()) == sorted(int(l) for l in want), (sorted(storage.ledgers()), sorted(want))
    for lid, m in want.items():
        l = int(lid)
        assert storage.has_ledger(l), l
        assert [list(r) for r in storage.list_entries(l)] == m["entries"], (l, storage.list_entries(l))
        assert bool(storage.is_fenced(l)) == m["fenced"], l
        assert storage.master_key(l) == bytes.fromhex(m["master_key"]), l
        lac = storage.explicit_lac(l)
        assert (lac.hex() if lac is not None else None) == m["explicit_lac"], (l, lac)
        for e, h in m["bodies_sha256"].items():
            assert hashlib.sha256(storage.read_entry(l, int(e))).hexdigest() == h, (l, e)
        if m["entries"]:
            hi = m["entries"][-1][1]
            try:
                storage.read_entry(l, hi + 1)
                raise AssertionError(f"ledger {l} entry {hi + 1} should not exist")
            except NoSuchEntryError:
                pass
    for l in manifest["absent"]:
        assert not storage.has_ledger(l), l


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    assert not os.listdir(out), f"{out} is not empty"
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", out],
                       stdout=subprocess.PIPE, check=True)
    line = json.loads(p.stdout.decode().strip().splitlines()[-1])
    manifest = manifest_from_model(line["model"], line["observed"])
    print(json.dumps(line["observed"], indent=1, sort_keys=True))

    from bkspark.bookie.storage import Storage
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "copy")
        shutil.copytree(out, copy)
        s = Storage(config(copy))
        try:
            verify(s, manifest)
        finally:
            s.close()
    print("verified against a copy: OK", file=sys.stderr)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")
    if len(sys.argv) > 3:
        subprocess.run(["tar", "--sort=name", "-czf", os.path.abspath(sys.argv[3]), "journal", "ledgers"], cwd=out, check=True)


if __name__ == "__main__":
    main()
