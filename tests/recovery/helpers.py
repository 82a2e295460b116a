"""Helpers of the autorecovery tests: autorecovery processes, entry-by-entry verification."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from bkspark.client import quorum
from bkspark.recovery.replicator import list_entries, live_bookies
from metadata.ledger_metadata import LedgerState

PW = b"pw"


def wait_until(predicate, timeout: float, interval: float = 0.25, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    value = predicate()
    assert value, f"timed out after {timeout}s waiting for {what}"
    return value


class AutoRecoveryProcess:
    """`python -m bkspark.cli.main autorecovery ...` as a real subprocess."""

    def __init__(self, uri: str, ident: str, log_dir, env: dict | None = None, **opts):
        """``env``: the process's environment (default: this one's); ``opts``: its flags."""
        self.ident = ident
        self.log_path = os.path.join(str(log_dir), f"autorecovery-{ident}.log")
        args = {"lost-bookie-recovery-delay": 1, "audit-interval": 2,
                "open-ledger-grace": 3, "retry-backoff": 1, "session-timeout": 3,
                "periodic-check-interval": 0}
        args.update({k.replace("_", "-"): v for k, v in opts.items()})
        cmd = [sys.executable, "-m", "bkspark.cli.main", "autorecovery", "--metadata", uri,
               "--id", ident]
        for k, v in args.items():
            cmd += [f"--{k}", str(v)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=env)

    @property
    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.alive:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.alive:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, n=40):
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""


def write_ledger(bk, n: int, size: int = 1024, close: bool = True, e=3, qw=2, qa=2):
    lh = bk.create_ledger(e, qw, qa, password=PW)
    payloads = [(b"%06d-" % i) + os.urandom(size - 7) for i in range(n)]
    futs = [lh.append_async(p) for p in payloads]
    for f in futs:
        f.result()
    if close:
        lh.close()
    return lh, payloads


def replication_problems(bk, ledger_id: int, acked: int) -> list[str]:
    """Entries 0..acked-1 not on every live bookie of their write quorum (ListEntries),
    plus fragments naming a bookie that is not registered. Empty list = fully replicated."""
    md = bk.ledger_metadata(ledger_id)
    _, alive = live_bookies(bk.store)
    problems = []
    if md.state is LedgerState.CLOSED and md.last_entry_id < acked - 1:
        problems.append(f"ledger {ledger_id} closed at {md.last_entry_id} < {acked - 1} "
                        "(truncated!)")
    holdings = {}
    for e in range(acked):
        ws = quorum.write_set_bookies(e, md.ensemble_for(e), md.write_quorum)
        for b in ws:
            if b not in alive:
                problems.append(f"ledger {ledger_id} entry {e}: bookie {b} not alive")
                continue
            if b not in holdings:
                holdings[b] = list_entries(bk.ctx, b, ledger_id)
            if e not in holdings[b]:
                problems.append(f"ledger {ledger_id} entry {e}: missing on {b}")
    for first, bookies in md.ensembles:
        for b in bookies:
            if b not in alive and (md.state is LedgerState.CLOSED and first <= md.last_entry_id):
                problems.append(f"ledger {ledger_id} fragment {first}: {b} not alive")
    return problems


def read_back(bk, ledger_id: int, payloads: list[bytes]) -> None:
    md = bk.ledger_metadata(ledger_id)
    rh = bk.open_ledger(ledger_id, password=PW, recovery=False)
    last = len(payloads) - 1
    if last < 0:
        return
    if md.state is LedgerState.CLOSED:
        got = [e.data for e in rh.read(0, last)]
    else:
        got = [e.data for e in rh.read_unconfirmed(0, last)]
    assert got == payloads, f"ledger {ledger_id}: data differs after re-replication ({md})"
