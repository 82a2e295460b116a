"""Segmented log metadata (format 2): a small head record and one record per ledger.

A log's ledger list used to be one record (format 1, :mod:`metadata.log_metadata`), rewritten
whole by every change: ZooKeeper's 1 MB record limit capped a log at ~13,000 ledgers and each
commit cost as much as the list was long. Format 2 keeps, as DistributedLog does, one record
per ledger ("segment") under the log and a head that stays small::

    /logs/<name>                    head: b"bkspark-log-metadata\\t2\\n" + JSON (below)
    /logs/<name>/segments/<seq>     one ledger of the list (its list entry, JSON); seq = %012d
    /logs/<name>/ledgers/<id>       the seq of the segment that lists ledger <id> (ascii)
    /logs/<name>/cursors/<cursor>   cursor positions (unchanged)
    /logs/<name>/expired-writers/<shard>   the filter of expired writer ids (below)

Head fields: ``uid`` -- a fresh id per log created (a log deleted and created again under the
same name is another log); ``first`` / ``next`` -- the list is the segments ``first ..
next-1``, contiguous, in order; ``gc`` -- segments ``gc .. first-1`` were truncated and their
records are being removed (in batches, by the truncating caller:
:meth:`bkspark.log.LogStore.collect_truncated`); ``rev`` -- grows when a segment other than the
last changes (a ledger unlisted from the middle), so a reader's copy of the list knows to
reload it; ``writers`` -- idempotency keys, ``writer id -> {"seq", "epoch", "t", "n"}`` (last
committed sequence, owner epoch, commit time in ms, and the head version of that commit,
which orders keys by use); ``expired`` -- how many keys expired and
the newest ``t`` among them; ``properties``; ``stamp`` -- a fresh token per write;
``recent`` (the head property ``__recent``, which clients that predate it read as any
property) -- the stamps of the last :data:`RECENT_CHANGES` writes (their first
:data:`RECENT_TOKEN` characters, 32 random bits: a window of 16 confuses two with odds of
~4 in 10^9), oldest first (the head's versions ``v - len(recent) + 1 .. v``).

**A lost answer is settled by the writer's own token** (:func:`change_outcome`), never by what
the list looks like: the change whose answer was lost would be version ``v + 1`` of the head it
read at ``v``; a synced re-read at version ``w`` shows it applied exactly when its stamp is
among ``recent``, not applied when ``recent`` reaches back to ``v + 1`` without it, and
unknown when more than :data:`RECENT_CHANGES` changes came since (the caller then decides from
a mark of its own -- an idempotency key, a Spark job's commit record -- or reports the outcome
unknown). A property of the list ("are my ledgers listed?") is no such proof: a truncation or
retention may have removed them since.

Rules (every reader and writer relies on them):

* **Every change is one transaction that sets the head at the version it read** (plus the
  segment and index records it creates, sets or deletes). The head's version therefore orders
  all changes, a conflict is a failed head check, and nothing changes a segment without
  changing the head. A transaction's size depends on what it changes (the ledgers appended,
  or :data:`GC_BATCH` leftovers removed), never on how long the list is.
* Only the last two segments of the list can be open (a writer may still write the
  second-to-last while listing the last), so only they change after being listed (sealed:
  state, end); any other change of a listed segment (an unlist) raises ``rev``.
* A ledger index record exists for every listed segment; one whose seq is outside
  ``first .. next-1``, or whose segment names another ledger, is a leftover: the ledger is not
  listed.

Stamps of a segment (set by the change that lists it or seals it, never changed after):
``offset`` -- the log offset of its first entry; ``byte_offset`` -- the sum of the byte
lengths of the ledgers listed before it (only differences between two segments of one list
mean anything: a list whose older segments predate the stamp starts a new base at 0);
``closed_ms`` -- when the list first recorded it closed (wall clock, ms). They make a log's
size, entry count and the age of its oldest ledgers two reads away, whatever its length
(:mod:`bkspark.log.retention`).

Idempotency keys are bounded (:func:`expire_writers`): a key is kept while it is among the
:data:`WRITER_KEYS_MAX` most recently used and younger than :data:`WRITER_KEY_MAX_AGE_MS`
(Kafka's producer-id expiry); ``expired.t`` is the newest commit time of any key that expired.

**An expired key is never forgotten silently.** Its writer id goes into the log's filter of
expired writer ids (:class:`ExpiredWriters`, written by the transaction that expires the key;
``expired.filtered`` counts them). A commit from a writer id the head does not know is
refused with :class:`WriterKeyExpiredError` when the filter holds that id (it may be the rerun
of a commit already applied: a batch job rerun under the same ``(writerId, writerSequence)``
long after), and applied when it does not (the id never committed to this log). A filter
answers "maybe" for an id it never held with a small probability: such a new writer is
refused too and takes another id -- a refusal, never a duplicate.

The filter is a scalable Bloom filter (Almeida et al., 2007): generations of records of
:data:`FILTER_BITS` bits. Generation ``g`` has ``FILTER_SHARDS << g`` records (generation 0
under ``/logs/<name>/expired-writers/<shard>``, ``g`` >= 1 under ``.../expired-writers/g<g>/
<shard>``) and takes :data:`SHARD_CAPACITY` ids a record; the ``k``-th id filtered goes into
the generation whose range holds ``k`` (:meth:`ExpiredWriters.generation`: the
generations are fixed by the count alone). A full generation answers "maybe" falsely for
~0.17% of ids, so with ``G`` generations a new id is refused with odds below ``G`` x 0.17%
(1 million expired ids: 4 generations, 10 million: 8), where one fixed filter would refuse
nearly every new id. A check reads one record per generation, in one round trip; a record
stays 512 bytes; an expiry writes one record. Keys that expired
before the filter existed (``expired.count`` > ``expired.filtered``) keep the older rule: a
writer id the head does not know is applied only if the writer says when it started
(``started_ms``, taken before its first commit attempt) and that is later than ``expired.t`` +
:data:`CLOCK_SKEW_MS`.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field

from bkspark.errors import BadRequestError, BKError, MetadataFormatError
from metadata.layout import log_path
from metadata.log_entry import CLOSED, OPEN, LogLedger  # noqa: F401 - (the states, re-exported)
from metadata.log_metadata import HEADER, encode_record

FORMAT_VERSION = 2
#: records of truncated segments removed by one transaction, at most
GC_BATCH = 64
#: idempotency keys a head keeps at most (the least recently used expire first)
WRITER_KEYS_MAX = 1000
#: idempotency keys idle for longer expire (Kafka's transactional.id.expiration.ms default)
WRITER_KEY_MAX_AGE_MS = 7 * 24 * 3600 * 1000
#: clocks of the clients that stamp keys and start writers may disagree by this much
CLOCK_SKEW_MS = 60 * 1000

#: stamps of the last writes a head keeps (a lost answer is settled within that many changes)
RECENT_CHANGES = 16
#: characters of a stamp kept in ``recent`` (the head stays small: it is read by every change)
RECENT_TOKEN = 8

_HEAD_FIELDS = {"name", "uid", "first", "next", "gc", "rev", "writers", "expired", "properties",
                "stamp"}
#: the head property holding ``recent`` (a property: clients that predate it read such heads)
RECENT_PROPERTY = "__recent"


#: records of the first generation of the filter of expired writer ids (each next one has twice
#: as many), bits a record (512 bytes), hashes an id sets, and ids a record takes before the
#: next generation starts (a full record answers "maybe" falsely for ~0.17% of ids)
FILTER_SHARDS = 256
FILTER_BITS = 4096
FILTER_HASHES = 7
SHARD_CAPACITY = 300


class ExpiredWriters:
    """The scalable Bloom filter of a log's expired writer ids (module docstring): which
    generation the next id goes into, which record of a generation holds an id, its bits."""

    @staticmethod
    def capacity_before(generation: int) -> int:
        """Ids the generations before ``generation`` take in all."""
        return SHARD_CAPACITY * FILTER_SHARDS * ((1 << generation) - 1)

    @classmethod
    def generation(cls, index: int) -> int:
        """The generation of the ``index``-th id filtered (0-based)."""
        g = 0
        while index >= cls.capacity_before(g + 1):
            g += 1
        return g

    @classmethod
    def generations(cls, filtered: int) -> int:
        """How many generations hold the first ``filtered`` ids."""
        return cls.generation(filtered - 1) + 1 if filtered > 0 else 0

    @staticmethod
    def _digest(writer_id: str, generation: int) -> tuple[int, list[int]]:
        if generation == 0:
            d = hashlib.blake2b(writer_id.encode("utf-8"), digest_size=16).digest()
            shard, rest = d[0], int.from_bytes(d[1:], "big")
        else:
            d = hashlib.blake2b(writer_id.encode("utf-8"), digest_size=16,
                                person=b"bk-ew-g%d" % generation).digest()
            shard, rest = int.from_bytes(d[:4], "big"), int.from_bytes(d[4:], "big")
        return shard % (FILTER_SHARDS << generation), [(rest >> (12 * i)) % FILTER_BITS
                                                       for i in range(FILTER_HASHES)]

    @classmethod
    def shard(cls, writer_id: str, generation: int = 0) -> int:
        return cls._digest(writer_id, generation)[0]

    @classmethod
    def holds(cls, bits: bytes | None, writer_id: str, generation: int = 0) -> bool:
        """Whether record ``bits`` (None: never written) of ``generation`` may hold
        ``writer_id`` (it must be the record :meth:`shard` names)."""
        if not bits:
            return False
        return all(len(bits) > b // 8 and bits[b // 8] >> (b % 8) & 1
                   for b in cls._digest(writer_id, generation)[1])

    @classmethod
    def add(cls, bits: bytes | None, writer_id: str, generation: int = 0) -> bytes:
        out = bytearray(bits or bytes(FILTER_BITS // 8))
        out.extend(bytes(max(0, FILTER_BITS // 8 - len(out))))
        for b in cls._digest(writer_id, generation)[1]:
            out[b // 8] |= 1 << (b % 8)
        return bytes(out)


def expired_writers_path(name: str, generation: int = 0) -> str:
    """The parent of a generation's records (generation 0's is the filter's root)."""
    root = f"{log_path(name)}/expired-writers"
    return root if generation == 0 else f"{root}/g{generation}"


def expired_writers_shard_path(name: str, shard: int, generation: int = 0) -> str:
    if generation == 0:
        return f"{expired_writers_path(name)}/{shard:03d}"
    return f"{expired_writers_path(name, generation)}/{shard:06d}"


class WriterKeyExpiredError(BKError):
    """A commit with an idempotency key from a writer the log does not remember and that
    cannot show it started after the last key expired: it could be the retry of a commit
    already applied. Refused; commit under a new writer id -- see :mod:`metadata.log_segments`."""


def segments_path(name: str) -> str:
    return f"{log_path(name)}/segments"


def segment_path(name: str, seq: int) -> str:
    return f"{log_path(name)}/segments/{seq:012d}"


def ledgers_index_path(name: str) -> str:
    return f"{log_path(name)}/ledgers"


def ledger_index_path(name: str, ledger_id: int) -> str:
    return f"{log_path(name)}/ledgers/{ledger_id}"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def new_stamp() -> str:
    return os.urandom(8).hex()


def now_ms() -> int:
    return int(time.time() * 1000)


def format_version(data: bytes) -> int:
    """The format version a log head record declares (1: the single-record list)."""
    head, nl, _ = bytes(data).partition(b"\n")
    magic, tab, ver = head.partition(b"\t")
    if not nl or magic != HEADER or not tab or not ver.isdigit() or len(ver) > 6:
        raise MetadataFormatError(f"corrupt log metadata: unknown header {head[:60]!r}")
    return int(ver)


@dataclass
class LogHead:
    """The head record of a format-2 log (see the module docstring)."""

    name: str
    uid: str = ""
    first: int = 0
    next: int = 0
    gc: int = 0
    rev: int = 0
    writers: dict = field(default_factory=dict)
    expired: dict = field(default_factory=lambda: {"count": 0, "t": 0})
    properties: dict = field(default_factory=dict)
    stamp: str = ""

    @property
    def recent(self) -> list:
        """Tokens of the last :data:`RECENT_CHANGES` writes, oldest first (module docstring)."""
        return self.properties.get(RECENT_PROPERTY, [])

    @recent.setter
    def recent(self, tokens: list) -> None:
        self.properties[RECENT_PROPERTY] = tokens

    def validate(self) -> "LogHead":
        if not isinstance(self.name, str) or not self.name:
            raise BadRequestError(f"log name must be a non-empty str, got {self.name!r}")
        if not (_is_int(self.gc) and _is_int(self.first) and _is_int(self.next)
                and 0 <= self.gc <= self.first <= self.next):
            raise BadRequestError(f"log {self.name}: bad segment bounds gc={self.gc!r} "
                                  f"first={self.first!r} next={self.next!r}")
        if not isinstance(self.uid, str) or not _is_int(self.rev):
            raise BadRequestError(f"log {self.name}: bad uid {self.uid!r} or rev {self.rev!r}")
        if not isinstance(self.writers, dict) or not all(
                isinstance(k, str) and isinstance(v, dict) and _is_int(v.get("seq"))
                and _is_int(v.get("t")) and (v.get("epoch") is None or _is_int(v.get("epoch")))
                and (v.get("n") is None or _is_int(v.get("n")))
                for k, v in self.writers.items()):
            raise BadRequestError(f"log {self.name}: writers must map str -> "
                                  "{seq: int, t: int, epoch: int|None}")
        if not isinstance(self.expired, dict) or not _is_int(self.expired.get("count")) \
                or not _is_int(self.expired.get("t")):
            raise BadRequestError(f"log {self.name}: bad expired-keys summary {self.expired!r}")
        if not isinstance(self.recent, list) or not all(isinstance(t, str) for t in self.recent):
            raise BadRequestError(f"log {self.name}: recent stamps must be a list of str")
        if not isinstance(self.properties, dict) or not all(isinstance(k, str) for k in self.properties):
            raise BadRequestError(f"log {self.name}: properties must be a dict with str keys")
        return self

    def serialize(self) -> bytes:
        self.validate()
        return encode_record(self.name, FORMAT_VERSION, {
            "name": self.name, "uid": self.uid, "first": self.first, "next": self.next,
            "gc": self.gc, "rev": self.rev, "writers": self.writers, "expired": self.expired,
            "properties": self.properties, "stamp": self.stamp})

    def restamp(self) -> str:
        """A fresh stamp for the write about to be made, remembered among ``recent``."""
        self.stamp = new_stamp()
        self.recent = (self.recent + [self.stamp[:RECENT_TOKEN]])[-RECENT_CHANGES:]
        return self.stamp

    @classmethod
    def deserialize(cls, data: bytes) -> "LogHead":
        version = format_version(data)
        if version != FORMAT_VERSION:
            raise MetadataFormatError(f"log head of format version {version}, expected "
                                      f"{FORMAT_VERSION}")
        body = bytes(data).partition(b"\n")[2]
        try:
            obj = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise MetadataFormatError(f"corrupt log head: bad JSON body: {e}") from None
        if not isinstance(obj, dict) or set(obj) != _HEAD_FIELDS:
            raise MetadataFormatError(f"corrupt log head: expected exactly the fields "
                                      f"{', '.join(sorted(_HEAD_FIELDS))}")
        try:
            return cls(**obj).validate()
        except BadRequestError as e:
            raise MetadataFormatError(f"corrupt log head: {e}") from None

    def writer_seq(self, writer_id: str) -> int:
        key = self.writers.get(writer_id)
        return -1 if key is None else key["seq"]

    def writer_epoch(self, writer_id: str) -> int | None:
        key = self.writers.get(writer_id)
        return None if key is None else key.get("epoch")


APPLIED, NOT_APPLIED, UNKNOWN = "applied", "not applied", "unknown"


def change_outcome(head: "LogHead", version: int, stamp: str, read_version: int,
                   uid: str | None = None) -> str:
    """Whether the write stamped ``stamp``, made on the head read at ``read_version`` (of the
    log ``uid``) and whose answer was lost, is stored, told by ``head`` (read after a sync) at
    ``version``: APPLIED, NOT_APPLIED, or UNKNOWN when more than :data:`RECENT_CHANGES` writes
    came since, or the head is another log's (deleted and created again: module docstring)."""
    if uid is not None and head.uid != uid:
        return UNKNOWN
    if stamp[:RECENT_TOKEN] in head.recent:
        return APPLIED
    if version == read_version:
        return NOT_APPLIED          # nothing was written since that read
    if head.recent and version - len(head.recent) + 1 <= read_version + 1:
        return NOT_APPLIED          # ``recent`` reaches back to where it would be
    return UNKNOWN


def encode_segment(entry: LogLedger) -> bytes:
    if not _is_int(entry.ledger_id) or entry.ledger_id < 0:
        raise BadRequestError(f"bad log segment {entry!r} (needs an int ledger_id >= 0)")
    return json.dumps(entry.to_dict(), sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode()


def decode_segment(data: bytes, seq: int) -> LogLedger:
    try:
        return LogLedger.from_dict(json.loads(bytes(data).decode("utf-8")), seq=seq)
    except (UnicodeDecodeError, ValueError, BadRequestError) as e:
        raise MetadataFormatError(f"corrupt log segment {seq}: {e}") from None


def next_offset(entry: LogLedger | None) -> int | None:
    """The log offset of the entry after ``entry``'s ledger (0 for an empty list); None
    while it cannot be known (the ledger is open, or its offset is unknown)."""
    if entry is None:
        return 0
    count = entry.entry_count()
    if count is None or entry.offset is None:
        return None
    return entry.offset + count


def next_byte_offset(entry: LogLedger | None) -> int | None:
    """The ``byte_offset`` of the ledger listed after ``entry`` (0 for an empty list); None
    while ``entry`` is open. After a closed segment without the stamp (listed before stamps
    existed) a new base starts at 0."""
    if entry is None:
        return 0
    if not entry.closed or entry.length is None:
        return None
    if entry.byte_offset is None:
        return 0
    return entry.byte_offset + entry.length


def stamp_closed(entry: LogLedger, now: int) -> None:
    """Record when the list first holds ``entry`` closed (its ``closed_ms``)."""
    if entry.closed and entry.closed_ms is None:
        entry.closed_ms = now


def may_be_expired(head: LogHead, writer_id: str, started_ms: int | None) -> bool:
    """Whether a commit of ``writer_id`` could be the writer of a key that expired before the
    filter of expired writer ids recorded them (module docstring)."""
    if writer_id in head.writers or head.expired["count"] <= head.expired.get("filtered", 0):
        return False
    return started_ms is None or started_ms <= head.expired["t"] + CLOCK_SKEW_MS


def expire_writers(head: LogHead, now: int, keep: str | None = None) -> list[str]:
    """Expire idempotency keys beyond the bounds (module docstring); ``keep``: a key being
    written now, never expired by its own commit. Returns the expired writer ids (the caller
    records them in the filter of expired writer ids, in the same transaction)."""
    gone = []
    # most recently used first: by the head version of the last commit (``n``; keys written
    # before it had none), then by commit time
    keys = sorted(head.writers.items(),
                  key=lambda kv: (kv[0] != keep, -kv[1].get("n", 0), -kv[1]["t"]))
    survivors = {}
    for wid, key in keys:
        young = now - key["t"] <= WRITER_KEY_MAX_AGE_MS
        if wid == keep or (young and len(survivors) < WRITER_KEYS_MAX):
            survivors[wid] = key
        else:
            head.expired = dict(head.expired, count=head.expired["count"] + 1,
                                t=max(head.expired["t"], key["t"]))
            gone.append(wid)
    head.writers = survivors
    return gone
