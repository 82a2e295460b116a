"""Time from the end of a partition to a log writer's first acknowledged append.

    python bench/partition_heal.py [--rounds 4] [--cuts 3,8,15]

A client host with a log writer (appending every 20 ms, add timeout ``--add-timeout``,
10 s by default as in ``ClientConfig``; ZooKeeper session timeout of 4 s) is cut from every
bookie (ZooKeeper stays reachable) for each cut length in turn, then healed; the figure is
the time from the heal to its first acknowledged append, p50 and max over the rounds. Hosts
are network namespaces, the cut is packet filters (:mod:`bkspark.testing.netns`); needs root,
iproute2 and nftables.

Reference ("before"), measured in the same run on the same host and cuts: the same writer
without the stall probe (``stall_probe_after=0``) and with one TCP connect attempt per
connection (``CONNECT_ATTEMPT`` = the whole connect timeout): its add stream, stuck in TCP
retransmission back-off during the cut (retransmissions 0.2, 0.4, 0.8 ... s apart), waits for
the next retransmission after the heal. The two writers write two logs from the same host.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORKER = """
import sys
import bkspark.client.bookie_client as bc
import bkspark.testing.multihost as mh
if sys.argv[1] == "before":         # the reference: one attempt per connect, no stall probe
    bc.CONNECT_ATTEMPT = 1e9
    _client = mh._client
    def client_without_probe(uri, add_timeout):
        bk = _client(uri, add_timeout)
        bk.conf.stall_probe_after = 0
        return bk
    mh._client = client_without_probe
from bkspark.testing.multihost import main
main(["worker", "--uri", sys.argv[2], "--mode", "stream", "--worker", sys.argv[3],
      "--events", sys.argv[4], "--log", "heal-" + sys.argv[1], "--add-timeout", sys.argv[5]])
"""


def first_ack_after(path: str, t: float, timeout: float = 60.0) -> float | None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:
                for line in f:
                    e = json.loads(line)
                    if e["kind"] == "ack" and e["t"] > t:
                        return e["t"] - t
        except (FileNotFoundError, ValueError):
            pass                    # not started yet, or a line being written
        time.sleep(0.05)
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--cuts", default="3,8,15", help="cut lengths, seconds")
    p.add_argument("--add-timeout", type=float, default=10.0,
                   help="the writers' add timeout (ClientConfig's default: 10 s)")
    a = p.parse_args()
    from bkspark.testing.multihost import Deployment
    cuts = [float(c) for c in a.cuts.split(",")]
    workdir = tempfile.mkdtemp(prefix="bkspark-heal-")
    dep = Deployment(workdir, num_bookies=3, zk_servers=1)
    variants = ("after", "before")
    results = {v: {c: [] for c in cuts} for v in variants}
    writers = {}
    try:
        host = dep.clients[0]
        for variant in variants:        # one log each: the two writers never fence each other
            path = os.path.join(workdir, f"events-{variant}.jsonl")
            writers[variant] = (dep.net.popen(host, [sys.executable, "-c", WORKER, variant,
                                                     dep.uri, variant, path,
                                                     str(a.add_timeout)]), path)
        for variant, (_, path) in writers.items():
            if first_ack_after(path, 0.0) is None:
                raise SystemExit(f"the {variant} writer does not write")
        for r in range(a.rounds):
            for cut in cuts:
                for b in dep.bookie_hosts:
                    dep.net.cut(host, b)
                time.sleep(cut)
                healed = time.time()
                dep.net.heal()
                for variant, (_, path) in writers.items():
                    results[variant][cut].append(first_ack_after(path, healed))
                print(f"round {r} cut {cut:g}s: after {results['after'][cut][-1]}, "
                      f"before {results['before'][cut][-1]}", flush=True)
                time.sleep(3)
    finally:
        for proc, _ in writers.values():
            proc.kill()
        dep.close()
    print(f"\npartition_heal: client cut from all 3 bookies (ZooKeeper reachable), writer "
          f"appending every 20 ms, add timeout {a.add_timeout:g} s; {a.rounds} rounds; "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"{'cut s':>6} | {'first ack after heal, s: stall probe p50 / max':>46} | "
          f"{'reference (no probe, one connect attempt) p50 / max':>52}")
    for cut in cuts:
        row = []
        for variant in variants:
            xs = [x for x in results[variant][cut] if x is not None]
            missing = len(results[variant][cut]) - len(xs)
            row.append(f"{statistics.median(xs):.2f} / {max(xs):.2f}" if xs else "-"
                       + (f" ({missing} none within 60 s)" if missing else ""))
        print(f"{cut:>6g} | {row[0]:>46} | {row[1]:>52}")


if __name__ == "__main__":
    main()
