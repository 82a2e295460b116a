"""Opt-in profiling of the connector's Spark work (``BKSPARK_SPARK_PROFILE``)."""
import os
import pstats

from bkspark.spark import conn


def _work_in_the_block():
    return sum(range(1000))


def _task():
    yield _work_in_the_block()


def test_a_block_and_a_task_dump_a_profile_each_only_when_asked(tmp_path, monkeypatch):
    out = tmp_path / "prof"
    monkeypatch.delenv(conn.PROFILE_ENV, raising=False)
    with conn.profile("commit"):
        _work_in_the_block()
    assert list(conn.profiled("read", _task())) == [499500]
    assert not out.exists()
    monkeypatch.setenv(conn.PROFILE_ENV, str(out))
    with conn.profile("commit"):
        _work_in_the_block()
    assert list(conn.profiled("read", _task())) == [499500]
    files = sorted(os.listdir(out))
    assert [f.split("-")[0] for f in files] == ["commit", "read"]
    assert all(f.split("-")[1] == str(os.getpid()) for f in files)
    for f in files:
        functions = {name for _, _, name in pstats.Stats(str(out / f)).stats}
        assert "_work_in_the_block" in functions
