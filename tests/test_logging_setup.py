"""Daemon logs cannot fill a disk (issue 49): a log file rotates by size, and what a peer's
malformed requests make gRPC log passes a few lines a minute, without tracebacks."""
from __future__ import annotations

import logging

import pytest

from bkspark.logging_setup import LogBudget, PeerErrorFilter, setup_logging


@pytest.fixture
def restore_root():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    for name in ("grpc._server", "grpc._common"):
        logging.getLogger(name).filters.clear()


def test_a_log_file_rotates_by_size_keeping_its_backups(tmp_path, restore_root):
    path = tmp_path / "bookie.log"
    setup_logging("INFO", "text", str(path), max_mb=1, backups=2)
    line = "x" * 1000
    for _ in range(5000):                       # ~5 MiB
        logging.getLogger("bkspark.test").info(line)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["bookie.log", "bookie.log.1", "bookie.log.2"], files
    assert all(p.stat().st_size <= (1 << 20) + 2000 for p in tmp_path.iterdir())


def test_peer_errors_pass_as_a_few_warnings_without_tracebacks(tmp_path, restore_root):
    path = tmp_path / "bookie.log"
    setup_logging("INFO", "text", str(path))
    grpc_log = logging.getLogger("grpc._server")
    for _ in range(100):
        try:
            raise ValueError("Error parsing message")
        except ValueError:
            grpc_log.exception("Exception deserializing request!")
    for handler in logging.getLogger().handlers:
        handler.flush()
    text = path.read_text()
    lines = text.splitlines()
    assert len(lines) == 10 and "Traceback" not in text, lines
    assert all("level=WARNING" in line and "Error parsing message" in line for line in lines)


def test_the_budget_says_what_it_withheld():
    budget = LogBudget(lines=2, per_s=3600)
    assert [budget.allow() for _ in range(5)] == [0, 0, None, None, None]
    assert budget.withheld == 3


def test_at_debug_the_traceback_stays(restore_root, caplog):
    logging.getLogger().setLevel(logging.DEBUG)
    record = logging.LogRecord("grpc._server", logging.ERROR, __file__, 1, "boom", None, None)
    try:
        raise KeyError("k")
    except KeyError:
        import sys
        record.exc_info = sys.exc_info()
    assert PeerErrorFilter().filter(record) and record.exc_info is not None
    assert record.levelname == "WARNING"
