"""Automatic retention of logs: a per-log policy by age and by size, applied from the head.

A log's policy is its head property ``retention`` (:class:`RetentionPolicy`; no property:
keep everything). :func:`enforce` applies it to one log; the background service that calls
it for every log (:mod:`bkspark.recovery.retention`) runs in ``bkspark autorecovery``, in a
bookie started with ``--autorecovery`` and in ``bkspark localcluster``.

Rules of one pass (those of Kafka's ``retention.ms`` / ``retention.bytes``, cursors as in
Pulsar):

* Whole ledgers leave from the head of the list, oldest first. A ledger goes when it was
  closed more than ``ms`` ago (its segment's ``closed_ms``; a segment listed before that stamp
  existed: its ledger's creation time) -- stamped and judged on the metadata store's clock,
  never a host's (:mod:`metadata.clock`); an enforcer whose own clock is off the store's by
  more than the tolerance removes nothing -- or while the log without it still holds at least
  ``bytes`` bytes (so the log stays within one ledger of the limit; bytes of closed ledgers).
  The scan stops at the first ledger to keep, so a pass reads the segments it removes plus a
  few.
* Never the last listed ledger (the log's offsets continue from it), never one still open.
* Cursors: by default the cut stops at the ledger of the slowest cursor that moved within
  ``cursor_active_ms`` (Pulsar's backlog: what a live consumer has not read stays; a cursor
  idle for longer holds nothing, and a cursor record without a time -- written before cursors
  carried one -- counts as active). The cursor's own ledger stays even once read to its end
  (where it sits in the list is known only while it is listed); a cursor whose ledger the log
  does not list (cut by a forced truncation, or before it) holds everything while active: its
  reader starts over from the log's start. With ``pass_cursors`` (Kafka's semantics) cursors
  hold nothing: a reader behind the cut finds its position gone, and a Spark query fails with
  ``failOnDataLoss`` (or, with ``failOnDataLoss=false``, continues from the log's start); so
  does a Spark task whose ledger a cut removed after its read was planned.
* The cut is one truncation (:meth:`LogStore.truncate_segments`): one transaction on the
  head whatever it removes; the ledgers are then deleted (that transaction proves them
  unlisted; their records go in batched transactions), with the Parquet files of those
  offloaded (:mod:`bkspark.log.offload`), and the truncated segment records
  removed in batches, each batch read before its transaction so that commits racing for the
  head are not slowed. A pass removes at most ``max_ledgers`` ledgers; the next pass goes on.

A cursor created while a pass runs is not seen by it (cursors are separate records): a
consumer starting at the head of a log that retention is cutting may find its start gone.
"""
from __future__ import annotations

import logging
import math
import re
from dataclasses import asdict, dataclass, field

from bkspark.errors import BadRequestError, NoSuchLedgerError
from metadata.log_entry import LogLedger

log = logging.getLogger("bkspark.log.retention")

PROPERTY = "retention"          # the head property holding a log's policy
#: cursors that moved within this time hold retention back, by default (7 days)
DEFAULT_CURSOR_ACTIVE_MS = 7 * 24 * 3600 * 1000
#: ledgers one pass removes at most (the next pass goes on)
MAX_LEDGERS_PER_PASS = 10_000

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d|w)?\s*$", re.I)
_DURATION_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                "d": 86_400_000, "w": 7 * 86_400_000}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib)?\s*$", re.I)
_SIZE_BYTES = {None: 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20,
               "mb": 1000 ** 2, "mib": 1 << 20, "g": 1 << 30, "gb": 1000 ** 3, "gib": 1 << 30,
               "t": 1 << 40, "tb": 1000 ** 4, "tib": 1 << 40}


def _quantity(text, what: str, pattern, units: dict, hint: str, zero: bool = False) -> int:
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = text, None
    else:
        m = pattern.match(str(text))
        if not m:
            raise BadRequestError(f"{what} {text!r}: give {hint}")
        value, unit = float(m.group(1)), (m.group(2) or "").lower() or None
    if value * units[unit] >= 1 << 63:          # (also inf: a float past its range)
        raise BadRequestError(f"{what} {text!r} is too large: give at most 2^63 - 1 "
                              "(bytes or milliseconds)")
    amount = int(value * units[unit])
    if amount < 0 or amount == 0 and not zero:
        raise BadRequestError(f"{what} {text!r} must be more than 0")
    return amount


def parse_duration_ms(text, what: str = "retention time", zero: bool = False) -> int:
    """``"7d"``, ``"12h"``, ``"90s"``, ``"500ms"`` or a number of milliseconds -> ms (0 only
    with ``zero``)."""
    return _quantity(text, what, _DURATION, _DURATION_MS,
                     "milliseconds or a number with a unit (500ms, 90s, 30m, 12h, 7d, 2w)", zero)


def parse_size_bytes(text, what: str = "retention size") -> int:
    """``"10GiB"``, ``"500MB"``, ``"64k"`` or a number of bytes -> bytes."""
    return _quantity(text, what, _SIZE, _SIZE_BYTES,
                     "bytes or a number with a unit (64KiB, 500MB, 10GiB, 1TiB)")


@dataclass(frozen=True)
class RetentionPolicy:
    """How much of a log to keep (None: no limit of that kind; both None: keep everything).

    ``ms`` -- keep ledgers closed within this many milliseconds (Kafka's ``retention.ms``);
    ``bytes`` -- keep about this many bytes (Kafka's ``retention.bytes``); ``pass_cursors`` --
    remove data cursors have not read (Kafka) instead of keeping it for the slowest active
    cursor (Pulsar, the default); ``cursor_active_ms`` -- a cursor that has not moved for
    longer holds nothing back."""

    ms: int | None = None
    bytes: int | None = None
    pass_cursors: bool = False
    cursor_active_ms: int = DEFAULT_CURSOR_ACTIVE_MS

    def __post_init__(self):
        for key in ("ms", "bytes"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise BadRequestError(f"retention {key} must be a positive int or None, got {v!r}")
        if not isinstance(self.pass_cursors, bool):
            raise BadRequestError(f"retention pass_cursors must be a bool, got {self.pass_cursors!r}")
        v = self.cursor_active_ms
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise BadRequestError(f"retention cursor_active_ms must be a positive int, got {v!r}")

    @property
    def keeps_everything(self) -> bool:
        return self.ms is None and self.bytes is None

    def to_property(self) -> dict:
        return asdict(self)

    @classmethod
    def from_property(cls, value) -> "RetentionPolicy | None":
        """The policy a head property holds (None: none set)."""
        if value is None:
            return None
        if not isinstance(value, dict) or not set(value) <= set(cls.__dataclass_fields__):
            raise BadRequestError(f"bad retention property {value!r}")
        return cls(**value)

    def describe(self) -> str:
        if self.keeps_everything:
            return "keep everything"
        parts = []
        if self.ms is not None:
            parts.append(f"{_human_ms(self.ms)}")
        if self.bytes is not None:
            parts.append(f"{_human_bytes(self.bytes)}")
        parts.append("passes cursors" if self.pass_cursors
                     else f"keeps cursors active within {_human_ms(self.cursor_active_ms)}")
        return ", ".join(parts)


def _human_ms(ms: int) -> str:
    for unit in ("w", "d", "h", "min", "s"):
        if ms % _DURATION_MS[unit] == 0:
            return f"{ms // _DURATION_MS[unit]}{unit}"
    return f"{ms}ms"


def _human_bytes(n: int) -> str:
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if n % _SIZE_BYTES[unit.lower()] == 0:
            return f"{n // _SIZE_BYTES[unit.lower()]}{unit}"
    return f"{n}B"


@dataclass
class Cut:
    """What one pass decided: truncate before segment ``before`` (None: nothing to remove)."""

    before: int | None = None
    by_age: int = 0                 # ledgers removed because they are older than the policy
    by_size: int = 0                # ... because the log is over its size
    held_by: str | None = None      # the cursor that stopped the cut short
    removed: list = field(default_factory=list)     # ledger ids deleted
    #: nothing to cut before this time (the store's ms; inf: never) while the log's list is
    #: unchanged -- None when cursors decided (they move without the list changing)
    quiet_until_ms: float | None = None


def plan(logs, name: str, policy: RetentionPolicy, now_ms: int | None = None,
         max_ledgers: int = MAX_LEDGERS_PER_PASS) -> Cut:
    """Where a pass of ``policy`` cuts log ``name`` (module docstring); reads the segments it
    would remove, the log's two ends and its cursors. Ages are judged at ``now_ms`` (default:
    the metadata store's time, the clock that stamped them -- :mod:`metadata.clock`)."""
    now = logs.store.clock.now_ms() if now_ms is None else now_ms
    cut = Cut(quiet_until_ms=math.inf)
    if policy.keeps_everything:
        return cut
    first, _ = logs.bounds(name)
    last = logs.last_listed(name)
    if last is None:
        return cut
    excess = None
    if policy.bytes is not None:
        excess = logs.closed_bytes(name) - policy.bytes
    reasons: list[tuple[int, str]] = []     # (seq, "age" | "size") of each ledger to remove
    lo, step = first, 64
    while lo < last.seq and len(reasons) < max_ledgers:
        chunk = logs.segments(name, lo, min(last.seq, lo + step))
        for entry in chunk:
            if not entry.closed or len(reasons) >= max_ledgers:
                break
            closed = closed_at(logs, entry) if policy.ms is not None else None
            if closed is not None and closed <= now - policy.ms:
                reasons.append((entry.seq, "age"))
            elif excess is not None and excess - entry.sealed_length() >= 0:
                reasons.append((entry.seq, "size"))
            else:
                if closed is not None:          # the first ledger to keep ages out then
                    cut.quiet_until_ms = closed + policy.ms
                break
            if excess is not None:
                excess -= entry.sealed_length()
        else:
            lo, step = lo + step, min(step * 2, 1024)
            continue
        break
    if not reasons:
        return cut
    cut.before, cut.quiet_until_ms = reasons[-1][0] + 1, None
    if not policy.pass_cursors:
        for cursor, (position, moved_ms) in logs.cursor_records(name).items():
            if moved_ms is not None and now - moved_ms > policy.cursor_active_ms:
                continue
            at = logs.entry_of(name, position.ledger_id) if position.ledger_id >= 0 else None
            hold = first if at is None else at.seq
            if hold < cut.before:
                cut.before, cut.held_by = hold, cursor
    kept = [why for seq, why in reasons if seq < cut.before]
    cut.by_age, cut.by_size = kept.count("age"), kept.count("size")
    if not kept:
        cut.before = None
    return cut


def closed_at(logs, entry: LogLedger) -> int | None:
    """When ``entry``'s ledger was closed in the list (ms); for a segment listed before the
    stamp existed, its ledger's creation time (None if that is unknown too)."""
    if entry.closed_ms is not None:
        return entry.closed_ms
    try:
        return logs.bk.ledger_metadata(entry.ledger_id).ctime_ms or None
    except NoSuchLedgerError:
        return None


def enforce(logs, name: str, now_ms: int | None = None,
            max_ledgers: int = MAX_LEDGERS_PER_PASS) -> Cut:
    """Apply the log's policy once (module docstring): plan the cut, truncate, delete the
    ledgers, collect the truncated records. A log without a policy is left alone.

    :raises ClockSkewError: (``now_ms`` not given) this host's clock is off the store's by
        more than the tolerance: nothing is removed (:mod:`metadata.clock`)."""
    policy = logs.retention(name)
    if policy is None:
        return Cut()
    if now_ms is None and not policy.keeps_everything:
        now_ms = logs.store.clock.check_skew(f"retention of log {name}")
    cut = plan(logs, name, policy, now_ms, max_ledgers)
    if cut.before is None:
        logs.collect_truncated(name)    # what an earlier cut left (its collection paused)
        return cut
    cut.removed = logs.truncate_segments(name, cut.before)     # (offloaded files too)
    if cut.removed:
        log.info("log %s: retention (%s) removed %d ledgers (%d by age, %d by size)%s", name,
                 policy.describe(), len(cut.removed), cut.by_age, cut.by_size,
                 f"; held at cursor {cut.held_by!r}" if cut.held_by else "")
    return cut
