"""The project's words: docs and comments state figures with their date, command and
configuration, never which work session measured them (issue 27, item 10)."""
import pathlib
import re
import subprocess

REPO = pathlib.Path(__file__).resolve().parent.parent
#: "session 15", "sessions 4-5", "session 6's runs"; not durations such as "session 4 s"
NARRATION = re.compile(r"\bsessions? \d+(?:-\d+)?(?:'s)?(?![\d.]| ?(?:s|ms|seconds?)\b)",
                       re.IGNORECASE)


def tracked(*patterns):
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    return [REPO / p for p in out]


def test_docs_and_comments_do_not_narrate_work_sessions():
    found = []
    for path in tracked("*.md", "*.py", "*.c", "*.h", "Makefile"):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if NARRATION.search(line) and path.name != "test_docs_words.py":
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "state the date, command and configuration instead:\n" + "\n".join(found)


def test_the_pattern_tells_narration_from_durations():
    assert NARRATION.search("in the runs of sessions 4-5") and NARRATION.search("session 15's runs")
    assert not NARRATION.search("a ZooKeeper session 4 s long")
    assert not NARRATION.search("the session timeout of 10 seconds")
