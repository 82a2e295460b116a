"""The ledger metadata model and its versioned serialized form.

Serialized form (format version 2)::

    b"bkspark-ledger-metadata\\t2\\n" + UTF-8 JSON object

The JSON object holds exactly the fields of :class:`LedgerMetadata` (bytes base64-encoded;
``keys`` an object ``{scheme, salt, iterations, master_key, mac_key}``, see
:mod:`metadata.ledger_keys`). :meth:`LedgerMetadata.deserialize` rejects anything else —
unknown header or version, bad JSON, missing/extra/mistyped fields, invalid quorums — with
:class:`~bkspark.errors.MetadataFormatError`; it never fills in defaults.

Format 1 (before 2026-11-27) stored the ledger's ``password`` in place of ``keys``; it is
still read, as the ``sha1`` key record of that password (the password itself is dropped), and
the record's next write is format 2.
"""
from __future__ import annotations

import base64
import binascii
import bisect
import dataclasses
import enum
import json
import time
from dataclasses import dataclass, field

from bkspark.errors import BadRequestError, MetadataFormatError

from .ledger_keys import KeyRecord

HEADER = b"bkspark-ledger-metadata"
FORMAT_VERSION = 2
FORMAT_VERSIONS_READ = (1, 2)
DIGEST_TYPES = ("crc32c", "hmac", "crc32", "dummy")
MAX_LEDGER_ID = 2 ** 63 - 1


class LedgerState(str, enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"

    def __str__(self):
        return self.value


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class LedgerMetadata:
    """Metadata of one ledger. Treat as immutable: use the ``with_*`` helpers, which return
    modified copies (the store's record only changes through a CAS write)."""

    ledger_id: int = -1  # -1 until the ledger manager assigns one
    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    digest_type: str = "crc32c"
    #: what the metadata keeps of the password (:mod:`metadata.ledger_keys`); required
    keys: KeyRecord | None = None
    #: sorted ``[(first_entry_id, [bookie_id, ...]), ...]``; the first starts at entry 0
    ensembles: list = field(default_factory=list)
    ctime_ms: int = 0
    custom_metadata: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def __post_init__(self):
        # normalise segments to (first_entry_id, [bookies]) so that equality does not depend
        # on whether a caller used lists or tuples; garbage is left for validate() to report
        if isinstance(self.ensembles, (list, tuple)):
            self.ensembles = [
                (seg[0], list(seg[1])) if isinstance(seg, (list, tuple)) and len(seg) == 2
                and isinstance(seg[1], (list, tuple)) else seg
                for seg in self.ensembles]
        if isinstance(self.state, str) and not isinstance(self.state, LedgerState):
            try:
                self.state = LedgerState(self.state)
            except ValueError:
                pass  # validate() reports it

    # ---- validation ----------------------------------------------------------------------

    def validate(self) -> "LedgerMetadata":
        """Check every invariant; return self. :raises BadRequestError: what is wrong."""
        for name in ("ledger_id", "ensemble_size", "write_quorum", "ack_quorum",
                     "last_entry_id", "length", "ctime_ms", "format_version"):
            if not _is_int(getattr(self, name)):
                raise BadRequestError(f"ledger metadata: {name} must be an int, "
                                      f"got {getattr(self, name)!r}")
        e, qw, qa = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not e >= qw >= qa >= 1:
            raise BadRequestError(
                f"invalid quorums: need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                f"ensemble_size={e}, write_quorum={qw}, ack_quorum={qa}")
        if not -1 <= self.ledger_id <= MAX_LEDGER_ID:
            raise BadRequestError(f"ledger metadata: ledger_id {self.ledger_id} out of range")
        if not isinstance(self.state, LedgerState):
            raise BadRequestError(f"ledger metadata: state must be a LedgerState, "
                                  f"got {self.state!r}")
        if self.last_entry_id < -1:
            raise BadRequestError(f"ledger metadata: last_entry_id {self.last_entry_id} < -1")
        if self.length < 0:
            raise BadRequestError(f"ledger metadata: length {self.length} < 0")
        if self.state is LedgerState.CLOSED and self.last_entry_id == -1 and self.length != 0:
            raise BadRequestError("ledger metadata: an empty closed ledger must have length 0")
        if self.ctime_ms < 0:
            raise BadRequestError(f"ledger metadata: ctime_ms {self.ctime_ms} < 0")
        if self.format_version != FORMAT_VERSION:
            raise BadRequestError(f"ledger metadata: unsupported format_version "
                                  f"{self.format_version}")
        if self.digest_type not in DIGEST_TYPES:
            raise BadRequestError(f"ledger metadata: digest_type {self.digest_type!r} is not one "
                                  f"of {', '.join(DIGEST_TYPES)}")
        if not isinstance(self.keys, KeyRecord):
            raise BadRequestError("ledger metadata: keys must be a KeyRecord (LedgerMetadata.new "
                                  "derives it from the password)")
        self.keys.validate()
        if not isinstance(self.custom_metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, bytes)
                for k, v in self.custom_metadata.items()):
            raise BadRequestError("ledger metadata: custom_metadata must be dict[str, bytes]")
        if not isinstance(self.ensembles, list) or not self.ensembles:
            raise BadRequestError("ledger metadata: at least one ensemble is required")
        prev = None
        for seg in self.ensembles:
            if not isinstance(seg, (tuple, list)) or len(seg) != 2:
                raise BadRequestError(f"ledger metadata: ensemble segment {seg!r} is not "
                                      "(first_entry_id, [bookies])")
            first, bookies = seg
            if not _is_int(first) or first < 0:
                raise BadRequestError(f"ledger metadata: bad first entry id {first!r}")
            if prev is None and first != 0:
                raise BadRequestError(f"ledger metadata: first ensemble starts at entry {first}, "
                                      "not 0")
            if prev is not None and first <= prev:
                raise BadRequestError(f"ledger metadata: ensembles not strictly increasing "
                                      f"({prev} then {first})")
            prev = first
            if not isinstance(bookies, (list, tuple)) or len(bookies) != e:
                raise BadRequestError(
                    f"ledger metadata: ensemble at entry {first} has "
                    f"{len(bookies) if isinstance(bookies, (list, tuple)) else bookies!r} "
                    f"bookies, ensemble_size is {e}")
            if not all(isinstance(b, str) and b for b in bookies):
                raise BadRequestError(f"ledger metadata: bookie ids must be non-empty strings: "
                                      f"{bookies!r}")
            if len(set(bookies)) != len(bookies):
                raise BadRequestError(f"ledger metadata: ensemble at entry {first} repeats a "
                                      f"bookie: {list(bookies)}")
        return self

    # ---- serialization ---------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "digest_type": self.digest_type,
            "keys": {"scheme": self.keys.scheme, "iterations": self.keys.iterations,
                     "salt": base64.b64encode(self.keys.salt).decode("ascii"),
                     "master_key": base64.b64encode(self.keys.master_key).decode("ascii"),
                     "mac_key": base64.b64encode(self.keys.mac_key).decode("ascii")},
            "ensembles": [[first, list(bookies)] for first, bookies in self.ensembles],
            "ctime_ms": self.ctime_ms,
            "custom_metadata": {k: base64.b64encode(v).decode("ascii")
                                for k, v in sorted(self.custom_metadata.items())},
        }

    def to_public_dict(self) -> dict:
        """:meth:`to_dict` for display (shell, dashboard, reports): of the keys, only how they
        derive (scheme, iterations); no salt, no key."""
        d = self.to_dict()
        d["keys"] = {"scheme": self.keys.scheme, "iterations": self.keys.iterations}
        return d

    def serialize(self) -> bytes:
        """Validated, versioned bytes (see the module docstring)."""
        self.validate()
        body = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return HEADER + b"\t" + str(self.format_version).encode() + b"\n" + body.encode("utf-8")

    @staticmethod
    def format_of(data: bytes) -> int | None:
        """The format version a serialized record says it is (None: not a ledger record)."""
        head = bytes(data[:64]).partition(b"\n")[0]
        magic, _, ver = head.partition(b"\t")
        return int(ver) if magic == HEADER and ver.isdigit() and len(ver) <= 6 else None

    @classmethod
    def deserialize(cls, data: bytes) -> "LedgerMetadata":
        """Parse :meth:`serialize` output. :raises MetadataFormatError: anything corrupt."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MetadataFormatError(f"ledger metadata must be bytes, got {type(data).__name__}")
        data = bytes(data)
        head, nl, body = data.partition(b"\n")
        if not nl:
            raise MetadataFormatError("corrupt ledger metadata: no header line")
        magic, tab, ver = head.partition(b"\t")
        if magic != HEADER or not tab:
            raise MetadataFormatError(f"corrupt ledger metadata: unknown header {head[:60]!r}")
        if not ver.isdigit() or len(ver) > 6:
            raise MetadataFormatError(f"corrupt ledger metadata: bad format version {ver[:20]!r}")
        if int(ver) not in FORMAT_VERSIONS_READ:
            raise MetadataFormatError(f"unsupported ledger metadata format version {int(ver)} "
                                      f"(this bkspark reads versions "
                                      f"{', '.join(map(str, FORMAT_VERSIONS_READ))})")
        try:
            obj = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError) as e:
            raise MetadataFormatError(f"corrupt ledger metadata: bad JSON body: {e}") from None
        return cls.from_dict(obj, int(ver))

    @classmethod
    def from_dict(cls, obj, format_version: int = FORMAT_VERSION) -> "LedgerMetadata":
        if not isinstance(obj, dict):
            raise MetadataFormatError("corrupt ledger metadata: body is not a JSON object")
        secret = "password" if format_version == 1 else "keys"
        expected = {"ledger_id", "ensemble_size", "write_quorum", "ack_quorum", "state",
                    "last_entry_id", "length", "digest_type", secret, "ensembles",
                    "ctime_ms", "custom_metadata"}
        missing, extra = expected - obj.keys(), obj.keys() - expected
        if missing or extra:
            raise MetadataFormatError(
                "corrupt ledger metadata: " + "; ".join(
                    p for p in (missing and f"missing fields {sorted(missing)}",
                                extra and f"unknown fields {sorted(extra)}") if p))
        try:
            state = LedgerState(obj["state"])
        except (ValueError, TypeError):
            raise MetadataFormatError(
                f"corrupt ledger metadata: unknown state {obj['state']!r}") from None
        ensembles = obj["ensembles"]
        if not isinstance(ensembles, list) or not all(
                isinstance(s, list) and len(s) == 2 and isinstance(s[1], list) for s in ensembles):
            raise MetadataFormatError("corrupt ledger metadata: malformed ensembles")
        custom = obj["custom_metadata"]
        if not isinstance(custom, dict):
            raise MetadataFormatError("corrupt ledger metadata: custom_metadata is not an object")
        md = cls(
            ledger_id=obj["ledger_id"], ensemble_size=obj["ensemble_size"],
            write_quorum=obj["write_quorum"], ack_quorum=obj["ack_quorum"], state=state,
            last_entry_id=obj["last_entry_id"], length=obj["length"],
            digest_type=obj["digest_type"],
            keys=(KeyRecord.legacy(_b64(obj["password"], "password")) if format_version == 1
                  else _key_record(obj["keys"])),
            ensembles=[(first, list(bookies)) for first, bookies in ensembles],
            ctime_ms=obj["ctime_ms"],
            custom_metadata={k: _b64(v, f"custom_metadata[{k!r}]") for k, v in custom.items()},
        )
        try:
            md.validate()
        except BadRequestError as e:
            raise MetadataFormatError(f"corrupt ledger metadata: {e}") from None
        if md.ledger_id < 0:
            raise MetadataFormatError("corrupt ledger metadata: stored ledger has no id")
        return md

    # ---- queries -----------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def ensemble_for(self, entry_id: int) -> list[str]:
        """Bookies of the ensemble that stores ``entry_id`` (last segment starting at or
        before it)."""
        if not _is_int(entry_id) or entry_id < 0:
            raise BadRequestError(f"entry id must be an int >= 0, got {entry_id!r}")
        if not self.ensembles:
            raise BadRequestError(f"ledger {self.ledger_id} has no ensemble")
        firsts = [first for first, _ in self.ensembles]
        i = bisect.bisect_right(firsts, entry_id) - 1
        return list(self.ensembles[i][1])

    def last_ensemble(self) -> list[str]:
        if not self.ensembles:
            raise BadRequestError(f"ledger {self.ledger_id} has no ensemble")
        return list(self.ensembles[-1][1])

    def last_ensemble_first_entry(self) -> int:
        return self.ensembles[-1][0]

    def all_bookies(self) -> set[str]:
        return {b for _, bookies in self.ensembles for b in bookies}

    # ---- modified copies ----------------------------------------------------------------------

    def copy(self, **changes) -> "LedgerMetadata":
        """Deep-enough copy (ensembles, custom metadata) with ``changes`` applied."""
        base = dict(ensembles=[(f, list(b)) for f, b in self.ensembles],
                    custom_metadata=dict(self.custom_metadata))
        base.update(changes)
        return dataclasses.replace(self, **base)

    def with_ledger_id(self, ledger_id: int) -> "LedgerMetadata":
        return self.copy(ledger_id=ledger_id)

    def with_state(self, state: LedgerState) -> "LedgerMetadata":
        return self.copy(state=LedgerState(state))

    def with_in_recovery(self) -> "LedgerMetadata":
        return self.copy(state=LedgerState.IN_RECOVERY)

    def with_closed(self, last_entry_id: int, length: int) -> "LedgerMetadata":
        return self.copy(state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    def with_ensemble(self, first_entry_id: int, bookies) -> "LedgerMetadata":
        """Add a segment starting at ``first_entry_id`` (replacing the last segment if it
        already starts there, as BookKeeper's ensemble change does)."""
        ens = [(f, list(b)) for f, b in self.ensembles]
        if ens and ens[-1][0] == first_entry_id:
            ens[-1] = (first_entry_id, list(bookies))
        elif ens and ens[-1][0] > first_entry_id:
            raise BadRequestError(f"new ensemble at entry {first_entry_id} precedes the last "
                                  f"one at {ens[-1][0]}")
        else:
            ens.append((first_entry_id, list(bookies)))
        return self.copy(ensembles=ens)

    def with_replaced_bookie(self, first_entry_id: int, index: int,
                             new_bookie: str) -> "LedgerMetadata":
        """Swap member ``index`` of the segment starting at ``first_entry_id`` (re-replication)."""
        ens = [(f, list(b)) for f, b in self.ensembles]
        for f, bookies in ens:
            if f == first_entry_id:
                bookies[index] = new_bookie
                return self.copy(ensembles=ens)
        raise BadRequestError(f"ledger {self.ledger_id} has no ensemble starting at entry "
                              f"{first_entry_id}")

    def with_custom_metadata(self, **items: bytes) -> "LedgerMetadata":
        cm = dict(self.custom_metadata)
        cm.update(items)
        return self.copy(custom_metadata=cm)

    @classmethod
    def new(cls, ensemble, write_quorum: int, ack_quorum: int, *, password: bytes = b"",
            digest_type: str = "crc32c", custom_metadata: dict | None = None,
            ledger_id: int = -1) -> "LedgerMetadata":
        """Metadata of a new OPEN ledger on ``ensemble`` (validated); its keys derive from
        ``password`` with a fresh salt (:meth:`KeyRecord.for_password`)."""
        return cls(ledger_id=ledger_id, ensemble_size=len(ensemble), write_quorum=write_quorum,
                   ack_quorum=ack_quorum, keys=KeyRecord.for_password(password),
                   digest_type=digest_type,
                   ensembles=[(0, list(ensemble))], ctime_ms=int(time.time() * 1000),
                   custom_metadata=dict(custom_metadata or {})).validate()


def _key_record(obj) -> KeyRecord:
    if not isinstance(obj, dict) or obj.keys() != {"scheme", "salt", "iterations",
                                                    "master_key", "mac_key"}:
        raise MetadataFormatError("corrupt ledger metadata: keys must be an object of exactly "
                                  "scheme, salt, iterations, master_key, mac_key")
    return KeyRecord(scheme=obj["scheme"], salt=_b64(obj["salt"], "keys.salt"),
                     iterations=obj["iterations"],
                     master_key=_b64(obj["master_key"], "keys.master_key"),
                     mac_key=_b64(obj["mac_key"], "keys.mac_key"))


def _b64(value, what: str) -> bytes:
    if not isinstance(value, str):
        raise MetadataFormatError(f"corrupt ledger metadata: {what} is not a base64 string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise MetadataFormatError(f"corrupt ledger metadata: {what} is not valid base64") from None


def _reject_constant(name):
    raise ValueError(f"non-standard JSON constant {name}")
