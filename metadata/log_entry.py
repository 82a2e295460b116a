"""One ledger of a log's list, typed: what every reader and writer of logs handles.

Stored as a JSON object -- in format 1 an element of the log record's ``ledgers``
(:mod:`metadata.log_metadata`), in format 2 a whole segment record
(:mod:`metadata.log_segments`) -- whose keys are omitted while unknown:

* ``ledger_id`` -- the ledger (an int >= 0; the only key always there);
* ``state`` -- :data:`OPEN` (its writer may still add to it: only the last one or two ledgers
  of a list) or :data:`CLOSED` (sealed: ``last_entry_id`` and ``length`` are final);
* ``last_entry_id``, ``length`` -- its last entry and byte length, once closed;
* ``offset``, ``byte_offset``, ``closed_ms`` -- stamps: the log offset of its first entry,
  the bytes listed before it, when the list first held it closed (:mod:`metadata.log_segments`);
* ``min_ts``, ``max_ts`` -- the record timestamps (microseconds) its entries span, when the
  writer knew them (the Spark connector's seeks by time skip ledgers with them);
* ``unlisted`` -- true on a format-2 segment record that no longer lists its ledger;
* ``offloaded`` -- once the ledger's entries are also Parquet files (:mod:`bkspark.log.offload`):
  ``{"location": URI of the log's directory, "files": [{"name", "first", "last", "rows",
  "bytes", "crc32c"}, ...], "at": ms, "encoding": ...}``, each file entries ``first..last`` (a
  ``crc32c`` of their payloads, chained in entry order), ``at`` when it was offloaded,
  ``encoding`` (``record``, ``raw`` or ``arrow``) present if the files give back every entry
  byte for byte -- set by one change after the files are complete; ``"on_bookies": false``
  added once the bookies' copy is dropped (the files are then the only one);
* any other key a writer gave (``info`` of ``LogStore.append_ledgers``): kept as written, in
  :attr:`LogLedger.extra`. A known key holding a value of the wrong type is kept there too,
  so a record always reads back as it was written.

``seq`` (format 2): the number of the segment record, which comes from its path and is never
stored in it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from bkspark.errors import BadRequestError

#: the states of a ledger in a log's list: written to (the last ones only) or sealed at its end
CLOSED, OPEN = "closed", "open"

_INT_FIELDS = ("last_entry_id", "length", "offset", "byte_offset", "closed_ms", "min_ts", "max_ts")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class LogLedger:
    """One listed ledger (see the module docstring for each field)."""

    ledger_id: int
    state: str | None = None
    last_entry_id: int | None = None
    length: int | None = None
    offset: int | None = None
    byte_offset: int | None = None
    closed_ms: int | None = None
    min_ts: int | None = None
    max_ts: int | None = None
    unlisted: bool = False
    offloaded: dict | None = None
    extra: dict = field(default_factory=dict)
    seq: int | None = None

    # ---- the stored form -----------------------------------------------------------------
    @classmethod
    def from_dict(cls, obj, seq: int | None = None) -> "LogLedger":
        """The entry a stored JSON object describes. :raises BadRequestError: not an object
        with an int ``ledger_id`` >= 0."""
        if not isinstance(obj, dict) or not _is_int(obj.get("ledger_id")) or obj["ledger_id"] < 0:
            raise BadRequestError(f"bad ledger entry {obj!r} (needs an int ledger_id >= 0)")
        entry = cls(obj["ledger_id"], seq=seq)
        for key, value in obj.items():
            if key == "ledger_id":
                continue
            if key in _INT_FIELDS and (value is None or _is_int(value)):
                setattr(entry, key, value)
            elif key == "state" and value in (OPEN, CLOSED):
                entry.state = value
            elif key == "unlisted" and isinstance(value, bool):
                entry.unlisted = value
            elif key == "offloaded" and isinstance(value, dict):
                entry.offloaded = value
            else:
                entry.extra[key] = value
        return entry

    def to_dict(self) -> dict:
        """The stored JSON object (``seq`` left out)."""
        out: dict = {"ledger_id": self.ledger_id}
        if self.state is not None:
            out["state"] = self.state
        for key in _INT_FIELDS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.unlisted:
            out["unlisted"] = True
        if self.offloaded is not None:
            out["offloaded"] = self.offloaded
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    def set(self, **info) -> "LogLedger":
        """Change fields in place (keys that are not fields go to :attr:`extra`); returns it."""
        for key, value in info.items():
            if key in ("ledger_id", "seq", "extra"):
                raise BadRequestError(f"ledger entry: {key!r} cannot be set this way")
            if key in _INT_FIELDS or key in ("state", "unlisted", "offloaded"):
                setattr(self, key, value)
                self.extra.pop(key, None)
            else:
                self.extra[key] = value
        return self

    def copy(self, **changes) -> "LogLedger":
        return dataclasses.replace(self, extra=dict(self.extra), **changes)

    def with_end(self, end: "LogLedger") -> "LogLedger":
        """A copy recording the ledger closed at the end ``end`` gives (state, last entry,
        length: from its CLOSED ledger metadata)."""
        return self.copy(state=CLOSED, last_entry_id=end.last_entry_id, length=end.length)

    # ---- what it says ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.state == CLOSED

    @property
    def listed(self) -> bool:
        return not self.unlisted

    def entry_count(self) -> int | None:
        """Entries of the ledger once closed (None while open)."""
        if self.closed and self.last_entry_id is not None:
            return self.last_entry_id + 1
        return None

    def sealed_length(self) -> int:
        """Bytes of the ledger once closed (0 while open or unknown)."""
        return (self.length or 0) if self.closed else 0
