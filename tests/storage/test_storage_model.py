"""Model-based property test: random add/fence/delete/LAC/checkpoint/compact/restart sequences
against an in-memory model of the bookie storage semantics."""
import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bkspark import errors
from bkspark.bookie.storage import Storage, StorageConfig

LEDGERS = st.integers(0, 4)
KEYS = st.sampled_from([b"a", b"b"])
BODIES = st.binary(min_size=0, max_size=700)


class StorageMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="bks-model-")
        self.cfg = StorageConfig(journal_dir=self.dir + "/j", ledger_dirs=[self.dir + "/l0", self.dir + "/l1"],
                                 replace_entries=True,      # the model re-adds with new bodies
                                 write_cache_bytes=16 << 10, entry_log_max_size=6 << 10,
                                 journal_max_size_mb=1, journal_max_backups=0, compaction_threshold=0.8,
                                 compaction_max_bytes_per_pass=8 << 10, journal_max_group_wait_ms=0.2,
                                 checkpoint_interval_s=3600)
        self.s = Storage(self.cfg)
        self.model = {}  # lid -> {"key", "fenced", "entries": {eid: body}, "lac"}
        self.buf = bytearray(600)  # read_range_into's buffer, reused by every check

    def teardown(self):
        try:
            self.s.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(lid=LEDGERS, key=KEYS, recovery=st.booleans(),
          batch=st.lists(st.tuples(st.integers(0, 25), BODIES), min_size=1, max_size=8))
    def add(self, lid, key, recovery, batch):
        expected = []
        for eid, body in batch:
            m = self.model.get(lid)
            if m is not None and m["key"] != key:
                expected.append(errors.EUA)
            elif m is not None and m["fenced"] and not recovery:
                expected.append(errors.EFENCED)
            else:
                if m is None:
                    m = self.model[lid] = {"key": key, "fenced": False, "entries": {}, "lac": None}
                m["entries"][eid] = body
                expected.append(errors.EOK)
        got = self.s.add_entries([(lid, eid, key, recovery, body) for eid, body in batch])
        assert got == expected

    @rule(lid=LEDGERS, key=KEYS)
    def fence(self, lid, key):
        m = self.model.get(lid)
        want = errors.EUA if m is not None and m["key"] != key else errors.EOK
        assert self.s.fence(lid, key) == want
        if want == errors.EOK:
            if m is None:
                m = self.model[lid] = {"key": key, "fenced": False, "entries": {}, "lac": None}
            m["fenced"] = True

    @rule(lid=LEDGERS, body=st.binary(max_size=40))
    def set_lac(self, lid, body):
        if lid in self.model:
            self.s.set_explicit_lac(lid, body)
            self.model[lid]["lac"] = body
        else:
            try:
                self.s.set_explicit_lac(lid, body)
                raise AssertionError("set_explicit_lac on an unknown ledger succeeded")
            except errors.NoSuchLedgerError:
                pass

    @rule(lid=LEDGERS)
    def delete(self, lid):
        self.s.delete_ledger(lid)
        self.model.pop(lid, None)

    @rule()
    def checkpoint(self):
        self.s.checkpoint()

    @rule()
    def compact(self):
        self.s.compact()

    @rule(clean=st.booleans())
    def restart(self, clean):
        if clean:
            self.s.close()
        else:  # like kill -9 after the acks: no checkpoint, journal replay on open
            self.s._store.close(checkpoint=False)
        self.s = Storage(self.cfg)

    @precondition(lambda self: True)
    @invariant()
    def matches_model(self):
        s = self.s
        assert s.ledgers() == sorted(self.model)
        for lid in range(5):
            m = self.model.get(lid)
            assert s.has_ledger(lid) == (m is not None)
            if m is None:
                try:
                    s.read_entry(lid, 0)
                    raise AssertionError("read of a missing ledger succeeded")
                except errors.NoSuchLedgerError:
                    pass
                continue
            assert s.is_fenced(lid) == m["fenced"]
            assert s.master_key(lid) == m["key"]
            assert s.explicit_lac(lid) == m["lac"]
            ents = m["entries"]
            assert s.last_entry_id(lid) == (max(ents) if ents else -1)
            ranges = []
            for e in sorted(ents):
                if ranges and ranges[-1][1] + 1 == e:
                    ranges[-1][1] = e
                else:
                    ranges.append([e, e])
            assert s.list_entries(lid) == [tuple(r) for r in ranges]
            for e, body in ents.items():
                assert s.read_entry(lid, e) == body
            for e in range(26):
                if e not in ents:
                    try:
                        s.read_entry(lid, e)
                        raise AssertionError("read of a missing entry succeeded")
                    except errors.NoSuchEntryError:
                        pass
            if ents:
                first = min(ents)
                rr = s.read_range(lid, first, 100, 1 << 20)
                want = []
                e = first
                while e in ents:
                    want.append((e, ents[e]))
                    e += 1
                assert rr == want
                assert s.read_entry(lid, -1) == ents[max(ents)]
                # into a reused buffer: the prefix that fits ([] if the first entry does not)
                fits, used = [], 0
                for e, body in want:
                    if used + len(body) > len(self.buf):
                        break
                    fits.append((e, body))
                    used += len(body)
                got = s.read_range_into(lid, first, 100, 1 << 20, self.buf)
                assert [(e, bytes(b)) for e, b in got] == fits
                # strided (a striped ledger's share): first, first+3, ... while present
                strided = []
                e = first
                while e in ents:
                    strided.append((e, ents[e]))
                    e += 3
                assert s.read_range(lid, first, 100, 1 << 20, 3) == strided


StorageMachine.TestCase.settings = settings(max_examples=35, stateful_step_count=40, deadline=None,
                                            suppress_health_check=list(HealthCheck))
TestStorageModel = StorageMachine.TestCase
