"""update_record creating a missing record (``missing``), on both stores: someone else's
create is a conflict, a record deleted meanwhile is created again, and a create whose answer
was lost is settled from what is stored."""
from __future__ import annotations

import pytest

from metadata.testing import lost_answers
from metadata.update import NoChange, update_record

pytestmark = [pytest.mark.integration]


def _append(store, item: bytes, **kw):
    return update_record(store, "/a/b/rec", decode=bytes, encode=bytes,
                         transform=lambda old: old + item, missing=lambda: b"", what="test", **kw)


def test_a_missing_record_is_created_with_its_parents(store):
    done = _append(store, b"x")
    assert done.changed and done.version == 0 and store.get("/a/b/rec") == (b"x", 0)
    done = _append(store, b"y")
    assert (done.value, done.version) == (b"xy", 1)


def test_without_missing_an_absent_record_is_an_error(store):
    from bkspark.errors import NoNodeError
    with pytest.raises(NoNodeError):
        update_record(store, "/nope", decode=bytes, encode=bytes, transform=lambda v: v + b"!")


def test_a_concurrent_create_is_a_conflict_and_the_change_applies_on_top(store):
    calls = []

    def transform(old):
        calls.append(old)
        if len(calls) == 1:
            store.create("/a/b/rec", b"theirs", makepath=True)    # someone else creates first
        return old + b"+mine"
    done = update_record(store, "/a/b/rec", decode=bytes, encode=bytes, transform=transform,
                         missing=lambda: b"", what="test")
    assert calls == [b"", b"theirs"] and done.value == b"theirs+mine"
    assert store.get("/a/b/rec") == (b"theirs+mine", 1)


def test_a_record_deleted_meanwhile_is_created_again(store):
    store.create("/a/b/rec", b"old", makepath=True)
    calls = []

    def transform(old):
        calls.append(old)
        if len(calls) == 1:
            store.delete("/a/b/rec")
        return old + b"!"
    done = update_record(store, "/a/b/rec", decode=bytes, encode=bytes, transform=transform,
                         missing=lambda: b"", what="test")
    assert calls == [b"old", b""] and store.get("/a/b/rec") == (b"!", 0) and done.changed


def test_no_change_leaves_a_missing_record_missing(store):
    def transform(_old):
        raise NoChange
    done = update_record(store, "/a/b/rec", decode=bytes, encode=bytes, transform=transform,
                         missing=lambda: b"")
    assert not done.changed and store.exists("/a/b/rec") is None


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_a_create_whose_answer_was_lost_is_settled_from_what_is_stored(store, applied):
    store.ensure_path("/a/b")
    with lost_answers(store, "/a/b/rec", applied=applied) as injected:
        done = _append(store, b"x")
    assert injected.lost == [("create", "/a/b/rec")]
    # applied: found on the re-read (not appended twice); not applied: created on the retry
    assert done.changed and store.get("/a/b/rec") == (b"x", 0)
