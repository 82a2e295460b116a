"""The checked-in generated protocol modules must match bookie.proto (run `make proto`)."""
from bkspark import errors
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto.generate import stale_outputs


def test_generated_modules_are_fresh():
    assert stale_outputs() == [], "generated protocol modules are stale: run `make proto`"


def test_status_codes_match_bookkeeper_and_errors_module():
    expected = {"EOK": 0, "ENOLEDGER": 402, "ENOENTRY": 403, "EBADREQ": 404, "EIO": 501,
                "EUA": 502, "EBADVERSION": 503, "EFENCED": 504, "EREADONLY": 505,
                "ETOOMANYREQUESTS": 506}
    for name, code in expected.items():
        assert pb.StatusCode.Value(name) == code
        assert getattr(errors, name) == code


def test_error_for_status_maps_each_code_to_its_class():
    assert isinstance(errors.error_for_status(errors.EFENCED), errors.FencedError)
    assert isinstance(errors.error_for_status(errors.EUA), errors.UnauthorizedError)
    assert isinstance(errors.error_for_status(errors.ENOENTRY), errors.NoSuchEntryError)
    assert isinstance(errors.error_for_status(errors.EIO), errors.BookieIOError)
    unknown = errors.error_for_status(999)
    assert type(unknown) is errors.BKError and unknown.status == 999
