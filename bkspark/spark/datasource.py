"""The ``bookkeeper`` Python data source: batch and streaming reads and writes of logs."""
from __future__ import annotations

import json
import logging

from pyspark.sql.datasource import DataSource

from bkspark.errors import BadRequestError, NoSuchLedgerError, NoSuchLogError
from bkspark.spark import codec, conn, importguard
from bkspark.spark.options import FORMAT_NAME, RECORD, parse_options

log = logging.getLogger("bkspark.spark")


def _default_uri():
    from bkspark.cluster_registry import default_metadata_uri
    return default_metadata_uri()


def _strip_nullability(obj):
    if isinstance(obj, dict):
        return {k: _strip_nullability(v) for k, v in obj.items()
                if k not in ("nullable", "containsNull", "valueContainsNull", "metadata")}
    if isinstance(obj, list):
        return [_strip_nullability(v) for v in obj]
    return obj


class BookKeeperDataSource(importguard.Guarded, DataSource,
                           metaclass=importguard.guard_class(type(DataSource))):
    """``format("bookkeeper")`` — see :mod:`bkspark.spark` for the options. The class and its
    instances pickle through :mod:`bkspark.spark.importguard` (a Spark Python without bkspark
    says what to install where)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def __init__(self, options):
        super().__init__(options)
        self.opts = parse_options(options, default_uri=_default_uri)

    # ---- schema -------------------------------------------------------------------------
    def schema(self):
        if self.opts.entry_format == RECORD:
            return self._record_schema()
        return self._stored_schema(required=True)

    def _record_schema(self):
        if self.opts.schema == "kafka":
            return codec.kafka_spark_schema(self.opts.include_headers)
        return codec.record_spark_schema()

    def _stored_schema(self, required: bool):
        """The Spark schema recorded in the newest arrow ledger of the (first) log read."""
        from pyspark.sql.types import StructType
        self.opts.require_logs()
        logs = conn.log_store(self.opts)
        names = self.opts.matching_logs(logs.list_logs())
        def newest_first(name):
            newest = logs.last_listed(name)     # usually it: the whole list only if not
            if newest is not None:
                yield newest
                yield from reversed(logs.get(name)[0].ledgers[:-1])
        for name in names:
            try:
                for entry in newest_first(name):
                    try:        # (one whose bookies' copy was dropped: not there)
                        custom = logs.bk.ledger_metadata(entry.ledger_id).custom_metadata
                    except NoSuchLedgerError:
                        continue
                    js = codec.ledger_spark_schema_json(custom)
                    if js:
                        return StructType.fromJson(json.loads(js))
            except NoSuchLogError:
                continue
        if required:
            raise BadRequestError(
                f"entryFormat=arrow: cannot infer the schema of {names or self.opts.log_pattern!r}: "
                "no arrow-format ledger found (the log is missing or empty); pass .schema(...)")
        return None

    def _check_read_schema(self, schema) -> None:
        if self.opts.entry_format == RECORD:
            expected = self._record_schema()
            if [(f.name, f.dataType) for f in schema.fields] != \
                    [(f.name, f.dataType) for f in expected.fields]:
                raise BadRequestError(
                    f"schema={self.opts.schema} reads have the fixed schema "
                    f"{expected.simpleString()}; got .schema({schema.simpleString()}) (drop "
                    ".schema(), or use entryFormat=arrow for tables)")

    # ---- batch --------------------------------------------------------------------------
    def reader(self, schema):
        from bkspark.spark.reader import make_batch_reader
        self.opts.require_logs()
        self._check_read_schema(schema)
        return make_batch_reader(self.opts, schema)

    def writer(self, schema, overwrite: bool):
        from bkspark.spark.writer import BookKeeperBatchWriter
        self._check_write(schema, overwrite)
        return BookKeeperBatchWriter(self.opts, schema, overwrite)

    def _check_write(self, schema, overwrite: bool) -> None:
        from bkspark.spark import routing
        from bkspark.spark.writer import prepare_log
        name = self.opts.write_target()
        for key in ("starting", "ending"):
            if getattr(self.opts, key) is not None:
                opt = "startingOffsets" if key == "starting" else "endingOffsets"
                raise BadRequestError(f"option {opt!r} is for reads, not writes")
        if name is None:                    # routed by a column: its logs are checked at commit
            routing.check_routed_schema(schema, self.opts.entry_format)
            if overwrite:
                raise BadRequestError("mode('overwrite') replaces one log: set option 'log' "
                                      "(a write routed by its 'topic' column can only append)")
        self._check_cluster_fits()
        self._reclaim_abandoned(name)
        if name is not None:
            prepare_log(conn.log_store(self.opts), self.opts, name, overwrite=overwrite)
        if self.opts.entry_format == RECORD:
            codec.check_record_write_schema(schema)
            return
        if overwrite:
            return
        try:
            existing = self._stored_schema(required=False)
        except BadRequestError:
            existing = None
        if existing is not None:
            a = _strip_nullability(json.loads(existing.json()))
            b = _strip_nullability(json.loads(schema.json()))
            if a != b:
                raise BadRequestError(
                    f"entryFormat=arrow: log {name!r} holds rows of schema "
                    f"{existing.simpleString()}; cannot append {schema.simpleString()} "
                    "(use mode('overwrite') or another log)")

    def _check_cluster_fits(self) -> None:
        """Refuse, before any task runs, ledgers that the cluster cannot place (or bookies
        this client cannot talk to: TLS ones without option client.tlsCaFile)."""
        bk = conn.bookkeeper(self.opts.metadata_uri, self.opts.client_settings)
        writable = bk.ctx.writable_bookies()
        if self.opts.ensemble_size > len(writable):
            raise BadRequestError(
                f"option 'ensembleSize' is {self.opts.ensemble_size} but the cluster at "
                f"{self.opts.metadata_uri} has {len(writable)} writable bookies "
                f"({', '.join(sorted(writable)) or 'none'}): start more bookies, or lower "
                "'ensembleSize' (and 'writeQuorumSize'/'ackQuorumSize' with it)")

    def _reclaim_abandoned(self, name: str | None) -> None:
        """Delete the leftover ledgers of this log's write jobs (of routed write jobs: ``name``
        None) whose driver is gone (:func:`bkspark.spark.pending.reclaim`); a failure here
        only postpones that."""
        from bkspark.errors import BKError
        from bkspark.spark import pending
        name = name or pending.ROUTED
        try:
            for job in pending.reclaim(conn.log_store(self.opts), grace=self.opts.reclaim_after,
                                       log_name=name):
                if job.verdict == "reclaimed":
                    log.warning("log %s: deleted ledgers %s of abandoned write job %s", name,
                                job.deleted, job.key)
        except BKError as exc:
            log.warning("log %s: abandoned write jobs not reclaimed now: %s", name, exc)

    # ---- streaming ----------------------------------------------------------------------
    def streamReader(self, schema):
        from bkspark.spark.stream import BookKeeperStreamReader
        self.opts.require_logs()
        if self.opts.ending is not None:
            raise BadRequestError("option 'endingOffsets' is for batch reads; streaming queries "
                                  "read until stopped (use Trigger.AvailableNow for a bounded run)")
        self._check_read_schema(schema)
        return BookKeeperStreamReader(self.opts, schema)

    def streamWriter(self, schema, overwrite: bool):
        from bkspark.spark.writer import BookKeeperStreamWriter
        if overwrite:
            raise BadRequestError("the bookkeeper sink appends: output mode 'complete' is not "
                                  "supported (use 'append' or 'update')")
        self._check_write(schema, False)
        return BookKeeperStreamWriter(self.opts, schema)
