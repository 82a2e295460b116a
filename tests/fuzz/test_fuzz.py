"""Issue 49: the bookie's parsers under coverage-guided fuzzing (bkspark.testing.fuzz).

* every target runs ``BKSPARK_FUZZ_SECONDS`` (20 by default) from its seed corpus
  (tests/fuzz/corpus/TARGET) on the storage engine built with AddressSanitizer and
  UndefinedBehaviorSanitizer: no finding;
* every input a run ever found (tests/fuzz/crashes/TARGET) is replayed: fixed, and staying so;
* the campaign catches what it exists to catch: with a bounds check taken out of the AddBatch
  walk, the add_batch target reports AddressSanitizer's heap-buffer-overflow within a minute.

Needs clang (Debian: clang) and atheris (PyPI); `.ci/run` installs both, and without them
the tests fail under BKSPARK_REQUIRE_ALL=1 (skip otherwise).
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

from bkspark.testing.fuzz import TARGETS
from metadata.testing import skip_or_fail

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SECONDS = int(os.environ.get("BKSPARK_FUZZ_SECONDS", "20"))
CRASHES = sorted(glob.glob(os.path.join(HERE, "crashes", "*", "*")))


@pytest.fixture(scope="module")
def fuzz_build(tmp_path_factory):
    try:
        import atheris  # noqa: F401
    except ImportError:
        skip_or_fail("atheris is not installed (pip install atheris)")
    if shutil.which("clang") is None:
        skip_or_fail("clang is not installed (Debian: apt-get install clang)")
    from bkspark.testing.fuzz import build
    return build.build(str(tmp_path_factory.mktemp("fuzz-build")))


def _fuzz(target: str, native: str, work, seconds: int, *extra: str, **env_vars):
    from bkspark.testing.fuzz import build
    corpus = work / "corpus"
    shutil.copytree(os.path.join(HERE, "corpus", target), corpus)
    env = build.environment()
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_vars)
    return subprocess.run(
        [sys.executable, "-m", "bkspark.testing.fuzz", target, "--native", native,
         f"-max_total_time={seconds}", "-timeout=20", "-rss_limit_mb=4096",
         f"-artifact_prefix={work}/", *extra, str(corpus)],
        cwd=work, env=env, capture_output=True, text=True, timeout=seconds + 240)


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_runs_clean_for_its_time(fuzz_build, tmp_path, target):
    done = _fuzz(target, fuzz_build, tmp_path, SECONDS)
    findings = glob.glob(str(tmp_path / "crash-*")) + glob.glob(str(tmp_path / "timeout-*"))
    assert done.returncode == 0 and not findings, (
        f"the {target} fuzz target found {findings} (copy it to tests/fuzz/crashes/{target}/ "
        f"once fixed):\n{done.stderr[-6000:]}")
    assert "Done " in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("path", CRASHES, ids=[os.path.relpath(p, HERE) for p in CRASHES])
def test_inputs_the_fuzzers_found_stay_fixed(path):
    """Each input in the normal build, in this process: the target's checks hold."""
    from bkspark.testing.fuzz import targets
    target = os.path.basename(os.path.dirname(path))
    one = _targets.get(target) or _targets.setdefault(target, targets.setup(target))
    with open(path, "rb") as f:
        one(f.read())


_targets: dict = {}


def test_the_campaign_reports_a_bounds_check_taken_out(fuzz_build, tmp_path):
    """The AddBatch walk without its check that a length-delimited field ends inside its
    message: the add_batch target finds an input that reads past the message, and
    AddressSanitizer reports it -- with the target's own checks off (they catch it first:
    the walk then takes what protobuf calls corrupt), so the sanitizer is shown to work."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(REPO, "bookie_native"), src)
    path = src / "addframe.c"
    code = path.read_text()
    check = "if (get_varint(pp, end, &n) < 0 || n > (uint64_t)(end - *pp)) {"
    assert check in code, "the bounds check this test removes moved: update the test"
    path.write_text(code.replace(check, "if (get_varint(pp, end, &n) < 0) {"))
    from bkspark.testing.fuzz import build
    broken = build.build(str(tmp_path / "build"), source_dir=str(src))
    done = _fuzz("add_batch", broken, tmp_path, 60, BKSPARK_FUZZ_CHECK_RESULTS="0")
    assert done.returncode != 0, "60 s of fuzzing missed a removed bounds check"
    assert "ERROR: AddressSanitizer" in done.stderr, done.stderr[-4000:]
    assert glob.glob(str(tmp_path / "crash-*"))
