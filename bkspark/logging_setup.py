"""Structured logging for bkspark processes: ``key=value`` text lines or JSON lines, to
stderr or to a file rotated by size; what peers can cause is bounded (:class:`LogBudget`,
:class:`PeerErrorFilter`)."""
from __future__ import annotations

import json
import logging
import logging.handlers
import sys
import threading
import time

#: loggers of libraries that log a peer's malformed request with its traceback at ERROR
PEER_ERROR_LOGGERS = ("grpc._server", "grpc._common")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "msg": record.getMessage(),
               "thread": record.threadName}
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(level: str = "INFO", fmt: str = "text", file: str = "",
                  max_mb: int = 64, backups: int = 5) -> None:
    """Configure the root logger: lines to stderr, or -- with ``file`` -- to that file,
    rotated at ``max_mb`` MiB keeping ``backups`` old files (at most (backups + 1) x max_mb on
    disk). gRPC's lines about a peer's malformed request go through :class:`PeerErrorFilter`."""
    if file:
        handler = logging.handlers.RotatingFileHandler(
            file, maxBytes=max_mb << 20, backupCount=backups, encoding="utf-8")
    else:
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
    peer_errors = PeerErrorFilter()
    for name in PEER_ERROR_LOGGERS:
        logger = logging.getLogger(name)
        logger.filters[:] = [f for f in logger.filters if not isinstance(f, PeerErrorFilter)]
        logger.addFilter(peer_errors)


class PeerErrorFilter(logging.Filter):
    """For a library logger that reports a peer's bad request (a message that does not
    parse, a handler's exception) at ERROR with its traceback: the line is kept as a WARNING
    without the traceback (that only at DEBUG), and at most :class:`LogBudget`'s lines a
    minute pass -- a peer sending garbage cannot fill the disk with tracebacks."""

    def __init__(self, lines: int = 10, per_s: float = 60.0) -> None:
        super().__init__()
        self.budget = LogBudget(lines, per_s)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        withheld = self.budget.allow()
        if withheld is None:
            return False
        if record.exc_info and not logging.getLogger().isEnabledFor(logging.DEBUG):
            err = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {err!r}" if err is not None else \
                record.getMessage()
            record.args = None
            record.exc_info = record.exc_text = None
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        if withheld:
            record.msg = f"{record.getMessage()} ({withheld} more such lines withheld)"
            record.args = None
        return True


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
