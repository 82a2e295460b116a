"""`bkspark autorecovery`: run the auditor (elected) and a replication worker standalone."""
from __future__ import annotations

import argparse
import sys

from bkspark.cli import client_args
from bkspark.errors import BKError
from bkspark.recovery.auditor import DEFAULT_ENTRIES_CHECK_RATE, DEFAULT_PERIODIC_CHECK_INTERVAL
from bkspark.recovery.throttle import DEFAULT_DAEMON_MB_PER_S


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata", default=None,
                        help="metadata URI (default: $BKSPARK_METADATA_URI, else the running local cluster)")
    parser.add_argument("--lost-bookie-recovery-delay", type=float, default=30.0,
                        help="seconds a bookie must stay unregistered before its ledgers are "
                             "marked under-replicated (default 30; the value stored with "
                             "`bkspark shell autorecovery --delay` wins)")
    parser.add_argument("--audit-interval", type=float, default=10.0,
                        help="seconds between ledger rescans while bookies are lost (default 10)")
    parser.add_argument("--periodic-check-interval", type=float,
                        default=DEFAULT_PERIODIC_CHECK_INTERVAL,
                        help="seconds between full ListEntries checks of every ledger "
                             f"(default {DEFAULT_PERIODIC_CHECK_INTERVAL:g}: a week, "
                             "BookKeeper's auditorPeriodicCheckInterval; 0 = off)")
    parser.add_argument("--entries-check-rate", type=float, default=DEFAULT_ENTRIES_CHECK_RATE,
                        metavar="LEDGERS/S",
                        help="the most ledgers per second the periodic ListEntries check "
                             f"examines (default {DEFAULT_ENTRIES_CHECK_RATE:g}; 0 = unlimited): "
                             "a check of N ledgers takes at least N / rate seconds")
    parser.add_argument("--bookie-check-interval", type=float, default=86400.0,
                        help="seconds between scans of every ledger for bookies that are not "
                             "registered (default 86400, 0 = off; a change of the registered "
                             "bookies always starts one)")
    parser.add_argument("--placement-check-interval", type=float, default=86400.0,
                        help="seconds between checks of every ledger's placement against the "
                             "policy: rack spread (default 86400, 0 = off)")
    parser.add_argument("--open-ledger-grace", type=float, default=30.0,
                        help="seconds to leave an open last fragment to its writer before "
                             "fencing the ledger (default 30)")
    parser.add_argument("--worker-threads", type=int, default=2,
                        help="ledgers re-replicated at once by this process (default 2)")
    parser.add_argument("--rate", type=float, default=DEFAULT_DAEMON_MB_PER_S, metavar="MB/S",
                        help="re-replication rate limit of this process, MB/s of entries "
                             f"copied (default {DEFAULT_DAEMON_MB_PER_S:g}; 0 = unlimited): "
                             "lower it to keep foreground latency, raise it to shorten the "
                             "time data is under-replicated")
    parser.add_argument("--rate-entries", type=float, default=0.0, metavar="ENTRIES/S",
                        help="re-replication rate limit in entries/s (default 0 = unlimited)")
    parser.add_argument("--retry-backoff", type=float, default=5.0)
    parser.add_argument("--session-timeout", type=float, default=10.0,
                        help="metadata session timeout: a dead auditor is replaced after it")
    parser.add_argument("--retention-interval", type=float, default=60.0,
                        help="seconds between passes applying the logs' retention policies "
                             "(default 60; 0 = not in this process). One process of the "
                             "cluster applies them (elected)")
    parser.add_argument("--http-port", type=int, default=-1,
                        help="serve Prometheus /metrics and the /api/v1/autorecovery routes "
                             "(status, list_under_replicated_ledger, who_is_auditor, "
                             "trigger_audit, process) on this port (default -1: none; 0: any "
                             "free port, logged)")
    parser.add_argument("--http-host", default="127.0.0.1",
                        help="address of --http-port (default 127.0.0.1; beyond loopback it "
                             "needs authentication and HTTPS, or --allow-insecure-network)")
    parser.add_argument("--http-token-public-key-file", default="", metavar="PEM",
                        help="accept tokens signed by the matching key on --http-port (each "
                             "route's role: docs/security.md); none: the endpoint is open, "
                             "which only loopback allows")
    parser.add_argument("--http-tls-cert-file", default="", metavar="PEM",
                        help="serve --http-port over HTTPS with this certificate (and "
                             "--http-tls-key-file)")
    parser.add_argument("--http-tls-key-file", default="", metavar="PEM")
    parser.add_argument("--http-tls-client-ca-file", default="", metavar="PEM",
                        help="over HTTPS, also accept client certificates signed by this CA "
                             "(their first OU is the role)")
    parser.add_argument("--allow-insecure-network", action="store_true",
                        help="serve --http-host beyond loopback without authentication or "
                             "TLS (a network protected otherwise)")
    parser.add_argument("--no-auditor", action="store_true", help="run only the worker")
    parser.add_argument("--no-worker", action="store_true", help="run only the auditor")
    parser.add_argument("--id", default=None, help="identifier shown by `shell whoisauditor`")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", default="text", choices=["text", "json"])
    client_args.add_arguments(parser)


def config_from_args(args):
    """The AutoRecoveryConfig of the flags (BadRequestError naming a bad client setting)."""
    from bkspark.errors import BadRequestError
    from bkspark.recovery.service import AutoRecoveryConfig
    if args.rate < 0 or args.rate_entries < 0:
        raise BadRequestError("--rate / --rate-entries: give a limit > 0, or 0 for unlimited")
    if args.entries_check_rate < 0:
        raise BadRequestError(f"--entries-check-rate {args.entries_check_rate:g}: give "
                              "ledgers per second > 0, or 0 for unlimited")
    if args.retention_interval < 0:
        raise BadRequestError(f"--retention-interval {args.retention_interval}: give seconds "
                              "between passes, or 0 to leave retention to another process")
    return AutoRecoveryConfig(
        lost_bookie_recovery_delay=args.lost_bookie_recovery_delay,
        audit_interval=args.audit_interval,
        periodic_check_interval=args.periodic_check_interval,
        entries_check_rate=args.entries_check_rate,
        bookie_check_interval=args.bookie_check_interval,
        placement_check_interval=args.placement_check_interval,
        open_ledger_grace=args.open_ledger_grace, worker_threads=args.worker_threads,
        retry_backoff=args.retry_backoff, session_timeout=args.session_timeout,
        run_auditor=not args.no_auditor, run_worker=not args.no_worker,
        retention_interval=args.retention_interval,
        http_port=args.http_port, http_host=args.http_host,
        http_token_public_key_file=args.http_token_public_key_file,
        http_tls_cert_file=args.http_tls_cert_file, http_tls_key_file=args.http_tls_key_file,
        http_tls_client_ca_file=args.http_tls_client_ca_file,
        allow_insecure_network=args.allow_insecure_network,
        replication_rate_mb_per_s=args.rate, replication_rate_entries_per_s=args.rate_entries,
        client=client_args.client_settings(args))


def run(args: argparse.Namespace) -> int:
    from bkspark.logging_setup import setup_logging
    from bkspark.recovery.service import AutoRecovery
    uri = client_args.metadata_uri("autorecovery", args.metadata)
    if not uri:
        return 2
    try:
        config = config_from_args(args)
    except BKError as exc:
        print(f"bkspark autorecovery: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_format)
    try:
        AutoRecovery(uri, config, identifier=args.id).run()
    except BKError as exc:
        print(f"bkspark autorecovery: {exc}", file=sys.stderr)
        return 1
    return 0
