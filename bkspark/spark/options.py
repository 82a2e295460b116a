"""Options of ``format("bookkeeper")``: parsing and validation (pure; no cluster needed).

Spark hands a data source a case-insensitive dict of strings. :func:`parse_options` turns it
into a :class:`ConnectorOptions` (typed, validated) and raises
:class:`~bkspark.errors.BadRequestError` naming the offending option for anything unknown or
invalid, so a bad option fails the query at planning time, before any task runs.

=======================  ====================================================================
option                   meaning (default)
=======================  ====================================================================
metadataServiceUri       ``zk://...`` or ``sqlite:///...`` (the running local cluster's)
log / path               one log (``load(name)`` / ``save(name)`` set ``path``); a write
                         without it routes each row to the log its ``topic`` (or ``log``)
                         column names, all logs committed at once (entryFormat=record)
maxLogsPerWrite          routed writes: at most this many logs in one job or micro-batch (100)
logs                     comma-separated logs (read only)
logPattern               regular expression over log names (read only; re-listed per batch)
startingOffsets          ``earliest`` | ``latest`` | JSON ``{"log": {"ledger": L, "entry": E}}``
                         (batch: earliest; streaming: latest)
endingOffsets            batch read end, exclusive (``latest``); same forms
maxEntriesPerTrigger     streaming: at most this many entries per micro-batch (no limit)
maxBytesPerTrigger       streaming: about at most this many bytes per micro-batch (no limit)
minEntriesPerTrigger     streaming: wait for this many entries before a micro-batch, at most
maxTriggerDelay          ... this long (``15m``; Kafka's pair of options)
startingTimestamp        start at the first record of each log stamped at/after this time
                         (milliseconds since the epoch; also per log: startingOffsetsByTimestamp)
endingTimestamp          batch reads: end before the first record at/after this time
                         (also per log: endingOffsetsByTimestamp)
schema                   ``record`` (default) | ``kafka``: the read schema of Spark's Kafka source
includeHeaders           schema=kafka: add the ``headers`` column (false)
failOnDataLoss           fail when a committed offset was truncated away (true)
ensembleSize / writeQuorumSize / ackQuorumSize   ledgers written by Spark (3 / 2 / 2)
digestType               ``crc32c`` | ``crc32`` | ``hmac`` (``mac``) | ``dummy`` (crc32c)
password                 ledger password ("")
entryFormat              ``record`` (one row per entry) | ``arrow`` (Arrow IPC batches) (record)
queryId                  streaming sink: idempotency key of its commits (Spark's query id);
                         streaming source: name of the cursor it moves (one per query)
writerId, writerSequence batch write: optional idempotency key (re-running the same
                         (writerId, writerSequence) appends nothing)
maxEntryBytes            arrow writes: target size of one entry (1 MiB, at most 4 MiB),
                         before compression
maxTimestampAheadMs      record writes: a row's ``timestamp`` may be at most this far ahead of
                         the metadata store's time (3600000, Kafka's
                         ``message.timestamp.after.max.ms``); a row further ahead fails the
                         write (rows without one are stamped with the store's time)
compression              arrow writes: ``lz4`` | ``zstd`` | ``none``, Arrow IPC body
                         compression of each entry (lz4); reads need no option
entriesPerPartition      reads: split a ledger into ranges of this many entries (auto: ~128 MiB
                         per partition for arrow, 100000 entries for record)
minPartitions            reads: at least this many partitions (as Kafka's): the largest ranges
                         are halved until there are; also the parallelism packs are cut for
                         (default: the planner's CPUs, at most 16; reader.pack)
maxPartitionBytes        reads: small ledger ranges, of one log or several, are packed into
                         one partition up to this many bytes (128MiB; Spark's
                         spark.sql.files.maxPartitionBytes) ...
openCostInBytes          ... each range counting its bytes plus this (256KiB: what opening a
                         ledger costs, in bytes read meanwhile; Spark's openCostInBytes)
retentionTime            writes: retention of a log the write creates -- keep ledgers closed
                         within this time (``7d``, ``12h``, milliseconds; Kafka's retention.ms)
retentionSize            ... keep about this many bytes (``10GiB``; Kafka's retention.bytes)
retentionPassCursors     ... remove what cursors have not read (false: keep it for the slowest
                         active cursor). A log that exists keeps its policy (a different one
                         fails the write: change it with ``bkspark shell set-retention``)
readOffloaded            reads: read the ledgers a log offloaded from their Parquet files
                         (true, default) or from the bookies while they keep their copy (false)
offloadLocation          writes: the offload policy of a log the write creates or that has none
                         (:mod:`bkspark.log.offload`) -- closed ledgers become Parquet files
                         under this absolute path or URI (``log=<name>/`` in it) ...
offloadAfter             ... when closed longer ago than this (``1h``, ``7d``, milliseconds)
offloadBeyond            ... or when wholly beyond this many bytes of the log's tail
offloadKeepOnBookies     ... and drop the bookies' copy this long after (``0``, ``7d``;
                         default: they keep it)
                         (``10GiB``). A log with another policy fails the write: change it
                         with ``bkspark shell set-offload``
reclaimAbandonedAfter    writes: seconds a write job of the log with no live task stays silent
                         before its leftover ledgers are reclaimed at planning (600)
client.<setting>         a ``ClientConfig`` field (``client.tlsCaFile``, ``client.addTimeout``)
                         for every client the connector makes, on the driver and executors;
                         names and values: :mod:`bkspark.client_settings`
=======================  ====================================================================

Spark also passes ``checkpointLocation`` and ``queryName`` (``writeStream.queryName(...)``)
to streaming sinks; they are accepted and ignored (a query's writer id is option ``queryId``,
or else Spark's query id, which its checkpoint keeps across restarts).

Kafka's option names are accepted beside these (:data:`KAFKA_ALIASES`: ``subscribe``,
``subscribePattern``, ``assign``, ``topic``, ``maxOffsetsPerTrigger``, ...), and the offsets
options take Kafka's JSON (``{"log": {"0": 42}}``, -2 = earliest, -1 = latest; a log has one
partition, 0, and ``offset`` numbers its entries: see :meth:`LogMetadata.offsets`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from bkspark.errors import BadRequestError, did_you_mean
from bkspark.spark.pending import DEFAULT_GRACE_S
from bkspark.log.position import EARLIEST, LATEST, Position
from bkspark.log.retention import RetentionPolicy, parse_duration_ms, parse_size_bytes
from metadata.layout import INTERNAL_LOG_PREFIX

FORMAT_NAME = "bookkeeper"
RECORD, ARROW = "record", "arrow"

#: canonical spelling of every accepted option (matched case-insensitively)
KNOWN_OPTIONS = (
    "metadataServiceUri", "log", "logs", "logPattern", "path", "startingOffsets", "endingOffsets",
    "maxEntriesPerTrigger", "failOnDataLoss", "ensembleSize", "writeQuorumSize", "ackQuorumSize",
    "digestType", "password", "entryFormat", "queryId", "writerId", "writerSequence",
    "maxEntryBytes", "maxTimestampAheadMs", "compression", "entriesPerPartition", "minPartitions", "checkpointLocation",
    "reclaimAbandonedAfter", "maxBytesPerTrigger", "minEntriesPerTrigger", "maxTriggerDelay",
    "startingTimestamp", "startingOffsetsByTimestamp", "endingTimestamp",
    "endingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "schema",
    "includeHeaders", "retentionTime", "retentionSize", "retentionPassCursors", "queryName",
    "maxLogsPerWrite", "maxPartitionBytes", "openCostInBytes", "offloadLocation",
    "offloadAfter", "offloadBeyond", "offloadKeepOnBookies", "readOffloaded",
    "_testFault",        # test-only fault injection (see bkspark.spark.writer)
)
#: Spark's Kafka source and sink option names, and the option each one is here
KAFKA_ALIASES = {"subscribe": "logs", "subscribePattern": "logPattern", "assign": "logs",
                 "topic": "log", "maxOffsetsPerTrigger": "maxEntriesPerTrigger",
                 "minOffsetsPerTrigger": "minEntriesPerTrigger"}
_CANON = {name.lower(): name for name in KNOWN_OPTIONS}
_CANON.update({alias.lower(): name for alias, name in KAFKA_ALIASES.items()})
#: what Kafka-only options become here (they fail, saying so)
_KAFKA_ONLY = {
    "kafka.bootstrap.servers": "option 'metadataServiceUri' (the bookies are found through "
                               "the metadata service)",
    "retention.ms": "option 'retentionTime' (set when the write creates the log)",
    "retention.bytes": "option 'retentionSize' (set when the write creates the log)",
    "kafka.group.id": "option 'queryId' (the name of the log cursor a query moves)",
    "groupidprefix": "option 'queryId' (the name of the log cursor a query moves)",
    "fetchoffset.numretries": "nothing: reads retry other bookies themselves (tune with "
                              "client.readTimeout)",
    "fetchoffset.retryintervalms": "nothing: reads retry other bookies themselves",
    "kafkaconsumer.polltimeoutms": "client.readTimeout (seconds)",
}
SCHEMAS = ("record", "kafka")
TIMESTAMP_STRATEGIES = ("error", "latest")
CLIENT_PREFIX = "client."   # client.<ClientConfig field>: passed to the connector's clients
DIGESTS = ("crc32c", "crc32", "hmac", "mac", "dummy")
COMPRESSIONS = {"none": None, "uncompressed": None, "lz4": "lz4", "zstd": "zstd"}
#: arrow entries are compressed unless told otherwise, with a fast codec as Parquet's snappy:
#: every byte saved is saved Qw times on the network and twice on each bookie's disk (journal
#: and entry log), and a scan decodes LZ4 at ~2.5 GB/s a core (ZSTD stores less but decodes at
#: about half that speed: reads are what a table is written for)
DEFAULT_COMPRESSION = "lz4"
#: reads: a partition packs small ledger ranges up to this many bytes, each range counting
#: its bytes plus the open cost (reader.pack; Spark's maxPartitionBytes / openCostInBytes)
DEFAULT_MAX_PARTITION_BYTES = 128 << 20
DEFAULT_OPEN_COST_BYTES = 256 << 10
#: routed writes: the logs one job (or micro-batch) may name -- each is an open ledger in a
#: task and a part of the one commit transaction (ZooKeeper's requests stay under 1 MB)
DEFAULT_MAX_LOGS_PER_WRITE = 100
MAX_LOGS_PER_WRITE_LIMIT = 1000
MAX_ENTRY_BYTES_LIMIT = 4 << 20         # bookies refuse entries over 5 MiB by default
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,150}$")


@dataclass
class ConnectorOptions:
    metadata_uri: str | None = None
    logs: list[str] = field(default_factory=list)      # explicit logs (log/logs/path)
    log_pattern: str | None = None
    starting: object = None          # None (mode default) | "earliest" | "latest" | {log: pos}
    ending: object = None            # None (latest) | "earliest" | "latest" | {log: pos}
    max_entries_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    digest: str = "crc32c"
    password: bytes = b""
    entry_format: str = RECORD
    query_id: str | None = None
    writer_id: str | None = None
    writer_sequence: int | None = None
    max_entry_bytes: int = 1 << 20
    max_timestamp_ahead_ms: int = 3_600_000  # a row's timestamp vs the store's time
    compression: str | None = None   # Arrow IPC body codec of arrow entries written (None:
                                     # uncompressed; parse_options sets the default for arrow)
    entries_per_partition: int | None = None
    min_partitions: int | None = None
    reclaim_after: float = DEFAULT_GRACE_S   # seconds; see bkspark.spark.pending
    retention: RetentionPolicy | None = None  # of a log the write creates
    offload: "OffloadPolicy | None" = None    # of a log the write creates or that has none
    read_offloaded: bool = True                # reads: offloaded ledgers from Parquet
    max_bytes_per_trigger: int | None = None
    min_entries_per_trigger: int | None = None
    max_trigger_delay: float = 15 * 60.0    # seconds
    timestamp_strategy: str = "error"        # no record at/after startingTimestamp: error|latest
    schema: str = "record"                   # record | kafka (the read schema)
    include_headers: bool = False            # schema=kafka: the headers column
    test_fault: str | None = None
    max_logs_per_write: int = DEFAULT_MAX_LOGS_PER_WRITE
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    open_cost_bytes: int = DEFAULT_OPEN_COST_BYTES
    client_settings: dict = field(default_factory=dict)   # client.* options: ClientConfig
                                                          # field -> typed value

    # ---- derived ------------------------------------------------------------------------
    def ledger_options(self) -> dict:
        return dict(ensemble_size=self.ensemble_size, write_quorum=self.write_quorum,
                    ack_quorum=self.ack_quorum, digest=self.digest)

    def single_log(self) -> str:
        """The one log a writer writes (log / path)."""
        if self.log_pattern is not None or len(self.logs) != 1:
            raise BadRequestError(f"format({FORMAT_NAME!r}) writes exactly one log: set option "
                                  "'log' (or save(\"name\")); 'logs' and 'logPattern' are for reads")
        return self.logs[0]

    def write_target(self) -> str | None:
        """The one log a writer writes, or None: no log named, so each row goes to the log
        its ``topic`` / ``log`` column names (:mod:`bkspark.spark.routing`)."""
        if self.log_pattern is None and not self.logs:
            return None
        return self.single_log()

    def matching_logs(self, all_logs) -> list[str]:
        """The logs to read: the explicit ones, or those of ``all_logs`` matching logPattern."""
        if self.log_pattern is None:
            return list(self.logs)
        rx = re.compile(self.log_pattern)
        return sorted(n for n in all_logs
                      if rx.fullmatch(n) and not n.startswith(INTERNAL_LOG_PREFIX))

    def require_logs(self) -> None:
        if not self.logs and self.log_pattern is None:
            raise BadRequestError(f"format({FORMAT_NAME!r}) needs option 'log', 'logs' or "
                                  "'logPattern' (or a name passed to load()/save())")

    def __repr__(self) -> str:      # client.authToken is never shown
        from bkspark.client_settings import SECRET_FIELDS
        shown = {f: ("<hidden>" if f in SECRET_FIELDS else v)
                 for f, v in self.client_settings.items()}
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k != "client_settings")
        return f"ConnectorOptions({fields}, client_settings={shown!r})"


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise BadRequestError(f"option {name!r} must be true or false, got {value!r}")


def _int(name: str, value: str, minimum: int, maximum: int | None = None) -> int:
    try:
        n = int(value.strip())
    except (ValueError, AttributeError):
        raise BadRequestError(f"option {name!r} must be an integer, got {value!r}") from None
    if n < minimum or (maximum is not None and n > maximum):
        bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise BadRequestError(f"option {name!r} must be {bound}, got {n}")
    return n


@dataclass(frozen=True)
class AtOffset:
    """A Kafka-style offset of a log (:meth:`LogMetadata.offsets`)."""
    offset: int


@dataclass(frozen=True)
class AtTime:
    """The first record stamped at or after ``ms`` (milliseconds since the epoch)."""
    ms: int


def _kafka_offset(name: str, log_name: str, spec):
    """Kafka's per-topic JSON ``{"0": offset}`` (-2 earliest, -1 latest) for one log."""
    if set(spec) != {"0"}:
        raise BadRequestError(f"option {name!r}, log {log_name!r}: a log has one partition, "
                              f"\"0\"; got partitions {sorted(spec)}")
    n = spec["0"]
    if not isinstance(n, int) or isinstance(n, bool) or n < -2:
        raise BadRequestError(f"option {name!r}, log {log_name!r}: an offset is an integer "
                              f">= 0, or -2 (earliest) / -1 (latest), got {n!r}")
    return {-2: EARLIEST, -1: LATEST}.get(n, AtOffset(n))


def parse_offsets(name: str, value: str):
    """``earliest`` | ``latest`` | ``{"log": {"ledger": L, "entry": E} | "earliest" | "latest"
    | {"0": kafka offset}}``."""
    v = value.strip()
    if v.lower() in (EARLIEST, LATEST):
        return v.lower()
    try:
        obj = json.loads(v)
    except ValueError:
        raise BadRequestError(f"option {name!r} must be 'earliest', 'latest' or JSON like "
                              f'{{"mylog": {{"ledger": 12, "entry": 0}}}}, got {value!r}') from None
    if not isinstance(obj, dict) or not obj:
        raise BadRequestError(f"option {name!r}: JSON offsets must be a non-empty object "
                              f"log -> position, got {value!r}")
    out = {}
    for log_name, pos in obj.items():
        if isinstance(pos, str) and pos.lower() in (EARLIEST, LATEST):
            out[log_name] = pos.lower()
            continue
        if isinstance(pos, dict) and "ledger" not in pos and "entry" not in pos:
            out[log_name] = _kafka_offset(name, log_name, pos)
            continue
        try:
            out[log_name] = Position.from_json(pos)
        except BadRequestError as e:
            raise BadRequestError(f"option {name!r}, log {log_name!r}: {e}") from None
        if out[log_name].entry_id < 0:
            raise BadRequestError(f"option {name!r}, log {log_name!r}: entry must be >= 0")
    return out


def _assigned_logs(value: str) -> str:
    """Kafka's ``assign`` JSON ``{"log": [0], ...}`` as a comma list of logs."""
    try:
        obj = json.loads(value)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or not obj or not all(
            isinstance(p, list) and p in ([0], []) for p in obj.values()):
        raise BadRequestError("option 'assign' must be JSON like {\"log1\": [0], \"log2\": [0]} "
                              "(a log has one partition, 0) or a comma list of logs, "
                              f"got {value!r}")
    return ",".join(obj)


def parse_timestamps(name: str, value: str) -> dict:
    """Kafka's ``startingOffsetsByTimestamp`` JSON: ``{"log": {"0": ms}}``."""
    try:
        obj = json.loads(value)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or not obj:
        raise BadRequestError(f"option {name!r} must be JSON like {{\"mylog\": {{\"0\": "
                              f"1700000000000}}}} (milliseconds since the epoch), got {value!r}")
    out = {}
    for log_name, spec in obj.items():
        ms = spec.get("0") if isinstance(spec, dict) and set(spec) == {"0"} else None
        if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
            raise BadRequestError(f"option {name!r}, log {log_name!r}: expected {{\"0\": "
                                  f"milliseconds since the epoch}}, got {spec!r}")
        out[log_name] = AtTime(ms)
    return out


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def _duration(name: str, value: str) -> float:
    """``15m``, ``30s``, ``500ms``, ``1h``; a bare number is milliseconds (as Kafka's)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", value.lower())
    if not m or m.group(2) not in ("", *_UNITS):
        raise BadRequestError(f"option {name!r} must be a duration like 15m, 30s or 500ms, "
                              f"got {value!r}")
    return float(m.group(1)) * _UNITS.get(m.group(2), 0.001)


def _identifier(name: str, value: str) -> str:
    v = value.strip()
    if not _ID.match(v):
        raise BadRequestError(f"option {name!r} must be letters, digits, '.', '_' or '-' "
                              f"(not starting with punctuation), got {value!r}")
    return v


def _unknown_option(key: str) -> str:
    """The error for an option this source does not know, with the closest known name.

    Spark hands a Python data source its option names lower-cased, so ``key`` is shown as
    Spark passed it; the suggestion is spelled as documented. Kafka-only options say what
    to use instead."""
    public = [n for n in KNOWN_OPTIONS if not n.startswith("_")]
    instead = _KAFKA_ONLY.get(key.lower())
    if instead is None and key.lower().startswith("kafka."):
        instead = ("client.<setting> for the BookKeeper client's settings (e.g. "
                   "client.tlsCaFile for kafka.ssl.truststore.location); a Kafka consumer or "
                   "producer setting has no counterpart here")
    if instead is not None:
        return (f"option {key!r} is a Kafka option; format({FORMAT_NAME!r}) uses {instead}")
    return (f"unknown option {key!r} for format({FORMAT_NAME!r})"
            + did_you_mean(key, public + list(KAFKA_ALIASES))
            + " Known options (case does not matter): " + ", ".join(public)
            + "; and Kafka's " + ", ".join(KAFKA_ALIASES))


def _check_not_a_client_setting(key: str) -> None:
    """A ClientConfig field given without the ``client.`` prefix: say where it goes."""
    from bkspark.client_settings import camel, field_named
    name = None if key.lower() in _CANON else field_named(key)
    if name is not None:
        raise BadRequestError(f"unknown option {key!r} for format({FORMAT_NAME!r}): did you mean "
                              f"{CLIENT_PREFIX + camel(name)!r}? (client settings take the "
                              f"prefix {CLIENT_PREFIX!r})")


def parse_options(options, *, default_uri=None) -> ConnectorOptions:
    """Validate Spark's options mapping; ``default_uri()`` supplies metadataServiceUri."""
    raw: dict[str, str] = {}
    given_as: dict[str, str] = {}
    client: dict[str, str] = {}
    for key, value in dict(options).items():
        if str(key).lower().startswith(CLIENT_PREFIX):
            client[str(key)] = "" if value is None else str(value)
            continue
        _check_not_a_client_setting(str(key))
        canon = _CANON.get(str(key).lower())
        if canon is None:
            raise BadRequestError(_unknown_option(str(key)))
        if canon in raw:
            raise BadRequestError(f"options {given_as[canon]!r} and {str(key)!r} mean the same "
                                  f"({canon!r}): give it once")
        raw[canon] = "" if value is None else str(value)
        given_as[canon] = str(key)
    o = ConnectorOptions()

    # -- where ----------------------------------------------------------------------------
    uri = raw.get("metadataServiceUri")
    if uri is not None and not uri.strip():
        raise BadRequestError("option 'metadataServiceUri' is empty")
    if uri is None and default_uri is not None:
        uri = default_uri()
    if uri is None:
        raise BadRequestError("option 'metadataServiceUri' is not set, BKSPARK_METADATA_URI was "
                              "not set when Spark started, and no local cluster is running "
                              "(start one with `bkspark localcluster`, or pass e.g. "
                              ".option('metadataServiceUri', 'zk://host:2181/ledgers'))")
    o.metadata_uri = uri.strip()

    given = [k for k in ("log", "logs", "logPattern", "path") if raw.get(k, "").strip()]
    if len(given) > 1:
        raise BadRequestError(f"options {' and '.join(repr(given_as[g]) for g in given)} are "
                              "exclusive: name the logs once")
    if given_as.get("logs", "").lower() == "assign" and raw["logs"].strip().startswith("{"):
        raw["logs"] = _assigned_logs(raw["logs"])
    from metadata.layout import check_log_name
    for key in ("log", "path"):
        if key in given:
            try:
                o.logs = [check_log_name(raw[key].strip())]
            except BadRequestError as e:
                raise BadRequestError(f"option {key!r}: {e}") from None
    if "logs" in given:
        names = [n.strip() for n in raw["logs"].split(",") if n.strip()]
        try:
            o.logs = list(dict.fromkeys(check_log_name(n) for n in names))
        except BadRequestError as e:
            raise BadRequestError(f"option 'logs': {e}") from None
    if "logPattern" in given:
        try:
            re.compile(raw["logPattern"])
        except re.error as e:
            raise BadRequestError(f"option 'logPattern' is not a valid regular expression: {e}") from None
        o.log_pattern = raw["logPattern"]

    # -- reads ----------------------------------------------------------------------------
    if "startingOffsets" in raw:
        o.starting = parse_offsets("startingOffsets", raw["startingOffsets"])
    if "endingOffsets" in raw:
        o.ending = parse_offsets("endingOffsets", raw["endingOffsets"])
    starts = [k for k in ("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp")
              if k in raw]
    ends = [k for k in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
            if k in raw]
    for group in (starts, ends):
        if len(group) > 1:
            raise BadRequestError(f"options {' and '.join(repr(given_as[g]) for g in group)} "
                                  "are exclusive: say where to start (end) once")
    for key, attr in (("startingTimestamp", "starting"), ("endingTimestamp", "ending")):
        if key in raw:
            setattr(o, attr, AtTime(_int(key, raw[key], 0)))
    for key, attr in (("startingOffsetsByTimestamp", "starting"),
                      ("endingOffsetsByTimestamp", "ending")):
        if key in raw:
            setattr(o, attr, parse_timestamps(key, raw[key]))
    for key, value in (("startingOffsets", o.starting), ("endingOffsets", o.ending)):
        if isinstance(value, dict) and o.log_pattern is None:
            extra = sorted(set(value) - set(o.logs))
            if extra:
                key = next((k for k in (starts if key[0] == "s" else ends)), key)
                raise BadRequestError(f"option {given_as.get(key, key)!r} names logs that are "
                                      f"not read: {extra}")
    if "startingOffsetsByTimestampStrategy" in raw:
        v = raw["startingOffsetsByTimestampStrategy"].strip().lower()
        if v not in TIMESTAMP_STRATEGIES:
            raise BadRequestError("option 'startingOffsetsByTimestampStrategy' must be 'error' "
                                  f"or 'latest', got {raw['startingOffsetsByTimestampStrategy']!r}")
        o.timestamp_strategy = v
    if "maxEntriesPerTrigger" in raw:
        o.max_entries_per_trigger = _int(given_as["maxEntriesPerTrigger"],
                                         raw["maxEntriesPerTrigger"], 1)
    if "maxBytesPerTrigger" in raw:
        o.max_bytes_per_trigger = _int("maxBytesPerTrigger", raw["maxBytesPerTrigger"], 1)
    if "minEntriesPerTrigger" in raw:
        o.min_entries_per_trigger = _int(given_as["minEntriesPerTrigger"],
                                         raw["minEntriesPerTrigger"], 1)
    if "maxTriggerDelay" in raw:
        o.max_trigger_delay = _duration("maxTriggerDelay", raw["maxTriggerDelay"])
    if "failOnDataLoss" in raw:
        o.fail_on_data_loss = _bool("failOnDataLoss", raw["failOnDataLoss"])
    if "entriesPerPartition" in raw:
        o.entries_per_partition = _int("entriesPerPartition", raw["entriesPerPartition"], 1)
    if "minPartitions" in raw:
        o.min_partitions = _int("minPartitions", raw["minPartitions"], 1)
    for key, attr in (("maxPartitionBytes", "max_partition_bytes"),
                      ("openCostInBytes", "open_cost_bytes")):
        if key in raw:
            setattr(o, attr, parse_size_bytes(raw[key], f"option {key!r}"))
    if "maxLogsPerWrite" in raw:
        o.max_logs_per_write = _int("maxLogsPerWrite", raw["maxLogsPerWrite"], 1,
                                    MAX_LOGS_PER_WRITE_LIMIT)

    # -- writes ---------------------------------------------------------------------------
    if "ensembleSize" in raw:
        o.ensemble_size = _int("ensembleSize", raw["ensembleSize"], 1, 64)
    if "writeQuorumSize" in raw:
        o.write_quorum = _int("writeQuorumSize", raw["writeQuorumSize"], 1, 64)
    if "ackQuorumSize" in raw:
        o.ack_quorum = _int("ackQuorumSize", raw["ackQuorumSize"], 1, 64)
    if not o.ensemble_size >= o.write_quorum >= o.ack_quorum:
        raise BadRequestError(
            f"options 'ensembleSize' ({o.ensemble_size}) >= 'writeQuorumSize' ({o.write_quorum}) "
            f">= 'ackQuorumSize' ({o.ack_quorum}) must hold")
    if "digestType" in raw:
        d = raw["digestType"].strip().lower()
        if d not in DIGESTS:
            raise BadRequestError(f"option 'digestType' must be one of {', '.join(DIGESTS)}, "
                                  f"got {raw['digestType']!r}")
        o.digest = d
    if "password" in raw:
        o.password = raw["password"].encode()
    if "entryFormat" in raw:
        f = raw["entryFormat"].strip().lower()
        if f not in (RECORD, ARROW):
            raise BadRequestError(f"option 'entryFormat' must be 'record' or 'arrow', "
                                  f"got {raw['entryFormat']!r}")
        o.entry_format = f
    if "schema" in raw:
        v = raw["schema"].strip().lower()
        if v not in SCHEMAS:
            raise BadRequestError(f"option 'schema' must be 'record' or 'kafka', got {raw['schema']!r}")
        if v == "kafka" and o.entry_format != RECORD:
            raise BadRequestError("option schema=kafka reads record entries (entryFormat=record); "
                                  "arrow entries are table rows and keep their own schema")
        o.schema = v
    if "includeHeaders" in raw:
        o.include_headers = _bool("includeHeaders", raw["includeHeaders"])
    by_time = [v for spec in (o.starting, o.ending)
               for v in (spec.values() if isinstance(spec, dict) else [spec])
               if isinstance(v, AtTime)]
    if by_time and o.entry_format != RECORD:
        raise BadRequestError("seeking by time needs record entries (entryFormat=record): "
                                  "arrow entries carry no record timestamps")
    if "queryId" in raw:
        o.query_id = _identifier("queryId", raw["queryId"])
    if "writerId" in raw:
        o.writer_id = _identifier("writerId", raw["writerId"])
    if "writerSequence" in raw:
        o.writer_sequence = _int("writerSequence", raw["writerSequence"], 0)
    if (o.writer_id is None) != (o.writer_sequence is None):
        raise BadRequestError("options 'writerId' and 'writerSequence' go together")
    if "maxEntryBytes" in raw:
        o.max_entry_bytes = _int("maxEntryBytes", raw["maxEntryBytes"], 1024, MAX_ENTRY_BYTES_LIMIT)
    if "maxTimestampAheadMs" in raw:
        o.max_timestamp_ahead_ms = _int("maxTimestampAheadMs", raw["maxTimestampAheadMs"], 0)
    o.compression = DEFAULT_COMPRESSION if o.entry_format == ARROW else None
    if "compression" in raw:
        c = raw["compression"].strip().lower()
        if c not in COMPRESSIONS:
            raise BadRequestError(f"option 'compression' must be one of lz4, zstd, none, "
                                  f"got {raw['compression']!r}")
        if COMPRESSIONS[c] is not None and o.entry_format != ARROW:
            raise BadRequestError("option 'compression' applies to entryFormat=arrow (record "
                                  "entries are single rows)")
        o.compression = COMPRESSIONS[c]
    if o.compression is not None:
        import pyarrow as pa
        if not pa.Codec.is_available(o.compression):
            raise BadRequestError(f"option 'compression': this pyarrow has no {o.compression} "
                                  "codec; use compression=none or another codec")
    if "reclaimAbandonedAfter" in raw:
        o.reclaim_after = float(_int("reclaimAbandonedAfter", raw["reclaimAbandonedAfter"], 0))
    if "retentionTime" in raw or "retentionSize" in raw:
        o.retention = RetentionPolicy(
            ms=parse_duration_ms(raw["retentionTime"], "option 'retentionTime'")
            if "retentionTime" in raw else None,
            bytes=parse_size_bytes(raw["retentionSize"], "option 'retentionSize'")
            if "retentionSize" in raw else None,
            pass_cursors=_bool("retentionPassCursors", raw.get("retentionPassCursors", "false")))
    elif "retentionPassCursors" in raw:
        raise BadRequestError("option 'retentionPassCursors' goes with 'retentionTime' and/or "
                              "'retentionSize'")
    o.read_offloaded = _bool("readOffloaded", raw.get("readOffloaded", "true"))
    if "offloadLocation" in raw:
        from bkspark.log.offload import OffloadPolicy
        if "offloadAfter" not in raw and "offloadBeyond" not in raw:
            raise BadRequestError("option 'offloadLocation' needs 'offloadAfter' and/or "
                                  "'offloadBeyond' (when a closed ledger is offloaded)")
        o.offload = OffloadPolicy.parse(raw["offloadLocation"], raw.get("offloadAfter"),
                                        raw.get("offloadBeyond"),
                                        raw.get("offloadKeepOnBookies"))
    elif "offloadAfter" in raw or "offloadBeyond" in raw or "offloadKeepOnBookies" in raw:
        raise BadRequestError("options 'offloadAfter' / 'offloadBeyond' / "
                              "'offloadKeepOnBookies' go with "
                              "'offloadLocation' (where the Parquet files go)")
    o.test_fault = raw.get("_testFault") or None
    from bkspark.client_settings import client_settings
    o.client_settings = client_settings(client, prefix=CLIENT_PREFIX, camel_case=True,
                                        what="option")
    return o
