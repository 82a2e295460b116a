"""The one LAC read (bkspark.client.lac): how each answer counts, on stand-in bookies (the
fencing and LAC-read paths over real bookies are in test_recovery*.py and test_write_read.py)."""
from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from bkspark import errors
from bkspark.client.api import ClientConfig
from bkspark.client.digest import DigestManager
from bkspark.client.lac import read_lac
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import wire

DIGEST = DigestManager(5, "crc32c", b"pw")


def ctx_answering(answers: dict, asked: list):
    """A context whose bookie ``b`` answers ``answers[b]`` (a ReadResponse, or a BKError)."""
    def get(bookie):
        def read(ledger_id, entry_id, *, flags=0, master_key=b"", timeout=10.0):
            asked.append((bookie, ledger_id, entry_id, flags, master_key))
            fut: Future = Future()
            answer = answers[bookie]
            if isinstance(answer, Exception):
                fut.set_exception(answer)
            elif answer is not None:
                fut.set_result(answer)
            return fut
        return SimpleNamespace(read=read)
    return SimpleNamespace(pool=SimpleNamespace(get=get), conf=ClientConfig())


def test_answers_count_as_the_protocol_says():
    asked = []
    ctx = ctx_answering({
        "a": pb.ReadResponse(status=errors.EOK, body=DIGEST.frame(8, 7, 1, b"x")),
        "b": pb.ReadResponse(status=errors.ENOLEDGER),            # an answer, without a LAC
        "c": errors.BookieUnavailableError("c: connection refused"),
        "d": pb.ReadResponse(status=errors.EIO),
    }, asked)
    out = read_lac(ctx, 5, ["a", "b", "c", "d"], DIGEST, fence=True, master_key=b"k" * 20)
    assert out.answered == {0, 1} and out.lac == 7
    assert [u.split(":")[0] for u in out.unknown] == ["c", "d"]
    assert all(a[2] == -1 and a[3] == wire.FENCE_LEDGER and a[4] == b"k" * 20 for a in asked)


def test_a_refused_master_key_fails_the_read_whatever_the_others_say():
    ctx = ctx_answering({"a": pb.ReadResponse(status=errors.EOK, lac_body=DIGEST.frame_lac(3)),
                         "b": pb.ReadResponse(status=errors.EUA)}, [])
    with pytest.raises(errors.UnauthorizedError, match="bookie b refused the master key"):
        read_lac(ctx, 5, ["a", "b"], DIGEST, fence=True, master_key=b"k" * 20)


def test_enough_returns_before_every_bookie_answered():
    ctx = ctx_answering({"a": pb.ReadResponse(status=errors.EOK, lac_body=DIGEST.frame_lac(2)),
                         "b": pb.ReadResponse(status=errors.ENOENTRY),
                         "c": None}, [])                          # c never answers
    out = read_lac(ctx, 5, ["a", "b", "c"], DIGEST, enough=lambda got: len(got) >= 2)
    assert out.answered == {0, 1} and out.lac == 2


def test_the_body_of_the_last_entry_tells_its_piggybacked_lac_unless_it_fails_its_digest():
    body = DIGEST.frame(9, 8, 10, b"x" * 10)            # entry 9, written when LAC was 8
    damaged = body[:-1] + bytes([body[-1] ^ 1])
    ctx = ctx_answering({"a": pb.ReadResponse(status=errors.EOK, max_lac=3, body=body),
                         "b": pb.ReadResponse(status=errors.EOK, max_lac=4, body=damaged)}, [])
    out = read_lac(ctx, 5, ["a", "b"], DIGEST)
    assert out.lac == 8 and out.answered == {0, 1}
    assert len(out.mismatches) == 1 and out.mismatches[0].startswith("b:")


def test_only_verified_lacs_count_never_the_bookies_word():
    """A bookie's ``max_lac`` is its word: 1,000,000 from one that holds a forged explicit
    LAC (a digest no key made) counts for nothing; the explicit LAC body and the last entry's
    piggybacked LAC count once their digests check, the highest of them."""
    forged = DIGEST.frame_lac(1_000_000)
    forged = forged[:-1] + bytes([forged[-1] ^ 1])
    ctx = ctx_answering({
        "a": pb.ReadResponse(status=errors.EOK, max_lac=1_000_000, lac_body=forged,
                             body=DIGEST.frame(4, 3, 1, b"x")),
        "b": pb.ReadResponse(status=errors.EOK, max_lac=1_000_000),
        "c": pb.ReadResponse(status=errors.EOK, max_lac=2, lac_body=DIGEST.frame_lac(5),
                             body=DIGEST.frame(4, 3, 1, b"x")),
    }, [])
    out = read_lac(ctx, 5, ["a", "b", "c"], DIGEST)
    assert out.lac == 5 and out.answered == {0, 1, 2}
    assert len(out.mismatches) == 1 and "LAC digest mismatch" in out.mismatches[0]
    other_ledger = DigestManager(6, "crc32c", b"pw").frame_lac(9)
    ctx = ctx_answering({"a": pb.ReadResponse(status=errors.EOK, lac_body=other_ledger)}, [])
    assert read_lac(ctx, 5, ["a"], DIGEST).lac == -1
