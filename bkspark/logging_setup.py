"""Structured logging for bkspark processes: ``key=value`` text lines or JSON lines."""
from __future__ import annotations

import json
import logging
import sys
import threading
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "msg": record.getMessage(),
               "thread": record.threadName}
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s.%(msecs)03d level=%(levelname)s logger=%(name)s %(message)s",
            "%Y-%m-%dT%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("kazoo").setLevel(logging.WARNING)


class LogBudget:
    """At most ``lines`` log lines per ``per_s`` seconds for one kind of event a peer can
    cause (a refused request, a refused connection); the lines withheld are counted and said
    with the next line allowed. Thread-safe."""

    def __init__(self, lines: int = 10, per_s: float = 60.0) -> None:
        self.lines, self.per_s = lines, per_s
        self._window = 0.0
        self._used = 0
        self.withheld = 0
        self._lock = threading.Lock()

    def allow(self) -> int | None:
        """None: do not log this one; else how many were withheld before it (log them)."""
        now = time.monotonic()
        with self._lock:
            if now - self._window >= self.per_s:
                self._window, self._used = now, 0
            if self._used >= self.lines:
                self.withheld += 1
                return None
            self._used += 1
            withheld, self.withheld = self.withheld, 0
            return withheld
