"""A hostile peer against one bookie with default settings (issue 49): figures, not pass/fail.

For each attack of the review that found them, a fresh bookie is started, and the attacker --
holding a client credential, so past authentication -- runs for ``--seconds`` while a
well-behaved client appends 1 KiB entries one at a time (E=Qw=Qa=1 on that bookie, over the
data port) and measures each append's latency. Each line prints the bookie's peak RSS (its
high-water mark), the most threads it had, how long a ``GetBookieInfo`` took at the end of the
attack (a gRPC call: long polls hold gRPC workers, not the data port), and the good client's
p99 beside its p99 with no attack, measured just before; and the CPU (in cores) the bookie
and the attacker used during the attack (the bookie's includes serving the good client).
Target: peak RSS within the documented bound (docs/operations.md, "A bookie's memory"), the good
client's p99 within 2x. The attacker is a process of its own (as a peer on another host
would be; its threads in the good client's process would put its share of one interpreter
lock in the figure), at the same priority, with a client credential of its own (subject
"attacker"). It runs on the same machine: on 2 cores its own CPU is in the good client's
p99. ``--isolate`` pins the attacker to CPU 1 and the bookie and the good client to CPU 0
(both p99s measured so), as a peer on another host would leave the bookie its core.

Attacks:
* ``empty-adds-grpc``: AddStream messages of 1 MiB of empty adds, as fast as answered;
* ``empty-adds-data``: the same as data-port AddBatch frames (one connection each);
* ``range-buffers``: 16 data-port connections each asking a range of a ledger that does not
  exist with ``max_bytes_per_message = 0xFFFFFFFF``, then idling;
* ``long-polls``: 80 concurrent long-poll reads (10 s each) of a ledger nobody writes;
* ``hello-only``: 1,100 connections that send the data port's 4-byte magic and nothing more;
* ``malformed-grpc``: undecodable bytes on Read, as fast as answered.

    python bench/hostile.py [--seconds 5] [--isolate]
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import grpc  # noqa: E402

from bkspark.auth import tokens  # noqa: E402
from bkspark.auth.credentials import Credentials  # noqa: E402
from bkspark.client import BookKeeper  # noqa: E402
from bkspark.proto import bookie_pb2 as pb  # noqa: E402
from bkspark.proto import bookie_pb2_grpc as pb_grpc  # noqa: E402
from bkspark.proto import wire  # noqa: E402
from bkspark.testing.cluster import BookieCluster, credentials_of_bookie  # noqa: E402

ADD_STREAM = "/bkspark.bookie.v1.Bookie/AddStream"


def status_of(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (/proc/PID/stat, clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (and those it starts later) to ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass                # (a thread that just ended)


def reset_peak(pid: int) -> None:
    """Reset the process's RSS high-water mark (Linux: 5 > clear_refs)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * 0.99))] if values else float("nan")


class Attack:
    """One attack's threads, run until :meth:`stop`; each target reaches the bookie at
    ``host`` with the client credentials ``creds``."""

    def __init__(self, name: str, bookie: str, data_port: int, creds) -> None:
        self.name, self.bookie, self.data_port, self.creds = name, bookie, data_port, creds
        self.host = bookie.rsplit(":", 1)[0]
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []
        self.sent = 0

    def start(self) -> "Attack":
        target, count = getattr(self, "_" + self.name.replace("-", "_"))
        for _ in range(count):
            t = threading.Thread(target=self._guard, args=(target,), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def stop(self) -> None:
        self.stopped.set()
        for sock in self.socks:
            try:
                sock.close()
            except OSError:
                pass
        for t in self.threads:
            t.join(15)

    def _guard(self, target) -> None:
        while not self.stopped.is_set():
            try:
                target()
            except Exception:  # noqa: BLE001 - a refused attack just tries again
                time.sleep(0.05)

    def _data_conn(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.data_port), timeout=30)
        self.socks.append(sock)
        sock.sendall(wire.hello(self.creds.token))
        if sock.recv(4) != wire.DATA_MAGIC:
            raise OSError("hello refused")
        return sock

    # ---- the attacks: (target, threads) --------------------------------------------------
    @property
    def _empty_adds_grpc(self):
        payload = pb.AddBatch(adds=[pb.AddRequest()] * (1 << 19)).SerializeToString()

        def run():
            with self.creds.channel(self.bookie) as channel:
                call = channel.stream_stream(ADD_STREAM, request_serializer=lambda b: b,
                                             response_deserializer=lambda b: b)
                for _ in call(iter([payload]), timeout=30):
                    pass
                self.sent += 1
        return run, 2

    @property
    def _empty_adds_data(self):
        payload = pb.AddBatch(adds=[pb.AddRequest()] * (1 << 19)).SerializeToString()

        def run():
            sock = self._data_conn()
            sock.sendall(wire.frame(wire.KIND_ADD_BATCH, [payload]))
            sock.settimeout(30)
            while sock.recv(1 << 16):
                pass
            self.sent += 1
        return run, 2

    @property
    def _range_buffers(self):
        request = pb.ReadRangeRequest(ledger_id=987_654_321, first_entry_id=0, last_entry_id=9,
                                      max_bytes_per_message=0xFFFFFFFF).SerializeToString()

        def run():
            sock = self._data_conn()
            sock.sendall(wire.frame(wire.KIND_READ_RANGE, [request]))
            self.sent += 1
            self.stopped.wait()
        return run, 16

    @property
    def _long_polls(self):
        def run():
            with self.creds.channel(self.bookie) as channel:
                read = channel.unary_unary("/bkspark.bookie.v1.Bookie/Read",
                                           request_serializer=pb.ReadRequest.SerializeToString,
                                           response_deserializer=pb.ReadResponse.FromString)
                while not self.stopped.is_set():
                    r = read(pb.ReadRequest(ledger_id=424_242, entry_id=0, has_previous_lac=True,
                                            previous_lac=5, timeout_ms=10_000), timeout=30)
                    self.sent += 1
                    if r.status != 0:
                        time.sleep(0.1)
        return run, 80

    @property
    def _hello_only(self):
        def run():
            for _ in range(100):
                sock = socket.create_connection((self.host, self.data_port), timeout=30)
                self.socks.append(sock)
                sock.sendall(wire.DATA_MAGIC)
                self.sent += 1
            self.stopped.wait()
        return run, 11

    @property
    def _malformed_grpc(self):
        def run():
            with self.creds.channel(self.bookie) as channel:
                call = channel.unary_unary("/bkspark.bookie.v1.Bookie/Read",
                                           request_serializer=lambda b: b,
                                           response_deserializer=lambda b: b)
                while not self.stopped.is_set():
                    try:
                        call(b"\xff\xff\xff\xff not protobuf", timeout=10)
                    except grpc.RpcError:
                        pass
                    self.sent += 1
        return run, 2


def _attack_main(name: str, bookie: str, data_port: int, token: str, stop, sent) -> None:
    """The attacker's process: ``name`` until ``stop`` is set; what it sent into ``sent``."""
    from bkspark.auth.credentials import Credentials
    attack = Attack(name, bookie, data_port, Credentials(token=token)).start()
    stop.wait()
    attack.stop()
    sent.value = attack.sent


class AttackProcess:
    """:class:`Attack` in a process of its own (``spawn``: no inherited gRPC state)."""

    def __init__(self, name: str, bookie: str, data_port: int, creds) -> None:
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")
        self._stop, self._sent = ctx.Event(), ctx.Value("q", 0)
        self._proc = ctx.Process(target=_attack_main, daemon=True, args=(
            name, bookie, data_port, creds.token, self._stop, self._sent))

    def start(self) -> "AttackProcess":
        self._proc.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._proc.join(30)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def sent(self) -> int:
        return self._sent.value


ATTACKS = ("empty-adds-grpc", "empty-adds-data", "range-buffers", "long-polls", "hello-only",
           "malformed-grpc")


def good_client(bk, seconds: float) -> list[float]:
    """Latencies (ms) of 1 KiB appends one at a time for ``seconds`` (a fresh ledger)."""
    lh = bk.create_ledger(1, 1, 1)
    payload = os.urandom(1024)
    out = []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            lh.append(payload)
            out.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.002)
    finally:
        lh.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument("--isolate", action="store_true",
                    help="attacker on CPU 1, the bookie and the good client on CPU 0")
    args = ap.parse_args()
    print(f"bench/hostile.py: 1 bookie (default settings, sqlite metadata, journal sync on), "
          f"{os.cpu_count()} CPUs"
          f"{' (attacker pinned to CPU 1, the rest to CPU 0)' if args.isolate else ''}; "
          f"{args.seconds:g} s per attack; good client: 1 KiB appends one "
          f"at a time, E=Qw=Qa=1; load average before the run {os.getloadavg()[0]:.1f}")
    print(f"{'attack':<18} {'sent':>8} {'peak RSS':>10} {'threads':>8} {'info':>9} "
          f"{'bookie':>7} {'attacker':>7} {'good p99':>10} {'quiet p99':>10} {'ratio':>6}  errors")
    for name in args.attacks.split(","):
        with tempfile.TemporaryDirectory(prefix="bkspark-hostile-") as d, \
                BookieCluster(f"sqlite:///{d}/meta.db", raw_ledgers=True, num_bookies=1, data_dir=d,
                              fault_injection=False) as cluster, \
                BookKeeper(cluster.metadata_uri) as bk:
            bid = cluster.bookie_ids[0]
            pid = cluster.bookies[0].proc.pid
            creds = credentials_of_bookie(bid, "client")
            with open(cluster.auth.signing_key_file, "rb") as f:      # a client of its own
                attacker = Credentials(token=tokens.mint(f.read(), "attacker", "client", 3600))
            channel = creds.channel(bid)
            stub = pb_grpc.BookieStub(channel)
            data_port = stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=10).data_port
            if args.isolate:
                pin(pid, {0})
                pin(os.getpid(), {0})
            good_client(bk, 1.0)                                # warm up
            quiet = p99(good_client(bk, args.seconds))
            reset_peak(pid)
            threads = [status_of(pid)["Threads"]]
            attack = AttackProcess(name, bid, data_port, attacker).start()
            if args.isolate:
                pin(attack.pid, {1})
            sampler_stop = threading.Event()

            def sample():
                while not sampler_stop.wait(0.1):
                    try:
                        threads.append(status_of(pid)["Threads"])
                    except OSError:
                        return
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            errors = ""
            time.sleep(1.5)                         # (the attacker's interpreter starts)
            cpu0 = cpu_seconds(pid), cpu_seconds(attack.pid), time.monotonic()
            try:
                loud = p99(good_client(bk, args.seconds))
            except Exception as exc:  # noqa: BLE001 - the attack won: say how
                loud, errors = float("nan"), repr(exc)[:80]
            span = time.monotonic() - cpu0[2]
            bookie_cpu = (cpu_seconds(pid) - cpu0[0]) / span
            attacker_cpu = (cpu_seconds(attack.pid) - cpu0[1]) / span
            t0 = time.monotonic()
            try:
                stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=30)
                info = f"{time.monotonic() - t0:.2f} s"
            except grpc.RpcError as exc:
                info = exc.code().name
            attack.stop()
            sampler_stop.set()
            sampler.join()
            st = status_of(pid)
            channel.close()
            print(f"{name:<18} {attack.sent:>8} {st['VmHWM'] / 1024:>8.0f} MiB {max(threads):>8} "
                  f"{info:>9} {bookie_cpu:>7.2f} {attacker_cpu:>7.2f} {loud:>8.1f} ms "
                  f"{quiet:>7.1f} ms {loud / quiet:>5.1f}x  {errors}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
