"""Ledger metadata model: round trip, validation, corrupt serialized forms."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkspark.errors import BadRequestError, MetadataFormatError
from metadata.ledger_keys import KeyRecord
from metadata.ledger_metadata import HEADER, LedgerMetadata, LedgerState

KEYS = KeyRecord("pbkdf2-sha256", bytes(range(16)), 10_000, b"M" * 20, b"C" * 20)


def sample(**kw) -> LedgerMetadata:
    base = dict(ledger_id=7, ensemble_size=3, write_quorum=2, ack_quorum=2,
                keys=KEYS, ensembles=[(0, ["b1:3181", "b2:3181", "b3:3181"])],
                ctime_ms=1700000000000, custom_metadata={"app": b"\x01\x02"})
    base.update(kw)
    return LedgerMetadata(**base)


bookie = st.builds(lambda host, port: f"{host}:{port}",
                   st.sampled_from(["127.0.0.1", "10.0.0.2", "bk-1.example", "b"]),
                   st.integers(1, 65535))


@st.composite
def ledger_metadata(draw):
    e = draw(st.integers(1, 6))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    n_segments = draw(st.integers(1, 4))
    firsts = sorted(draw(st.sets(st.integers(1, 10 ** 12), min_size=n_segments - 1,
                                 max_size=n_segments - 1)))
    ensembles = [(f, draw(st.lists(bookie, min_size=e, max_size=e, unique=True)))
                 for f in [0] + firsts]
    state = draw(st.sampled_from(list(LedgerState)))
    last = draw(st.integers(-1, 2 ** 62))
    return LedgerMetadata(
        ledger_id=draw(st.integers(0, 2 ** 63 - 1)), ensemble_size=e, write_quorum=qw,
        ack_quorum=qa, state=state, last_entry_id=last,
        length=0 if last == -1 else draw(st.integers(0, 2 ** 62)),
        digest_type=draw(st.sampled_from(["crc32c", "hmac", "crc32", "dummy"])),
        keys=draw(st.one_of(st.builds(KeyRecord.legacy, st.binary(max_size=40)), st.builds(
            KeyRecord, st.just("pbkdf2-sha256"), st.binary(min_size=16, max_size=16),
            st.integers(1, 1_000_000), st.binary(min_size=20, max_size=20),
            st.binary(min_size=20, max_size=20)))),
        ensembles=ensembles,
        ctime_ms=draw(st.integers(0, 2 ** 50)),
        custom_metadata=draw(st.dictionaries(st.text(max_size=8), st.binary(max_size=16),
                                             max_size=3)))


@settings(max_examples=60, deadline=None)
@given(ledger_metadata())
def test_round_trip(md):
    data = md.serialize()
    assert data.startswith(HEADER + b"\t2\n")
    back = LedgerMetadata.deserialize(data)
    assert back == md
    assert back.serialize() == data


def test_serialized_form_is_stable():
    data = sample().serialize()
    head, body = data.split(b"\n", 1)
    assert head == b"bkspark-ledger-metadata\t2"
    obj = json.loads(body)
    assert obj["keys"] == {"scheme": "pbkdf2-sha256", "iterations": 10_000,
                           "salt": "AAECAwQFBgcICQoLDA0ODw==",
                           "master_key": "TU1NTU1NTU1NTU1NTU1NTU1NTU0=",
                           "mac_key": "Q0NDQ0NDQ0NDQ0NDQ0NDQ0NDQ0M="}
    assert "password" not in obj
    assert obj["state"] == "OPEN"
    assert obj["ensembles"] == [[0, ["b1:3181", "b2:3181", "b3:3181"]]]


@pytest.mark.parametrize("e,qw,qa", [(2, 3, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0), (3, 1, 2)])
def test_quorum_validation(e, qw, qa):
    md = sample(ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                ensembles=[(0, [f"b{i}" for i in range(e)])])
    with pytest.raises(BadRequestError, match="ensemble_size >= write_quorum >= ack_quorum >= 1"):
        md.validate()
    with pytest.raises(BadRequestError):
        md.serialize()


@pytest.mark.parametrize("change,message", [
    (dict(ensembles=[]), "at least one ensemble"),
    (dict(ensembles=[(0, ["a", "b"])]), "ensemble_size is 3"),
    (dict(ensembles=[(0, ["a", "a", "b"])]), "repeats a bookie"),
    (dict(ensembles=[(1, ["a", "b", "c"])]), "not 0"),
    (dict(ensembles=[(0, ["a", "b", "c"]), (0, ["a", "b", "d"])]), "strictly increasing"),
    (dict(digest_type="md5"), "digest_type"),
    (dict(keys=None), "keys must be a KeyRecord"),
    (dict(keys=KeyRecord("sha1", b"", 0, b"x", b"y" * 20)), "master key of 1 bytes"),
    (dict(state="HALF_OPEN"), "state"),
    (dict(last_entry_id=-2), "last_entry_id"),
    (dict(length=-1), "length"),
    (dict(ensemble_size=True), "ensemble_size must be an int"),
    (dict(custom_metadata={"k": "v"}), "custom_metadata"),
    (dict(state=LedgerState.CLOSED, last_entry_id=-1, length=5), "empty closed ledger"),
])
def test_validation_errors_are_clear(change, message):
    with pytest.raises(BadRequestError, match=message):
        sample(**change).validate()


def _corrupt(body_change=None, header=None):
    data = sample().serialize()
    head, body = data.split(b"\n", 1)
    if header is not None:
        head = header
    if body_change is not None:
        obj = json.loads(body)
        body_change(obj)
        body = json.dumps(obj).encode()
    return head + b"\n" + body


CORRUPT = {
    "empty": b"",
    "no newline": b"bkspark-ledger-metadata\t2",
    "wrong magic": _corrupt(header=b"BookieMetadataFormatVersion\t3"),
    "future version": _corrupt(header=b"bkspark-ledger-metadata\t3"),
    "version 1 with keys": _corrupt(header=b"bkspark-ledger-metadata\t1"),
    "version 2 with a password": _corrupt(lambda o: o.update(password=o.pop("keys"))),
    "version not a number": _corrupt(header=b"bkspark-ledger-metadata\tx"),
    "no version": _corrupt(header=b"bkspark-ledger-metadata"),
    "truncated json": sample().serialize()[:-5],
    "not an object": b"bkspark-ledger-metadata\t2\n[1, 2]",
    "not utf8": b"bkspark-ledger-metadata\t2\n\xff\xfe",
    "NaN": b"bkspark-ledger-metadata\t2\n" + sample().serialize().split(b"\n", 1)[1]
    .replace(b'"length":0', b'"length":NaN'),
    "missing field": _corrupt(lambda o: o.pop("ack_quorum")),
    "unknown field": _corrupt(lambda o: o.update(extra=1)),
    "bad state": _corrupt(lambda o: o.update(state="HALF_OPEN")),
    "bad quorum": _corrupt(lambda o: o.update(ack_quorum=5)),
    "bad base64": _corrupt(lambda o: o["keys"].update(salt="***")),
    "keys not an object": _corrupt(lambda o: o.update(keys="x")),
    "keys field missing": _corrupt(lambda o: o["keys"].pop("iterations")),
    "keys field extra": _corrupt(lambda o: o["keys"].update(password="cHc=")),
    "keys scheme unknown": _corrupt(lambda o: o["keys"].update(scheme="none")),
    "keys iterations float": _corrupt(lambda o: o["keys"].update(iterations=1.5)),
    "master key short": _corrupt(lambda o: o["keys"].update(master_key="cHc=")),
    "mac key missing": _corrupt(lambda o: o["keys"].pop("mac_key")),
    "iterations too many": _corrupt(lambda o: o["keys"].update(iterations=10 ** 9)),
    "ensembles not list": _corrupt(lambda o: o.update(ensembles={"0": []})),
    "ensemble wrong size": _corrupt(lambda o: o.update(ensembles=[[0, ["a"]]])),
    "string id": _corrupt(lambda o: o.update(ledger_id="7")),
    "no id": _corrupt(lambda o: o.update(ledger_id=-1)),
    "float length": _corrupt(lambda o: o.update(length=1.5)),
    "custom not dict": _corrupt(lambda o: o.update(custom_metadata=[])),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_forms_raise_metadata_format_error(name):
    with pytest.raises(MetadataFormatError):
        LedgerMetadata.deserialize(CORRUPT[name])


def test_future_version_message_names_version():
    with pytest.raises(MetadataFormatError, match="version 3"):
        LedgerMetadata.deserialize(CORRUPT["future version"])


def test_not_bytes_is_format_error():
    with pytest.raises(MetadataFormatError):
        LedgerMetadata.deserialize("text")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_yield_a_silent_default(data):
    try:
        md = LedgerMetadata.deserialize(HEADER + b"\t1\n" + data)
    except MetadataFormatError:
        return
    md.validate()  # whatever parsed is a fully valid record


@settings(max_examples=50, deadline=None)
@given(ledger_metadata(), st.data())
def test_single_byte_corruption_is_detected_or_harmless(md, data):
    raw = bytearray(md.serialize())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255))
    try:
        back = LedgerMetadata.deserialize(bytes(raw))
    except MetadataFormatError:
        return
    back.validate()


def test_ensemble_for_and_last_ensemble():
    md = sample(ensembles=[(0, ["a", "b", "c"]), (10, ["a", "d", "c"]), (25, ["e", "d", "c"])])
    assert md.ensemble_for(0) == ["a", "b", "c"]
    assert md.ensemble_for(9) == ["a", "b", "c"]
    assert md.ensemble_for(10) == ["a", "d", "c"]
    assert md.ensemble_for(24) == ["a", "d", "c"]
    assert md.ensemble_for(10 ** 9) == ["e", "d", "c"]
    assert md.last_ensemble() == ["e", "d", "c"]
    assert md.all_bookies() == {"a", "b", "c", "d", "e"}
    with pytest.raises(BadRequestError):
        md.ensemble_for(-1)


def test_with_helpers_return_copies():
    md = sample()
    closed = md.with_closed(41, 4200)
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 41
    assert md.state is LedgerState.OPEN and md.last_entry_id == -1
    rec = md.with_in_recovery()
    assert rec.state is LedgerState.IN_RECOVERY
    changed = md.with_ensemble(5, ["b1:3181", "x:1", "b3:3181"])
    assert changed.ensembles == [(0, ["b1:3181", "b2:3181", "b3:3181"]),
                                 (5, ["b1:3181", "x:1", "b3:3181"])]
    assert md.ensembles == [(0, ["b1:3181", "b2:3181", "b3:3181"])]
    replaced = changed.with_ensemble(5, ["y:1", "x:1", "b3:3181"])  # same start: replace
    assert replaced.ensembles[-1] == (5, ["y:1", "x:1", "b3:3181"])
    assert len(replaced.ensembles) == 2
    with pytest.raises(BadRequestError):
        changed.with_ensemble(3, ["a", "b", "c"])
    swapped = md.with_replaced_bookie(0, 1, "z:1")
    assert swapped.ensembles[0][1] == ["b1:3181", "z:1", "b3:3181"]
    assert md.ensembles[0][1][1] == "b2:3181"
    assert md.with_custom_metadata(k=b"v").custom_metadata == {"app": b"\x01\x02", "k": b"v"}
    assert md.custom_metadata == {"app": b"\x01\x02"}


def test_new_validates():
    md = LedgerMetadata.new(["a", "b", "c"], 2, 2, password=b"pw")
    assert md.state is LedgerState.OPEN and md.ensembles == [(0, ["a", "b", "c"])]
    assert md.ctime_ms > 0
    with pytest.raises(BadRequestError):
        LedgerMetadata.new(["a", "b"], 3, 2)


def test_segments_and_state_are_normalised():
    a = sample(ensembles=[[0, ("b1:3181", "b2:3181", "b3:3181")]], state="CLOSED")
    assert a.ensembles == [(0, ["b1:3181", "b2:3181", "b3:3181"])]
    assert a.state is LedgerState.CLOSED
    assert LedgerMetadata.deserialize(a.serialize()) == a


def test_format_1_is_read_without_keeping_the_password_and_rewritten_as_format_2():
    """A record written before key records (format 1 held the password itself) still opens
    with its password; read, the password is gone, and its next write is format 2."""
    obj = json.loads(sample().serialize().split(b"\n", 1)[1])
    del obj["keys"]
    obj["password"] = "cHcA/w=="            # b"pw\x00\xff"
    v1 = b"bkspark-ledger-metadata\t1\n" + json.dumps(obj).encode()
    md = LedgerMetadata.deserialize(v1)
    assert md.keys == KeyRecord.legacy(b"pw\x00\xff")
    assert md.keys.derive(b"pw\x00\xff") is not None and md.keys.derive(b"pw") is None
    again = md.serialize()
    assert again.startswith(HEADER + b"\t2\n") and b"cHcA/w==" not in again
    assert LedgerMetadata.deserialize(again) == md


def test_new_metadata_stores_a_fresh_salted_record_not_the_password():
    a = LedgerMetadata.new(["a", "b", "c"], 2, 2, password=b"hunter2")
    b = LedgerMetadata.new(["a", "b", "c"], 2, 2, password=b"hunter2")
    assert a.keys.salt != b.keys.salt and a.keys.derive(b"hunter2") is not None
    assert b"hunter2" not in a.serialize()
