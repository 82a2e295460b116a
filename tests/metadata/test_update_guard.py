"""update_record's guard: a change stored only while another record keeps its version
(one transaction), on both stores."""
from __future__ import annotations

import pytest

from metadata.update import GuardChangedError, update_record

pytestmark = [pytest.mark.integration]


def _update(store, guard, value=b"new"):
    return update_record(store, "/rec", decode=bytes, encode=bytes,
                         transform=lambda _old: value, guard=guard, what="guarded")


def test_a_guarded_change_is_stored_while_the_guard_holds(store):
    store.create("/rec", b"old")
    store.create("/guard", b"g")
    done = _update(store, ("/guard", 0))
    assert done.changed and store.get("/rec") == (b"new", 1)


def test_a_changed_or_missing_guard_refuses_the_change(store):
    store.create("/rec", b"old")
    store.create("/guard", b"g")
    store.set("/guard", b"reclaimed", version=0)             # what a reclaim does
    with pytest.raises(GuardChangedError, match="/guard"):
        _update(store, ("/guard", 0))
    store.delete("/guard")
    with pytest.raises(GuardChangedError):
        _update(store, ("/guard", 1))
    assert store.get("/rec") == (b"old", 0)


def test_a_conflict_on_the_record_itself_is_retried_under_the_guard(store):
    store.create("/rec", b"old")
    store.create("/guard", b"g")
    calls = []

    def transform(old):
        calls.append(old)
        if len(calls) == 1:
            store.set("/rec", b"concurrent", version=0)      # someone else wins the first CAS
        return old + b"+mine"
    done = update_record(store, "/rec", decode=bytes, encode=bytes, transform=transform,
                         guard=("/guard", 0), what="guarded")
    assert done.changed and calls == [b"old", b"concurrent"]
    assert store.get("/rec")[0] == b"concurrent+mine"
