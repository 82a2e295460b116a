"""Test-only fault injection: rules that make this bookie delay, drop or fail requests.

Served through the ``SetFaults`` RPC only when the bookie runs with ``fault_injection``
on; a production bookie answers SetFaults with EBADREQ. A rule matches an operation
("add", "read", "read_range", "read_lac", "write_lac", "fence" or "any"), optionally one
ledger and one entry; ``count`` limits how many requests it applies to.

* "fence" is recovery's fencing read, a ``Read`` of entry -1 with the FENCE flag; a "read"
  rule matches it too (as every ``Read``), a "read_lac" rule does not (that is ``ReadLac``,
  the tailing readers' and long polls' call).
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

ANY_ENTRY = -2


@dataclass
class FaultRule:
    op: str
    action: str                 # "delay" | "drop" | "fail"
    delay_ms: int = 0
    error: int = 501
    ledger_id: int = 0
    entry_id: int = ANY_ENTRY
    probability: float = 1.0
    remaining: int = 0          # 0 = unlimited

    def matches(self, op: str, ledger_id: int, entry_id: int) -> bool:
        op_matches = self.op in ("any", op) or (op == "fence" and self.op == "read")
        return (op_matches and (self.ledger_id in (0, ledger_id))
                and (self.entry_id in (ANY_ENTRY, entry_id)))


class Fault:
    """What to do to one request: ``delay_s`` first, then drop it or answer ``error``."""

    def __init__(self, delay_s: float = 0.0, drop: bool = False, error: int = 0):
        self.delay_s, self.drop, self.error = delay_s, drop, error


class FaultInjector:
    """Thread-safe rule set consulted by the service for every request."""

    DROP_SECONDS = 3600.0       # a dropped request is held this long (the caller times out)

    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """True while any rule is set (the hot path skips fault checks otherwise)."""
        return bool(self._rules)

    def set_rules(self, rules: list[FaultRule]) -> None:
        with self._lock:
            self._rules = list(rules)

    def check(self, op: str, ledger_id: int, entry_id: int = ANY_ENTRY) -> Fault | None:
        """Return the fault for this request, consuming one use of the rule, or None."""
        if not self._rules:
            return None
        with self._lock:
            for rule in self._rules:
                if not rule.matches(op, ledger_id, entry_id):
                    continue
                if rule.probability < 1.0 and random.random() >= rule.probability:
                    continue
                if rule.remaining:
                    rule.remaining -= 1
                    if rule.remaining == 0:
                        self._rules.remove(rule)
                return Fault(delay_s=rule.delay_ms / 1000.0, drop=rule.action == "drop",
                             error=rule.error if rule.action == "fail" else 0)
        return None

    @staticmethod
    def apply_delay(fault: Fault, cancelled=None) -> None:
        """Sleep the fault's delay (or, for a drop, until the caller gives up)."""
        wait = FaultInjector.DROP_SECONDS if fault.drop else fault.delay_s
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if cancelled is not None and cancelled():
                return
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
