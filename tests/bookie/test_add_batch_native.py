"""The data port's add path in C (``Storage.add_batch`` behind ``process_add_batch``) must
answer, store and advance LACs exactly as the Python path (``_process_adds`` on the parsed
message) does: two real storages side by side, fed the same messages, compared."""
import random
import struct
from types import SimpleNamespace

import pytest

from bkspark import errors
from bkspark.bookie.faults import FaultRule
from bkspark.bookie.service import BookieService
from bkspark.bookie.storage import Storage, StorageConfig
from bkspark.proto import bookie_pb2 as pb

from .conftest import MASTER_KEY, OTHER_KEY, add_request, frame

MAX_ENTRY = 4096


def _service(path):
    storage = Storage(StorageConfig(journal_dir=path / "journal", ledger_dirs=[path / "ledgers"]))
    config = SimpleNamespace(max_entry_bytes=MAX_ENTRY, max_message_bytes=64 << 20,
                             long_poll_max_ms=1000, fault_injection=True, max_inflight_add_mb=64,
                             max_adds_per_message=65_536, max_long_polls=32)
    state = SimpleNamespace(read_only=False, bookie_id="test", disk_space=lambda: (1 << 40, 1 << 39))
    return BookieService(storage, config, state)


@pytest.fixture
def twins(tmp_path):
    """(native, python): two services on their own storages."""
    pair = [_service(tmp_path / "native"), _service(tmp_path / "python")]
    yield pair
    for s in pair:
        s.stop()
        s.storage.close()


def _answers(raw):
    return [(r.status, r.ledger_id, r.entry_id, r.request_id, r.message)
            for r in pb.AddBatchResponse.FromString(raw).responses]


def _both(twins, payload):
    native, python = twins
    got = native.process_add_batch(payload)
    want = python._process_adds(pb.AddBatch.FromString(payload).adds)
    assert _answers(got) == _answers(want)
    assert native.lac._lac == python.lac._lac
    return _answers(got)


def _batch(*adds) -> bytes:
    return pb.AddBatch(adds=list(adds)).SerializeToString()


def test_valid_batch_across_ledgers_is_stored_and_acked_in_order(twins):
    adds = [add_request(7, e, b"p%d" % e, lac=e - 1) for e in range(5)]
    adds += [add_request(9, 0, b"q", lac=-1), add_request(7, 5, b"r", lac=3)]
    answers = _both(twins, _batch(*adds))
    assert [(a[0], a[1], a[2]) for a in answers] == [(0, a.ledger_id, a.entry_id) for a in adds]
    assert twins[0].lac._lac == {7: 3}
    for service in twins:
        assert service.storage.read_entry(7, 4) == frame(7, 4, b"p4", lac=3)
        assert service.storage.read_entry(9, 0) == frame(9, 0, b"q")


@pytest.mark.parametrize("bad", [
    dict(ledger_id=-1), dict(entry_id=-5), dict(master_key=b"short" * 3),
    dict(body=b"x" * (MAX_ENTRY + 1)), dict(flags=6)])
def test_invalid_adds_are_refused_with_the_python_paths_words(twins, bad):
    good = add_request(11, 0, b"ok")
    broken = add_request(11, 1, b"ok")
    for field, value in bad.items():
        setattr(broken, field, value)
    answers = _both(twins, _batch(good, broken, add_request(11, 2, b"ok", lac=0)))
    refused = [a for a in answers if a[0] == errors.EBADREQ]
    assert len(refused) == 1 and refused[0][3] == broken.request_id and refused[0][4]
    with pytest.raises(errors.NoSuchEntryError):
        twins[0].storage.read_entry(11, 1)


def test_fenced_ledger_and_wrong_key(twins):
    _both(twins, _batch(add_request(13, 0, b"a")))
    for service in twins:
        service.storage.fence(13, MASTER_KEY)
    answers = _both(twins, _batch(add_request(13, 1, b"b"), add_request(13, 2, b"c", recovery=True),
                                  add_request(13, 3, b"d", key=OTHER_KEY, recovery=True)))
    assert [a[0] for a in answers] == [errors.EFENCED, errors.EOK, errors.EUA]


def test_unknown_fields_are_skipped_like_protobuf_does(twins):
    body = frame(15, 0, b"z")
    add = (b"\x08\x0f" + b"\x10\x00" + b"\x1a\x14" + MASTER_KEY + b"\x2a" + bytes([len(body)]) + body
           + b"\x78\x05" + b"\x3a\x03abc" + b"\x41" + b"\x00" * 8 + b"\x35" + b"\x00" * 4
           + b"\x10\x01")     # entry_id given twice: the last one wins
    payload = b"\x12\x02hi" + b"\x0a" + bytes([len(add)]) + add + b"\x18\x07"
    assert _both(twins, payload) == [(0, 15, 1, 0, "")]


@pytest.mark.parametrize("payload", [
    b"\x0a", b"\x0a\x05ab", b"\x0a\x02\x08", b"\x0a\x03\x08\xff\xff", b"\x0b\x0c",
    b"\x0a\x0b" + b"\x08" + b"\xff" * 10, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"])
def test_malformed_messages_raise_and_store_nothing(twins, payload):
    native = twins[0]
    with pytest.raises(errors.BadRequestError, match="malformed AddBatch"):
        native.process_add_batch(payload)
    assert native.storage.ledgers() == [] and native.inflight_bytes == 0


def test_mutated_messages_never_disagree(twins):
    """Random byte flips, cuts and splices of a valid batch: whatever both parsers accept
    gets the same answers and LACs; the C parser never accepts what protobuf refuses."""
    rng = random.Random(20261122)
    base = _batch(*[add_request(17 + (e % 3), e, bytes(rng.randrange(256) for _ in range(8)),
                                lac=e - 1) for e in range(6)])
    disagreements = []
    for trial in range(400):
        raw = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            op = rng.randrange(3) if raw else 2
            if op == 0:
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            elif op == 1:
                del raw[rng.randrange(len(raw)):]
            else:
                i = rng.randrange(len(raw) + 1)
                raw[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
        payload = bytes(raw)
        try:
            parsed = pb.AddBatch.FromString(payload)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError
            parsed = None
        try:
            got = twins[0].process_add_batch(payload)
        except errors.BadRequestError:
            got = None
        if parsed is None:
            if got is not None:
                disagreements.append((trial, "C accepted what protobuf refused"))
            continue
        if got is None:
            # protobuf accepts (e.g. an end-group tag it tolerates); C refuses: the connection
            # closes, nothing stored -- keep the twin in step
            continue
        want = twins[1]._process_adds(parsed.adds)
        if _answers(got) != _answers(want):
            disagreements.append((trial, _answers(got), _answers(want)))
    assert disagreements == []
    assert twins[0].lac._lac == twins[1].lac._lac


def test_injected_faults_and_read_only_take_the_python_path(twins):
    native = twins[0]
    native.faults.set_rules([FaultRule(op="add", action="fail", error=errors.EIO, entry_id=1)])
    answers = _answers(native.process_add_batch(_batch(add_request(19, 0, b"a"),
                                                       add_request(19, 1, b"b"))))
    assert [(a[0], a[2], a[4]) for a in answers] == [(errors.EIO, 1, "injected fault"),
                                                     (errors.EOK, 0, "")]
    native.faults.set_rules([])
    native.state.read_only = True
    answers = _answers(native.process_add_batch(_batch(add_request(19, 2, b"c"))))
    assert [a[0] for a in answers] == [errors.EREADONLY]
    native.state.read_only = False
    assert [a[0] for a in _answers(native.process_add_batch(_batch(add_request(19, 2, b"c"))))] \
        == [errors.EOK]


def test_entry_header_lac_is_read_big_endian(twins):
    body = struct.pack(">qqqq", 21, 0, 2**40, 1) + b"x"
    add = pb.AddRequest(ledger_id=21, entry_id=0, master_key=MASTER_KEY, body=body)
    _both(twins, _batch(add))
    assert twins[0].lac._lac == {21: 2**40}


def test_closed_storage_answers_every_add_with_an_io_error(twins):
    native = twins[0]
    native.storage.close()
    answers = _answers(native.process_add_batch(_batch(add_request(23, 0, b"a"),
                                                       add_request(23, 1, b"b"))))
    assert [(a[0], a[2]) for a in answers] == [(errors.EIO, 0), (errors.EIO, 1)]
    assert "closed" in answers[0][4] and native.inflight_bytes == 0


@pytest.mark.parametrize("short", [pb.AddRequest(), pb.AddRequest(ledger_id=17, entry_id=1),
                                   pb.AddRequest(ledger_id=17, body=b"x" * 12)])
def test_a_message_holding_an_add_too_short_for_a_key_is_refused_whole(twins, short):
    """No client of ours sends one; a message of them cost the bookie ~410x its size before
    (issue 49): it is refused before any add of it is looked at, and nothing is stored."""
    broken = short
    with pytest.raises(errors.BadRequestError, match="too short to hold a master key"):
        twins[0].process_add_batch(_batch(add_request(17, 0, b"ok"), broken))
    with pytest.raises(errors.NoSuchLedgerError):
        twins[0].storage.read_entry(17, 0)


def test_a_read_only_bookie_refuses_in_c_as_the_python_path_does(twins):
    """Refusing costs no Python object per add (issue 49: the fallback decoded every add, the
    bookie spent most when it could least): the same answers, invalid adds with their reason."""
    for service in twins:
        service.state.read_only = True
    broken = add_request(23, 1, b"b")
    broken.master_key = b"short" * 3
    answers = _both(twins, _batch(add_request(23, 0, b"a"), broken, add_request(23, 2, b"c")))
    assert [a[0] for a in answers] == [errors.EREADONLY, errors.EBADREQ, errors.EREADONLY]


def test_ledgers_admitted_for_new_records_are_bounded(tmp_path, monkeypatch):
    """The keys ``_check_new_ledgers`` remembers -- of ledgers the metadata admitted and of
    ledgers the bookie already holds -- stay within ADMITTED_LEDGERS (before: those the
    bookie held were added without a bound)."""
    from bkspark.bookie import service as service_module
    monkeypatch.setattr(service_module, "ADMITTED_LEDGERS", 50)
    svc = _service(tmp_path)
    svc.ledger_master_key = lambda lid: MASTER_KEY
    held = set(range(1000, 1200))
    monkeypatch.setattr(svc.storage, "master_key",
                        lambda lid: MASTER_KEY if lid in held else None, raising=False)
    for lid in list(range(1, 200)) + sorted(held):
        assert svc._check_new_ledgers(((lid, MASTER_KEY),)) is None
        assert len(svc._admitted) <= 50
    assert svc._check_new_ledgers(((5, OTHER_KEY),)) == (service_module.errors.EUA,
                                                          "wrong master key")
