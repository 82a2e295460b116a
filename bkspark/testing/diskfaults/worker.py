"""One run of the disk-fault campaign, in a process of its own (the I/O fault layer and a
power loss act on the whole process): ``python -m bkspark.testing.diskfaults worker DIR SEED
RUN``.

Opens the storage on DIR (two journal and two ledger directories; the open replays what the
previous run left), arms the layer's rules as the seed's schedule says, and loops over adds,
fences, explicit LACs, deletes, checkpoints and compaction. Each acknowledged operation is one
line on stdout, written once the call returned success (what the bookie claimed durable):

    O                       the storage opened
    A <ledger> <first> <last>  entries acknowledged (bodies: :func:`body_for`)
    F <ledger>              fence acknowledged
    X <ledger> <n>          explicit LAC acknowledged (its body: :func:`lac_for`)
    d <ledger> / D <ledger> delete started / acknowledged
    I <op> <where> <errno> <lose|short>   a fault rule armed
    V <kind> <details>      a violation seen while running (a read of an acknowledged entry
                            that answered wrong bytes, "no such entry" or "no such ledger")
    E <message>             the storage failed to open under the faults armed before it (then
                            the process exits 3; not a violation: the checker opens it without)

It ends by a power loss (the layer drops unsynced bytes, then SIGKILL), a clean close, or the
parent's SIGKILL, whichever the schedule says.
"""
from __future__ import annotations

import errno
import os
import random
import sys
import time

from bkspark import _native, errors
from bkspark.bookie.storage import Storage, StorageConfig

KEY = b"diskfaults"
OPS = ("write", "sync_range", "sync", "open", "rename", "fallocate", "read")


def body_for(ledger: int, entry: int) -> bytes:
    n = (ledger * 7919 + entry * 104729) % 9000
    return (f"{ledger}:{entry}:".encode() * (n // 6 + 2))[:n + 12]


def lac_for(ledger: int, n: int) -> bytes:
    return f"lac:{ledger}:{n}".encode()


def config(d: str) -> StorageConfig:
    return StorageConfig(
        journal_dirs=[os.path.join(d, "j0"), os.path.join(d, "j1")],
        ledger_dirs=[os.path.join(d, "l0"), os.path.join(d, "l1")],
        write_cache_bytes=1 << 20, journal_max_size_mb=1, journal_max_backups=1,
        entry_log_max_size=256 << 10, journal_max_group_wait_ms=0.5, checkpoint_interval_s=0.2,
        compaction_threshold=0.6, compaction_max_bytes_per_pass=256 << 10)


def schedule(seed: int) -> dict:
    """What run ``seed`` does: its fault rules (each armed after some operations), how long it
    runs, how it ends. The parent derives the same from the seed."""
    rnd = random.Random(seed)
    rules = []
    for _ in range(rnd.choice((0, 1, 1, 2, 2, 3))):
        op = rnd.choice(("sync_range", "sync_range", "sync", "sync", "write", "write", "open",
                         "rename", "fallocate", "read"))
        where = rnd.choice(("/l0", "/l1", "/l", "/j0", "/j1"))   # (the directories' own fsyncs too)
        short = op == "write" and rnd.random() < 0.3
        err = 0 if short else rnd.choice((errno.EIO, errno.EIO, errno.ENOSPC))
        # after_ops -1: armed before the storage opens (its replay and recovery under the fault)
        rules.append({"after_ops": -1 if rnd.random() < 0.15 else rnd.randint(0, 150),
                      "op": op, "path": where, "errno": err,
                      "after": rnd.randint(0, 5), "times": rnd.choice((1, 1, 3, -1)),
                      "lose": rnd.random() < 0.8, "short": short})
    end = rnd.choices(("power-loss", "kill", "close"), weights=(5, 4, 1))[0]
    return {"rules": rules, "ops": rnd.randint(60, 400), "end": end}


def main(argv: list[str]) -> int:
    d, seed, run = argv[0], int(argv[1]), int(argv[2])
    plan = schedule(seed)
    rnd = random.Random(seed ^ 0x5EED)
    out = sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    _native.io_faults_clear()
    _native.io_track(True)
    pending = sorted(plan["rules"], key=lambda r: r["after_ops"])

    def arm(upto: int) -> None:
        while pending and pending[0]["after_ops"] <= upto:
            r = pending.pop(0)
            _native.io_fault(r["op"], r["path"], r["errno"], after=r["after"], times=r["times"],
                             lose=r["lose"], short=r["short"])
            say(f"I {r['op']} {r['path']} {r['errno']} "
                f"{'short' if r['short'] else 'lose' if r['lose'] else '-'}")
    arm(-1)
    try:
        s = Storage(config(d))
    except errors.BKError as exc:       # (under a fault: honest; the checker opens without)
        say(f"E {exc}")
        return 3
    say("O")
    ledgers = [run * 100 + k for k in range(5)]
    nxt = {lid: 0 for lid in ledgers}
    lacs = {lid: 0 for lid in ledgers}
    for step in range(plan["ops"]):
        arm(step)
        lid = rnd.choice(ledgers)
        action = rnd.random()
        try:
            if action < 0.70:
                n = rnd.randint(1, 30)
                first = nxt[lid]
                st = s.add_entries([(lid, first + i, KEY, False, body_for(lid, first + i))
                                    for i in range(n)])
                ok = 0
                while ok < n and st[ok] == errors.EOK:
                    ok += 1
                if ok:
                    say(f"A {lid} {first} {first + ok - 1}")
                    nxt[lid] = first + ok
            elif action < 0.74:
                if s.fence(lid, KEY) == errors.EOK:
                    say(f"F {lid}")
            elif action < 0.80:
                lacs[lid] += 1
                s.set_explicit_lac(lid, lac_for(lid, lacs[lid]))
                say(f"X {lid} {lacs[lid]}")
            elif action < 0.81 and run > 0:     # a ledger of the run before
                victim = (run - 1) * 100 + rnd.randrange(5)
                say(f"d {victim}")
                s.delete_ledger(victim)
                say(f"D {victim}")
            elif action < 0.90:
                s.checkpoint()
            elif action < 0.93:
                s.compact()
            elif nxt[lid]:
                e = rnd.randrange(nxt[lid])
                try:
                    got = s.read_entry(lid, e)
                    if got != body_for(lid, e):
                        say(f"V wrong-bytes {lid}:{e} while running")
                except (errors.NoSuchEntryError, errors.NoSuchLedgerError) as exc:
                    say(f"V acked-entry-missing {lid}:{e} while running ({type(exc).__name__})")
                except errors.BookieIOError:
                    pass                # an I/O error is an honest answer
        except errors.BKError:
            pass                        # refused under faults: nothing was acknowledged
    if plan["end"] == "power-loss":
        _native.io_crash()
    if plan["end"] == "close":
        _native.io_faults_clear()
        try:
            s.close()
        except errors.BKError:
            pass
        return 0
    while True:                         # "kill": the parent SIGKILLs us
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
