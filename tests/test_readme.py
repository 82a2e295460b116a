"""README.md, the pages of docs/ and bkspark/spark/README.md run as written.

Every ```bash and ```python block of them runs, in order, from an empty directory
outside the repository, with a fresh HOME (so the user's default local cluster is the one the
README starts) and without PYTHONPATH or BKSPARK_* variables: only what `make install` gives a
user. A block preceded by ``<!-- not run by tests/test_readme.py: why -->`` is skipped, and
must say why. Python blocks share one interpreter and namespace, as a user pasting them into
one session would; shell blocks run with ``bash -e``. The order: README.md (its quickstart
starts the cluster), then the pages of :data:`PAGES`; the Spark README's blocks run after
the tour's Spark section, before the last block of all (operations.md's, which stops the
cluster).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from metadata.testing import skip_or_fail

pytestmark = [pytest.mark.integration, pytest.mark.spark]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_RUN = "<!-- not run by tests/test_readme.py:"
FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(path: str) -> list[tuple[str, int, str]]:
    """``(language, line, code)`` of the runnable bash/python blocks of a markdown file."""
    out, lines, i = [], open(path).read().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        i += 1
        while not lines[i].startswith("```"):
            i += 1
        skipped = start > 0 and lines[start - 1].startswith(NOT_RUN)
        if skipped:
            assert lines[start - 1].rstrip().endswith("-->") and \
                len(lines[start - 1]) > len(NOT_RUN) + 8, f"{path}:{start}: say why it is not run"
        if lang in ("bash", "python") and not skipped:
            out.append((lang, start + 2, "\n".join(lines[start + 1:i])))
        i += 1
    return out


#: the pages after README.md, in the order they run (a page none of whose blocks runs is
#: still listed: its not-run blocks must say why)
PAGES = ["docs/tour.md", "docs/operations.md", "docs/security.md", "docs/metadata.md",
         "docs/development.md"]


def walkthrough() -> list[tuple[str, str, int, str]]:
    main = [(page, *b) for page in ["README.md", *PAGES]
            for b in blocks(os.path.join(REPO, page))]
    spark = [("bkspark/spark/README.md", *b)
             for b in blocks(os.path.join(REPO, "bkspark", "spark", "README.md"))]
    return main[:-1] + spark + main[-1:]


RUNNER = textwrap.dedent('''
    import json, subprocess, sys
    namespace = {"__name__": "__readme__"}
    for doc, lang, line, code in json.load(open(sys.argv[1])):
        print(f"=== {doc}:{line} ({lang})", flush=True)
        if lang == "bash":
            subprocess.run(["bash", "-e", "-c", code], check=True)
        else:
            exec(compile(code, f"{doc}:{line}", "exec"), namespace)
        sys.stdout.flush()
    print("=== all blocks ran", flush=True)
''')


def test_the_readmes_blocks_are_found():
    steps = walkthrough()
    docs = [(doc, lang) for doc, lang, _, _ in steps]
    assert ("bkspark/spark/README.md", "python") in docs
    assert "bkspark localcluster --data-dir ./bkspark-data --background" in steps[0][3]
    assert "localcluster --stop" in steps[-1][3]
    assert not any("/abs/path" in code.replace('"sqlite:///abs/meta.db"', "")
                   for _, _, _, code in steps), "no placeholder paths in blocks that run"


def test_the_readmes_run_as_written(tmp_path):
    import shutil
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        skip_or_fail("no Java: the README's Spark sections need a JVM")
    import json
    work = tmp_path / "user"
    work.mkdir()
    (tmp_path / "steps.json").write_text(json.dumps(walkthrough()))
    (tmp_path / "runner.py").write_text(RUNNER)
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("BKSPARK_", "PYSPARK_"))}
    scripts = sysconfig.get_path("scripts")                # where `bkspark` was installed
    env.update(HOME=str(tmp_path / "home"),
               PATH=os.pathsep.join([scripts, os.path.dirname(sys.executable),
                                     env.get("PATH", "")]))
    r = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "steps.json")],
                       cwd=work, env=env, capture_output=True, text=True, timeout=900)
    try:
        assert r.returncode == 0, f"stdout:\n{r.stdout[-6000:]}\nstderr:\n{r.stderr[-6000:]}"
        out = r.stdout
        assert "=== all blocks ran" in out
        assert re.search(r"'my-consumer': \(Position\(ledger_id=\d+, entry_id=\d+\), 0\)", out), out
        assert "\n1001\n" in out                           # the streaming copy copied everything
        # rows routed by their topic column (bkspark/spark/README.md, "Exactly once")
        assert "[Row(log='orders-eu', count=2), Row(log='orders-us', count=1)]" in out
        assert "stopped the local cluster" in out
    finally:
        subprocess.run([sys.executable, "-m", "bkspark.cli.main", "localcluster", "--stop",
                        "--data-dir", str(work / "bkspark-data")], env=env,
                       capture_output=True, timeout=180)
