import hashlib
import hmac
import struct
import zlib

import crc32c
import pytest
from hypothesis import given, strategies as st

from bkspark.client.digest import DIGEST_SIZES, DigestManager
from bkspark.errors import BadRequestError, DigestMismatchError


def test_golden_crc32c_frame():
    d = DigestManager(7, "crc32c")
    body = d.frame(3, 2, 100, b"hello")
    header = struct.pack(">qqqq", 7, 3, 2, 100)
    assert body[:32] == header
    assert body[32:36] == struct.pack(">I", crc32c.crc32c(header + b"hello"))
    assert body[36:] == b"hello"
    assert d.verify(body, 3) == (3, 2, 100, b"hello")


def test_golden_other_digests():
    header = struct.pack(">qqqq", 1, 0, -1, 3)
    assert DigestManager(1, "crc32").frame(0, -1, 3, b"abc")[32:40] == struct.pack(
        ">Q", zlib.crc32(header + b"abc"))
    want = hmac.new(b"K" * 20, header + b"abc", hashlib.sha1).digest()
    assert DigestManager(1, "hmac", b"K" * 20).frame(0, -1, 3, b"abc")[32:52] == want
    assert DigestManager(1, "dummy").frame(0, -1, 3, b"abc") == header + b"abc"


@pytest.mark.parametrize("kind", ["crc32c", "crc32", "hmac"])
@given(payload=st.binary(max_size=200), flip=st.integers(0, 10_000))
def test_any_corruption_detected(kind, payload, flip):
    d = DigestManager(5, kind, b"secret")
    body = bytearray(d.frame(9, 8, 1000, payload))
    assert len(body) == 32 + DIGEST_SIZES[kind] + len(payload)
    i = flip % len(body)
    body[i] ^= 0x01
    with pytest.raises(DigestMismatchError):
        d.verify(bytes(body), 9)


def test_wrong_entry_or_ledger_rejected():
    body = DigestManager(5, "crc32c").frame(9, 8, 1, b"x")
    with pytest.raises(DigestMismatchError):
        DigestManager(5, "crc32c").verify(body, 10)
    with pytest.raises(DigestMismatchError):
        DigestManager(6, "crc32c").verify(body, 9)
    with pytest.raises(DigestMismatchError):
        DigestManager(5, "hmac", b"a").verify(DigestManager(5, "hmac", b"b").frame(1, 0, 1, b"x"))


def test_lac_body_and_unknown_type():
    d = DigestManager(5, "hmac", b"k")
    assert d.verify_lac(d.frame_lac(42)) == 42
    with pytest.raises(BadRequestError):
        DigestManager(1, "md5")


def test_an_hmac_manager_needs_its_mac_key():
    with pytest.raises(BadRequestError, match="MAC key"):
        DigestManager(5, "hmac")
