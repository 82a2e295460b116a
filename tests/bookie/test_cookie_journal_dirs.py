"""Cookies and several journal directories: the cookie lists them all, and a bookie whose list
changed (count or order) is refused -- ledger L's records are in journal L % n."""
import json
import os

import pytest

from bkspark.bookie import cookie as cookies
from bkspark.bookie.config import BookieConfig
from metadata import open_store, registry


def _config(tmp_path, journal_dirs=None, journal_dir=""):
    return BookieConfig(metadata_uri=f"sqlite:///{tmp_path}/meta.db", bookie_id="127.0.0.1:3999",
                        journal_dir=journal_dir, journal_dirs=list(journal_dirs or []),
                        ledger_dirs=[str(tmp_path / "l0")]).finalize()


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path}/meta.db", create=True)
    registry.ensure_layout(s)
    yield s
    s.close()


def _jdirs(tmp_path, n):
    return [str(tmp_path / f"j{k}") for k in range(n)]


def test_cookie_lists_every_journal_dir_and_is_stamped_in_each(tmp_path, store):
    cfg = _config(tmp_path, _jdirs(tmp_path, 3))
    cookie = cookies.validate_or_create(store, cfg)
    assert cookie["journal_dirs"] == _jdirs(tmp_path, 3)
    assert cookie["journal_dir"] == _jdirs(tmp_path, 3)[0]
    for d in _jdirs(tmp_path, 3) + [str(tmp_path / "l0")]:
        with open(os.path.join(d, "COOKIE")) as f:
            assert json.load(f)["journal_dirs"] == _jdirs(tmp_path, 3)
    cookies.validate_or_create(store, _config(tmp_path, _jdirs(tmp_path, 3)))  # same list: accepted


@pytest.mark.parametrize("new", [2, 4, "reversed"])
def test_changed_journal_list_is_refused_naming_both_lists(tmp_path, store, new):
    old = _jdirs(tmp_path, 3)
    cookies.validate_or_create(store, _config(tmp_path, old))
    changed = old[::-1] if new == "reversed" else _jdirs(tmp_path, new)
    for d in changed:
        os.makedirs(d, exist_ok=True)
    with pytest.raises(cookies.CookieMismatchError) as ex:
        cookies.validate_or_create(store, _config(tmp_path, changed))
    msg = str(ex.value)
    assert "refusing to start" in msg
    assert f"found {old!r}, expected {changed!r}" in msg, msg
    if new == 2:  # every journal dir of the new list has the old cookie: the check names the change
        assert "number and order of journal directories" in msg, msg
        assert "--journal-dirs " + ",".join(old) in msg, msg


def test_old_single_journal_cookie_still_accepted(tmp_path, store):
    jd = str(tmp_path / "journal")
    cfg = _config(tmp_path, journal_dir=jd)
    cookie = cookies.validate_or_create(store, cfg)
    assert "journal_dirs" not in cookie  # a single journal: the cookie of before the list
    # the same bookie configured as journal_dirs=[jd]: same cookie, accepted
    assert cookies.validate_or_create(store, _config(tmp_path, [jd])) == cookie
    # going from one journal to two is refused
    with pytest.raises(cookies.CookieMismatchError, match=r"journal_dirs: found \[.*\], expected"):
        cookies.validate_or_create(store, _config(tmp_path, [jd, str(tmp_path / "j1")]))


def test_journal_dirs_flag(tmp_path):
    from bkspark.bookie.command import config_from_args
    from bkspark.cli.main import build_parser
    from bkspark.errors import BadRequestError
    base = ["bookie", "--metadata", f"sqlite:///{tmp_path}/m.db", "--ledger-dirs", "/l"]
    config = config_from_args(build_parser().parse_args([*base, "--journal-dirs", "/a,/b"]))
    assert config.journal_dirs == ["/a", "/b"] and config.journal_dir == "/a"
    config = config_from_args(build_parser().parse_args([*base, "--journal-dir", "/a", "--journal-dirs", "/a,/b"]))
    assert config.journal_dirs == ["/a", "/b"]
    with pytest.raises(BadRequestError, match="conflicts with journal_dirs"):
        config_from_args(build_parser().parse_args([*base, "--journal-dir", "/c", "--journal-dirs", "/a,/b"]))


def test_bookie_with_two_journals_survives_kill_and_refuses_a_changed_list(tmp_path):
    """A bookie process started with --journal-dirs: adds of ledgers of both journals survive a
    kill -9; restarted with one journal dir it is refused by the cookie, naming both lists."""
    from bkspark import errors
    from bkspark.proto import bookie_pb2 as pb
    from bkspark.testing.cluster import BookieCluster
    from .conftest import add_request, frame, stub_for
    bdir = tmp_path / "bookie-0"
    jdirs = [str(bdir / "journal"), str(bdir / "journal1")]
    with BookieCluster(f"sqlite:///{tmp_path}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=tmp_path,
                       extra_args=["--journal-dirs", ",".join(jdirs),
                                   "--checkpoint-interval-s", "3600"]) as c:
        stub, channel = stub_for(c.bookie_ids[0])
        for e in range(10):
            for lid in (8, 9):  # journal 0 and journal 1
                assert stub.Add(add_request(lid, e, b"%d" % e * 30), timeout=10).status == errors.EOK
        channel.close()
        assert all(os.listdir(d) for d in jdirs)
        with open(os.path.join(jdirs[1], "COOKIE")) as f:
            assert json.load(f)["journal_dirs"] == jdirs
        c.kill(0)
        c.start(0)
        stub, channel = stub_for(c.bookie_ids[0])
        for e in range(10):
            for lid in (8, 9):
                reply = stub.Read(pb.ReadRequest(ledger_id=lid, entry_id=e), timeout=10)
                assert reply.status == errors.EOK and reply.body == frame(lid, e, b"%d" % e * 30)
        channel.close()
        c.stop(0)
        c.bookies[0].extra_args = []  # back to --journal-dir alone: the list changed
        with pytest.raises(errors.BKError, match="journal directories changed") as ex:
            c.start(0)
        assert f"found {jdirs!r}, expected {jdirs[:1]!r}" in str(ex.value), str(ex.value)
