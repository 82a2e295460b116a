"""The project's words: docs and comments state figures with their date, command and
configuration, never which work session measured them (issue 27, item 10)."""
import pathlib
import re
import subprocess

REPO = pathlib.Path(__file__).resolve().parent.parent
#: the word followed by a session number or range ("<word> 15", "<words> 4-5", "<word> 6's
#: runs"); not a duration ("<word> 4 s", "<word> timeout of 10 seconds")
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
            if NARRATION.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "state the date, command and configuration instead:\n" + "\n".join(found)


def test_the_pattern_tells_narration_from_durations():
    word = "session"        # examples built here, so that this file states none itself
    assert NARRATION.search(f"in the runs of {word}s 4-5")
    assert NARRATION.search(f"{word} 15's runs")
    assert not NARRATION.search(f"a ZooKeeper {word} 4 s long")
    assert not NARRATION.search(f"the {word} timeout of 10 seconds")
