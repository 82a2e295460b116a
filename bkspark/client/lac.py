"""The LAC read of a ledger's last ensemble: the one operation behind fencing (recovery) and
``ReadHandle.read_last_add_confirmed``, and the one reading of its answers.

Every bookie of the last ensemble is asked (``Read`` of entry -1; with ``fence``, the same read
also fences the ledger on the bookie, durably, before it answers). An answer is:

* EOK: the bookie's LAC -- the highest LAC this client verified in the answer: the one
  piggybacked in the body of its last entry and the explicit LAC body (each checked with the
  ledger's digest; one that fails it only loses its LAC). The bookie's ``max_lac`` is never
  counted: it is the bookie's word, and a LAC beyond the acknowledged entries would make
  readers serve entries never acknowledged and recovery look for entries that are not there;
* ENOENTRY / ENOLEDGER: it holds nothing of the ledger -- an answer, without a LAC;
* EUA: the master key is wrong -- :class:`UnauthorizedError`, whatever the others say;
* anything else, or no answer: unknown (the bookie may hold entries).

The caller decides what is enough: fencing needs ``(E - Qa) + 1`` answers, a LAC read quorum
coverage of the answered bookies (:mod:`.quorum`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from bkspark import errors
from bkspark.errors import BKError, DigestMismatchError, UnauthorizedError
from bkspark.proto import wire

NEGATIVE = (errors.ENOENTRY, errors.ENOLEDGER)


@dataclass
class LacAnswers:
    answered: set = field(default_factory=set)      # ensemble indices that answered
    lac: int = -1                                    # the highest LAC learnt (-1: none)
    unknown: list = field(default_factory=list)      # "bookie: why" of those that did not
    mismatches: list = field(default_factory=list)   # "bookie: why" of bodies failing digests


def lac_of(resp, digest) -> tuple[int, str]:
    """The LAC an EOK answer proves (the highest of its body's piggybacked LAC and its
    explicit LAC body, each digest-checked; -1 if neither), and why a proof was left out
    ("" if none was)."""
    lac, why = -1, []
    if resp.body:
        try:
            lac = max(lac, digest.verify(resp.body)[1])
        except DigestMismatchError as exc:
            why.append(str(exc))
    if resp.lac_body:
        try:
            lac = max(lac, digest.verify_lac(resp.lac_body))
        except DigestMismatchError as exc:
            why.append(str(exc))
    return lac, "; ".join(why)


def read_lac(ctx, ledger_id: int, ensemble: list, digest, *, fence: bool = False,
             master_key: bytes = b"", enough: Callable[[set], bool] | None = None) -> LacAnswers:
    """Ask every bookie of ``ensemble`` for its LAC (``fence``: fencing the ledger with
    ``master_key``); returns once ``enough(answered)`` holds, or once every bookie answered or
    failed. :raises UnauthorizedError: a bookie refused the master key."""
    out = LacAnswers()
    cond = threading.Condition()
    done = [0]
    refused: list[BKError] = []
    flags = wire.FENCE_LEDGER if fence else 0

    def on_answer(i, bookie, fut):
        try:
            resp = fut.result()
            status, note = resp.status, ""
        except BKError as exc:
            resp, status, note = None, None, str(exc)
        with cond:
            done[0] += 1
            if status == errors.EOK:
                lac, mismatch = lac_of(resp, digest)
                out.lac = max(out.lac, lac)
                out.answered.add(i)
                if mismatch:
                    out.mismatches.append(f"{bookie}: {mismatch}")
            elif status in NEGATIVE:
                out.answered.add(i)
            elif status == errors.EUA:
                refused.append(UnauthorizedError(
                    f"ledger {ledger_id}: bookie {bookie} refused the master key (wrong "
                    "password)"))
            else:
                out.unknown.append(f"{bookie}: " + (note if status is None
                                                    else errors.status_name(status)))
            cond.notify_all()

    for i, bookie in enumerate(ensemble):
        fut = ctx.pool.get(bookie).read(ledger_id, -1, flags=flags, master_key=master_key,
                                        timeout=ctx.conf.read_timeout)
        fut.add_done_callback(lambda f, i=i, b=bookie: on_answer(i, b, f))
    with cond:
        while not refused and done[0] < len(ensemble) and \
                not (enough is not None and enough(out.answered)):
            cond.wait(1.0)
        if refused:
            raise refused[0]
        return LacAnswers(set(out.answered), out.lac, list(out.unknown), list(out.mismatches))
