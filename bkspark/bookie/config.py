"""Bookie configuration: one dataclass, loadable from an INI file and overridable by flags.

``examples/bookie.conf`` documents every setting. Unknown keys in a config file are an
error naming the key (a typo must not silently fall back to a default).
"""
from __future__ import annotations

import configparser
import dataclasses
import logging
import os
from dataclasses import dataclass, field

from bkspark.bookie.netaddr import WILDCARDS, routable_address
from bkspark.errors import BadRequestError


@dataclass
class BookieConfig:
    # identity and network
    metadata_uri: str = ""
    bookie_id: str = ""                 # default: "<advertised_address>:<port>"
    listen_address: str = "127.0.0.1"
    advertised_address: str = ""        # default: listen_address; for 0.0.0.0 the address of
                                        # the default route's interface (see netaddr)
    port: int = 3181
    data_port: int = 0                  # adds/range reads over TCP frames; 0 = any free port,
                                        # -1 = none (clients then stream adds over gRPC)
    rack: str = ""                      # placement label ("/region/rack")
    http_port: int = 0                  # admin endpoint; 0 = pick a free port, -1 = disabled
    # directories
    journal_dir: str = ""
    journal_dirs: list[str] = field(default_factory=list)  # several journals, one per disk
                                        # (ledger L -> journal_dirs[L % n]); journal_dir = the first
    ledger_dirs: list[str] = field(default_factory=list)
    # storage engine
    write_cache_mb: int = 64
    journal_max_group_wait_ms: float = 2.0
    journal_buffered_writes_threshold_kb: int = 512
    journal_max_size_mb: int = 512
    journal_max_backups: int = 5
    journal_sync: bool = True           # False only for benchmarks: acks before data is durable
    entry_log_max_size_mb: int = 1024
    compaction_threshold: float = 0.5
    compaction_rate_mb_per_s: float = 16.0  # copying pace of compaction; 0 = unlimited
    entry_log_page_cache: bool = False  # keep written entry logs in the OS page cache (else
                                        # dropped once written back; reads are O_DIRECT)
    index_cache_mb: int = 32            # block cache of the on-disk index (RocksDB)
    index_memtable_mb: int = 16         # one index memtable (two at most; its WAL <= four)
    ledger_cache_entries: int = 65536   # ledgers not being written kept in memory (LRU)
    # server limits
    max_entry_bytes: int = 5 << 20
    max_message_bytes: int = 64 << 20
    max_inflight_add_mb: int = 128      # beyond this, adds answer ETOOMANYREQUESTS
    max_adds_per_message: int = 65_536  # an AddBatch with more adds is refused whole
    grpc_workers: int = 64
    grpc_max_concurrent_rpcs: int = 0   # calls running or queued for a worker at once; more
                                        # are refused RESOURCE_EXHAUSTED (the client tries
                                        # another bookie). 0: 4 x grpc_workers
    long_poll_max_ms: int = 10_000
    max_long_polls: int = 0             # long-poll reads waiting at once (each holds a gRPC
                                        # worker); more answer ETOOMANYREQUESTS at once.
                                        # 0: half of grpc_workers
    data_port_send_timeout_s: float = 30.0  # a data-port peer that reads none of its answers
                                            # this long is closed
    check_new_ledgers: bool = True      # a ledger this bookie has no record of is recorded (by
                                        # a fence or an add) only if the metadata lists it,
                                        # under its key; off only for tests and benchmarks of
                                        # ledger ids no metadata lists
    # lifecycle
    metadata_session_timeout_s: float = 10.0
    disk_usage_threshold: float = 0.95  # read-only above this fraction used
    disk_usage_warn_threshold: float = 0.0    # a warning above this (0: disk_usage_lwm)
    disk_usage_lwm: float = 0.90        # writable again below this
    disk_check_interval_s: float = 5.0
    gc_interval_s: float = 60.0
    checkpoint_interval_s: float = 10.0
    # security (bkspark.auth; docs/security.md)
    tls_cert_file: str = ""             # serve TLS with this certificate (and tls_key_file)
    tls_key_file: str = ""
    tls_client_ca_file: str = ""        # mutual TLS: clients need a certificate signed by
                                        # this CA; their role is its first OU
    auth_token_public_key_file: str = ""  # accept tokens signed by the matching key
    allow_insecure_network: bool = False  # listen beyond loopback without authentication,
                                        # or with tokens in clear (a network protected
                                        # otherwise); else such a bookie refuses to start
    # testing
    fault_injection: bool = False       # test-only SetFaults RPC
    autorecovery: bool = False          # run auditor + replication worker in-process
    client_config: str = ""             # client settings (KEY = VALUE lines, as `bkspark
                                        # autorecovery --client-config`) of its autorecovery
    autorecovery_rate_mb_per_s: float = 100.0   # its copy rate limit (0: unlimited); the
                                        # default is recovery.throttle.DEFAULT_DAEMON_MB_PER_S
    log_format: str = "text"            # "text" or "json"
    log_level: str = "INFO"
    log_file: str = ""                  # log to this file, rotated by size (else stderr)
    log_max_mb: int = 64                # rotate the log file at this size ...
    log_backups: int = 5                # ... keeping this many old ones

    def finalize(self) -> "BookieConfig":
        """Fill derived defaults and validate; raises BadRequestError naming the bad setting."""
        if not self.metadata_uri:
            self.metadata_uri = os.environ.get("BKSPARK_METADATA_URI", "")
        if not self.metadata_uri:
            raise BadRequestError("metadata_uri is required (--metadata or BKSPARK_METADATA_URI)")
        if self.journal_dirs:
            from bkspark.bookie.storage import journal_dir_list
            try:
                self.journal_dir = journal_dir_list(self.journal_dir, self.journal_dirs, "bookie config")[0]
            except ValueError as exc:
                raise BadRequestError(str(exc)) from None
        if not self.journal_dir:
            raise BadRequestError("journal_dir is required")
        if not self.ledger_dirs:
            raise BadRequestError("ledger_dirs needs at least one directory")
        if self.index_cache_mb < 1:
            raise BadRequestError(f"index_cache_mb must be >= 1 (MiB of index block cache), got {self.index_cache_mb}")
        if self.index_memtable_mb < 1:
            raise BadRequestError(f"index_memtable_mb must be >= 1 (MiB of one index memtable), "
                                  f"got {self.index_memtable_mb}")
        if self.ledger_cache_entries < 0:
            raise BadRequestError(f"ledger_cache_entries must be >= 0, got {self.ledger_cache_entries}")
        if not (0 < self.port < 65536):
            raise BadRequestError(f"port must be in 1..65535, got {self.port}")
        if not (-1 <= self.data_port < 65536):
            raise BadRequestError(f"data_port must be -1, 0 or a port number, got {self.data_port}")
        if not self.advertised_address:
            if self.listen_address in WILDCARDS:
                self.advertised_address, why = routable_address()
                logging.getLogger("bkspark.bookie").info(
                    "listening on all interfaces; advertising %s (%s); set "
                    "--advertised-address to choose another", self.advertised_address, why)
            else:
                self.advertised_address = self.listen_address
        if not self.bookie_id:
            self.bookie_id = f"{self.advertised_address}:{self.port}"
        if self.compaction_rate_mb_per_s < 0:
            raise BadRequestError(f"compaction_rate_mb_per_s must be >= 0 (0 = unlimited), got "
                                  f"{self.compaction_rate_mb_per_s}")
        if not (0.0 < self.disk_usage_lwm <= self.disk_usage_threshold <= 1.0):
            raise BadRequestError("need 0 < disk_usage_lwm <= disk_usage_threshold <= 1")
        if not self.disk_usage_warn_threshold:
            self.disk_usage_warn_threshold = self.disk_usage_lwm
        if not (0.0 < self.disk_usage_warn_threshold <= self.disk_usage_threshold):
            raise BadRequestError("need 0 < disk_usage_warn_threshold <= disk_usage_threshold")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise BadRequestError("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise BadRequestError("tls_client_ca_file (mutual TLS) needs the bookie's own "
                                  "certificate: set tls_cert_file and tls_key_file")
        from bkspark.auth.guard import check_listen
        check_listen(f"bookie {self.bookie_id}", self.listen_address,
                     authenticated=bool(self.tls_client_ca_file or
                                        self.auth_token_public_key_file),
                     tls=bool(self.tls_cert_file),
                     allow_insecure_network=self.allow_insecure_network)
        client = self.client_settings()
        if self.autorecovery and self.tls_cert_file and not client.get("tls_ca_file"):
            logging.getLogger("bkspark.bookie").warning(
                "autorecovery runs here but its client has no tls_ca_file: it cannot reach "
                "bookies that serve TLS (set tls_ca_file in a client_config file)")
        if self.log_format not in ("text", "json"):
            raise BadRequestError(f"log_format must be text or json, got {self.log_format!r}")
        for name in ("write_cache_mb", "max_entry_bytes", "max_message_bytes", "grpc_workers",
                     "max_inflight_add_mb", "journal_max_size_mb", "max_adds_per_message",
                     "log_max_mb"):
            if getattr(self, name) <= 0:
                raise BadRequestError(f"{name} must be positive")
        if self.grpc_max_concurrent_rpcs < 0:
            raise BadRequestError("grpc_max_concurrent_rpcs must be positive (0: 4 x grpc_workers)")
        if not self.grpc_max_concurrent_rpcs:
            self.grpc_max_concurrent_rpcs = 4 * self.grpc_workers
        elif self.grpc_max_concurrent_rpcs < self.grpc_workers:
            raise BadRequestError(f"grpc_max_concurrent_rpcs ({self.grpc_max_concurrent_rpcs}) "
                                  f"must be at least grpc_workers ({self.grpc_workers})")
        if self.data_port_send_timeout_s <= 0:
            raise BadRequestError("data_port_send_timeout_s must be positive")
        if self.max_long_polls < 0:
            raise BadRequestError("max_long_polls must be positive (0: half of grpc_workers)")
        if not self.max_long_polls:
            self.max_long_polls = max(1, self.grpc_workers // 2)
        elif self.max_long_polls >= self.grpc_workers:
            raise BadRequestError(f"max_long_polls ({self.max_long_polls}) must be below "
                                  f"grpc_workers ({self.grpc_workers}): waiting reads would "
                                  "hold every worker")
        return self

    def client_settings(self) -> dict:
        """The ClientConfig fields of ``client_config`` (for the clients this bookie makes:
        its in-process autorecovery); BadRequestError naming a bad one."""
        if not self.client_config:
            return {}
        from bkspark.client_settings import read_settings_file
        return read_settings_file(self.client_config)

    @classmethod
    def from_file(cls, path: str) -> "BookieConfig":
        """Load ``[bookie]`` settings from an INI file."""
        parser = configparser.ConfigParser()
        if not parser.read(path):
            raise BadRequestError(f"cannot read config file {path}")
        if "bookie" not in parser:
            raise BadRequestError(f"config file {path} has no [bookie] section")
        config = cls()
        config.update({k: v for k, v in parser["bookie"].items()}, source=path)
        return config

    def update(self, values: dict, source: str = "flags") -> None:
        """Set fields from strings or typed values, converting to each field's type."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        for key, raw in values.items():
            if raw is None:
                continue
            if key not in fields:
                raise BadRequestError(f"unknown bookie setting {key!r} in {source}")
            setattr(self, key, _convert(key, fields[key].type, raw))


def _convert(key: str, type_name, raw):
    if not isinstance(raw, str):
        return raw
    try:
        if type_name in ("int", int):
            return int(raw)
        if type_name in ("float", float):
            return float(raw)
        if type_name in ("bool", bool):
            if raw.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if raw.strip().lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if type_name in ("list[str]",):
            return [p.strip() for p in raw.split(",") if p.strip()]
    except ValueError:
        raise BadRequestError(f"bad value {raw!r} for bookie setting {key!r}") from None
    return raw
