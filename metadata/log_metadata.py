"""The ledger-list model of a log (stored at ``/logs/<name>``, changed by compare-and-set).

Serialized form (format version 1)::

    b"bkspark-log-metadata\\t1\\n" + UTF-8 JSON {"name", "ledgers", "writers", "properties"}

* ``ledgers``: the ordered list, each a :class:`~metadata.log_entry.LogLedger` (stored as the
  JSON object that module describes).
* ``writers``: writer id -> last committed sequence number (idempotent appends).
* ``properties``: free-form ``str -> JSON value``.

Cursors are stored separately (see the logs layer). Anything corrupt or of an unknown
version raises :class:`~bkspark.errors.MetadataFormatError`.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from bkspark.errors import BadRequestError, MetadataFormatError
from metadata.log_entry import LogLedger

HEADER = b"bkspark-log-metadata"
FORMAT_VERSION = 1


def encode_record(name: str, version: int, fields: dict) -> bytes:
    """A log record: header, format version, then its fields as canonical JSON."""
    try:
        body = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise BadRequestError(f"log {name}: metadata not JSON-serialisable: {e}") from None
    return HEADER + b"\t" + str(version).encode() + b"\n" + body.encode()


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class LogMetadata:
    name: str
    ledgers: list = field(default_factory=list)
    writers: dict = field(default_factory=dict)
    properties: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def validate(self) -> "LogMetadata":
        if not isinstance(self.name, str) or not self.name:
            raise BadRequestError(f"log name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.ledgers, list):
            raise BadRequestError("log ledgers must be a list")
        seen = set()
        for entry in self.ledgers:
            if not isinstance(entry, LogLedger) or not _is_int(entry.ledger_id) \
                    or entry.ledger_id < 0:
                raise BadRequestError(f"log {self.name}: bad ledger entry {entry!r} "
                                      "(needs an int ledger_id >= 0)")
            if entry.ledger_id in seen:
                raise BadRequestError(f"log {self.name}: ledger {entry.ledger_id} listed twice")
            seen.add(entry.ledger_id)
        if not isinstance(self.writers, dict) or not all(
                isinstance(k, str) and _is_int(v) for k, v in self.writers.items()):
            raise BadRequestError(f"log {self.name}: writers must be dict[str, int]")
        if not isinstance(self.properties, dict) or not all(
                isinstance(k, str) for k in self.properties):
            raise BadRequestError(f"log {self.name}: properties must be a dict with str keys")
        if self.format_version != FORMAT_VERSION:
            raise BadRequestError(f"log {self.name}: unsupported format_version "
                                  f"{self.format_version}")
        return self

    def serialize(self) -> bytes:
        self.validate()
        return encode_record(self.name, FORMAT_VERSION, {
            "name": self.name, "ledgers": [e.to_dict() for e in self.ledgers],
            "writers": self.writers,
            "properties": self.properties})

    @classmethod
    def deserialize(cls, data: bytes) -> "LogMetadata":
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MetadataFormatError(f"log metadata must be bytes, got {type(data).__name__}")
        head, nl, body = bytes(data).partition(b"\n")
        magic, tab, ver = head.partition(b"\t")
        if not nl or magic != HEADER or not tab:
            raise MetadataFormatError(f"corrupt log metadata: unknown header {head[:60]!r}")
        if not ver.isdigit() or len(ver) > 6:
            raise MetadataFormatError(f"corrupt log metadata: bad format version {ver[:20]!r}")
        if int(ver) != FORMAT_VERSION:
            raise MetadataFormatError(f"unsupported log metadata format version {int(ver)} "
                                      f"(this bkspark reads version {FORMAT_VERSION})")
        try:
            obj = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise MetadataFormatError(f"corrupt log metadata: bad JSON body: {e}") from None
        if not isinstance(obj, dict) or set(obj) != {"name", "ledgers", "writers", "properties"}:
            raise MetadataFormatError("corrupt log metadata: expected exactly the fields "
                                      "name, ledgers, writers, properties")
        try:
            if not isinstance(obj["ledgers"], list):
                raise BadRequestError("log ledgers must be a list")
            md = cls(name=obj["name"], ledgers=[LogLedger.from_dict(e) for e in obj["ledgers"]],
                     writers=obj["writers"], properties=obj["properties"])
            return md.validate()
        except BadRequestError as e:
            raise MetadataFormatError(f"corrupt log metadata: {e}") from None

    # ---- queries and modified copies ------------------------------------------------------

    def ledger_ids(self) -> list[int]:
        return [e.ledger_id for e in self.ledgers]

    def last_ledger(self) -> LogLedger | None:
        return self.ledgers[-1].copy() if self.ledgers else None

    def copy(self, **changes) -> "LogMetadata":
        base = dict(ledgers=[e.copy() for e in self.ledgers], writers=dict(self.writers),
                    properties=json.loads(json.dumps(self.properties)))
        base.update(changes)
        return dataclasses.replace(self, **base)

    def with_ledger(self, ledger_id: int, **info) -> "LogMetadata":
        """Append a ledger (``info``: fields of its :class:`LogLedger`, other keys kept)."""
        return self.copy(ledgers=[e.copy() for e in self.ledgers]
                         + [LogLedger(ledger_id).set(**info)]).validate()

    def with_ledger_updated(self, ledger_id: int, **info) -> "LogMetadata":
        ledgers = [e.copy() for e in self.ledgers]
        for e in ledgers:
            if e.ledger_id == ledger_id:
                e.set(**info)
                return self.copy(ledgers=ledgers).validate()
        raise BadRequestError(f"log {self.name} has no ledger {ledger_id}")

    # ---- offsets: one number per entry of the log, in log order (Kafka's offsets) --------
    def offsets(self) -> list[int | None]:
        """The offset of entry 0 of each listed ledger: its recorded ``"offset"``, else the
        previous ledger's offset plus its entry count once that ledger is closed (the first
        ledger of a log that never recorded one: 0); None where it cannot be known yet.

        An entry's offset is its ledger's offset plus its entry id. Offsets only grow along
        the list, and a ledger keeps its offset when ledgers before it are truncated away
        (the logs layer stores them: :meth:`with_offsets`)."""
        out: list[int | None] = []
        nxt: int | None = 0
        for e in self.ledgers:
            base = e.offset if e.offset is not None else nxt
            out.append(base)
            count = e.entry_count()
            nxt = base + count if base is not None and count is not None else None
        return out

    def with_offsets(self) -> "LogMetadata":
        """A copy whose ledger entries record their offset wherever it is known."""
        ledgers = []
        for e, base in zip(self.ledgers, self.offsets()):
            ledgers.append(e.copy(offset=base) if base is not None else e.copy())
        return self.copy(ledgers=ledgers)

    def without_ledgers(self, ledger_ids) -> "LogMetadata":
        drop = set(ledger_ids)
        return self.copy(ledgers=[e.copy() for e in self.ledgers if e.ledger_id not in drop])

    def with_writer_sequence(self, writer_id: str, sequence: int) -> "LogMetadata":
        writers = dict(self.writers)
        writers[writer_id] = sequence
        return self.copy(writers=writers).validate()
