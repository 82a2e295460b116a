"""`bkspark shell <command>`: admin commands modelled on BookKeeper's shell.

Every command prints a human-readable table (rich) by default and one JSON document with
``--json``; errors go to stderr with a non-zero exit status (1 = failed, 2 = bad usage).
The metadata service is ``--metadata URI`` or ``$BKSPARK_METADATA_URI`` (or the local
cluster running on this machine); the client's settings are ``--tls-ca-file PEM`` (bookies
serving TLS), ``--client-config FILE`` and ``--client-option KEY=VALUE`` (see
:mod:`bkspark.cli.client_args`). ``lastmark``, ``readjournal`` and ``readlog`` are offline
tools reading a (stopped) bookie's directories; they need no metadata.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time

from bkspark.cli import client_args
from bkspark.errors import (BadRequestError, BKError, MetadataFormatError, NoSuchLedgerError,
                            did_you_mean)
from bkspark.log.retention import RetentionPolicy

COMMANDS = {}


def command(name, help_text):
    def deco(fn):
        COMMANDS[name] = (fn, help_text)
        return fn
    return deco


class ShellError(Exception):
    """A clear message for the user; exit status ``code``."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


# ---- argument parsing --------------------------------------------------------------------

def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--metadata", default=argparse.SUPPRESS,
                   help="metadata URI (default: $BKSPARK_METADATA_URI)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print JSON instead of tables")
    client_args.add_arguments(p, suppress=True)
    return p


def _rate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", type=float, default=0.0, metavar="MB/S",
                   help="copy at most this many MB/s (default 0 = unlimited: the shortest "
                        "time under-replicated, the most added to foreground latency)")
    p.add_argument("--rate-entries", type=float, default=0.0, metavar="ENTRIES/S",
                   help="copy at most this many entries/s (default 0 = unlimited)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = _common()
    parser.add_argument("--metadata", default=argparse.SUPPRESS,
                        help="metadata URI (default: $BKSPARK_METADATA_URI)")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    client_args.add_arguments(parser, suppress=True)
    sub = parser.add_subparsers(dest="shell_command", required=True, metavar="<command>")

    def add(name, help_text):
        return sub.add_parser(name, help=help_text, parents=[common], description=help_text)

    p = add("listbookies", "list registered bookies")
    p.add_argument("--readonly", action="store_true", help="only read-only bookies")
    p.add_argument("--all", action="store_true", help="writable and read-only bookies")
    add("listledgers", "list ledgers with their state and quorums")
    p = add("ledgermetadata", "print the metadata of a ledger")
    p.add_argument("ledger_id", type=int)
    p = add("readledger", "read the entries of a ledger")
    p.add_argument("ledger_id", type=int)
    p.add_argument("--from", dest="first", type=int, default=0)
    p.add_argument("--to", dest="last", type=int, default=None)
    p.add_argument("--force-recovery", action="store_true",
                   help="fence and recover an open ledger first (stops its writer!)")
    p.add_argument("--max-bytes", type=int, default=64,
                   help="payload bytes shown per entry in tables (default 64)")
    p = add("deleteledger", "delete a ledger (metadata; bookies garbage-collect the data)")
    p.add_argument("ledger_id", type=int)
    p.add_argument("--force", action="store_true",
                   help="also delete an OPEN ledger, or one that logs list (it is removed "
                        "from their lists first)")
    p = add("listunderreplicated", "list under-replicated ledgers (autorecovery records)")
    p.add_argument("--missing", default=None, metavar="BOOKIE",
                   help="only ledgers whose record names this bookie")
    add("whoisauditor", "print the elected auditor")
    add("triggeraudit", "ask the auditor for a full audit now (lost bookies published without "
                        "the recovery delay, entries and placement checked)")
    p = add("autorecovery", "enable/disable autorecovery cluster-wide, or show its status")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--enable", action="store_true")
    g.add_argument("--disable", action="store_true")
    g.add_argument("--status", action="store_true")
    p.add_argument("--delay", type=float, default=None,
                   help="set lostBookieRecoveryDelay (seconds) in the metadata")
    p = add("simpletest", "write, read back and verify N entries across the cluster")
    p.add_argument("--entries", type=int, default=100)
    p.add_argument("--ensemble", type=int, default=3)
    p.add_argument("--write-quorum", type=int, default=2)
    p.add_argument("--ack-quorum", type=int, default=2)
    p.add_argument("--entry-size", type=int, default=1024)
    p = add("bookiesanity", "write/read/delete a small ledger on each bookie (or one)")
    p.add_argument("--bookie", default=None)
    p.add_argument("--entries", type=int, default=10)
    p = add("lastmark", "print a bookie's LastLogMark (offline)")
    p.add_argument("ledger_dir", help="ledger directory (or lastMark file) of the bookie")
    p = add("readjournal", "dump journal records (offline)")
    p.add_argument("path", help="journal directory or .txn file")
    p.add_argument("--ledger", type=int, default=None)
    p.add_argument("--limit", type=int, default=1000)
    p = add("readlog", "dump entry log records (offline)")
    p.add_argument("path", help="entry log file (<id>.log)")
    p.add_argument("--ledger", type=int, default=None)
    p.add_argument("--entry", type=int, default=None)
    p.add_argument("--limit", type=int, default=1000)
    p = add("logs", "list logs: segments, entries, size, retention, cursor lags")
    p.add_argument("log", nargs="*", help="only these logs (default: every log)")
    p.add_argument("--ledgers", action="store_true", help="also list each log's ledger ids "
                                                           "(reads every segment record)")
    p = add("set-retention", "set a log's retention policy (applied by the retention service "
                             "of `bkspark autorecovery` / `bkspark localcluster`)")
    p.add_argument("log")
    p.add_argument("--time", default=None, metavar="AGE",
                   help="keep ledgers closed within this time (7d, 12h, 30m, or ms)")
    p.add_argument("--size", default=None, metavar="BYTES",
                   help="keep about this many bytes (10GiB, 500MB, or bytes)")
    p.add_argument("--pass-cursors", action="store_true",
                   help="remove data cursors have not read (Kafka); default: keep what the "
                        "slowest active cursor has not read (Pulsar)")
    p.add_argument("--cursor-active", default=None, metavar="AGE",
                   help="a cursor idle for longer holds nothing back (default 7d)")
    p.add_argument("--keep-everything", action="store_true", help="remove the policy")
    p = add("apply-retention", "apply logs' retention policies now (what the retention "
                               "service does every pass)")
    p.add_argument("log", nargs="*", help="only these logs (default: every log)")
    p = add("set-offload", "set a log's offload policy: closed ledgers become Parquet files "
                           "(applied by the service that applies retention)")
    p.add_argument("log")
    p.add_argument("--location", default=None, metavar="URI",
                   help="directory the files go to: an absolute path or a URI (file://, "
                        "hdfs://, s3://); each log gets log=<name>/ in it")
    p.add_argument("--after", default=None, metavar="AGE",
                   help="offload ledgers closed longer ago (1h, 7d, or ms)")
    p.add_argument("--beyond", default=None, metavar="BYTES",
                   help="offload ledgers wholly beyond this many bytes of the log's tail "
                        "(10GiB, 500MB)")
    p.add_argument("--keep-on-bookies", default=None, metavar="AGE",
                   help="drop the bookies' copy of an offloaded ledger this long after its "
                        "offload (0, 1d, 7d; default: the bookies keep it); only ledgers "
                        "whose files give back every entry byte for byte are dropped")
    p.add_argument("--off", action="store_true", help="remove the policy (files stay)")
    p = add("offload", "offload logs' closed ledgers now, as their policies say (what the "
                       "service does every pass): write their files, drop the bookies' "
                       "copies kept long enough, remove a crashed offload's files")
    p.add_argument("log", nargs="*", help="only these logs (default: every log with a policy)")
    add("zk-acl", "give every record under the ZooKeeper root the ACL of the URI's credentials "
                  "(digest_file / sasl_file): for a tree created before they were set")
    add("upgrade-ledgers", "rewrite ledger records of format 1 (which held the ledger's "
                           "password) in the current format (a salted key record, no "
                           "password); each converts on its next write anyway")
    p = add("convert-logs", "convert logs kept as one metadata record (format 1) to a head plus "
                            "one record per ledger (format 2); each log converts on its first "
                            "write anyway")
    p.add_argument("log", nargs="*", help="logs to convert (default: every log)")
    p = add("delete-cursor", "delete a log cursor (e.g. of a streaming query given up for good: "
                             "a cursor holds truncation back)")
    p.add_argument("log")
    p.add_argument("cursor")
    p = add("gc-pending", "reclaim the ledgers of Spark write jobs whose driver is gone")
    p.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                   help="silence (no live task) after which a job counts as abandoned "
                        "(default: the connector's, 600)")
    p.add_argument("--log", default=None, help="only jobs writing this log")
    p.add_argument("--dry-run", action="store_true", help="report, delete nothing")
    p = add("recover", "re-replicate everything that was on a failed bookie")
    p.add_argument("bookie")
    p.add_argument("--to", default=None, help="bookie to copy to (default: random per fragment)")
    p.add_argument("--skip-open-ledgers", action="store_true",
                   help="do not fence open ledgers whose last fragment uses the bookie")
    p.add_argument("--parallel", type=int, default=4, help="ledgers at once (default 4)")
    p.add_argument("--parallel-fragments", type=int, default=2,
                   help="fragments of one ledger at once (default 2)")
    _rate_arguments(p)
    p = add("decommission", "retire a bookie safely (read-only, migrate, delete cookie)")
    p.add_argument("bookie")
    _rate_arguments(p)
    p.add_argument("--open-ledger-grace", type=float, default=30.0,
                   help="seconds open ledgers on the bookie get to move on before they are "
                        "fenced (default 30)")


def run(args: argparse.Namespace) -> int:
    fn, _ = COMMANDS[args.shell_command]
    out = Output(getattr(args, "json", False))
    try:
        fn(args, out)
        return 0
    except ShellError as exc:
        print(f"bkspark shell {args.shell_command}: error: {exc}", file=sys.stderr)
        return exc.code
    except BKError as exc:
        print(f"bkspark shell {args.shell_command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"bkspark shell {args.shell_command}: interrupted", file=sys.stderr)
        return 130


# ---- output -------------------------------------------------------------------------------

class Output:
    def __init__(self, as_json: bool):
        self.as_json = as_json
        self._console = None

    @property
    def console(self):
        if self._console is None:
            from rich.console import Console
            self._console = Console(file=sys.stdout, soft_wrap=True)
        return self._console

    def json(self, doc) -> None:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()

    def table(self, title, columns, rows, doc=None) -> None:
        """Print ``rows`` as a table, or ``doc`` (default: list of row dicts) as JSON."""
        if self.as_json:
            self.json(doc if doc is not None else [dict(zip(columns, r)) for r in rows])
            return
        from rich.table import Table
        t = Table(title=title)
        for c in columns:
            t.add_column(str(c))
        for r in rows:
            t.add_row(*["" if v is None else str(v) for v in r])
        self.console.print(t)

    def message(self, text, doc=None) -> None:
        if self.as_json:
            self.json(doc if doc is not None else {"message": text})
        else:
            self.console.print(text)


# ---- helpers ---------------------------------------------------------------------------------

def _uri(args) -> str:
    from bkspark.cluster_registry import NO_METADATA_SERVICE, default_metadata_uri
    uri = default_metadata_uri(getattr(args, "metadata", None))
    if not uri:
        raise ShellError(NO_METADATA_SERVICE.replace("pass a URI", "pass --metadata URI"), 2)
    return uri


def _store(args):
    from metadata import open_store
    return open_store(_uri(args), connect_timeout=10.0)


def _client(args):
    from bkspark.client import BookKeeper
    uri = _uri(args)
    try:
        settings = client_args.client_settings(args)
    except BadRequestError as exc:
        raise ShellError(str(exc), 2) from None
    return BookKeeper(uri, role="admin",    # a local cluster's admin credentials, if none given
                      **{"add_timeout": 10.0, "read_timeout": 10.0, **settings})


def _md_doc(md, version=None) -> dict:
    d = md.to_public_dict()
    d["ensembles"] = [{"first_entry_id": f, "bookies": list(b)} for f, b in md.ensembles]
    d["custom_metadata"] = {k: v.decode("utf-8", "replace") for k, v in md.custom_metadata.items()}
    if version is not None:
        d["version"] = version
    return d


# ---- metadata commands --------------------------------------------------------------------------

@command("listbookies", "list registered bookies")
def cmd_listbookies(args, out):
    from metadata import registry
    with _store(args) as store:
        rows = []
        if not args.readonly or args.all:
            rows += [(b, "writable", i) for b, i in sorted(registry.list_bookies(store).items())]
        if args.readonly or args.all:
            rows += [(b, "readonly", i) for b, i in
                     sorted(registry.list_bookies(store, readonly=True).items())]
    docs = [{"bookie_id": b, "state": s, "address": i.get("address", b), "rack": i.get("rack", ""),
             "http_port": i.get("http_port")} for b, s, i in rows]
    out.table("bookies", ["bookie_id", "state", "address", "rack", "http_port"],
              [(d["bookie_id"], d["state"], d["address"], d["rack"], d["http_port"])
               for d in docs], docs)


def _open_ledger_extent(bk, md) -> tuple[int, int, int]:
    """(last add confirmed, last entry stored, bytes stored) of a ledger that is not closed,
    from its bookies and without fencing it (its metadata records an end only once closed).
    Entries past the LAC -- a writer that died before confirming them -- are read forward
    until one is missing: what they hold on disk, which recovery may still cut."""
    rh = bk.open_ledger_without_password(md.ledger_id, recovery=False)
    try:
        lac = last = rh.last_add_confirmed
        length = next(iter(rh.read(lac, lac))).length if lac >= 0 else 0
        chunk = 64
        while True:
            try:
                for entry in rh.read_unconfirmed(last + 1, last + chunk):
                    last, length = entry.entry_id, entry.length
            except BKError:
                break                       # the first entry no bookie has: the stored end
            chunk = min(chunk * 4, 4096)
        return lac, last, length
    finally:
        rh.close()


@command("listledgers", "list ledgers")
def cmd_listledgers(args, out):
    from metadata import ledgers as ls
    from metadata.ledger_metadata import LedgerState
    docs = []
    with _client(args) as bk:
        for lid in ls.list_ledgers(bk.store):
            try:
                md, _ = ls.read_ledger(bk.store, lid)
            except BKError as exc:
                docs.append({"ledger_id": lid, "error": str(exc)})
                continue
            doc = {"ledger_id": lid, "state": md.state.value,
                   "quorums": f"{md.ensemble_size}/{md.write_quorum}/{md.ack_quorum}",
                   "last_entry_id": md.last_entry_id, "length": md.length,
                   "fragments": len(md.ensembles), "bookies": sorted(md.all_bookies())}
            if md.state is not LedgerState.CLOSED:      # its size so far, from the bookies
                try:
                    lac, doc["last_entry_id"], doc["length"] = _open_ledger_extent(bk, md)
                    doc["extent"] = f"stored on bookies; last add confirmed {lac}"
                except BKError as exc:
                    doc["last_entry_id"] = doc["length"] = None
                    doc["extent"] = f"unknown: {exc}"
            docs.append(doc)
    out.table(f"{len(docs)} ledgers", ["ledger_id", "state", "E/Qw/Qa", "last_entry_id",
                                       "length", "fragments"],
              [(d["ledger_id"], d.get("state", "?"), d.get("quorums", d.get("error")),
                d.get("last_entry_id") if "extent" not in d else f"{d['last_entry_id']} (stored)",
                d.get("length"), d.get("fragments")) for d in docs], docs)


@command("ledgermetadata", "print ledger metadata")
def cmd_ledgermetadata(args, out):
    from metadata import ledgers as ls
    with _store(args) as store:
        md, version = ls.read_ledger(store, args.ledger_id)
    doc = _md_doc(md, version)
    if out.as_json:
        out.json(doc)
        return
    out.console.print(f"ledger {md.ledger_id}  state={md.state.value}  "
                      f"E/Qw/Qa={md.ensemble_size}/{md.write_quorum}/{md.ack_quorum}  "
                      f"last_entry_id={md.last_entry_id}  length={md.length}  "
                      f"digest={md.digest_type}  version={version}  ctime_ms={md.ctime_ms}")
    out.table("fragments", ["first_entry_id", "bookies"],
              [(f, ", ".join(b)) for f, b in md.ensembles])


@command("readledger", "read entries")
def cmd_readledger(args, out):
    with _client(args) as bk:
        rh = bk.open_ledger_without_password(args.ledger_id, recovery=args.force_recovery)
        last = rh.last_add_confirmed if args.last is None else args.last
        if args.first < 0:
            raise ShellError("--from must be >= 0", 2)
        docs = []
        if last >= args.first:
            for e in rh.read(args.first, last):
                docs.append({"entry_id": e.entry_id, "bytes": len(e.data),
                             "data_b64": base64.b64encode(e.data).decode("ascii"),
                             "preview": e.data[:args.max_bytes]})
    if out.as_json:
        out.json({"ledger_id": args.ledger_id, "last_add_confirmed": last,
                  "entries": [{k: v for k, v in d.items() if k != "preview"} for d in docs]})
        return
    out.table(f"ledger {args.ledger_id}: entries {args.first}..{last}",
              ["entry_id", "bytes", "data"],
              [(d["entry_id"], d["bytes"], repr(d["preview"])[2:-1]
                + ("..." if d["bytes"] > args.max_bytes else "")) for d in docs])


@command("deleteledger", "delete a ledger")
def cmd_deleteledger(args, out):
    from bkspark.log import LogStore
    from metadata import ledgers as ls
    from metadata.ledger_metadata import LedgerState
    lid = args.ledger_id
    with _client(args) as bk:
        md, _ = ls.read_ledger(bk.store, lid)
        if md.state is not LedgerState.CLOSED and not args.force:
            raise ShellError(f"ledger {lid} is {md.state.value}: a writer may still use it; "
                             "pass --force to delete it anyway")
        logs = LogStore(bk)
        listing = logs.logs_listing(lid)
        if listing and not args.force:
            raise ShellError(
                f"ledger {lid} is part of log {', '.join(map(repr, listing))}: deleting it would "
                "leave the log naming a missing ledger (to drop a log's oldest data, truncate it: "
                "LogStore.truncate); pass --force to remove the ledger from the log and delete it")
        for name in listing:
            logs.unlist_ledger(name, lid, force=True)     # (--force: even if it cannot be fenced)
        # deleted only once no log lists it, proven on every log's record (the scan above is
        # not a proof: a batch commit may append the ledger after it) -- one CAS per log
        if lid not in logs.delete_unreferenced(logs.list_logs(), [lid]):
            raise ShellError(f"ledger {lid} is listed by a log (again): not deleted")
        if ls.ledger_exists(bk.store, lid):
            raise ShellError(f"ledger {lid} could not be deleted (see the warning above); run "
                             "deleteledger again")
    out.message(f"deleted ledger {lid}" + (f" (removed from log {', '.join(listing)})"
                                           if listing else ""),
                {"deleted": lid, "removed_from_logs": listing})


# ---- autorecovery commands -------------------------------------------------------------------------

@command("listunderreplicated", "list under-replicated ledgers")
def cmd_listunderreplicated(args, out):
    from bkspark.recovery.urm import UnderReplicationManager
    with _store(args) as store:
        urm = UnderReplicationManager(store)
        docs = []
        for lid in urm.list():
            got = urm.get(lid)
            if got is None:
                continue
            rec, version = got
            if args.missing and args.missing not in rec.get("missing", []):
                continue
            docs.append({"ledger_id": lid, "missing": rec.get("missing", []),
                         "ctime_ms": rec.get("ctime_ms"), "locked_by": urm.lock_holder(lid)})
    out.table(f"{len(docs)} under-replicated ledgers",
              ["ledger_id", "missing bookies", "locked by"],
              [(d["ledger_id"], ", ".join(d["missing"]) or "(entries missing)",
                d["locked_by"] or "") for d in docs], docs)


@command("whoisauditor", "print the auditor")
def cmd_whoisauditor(args, out):
    from bkspark.recovery.urm import UnderReplicationManager
    with _store(args) as store:
        auditor = UnderReplicationManager(store).auditor()
    if auditor is None:
        raise ShellError("no auditor is elected (is any autorecovery process running?)")
    out.message(f"auditor: {auditor}", {"auditor": auditor})


@command("triggeraudit", "request a full audit")
def cmd_triggeraudit(args, out):
    from bkspark.recovery.urm import UnderReplicationManager
    with _store(args) as store:
        urm = UnderReplicationManager(store, "shell")
        version = urm.request_audit(by="shell")
        auditor = urm.auditor()
    doc = {"requested": version, "auditor": auditor}
    if auditor is None:
        raise ShellError("audit requested, but no auditor is elected to run it (is any "
                         "autorecovery process running? `bkspark autorecovery`, or bookies "
                         "with --autorecovery; a new auditor scans for lost bookies as it "
                         "starts)")
    out.message(f"audit requested; auditor {auditor} runs it within a second", doc)


@command("autorecovery", "toggle autorecovery")
def cmd_autorecovery(args, out):
    from bkspark.recovery.urm import UnderReplicationManager
    with _store(args) as store:
        urm = UnderReplicationManager(store)
        if args.enable:
            urm.enable()
        elif args.disable:
            urm.disable()
        if args.delay is not None:
            if args.delay < 0:
                raise ShellError("--delay must be >= 0", 2)
            urm.set_lost_bookie_recovery_delay(args.delay)
        doc = {"enabled": urm.is_enabled(), "auditor": urm.auditor(),
               "under_replicated": len(urm.list()),
               "lost_bookie_recovery_delay": urm.lost_bookie_recovery_delay(-1.0)}
    if doc["lost_bookie_recovery_delay"] < 0:
        doc["lost_bookie_recovery_delay"] = None
    delay = doc["lost_bookie_recovery_delay"]
    out.message(f"autorecovery is {'ENABLED' if doc['enabled'] else 'DISABLED'}; auditor: "
                f"{doc['auditor'] or 'none'}; under-replicated ledgers: "
                f"{doc['under_replicated']}; lostBookieRecoveryDelay: "
                f"{'process default' if delay is None else f'{delay:g}s'}", doc)


# ---- cluster tests ------------------------------------------------------------------------------------

@command("simpletest", "write/read/verify")
def cmd_simpletest(args, out):
    if args.entries < 1:
        raise ShellError("--entries must be >= 1", 2)
    t0 = time.monotonic()
    with _client(args) as bk:
        lh = bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum,
                              password=b"simpletest")
        payloads = [os.urandom(args.entry_size) for _ in range(args.entries)]
        futures = [lh.append_async(p) for p in payloads]
        for f in futures:
            f.result()
        lh.close()
        t_write = time.monotonic() - t0
        rh = bk.open_ledger(lh.ledger_id, password=b"simpletest")
        got = [e.data for e in rh.read(0, rh.last_add_confirmed)]
        ok = got == payloads
        ensemble = lh.metadata.last_ensemble() if hasattr(lh, "metadata") else []
        bk.delete_ledger(lh.ledger_id)
    doc = {"ledger_id": lh.ledger_id, "entries": args.entries, "verified": ok,
           "ensemble": ensemble, "write_seconds": round(t_write, 3),
           "total_seconds": round(time.monotonic() - t0, 3)}
    if not ok:
        raise ShellError(f"simpletest: read back {len(got)} entries that differ from the "
                         f"{args.entries} written (ledger {lh.ledger_id})")
    out.message(f"simpletest OK: wrote, read and verified {args.entries} entries of "
                f"{args.entry_size} bytes on ledger {lh.ledger_id} (ensemble {ensemble}) in "
                f"{doc['total_seconds']}s", doc)


@command("bookiesanity", "sanity check of bookies")
def cmd_bookiesanity(args, out):
    from bkspark.client import LedgerHandle
    from metadata import ledgers as ls
    from metadata import registry
    from metadata.ledger_metadata import LedgerMetadata
    results = []
    with _client(args) as bk:
        bookies = sorted(registry.list_bookies(bk.store))
        if args.bookie:
            if args.bookie not in bookies:
                raise ShellError(f"bookie {args.bookie} is not a registered writable bookie")
            bookies = [args.bookie]
        if not bookies:
            raise ShellError("no writable bookies are registered")
        for b in bookies:
            t0 = time.monotonic()
            try:
                md = ls.create_ledger(bk.store, LedgerMetadata.new(
                    [b], 1, 1, password=b"bookiesanity"))
                lh = LedgerHandle(bk.ctx, md, ls.CREATED_VERSION, md.keys.derive(b"bookiesanity"))
                data = [f"sanity-{i}".encode() for i in range(args.entries)]
                for d in data:
                    lh.append(d)
                lh.close()
                rh = bk.open_ledger(md.ledger_id, password=b"bookiesanity")
                ok = [e.data for e in rh.read(0, rh.last_add_confirmed)] == data
                bk.delete_ledger(md.ledger_id)
                results.append({"bookie": b, "ok": ok, "error": None if ok else "mismatch",
                                "seconds": round(time.monotonic() - t0, 3)})
            except BKError as exc:
                results.append({"bookie": b, "ok": False, "error": str(exc),
                                "seconds": round(time.monotonic() - t0, 3)})
    out.table("bookie sanity", ["bookie", "ok", "seconds", "error"],
              [(r["bookie"], "OK" if r["ok"] else "FAILED", r["seconds"], r["error"] or "")
               for r in results], results)
    failed = [r["bookie"] for r in results if not r["ok"]]
    if failed:
        raise ShellError(f"bookie sanity check failed on {', '.join(failed)}")


# ---- offline tools ------------------------------------------------------------------------------------

@command("lastmark", "LastLogMark")
def cmd_lastmark(args, out):
    from bkspark.cli.bookie_files import read_lastmark
    doc = read_lastmark(args.ledger_dir)
    out.message(f"LastLogMark: journal {doc['journal_file']} position {doc['position']}"
                f"{'' if doc['valid'] else '  (CHECKSUM MISMATCH)'}  ({doc['path']})", doc)


@command("readjournal", "journal dump")
def cmd_readjournal(args, out):
    from bkspark.cli.bookie_files import read_journal
    recs = []
    for rec in read_journal(args.path, args.ledger):
        recs.append(rec)
        if len(recs) >= args.limit:
            break
    out.table(f"{len(recs)} journal records", ["file", "offset", "type", "ledger_id",
                                               "entry_id", "length"],
              [(r.get("file"), r.get("offset"), r.get("type"), r.get("ledger_id", ""),
                r.get("entry_id", ""), r.get("length", "")) for r in recs], recs)


@command("readlog", "entry log dump")
def cmd_readlog(args, out):
    from bkspark.cli.bookie_files import read_entry_log
    recs = []
    for rec in read_entry_log(args.path, args.ledger):
        if args.entry is not None and rec["entry_id"] != args.entry:
            continue
        recs.append(rec)
        if len(recs) >= args.limit:
            break
    out.table(f"{len(recs)} entry log records", ["offset", "ledger_id", "entry_id",
                                                 "body_bytes", "crc"],
              [(r["offset"], r["ledger_id"], r["entry_id"], r["body_bytes"],
                "ok" if r["crc_ok"] else "MISMATCH") for r in recs], recs)


# ---- logs ------------------------------------------------------------------------------------------------

@command("logs", "logs and cursors")
def cmd_logs(args, out):
    from bkspark.log import LogStore
    docs = []
    with _client(args) as bk:
        logs = LogStore(bk)
        names = _chosen_logs(logs, args.log)
        stats = logs.stats_many(names, cursors=True)    # (a few pipelined reads per 512 logs)
        for name in names:
            try:
                if isinstance(stats[name], BKError):
                    raise stats[name]
                doc = {"log": name, **stats[name]}
                doc["cursors"] = {c: {"position": str(pos), "lag": lag}
                                  for c, (pos, lag) in doc.pop("cursor_lags").items()}
                if args.ledgers:
                    doc["ledgers"] = _log_ledgers(logs.get(name)[0])
                docs.append(doc)
            except BKError as exc:
                docs.append({"log": name, "error": str(exc)})
    offloads = any(d.get("offload") for d in docs)     # (the column only where it says something)
    columns = ["log", "segments", "entries", "size", "retention"] + \
        (["offloaded (lag)"] if offloads else []) + ["cursors (lag)"]
    rows = []
    for d in docs:
        if "error" in d:
            rows.append((d["log"], "", "", "", "") + (("",) if offloads else ()) + (d["error"],))
            continue
        policy = RetentionPolicy.from_property(d["retention"])
        offloaded = () if not offloads else ("" if d["offload"] is None else (
            f"{d['offloaded_entries']}, {_human_size(d['offloaded_bytes'])} "
            f"({d['offload_lag'] if d['offload_lag'] is not None else '?'})" +
            (f"; {d['dropped_entries']}, {_human_size(d['dropped_bytes'])} only there"
             if d["dropped_entries"] else "")),)
        rows.append((d["log"], d["segments"], d["entries"], _human_size(d["bytes"]),
                     policy.describe() if policy else "keep everything") + offloaded +
                    (", ".join(f"{c}={v['lag']}" for c, v in d["cursors"].items()),))
    if args.ledgers:
        columns.append("ledgers")
        rows = [r + (", ".join(map(str, d.get("ledgers", []))),) for r, d in zip(rows, docs)]
    out.table(f"{len(docs)} logs", columns, rows, docs)


def _chosen_logs(logs, names) -> list[str]:
    known = logs.list_logs()
    for name in names or ():
        if name not in known:
            raise BadRequestError(f"no log named {name!r}" + did_you_mean(name, known))
    return list(names) if names else known


def _human_size(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@command("set-retention", "set a log's retention policy")
def cmd_set_retention(args, out):
    from bkspark.log import LogStore
    from bkspark.log.retention import parse_duration_ms, parse_size_bytes
    if args.keep_everything and (args.time or args.size or args.pass_cursors or args.cursor_active):
        raise BadRequestError("--keep-everything removes the policy: give it alone")
    if not args.keep_everything and args.time is None and args.size is None:
        raise BadRequestError("give --time and/or --size (or --keep-everything to remove the "
                              "policy)")
    with _client(args) as bk:
        logs = LogStore(bk)
        _chosen_logs(logs, [args.log])
        policy = None
        if not args.keep_everything:
            extra = {} if args.cursor_active is None else \
                {"cursor_active_ms": parse_duration_ms(args.cursor_active, "--cursor-active")}
            policy = RetentionPolicy(
                ms=None if args.time is None else parse_duration_ms(args.time, "--time"),
                bytes=None if args.size is None else parse_size_bytes(args.size, "--size"),
                pass_cursors=args.pass_cursors, **extra)
        logs.set_retention(args.log, policy)
        stored = logs.retention(args.log)
    out.table("retention set", ["log", "retention"],
              [(args.log, stored.describe() if stored else "keep everything")],
              {"log": args.log, "retention": stored.to_property() if stored else None})


@command("apply-retention", "apply retention policies now")
def cmd_apply_retention(args, out):
    from bkspark.log import LogStore
    from bkspark.log.retention import enforce
    rows = []
    with _client(args) as bk:
        logs = LogStore(bk)
        for name in _chosen_logs(logs, args.log):
            policy = logs.retention(name)
            cut = enforce(logs, name) if policy else None
            rows.append({"log": name, "retention": policy.to_property() if policy else None,
                         "removed": cut.removed if cut else [],
                         "held_by_cursor": cut.held_by if cut else None})
    out.table(f"{sum(len(r['removed']) for r in rows)} ledgers removed",
              ["log", "retention", "ledgers removed", "held by cursor"],
              [(r["log"], RetentionPolicy.from_property(r["retention"]).describe()
                if r["retention"] else "keep everything", len(r["removed"]),
                r["held_by_cursor"] or "") for r in rows], rows)


@command("set-offload", "set a log's offload policy")
def cmd_set_offload(args, out):
    from bkspark.log import LogStore
    from bkspark.log.offload import OffloadPolicy
    if args.off and (args.location or args.after or args.beyond or args.keep_on_bookies):
        raise BadRequestError("--off removes the policy: give it alone")
    if not args.off and (args.location is None or args.after is None and args.beyond is None):
        raise BadRequestError("give --location and --after and/or --beyond (or --off to "
                              "remove the policy)")
    with _client(args) as bk:
        logs = LogStore(bk)
        _chosen_logs(logs, [args.log])
        logs.set_offload(args.log, None if args.off else
                         OffloadPolicy.parse(args.location, args.after, args.beyond,
                                             args.keep_on_bookies))
        stored = logs.offload_policy(args.log)
    out.table("offload set", ["log", "offload"],
              [(args.log, stored.describe() if stored else "nothing offloaded")],
              {"log": args.log, "offload": stored.to_property() if stored else None})


@command("offload", "offload closed ledgers now")
def cmd_offload(args, out):
    from bkspark.log import LogStore, offload
    from bkspark.recovery import offload as offload_pass
    rows = []
    failed = []
    with _client(args) as bk:
        logs = LogStore(bk)
        for name in _chosen_logs(logs, args.log):
            policy = logs.offload_policy(name)
            if policy is None:
                if args.log:
                    raise BadRequestError(f"log {name!r} has no offload policy: set one with "
                                          f"`bkspark shell set-offload {name} --location URI "
                                          "--after AGE`")
                continue
            errors_ = []
            done, dropped = {}, []
            try:
                done = offload_pass.run(logs, name)
            except offload.OffloadError as exc:
                errors_.append(str(exc))
            try:            # (also after a ledger that failed: the others' copies go)
                dropped = offload_pass.drop_copies(logs, name)
            except offload.OffloadError as exc:
                errors_.append(str(exc))
            error = "; ".join(errors_) or None
            if error:
                failed.append(name)
            orphans = offload.sweep_locations(logs, name)
            rows.append({"log": name, "location": policy.location, "ledgers": list(done),
                         "dropped_from_bookies": dropped,
                         "files": sum(len(r["files"]) for r in done.values()),
                         "rows": sum(f["rows"] for r in done.values() for f in r["files"]),
                         "bytes": sum(f["bytes"] for r in done.values() for f in r["files"]),
                         "orphans_removed": len(orphans), "error": error})
    out.table(f"{sum(len(r['ledgers']) for r in rows)} ledgers offloaded",
              ["log", "location", "ledgers", "rows", "size", "dropped from bookies",
               "orphans removed", "error"],
              [(r["log"], r["location"], len(r["ledgers"]), r["rows"], _human_size(r["bytes"]),
                len(r["dropped_from_bookies"]), r["orphans_removed"], r["error"] or "")
               for r in rows], rows)
    if failed:
        raise ShellError(f"offload failed for {', '.join(failed)} (see the error column; what "
                         "was offloaded before the failure is recorded)")


@command("zk-acl", "apply the URI's ACL to an existing ZooKeeper tree")
def cmd_zk_acl(args, out):
    from metadata.zk_store import ZkStore
    with _store(args) as store:
        if not isinstance(store, ZkStore):
            raise ShellError("zk-acl applies to a ZooKeeper store (zk://...); the embedded "
                             "store is a private file (docs/metadata.md, Files on disk)", 2)
        count = store.apply_acls()
    out.table(f"ACL applied to {count} records", ["records"], [(count,)],
              {"records": count})


@command("upgrade-ledgers", "rewrite format-1 ledger records")
def cmd_upgrade_ledgers(args, out):
    from metadata import ledgers as ls
    upgraded = current = gone = 0
    corrupt: list[int] = []
    first_error = ""
    with _store(args) as store:
        for lid in ls.list_ledgers(store):
            try:
                if ls.upgrade_ledger(store, lid):
                    upgraded += 1
                else:
                    current += 1
            except NoSuchLedgerError:
                gone += 1           # deleted while the listing ran
            except MetadataFormatError as exc:     # left as it is; the others go on
                first_error = first_error or str(exc)
                corrupt.append(lid)
    doc = {"upgraded": upgraded, "current": current, "deleted_meanwhile": gone,
           "corrupt": len(corrupt), "corrupt_ledgers": corrupt[:100]}
    out.table(f"{upgraded} ledger records rewritten without their password",
              ["upgraded", "already current", "deleted meanwhile", "corrupt (left as is)"],
              [(upgraded, current, gone, len(corrupt))], doc)
    if corrupt:
        raise ShellError(f"{len(corrupt)} ledger records are corrupt and were left as they are "
                         f"(first: {corrupt[:10]}; {first_error})", 1)


@command("convert-logs", "convert format-1 logs")
def cmd_convert_logs(args, out):
    from bkspark.log import LogStore
    rows = []
    with _client(args) as bk:
        logs = LogStore(bk)
        for name in _chosen_logs(logs, args.log):
            rows.append({"log": name, "converted": logs.convert(name)})
    out.table(f"{sum(r['converted'] for r in rows)} of {len(rows)} logs converted", ["log", "result"],
              [(r["log"], "converted" if r["converted"] else "format 2 already") for r in rows], rows)


@command("delete-cursor", "delete a log cursor")
def cmd_delete_cursor(args, out):
    from bkspark.log import LogStore
    with _client(args) as bk:
        logs = LogStore(bk)
        known = logs.cursors(args.log)
        if args.cursor not in known:
            raise BadRequestError(f"log {args.log!r} has no cursor {args.cursor!r}"
                                  + did_you_mean(args.cursor, list(known))
                                  + f" (its cursors: {', '.join(sorted(known)) or 'none'})")
        logs.delete_cursor(args.log, args.cursor)
        if args.cursor in logs.cursors(args.log):
            raise BKError(f"cursor {args.cursor!r} of log {args.log!r} is still there")
    out.table("deleted cursor", ["log", "cursor", "was at"],
              [(args.log, args.cursor, str(known[args.cursor]))],
              {"log": args.log, "cursor": args.cursor, "position": str(known[args.cursor])})


def _log_ledgers(md) -> list:
    return [e.ledger_id for e in md.ledgers]


@command("gc-pending", "reclaim abandoned write jobs")
def cmd_gc_pending(args, out):
    from bkspark.log import LogStore
    from bkspark.spark import pending
    grace = pending.DEFAULT_GRACE_S if args.grace is None else args.grace
    if grace < 0:
        raise ShellError("--grace must be >= 0", 2)
    with _client(args) as bk:
        jobs = pending.reclaim(LogStore(bk), grace=grace, log_name=args.log, dry_run=args.dry_run)
    docs = [j.to_dict() for j in jobs]
    reclaimed = [j for j in jobs if j.verdict == "reclaimed"]
    title = (f"{len(jobs)} write jobs with pending ledgers; "
             + ("dry run: nothing deleted" if args.dry_run else
                f"{len(reclaimed)} reclaimed, {sum(len(j.deleted) for j in reclaimed)} ledgers "
                "deleted"))
    out.table(title, ["job", "log", "state", "ledgers", "alive tasks", "idle s", "verdict"],
              [(d["job"], d["log"], d["state"], len(d["ledgers"]), d["alive_tasks"],
                d["idle_s"], d["verdict"]) for d in docs], docs)


# ---- recover / decommission --------------------------------------------------------------------------------

class _Progress:
    """Rich progress bar: ledgers, entries, bytes, rate, ETA (silent with --json)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self.ledgers = self.entries = 0
        self.ledgers_total = self.entries_total = 0
        import threading
        self.lock = threading.Lock()

    def __enter__(self):
        if self.enabled:
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                       TimeRemainingColumn, TransferSpeedColumn)
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TextColumn("ETA"), TimeRemainingColumn())
            self.bar.start()
        return self

    def _desc(self):
        return (f"ledgers {self.ledgers}/{self.ledgers_total}  "
                f"entries {self.entries}/{self.entries_total}")

    def start(self, ledgers, entries, nbytes):
        self.ledgers_total, self.entries_total = ledgers, entries
        if self.bar:
            self.task = self.bar.add_task(self._desc(), total=nbytes or None)

    def advance(self, entries, nbytes):
        with self.lock:
            self.entries += entries
        if self.bar:
            self.bar.update(self.task, advance=nbytes, description=self._desc())

    def ledger_done(self):
        with self.lock:
            self.ledgers += 1
        if self.bar:
            self.bar.update(self.task, description=self._desc())

    def __exit__(self, *exc):
        if self.bar:
            task = self.bar.tasks[0] if self.bar.tasks else None
            if task is not None and task.total is not None and task.completed > task.total:
                self.bar.update(self.task, total=task.completed)
            self.bar.stop()


def _summary_out(out, what, summary):
    doc = summary.to_dict()
    rate = summary.bytes / summary.seconds / 1e6 if summary.seconds > 0 else 0.0
    doc["mb_per_s"] = round(rate, 3)
    out.message(f"{what} {summary.bookie}: {len(summary.replicated)}/{len(summary.ledgers)} "
                f"ledgers re-replicated, {summary.entries} entries, {summary.bytes} bytes in "
                f"{summary.seconds:.1f}s ({rate:.2f} MB/s)"
                + (f"; open ledgers skipped: {summary.skipped_open}" if summary.skipped_open
                   else "")
                + (f"; cookie {summary.cookie}" if summary.cookie else ""), doc)
    if summary.failed:
        raise ShellError(f"{len(summary.failed)} ledgers could not be re-replicated: "
                         + "; ".join(f"{k}: {v}" for k, v in list(summary.failed.items())[:5]))


def _throttle(args):
    from bkspark.recovery.throttle import Throttle
    if args.rate < 0 or args.rate_entries < 0:
        raise ShellError("--rate / --rate-entries: give a limit > 0, or 0 for unlimited")
    return Throttle(args.rate, args.rate_entries)


@command("recover", "manual recovery")
def cmd_recover(args, out):
    from bkspark.recovery.manual import recover_bookie
    from metadata.layout import check_bookie_id
    check_bookie_id(args.bookie)
    if args.parallel < 1 or args.parallel_fragments < 1:
        raise ShellError("--parallel / --parallel-fragments: give at least 1")
    with _client(args) as bk, _Progress(not out.as_json) as prog:
        summary = recover_bookie(bk, args.bookie, target=args.to,
                                 fence_open=not args.skip_open_ledgers, progress=prog,
                                 parallel=args.parallel,
                                 fragments_at_once=args.parallel_fragments,
                                 throttle=_throttle(args))
    _summary_out(out, "recovered", summary)


@command("decommission", "decommission")
def cmd_decommission(args, out):
    from bkspark.recovery.manual import decommission_bookie
    from metadata.layout import check_bookie_id
    check_bookie_id(args.bookie)
    with _client(args) as bk, _Progress(not out.as_json) as prog:
        summary = decommission_bookie(bk, args.bookie, progress=prog,
                                      open_ledger_grace=args.open_ledger_grace,
                                      throttle=_throttle(args))
    _summary_out(out, "decommissioned", summary)
