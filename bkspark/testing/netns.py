"""Test hosts on one machine: network namespaces on a bridge, with real packet filters.

Each host is a Linux network namespace with one interface on a private bridge and its own
address; the process that builds the network (the *observer*) gets an interface on the same
bridge, so it can reach every host and is never cut off. Faults are nftables rules inside the
hosts' namespaces, so the kernel drops real packets: TCP retransmits, times out and reconnects
exactly as between real machines::

    with Network() as net:                      # root, iproute2 and nftables
        zk, b0, c0 = net.add_host("zk"), net.add_host("b0"), net.add_host("c0")
        proc = net.popen(b0, [sys.executable, "-m", "bkspark.bookie", ...])
        net.cut(c0, zk)                         # symmetric: nothing passes either way
        net.drop(zk, c0, sport=2181)            # one-way: ZooKeeper's answers to c0 are lost
        net.lossy(c0, b0, percent=20)           # one-way random loss
        net.heal()                              # every rule removed

Teardown (``close``, the context manager, ``atexit``, SIGTERM) kills every process left in
the hosts and deletes the namespaces and the observer's interface. A run that is SIGKILLed
cannot run its own teardown: a reaper process started with the network (``--reap``) waits
for the builder to die and tears down what it left. ``sweep()`` removes leftovers of dead
runs (names carry the builder's pid).
"""
from __future__ import annotations

import atexit
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

PREFIX = "bkn"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")


class NetworkUnavailable(RuntimeError):
    """Namespaces or packet filters cannot be used here (not root, no ip/nft)."""


def _run(*argv: str, check: bool = True, input: str | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def available() -> str | None:
    """None if hosts can be built here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return (f"{tool} not found (apt-get install -y iproute2 nftables)")
    return None


@dataclass(frozen=True)
class Host:
    name: str           #: short name given by the test ("zk", "b0", ...)
    netns: str          #: namespace name
    address: str        #: its IPv4 address on the bridge

    def __str__(self) -> str:
        return f"{self.name}({self.address})"


@dataclass(frozen=True)
class Rule:
    """A packet filter rule: packets from ``src`` to ``dst`` dropped (with ``percent`` < 100,
    that share of them at random), optionally only TCP to/from given ports."""

    src: str
    dst: str
    percent: int = 100
    dport: int | None = None
    sport: int | None = None

    def nft(self, dst_address: str) -> str:
        match = f"ip daddr {dst_address}"
        if self.dport is not None:
            match += f" tcp dport {self.dport}"
        if self.sport is not None:
            match += f" tcp sport {self.sport}"
        if self.percent < 100:
            match += f" numgen random mod 100 < {self.percent}"
        return f"{match} drop"


class Network:
    """Hosts on one bridge (see the module docstring). Not thread-safe for changes of the
    topology; ``cut``/``drop``/``lossy``/``heal`` may be called from any thread."""

    def __init__(self, subnet: str | None = None, reaper: bool = True):
        why = available()
        if why:
            raise NetworkUnavailable(why)
        sweep()
        self.tag = f"{PREFIX}{os.getpid()}"
        self.subnet = ipaddress.ip_network(subnet or _free_subnet())
        self._addresses = iter(self.subnet.hosts())
        self.switch = f"{self.tag}-sw"
        self.observer_if = f"{self.tag}o"[:15]
        self.hosts: dict[str, Host] = {}
        self._rules: set[Rule] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._procs: list[subprocess.Popen] = []
        _run("ip", "netns", "add", self.switch)
        try:
            _run("ip", "-n", self.switch, "link", "set", "lo", "up")
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            self.observer_address = str(next(self._addresses))
            _run("ip", "link", "add", self.observer_if, "type", "veth", "peer", "name", "obs",
                 "netns", self.switch)
            _run("ip", "-n", self.switch, "link", "set", "obs", "master", "br0", "up")
            _run("ip", "addr", "add", f"{self.observer_address}/{self.subnet.prefixlen}",
                 "dev", self.observer_if)
            _run("ip", "link", "set", self.observer_if, "up")
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)
        if reaper:
            self._reaper = subprocess.Popen(
                [sys.executable, "-m", "bkspark.testing.netns", "--reap", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)

    # ---- topology -------------------------------------------------------------------------

    def add_host(self, name: str) -> Host:
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists")
        if not re.fullmatch(r"[a-z0-9]{1,8}", name):
            raise ValueError(f"host name {name!r}: 1-8 lowercase letters or digits")
        host = Host(name, f"{self.tag}-{name}", str(next(self._addresses)))
        _run("ip", "netns", "add", host.netns)
        self.hosts[name] = host
        veth = f"v{len(self.hosts)}"
        _run("ip", "-n", host.netns, "link", "set", "lo", "up")
        _run("ip", "-n", self.switch, "link", "add", veth, "type", "veth", "peer", "name",
             "eth0", "netns", host.netns)
        _run("ip", "-n", self.switch, "link", "set", veth, "master", "br0", "up")
        _run("ip", "-n", host.netns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}",
             "dev", "eth0")
        _run("ip", "-n", host.netns, "link", "set", "eth0", "up")
        self._write_rules(host)
        return host

    def launcher(self, host: Host) -> list[str]:
        """The argv prefix that runs a command on ``host``."""
        return ["ip", "netns", "exec", host.netns]

    def popen(self, host: Host, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (in a new session, so it can be signalled as a group)."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.launcher(host) + list(argv), **kwargs)
        self._procs.append(proc)
        return proc

    # ---- faults ---------------------------------------------------------------------------

    def cut(self, a: Host, b: Host) -> None:
        """Symmetric partition: nothing passes between ``a`` and ``b``."""
        self._add(Rule(a.name, b.name), Rule(b.name, a.name))

    def drop(self, src: Host, dst: Host, *, dport: int | None = None,
             sport: int | None = None) -> None:
        """One-way: packets from ``src`` to ``dst`` are dropped (only TCP to ``dport`` / from
        ``sport`` if given), the other direction passes."""
        self._add(Rule(src.name, dst.name, dport=dport, sport=sport))

    def lossy(self, src: Host, dst: Host, percent: int) -> None:
        """One-way random loss of ``percent`` % of the packets from ``src`` to ``dst``."""
        if not 0 < percent < 100:
            raise ValueError("percent must be in 1..99")
        self._add(Rule(src.name, dst.name, percent=percent))

    def heal(self, *hosts: Host) -> None:
        """Remove every rule (or those that involve one of ``hosts``)."""
        names = {h.name for h in hosts}
        with self._lock:
            gone = {r for r in self._rules if not names or r.src in names or r.dst in names}
            self._rules -= gone
            touched = {r.src for r in gone} | {r.dst for r in gone}
        for name in touched:
            self._write_rules(self.hosts[name])

    @property
    def rules(self) -> set[Rule]:
        with self._lock:
            return set(self._rules)

    def _add(self, *rules: Rule) -> None:
        with self._lock:
            self._rules.update(rules)
        for name in {r.src for r in rules} | {r.dst for r in rules}:
            self._write_rules(self.hosts[name])

    def _write_rules(self, host: Host) -> None:
        """Replace the host's filter table atomically (one ``nft -f`` transaction): on its
        output hook the rules it sends under, on its input hook the whole drops of packets
        sent to it (so a cut holds even for packets already on their way)."""
        with self._lock:
            out = [r.nft(self.hosts[r.dst].address) for r in self._rules if r.src == host.name]
            into = [f"ip saddr {self.hosts[r.src].address} drop" for r in self._rules
                    if r.dst == host.name and r.percent == 100 and r.dport is None
                    and r.sport is None]
        script = ["table inet bkfault", "delete table inet bkfault", "table inet bkfault {",
                  "  chain output { type filter hook output priority 0; policy accept;"]
        script += [f"    {line}" for line in out]
        script += ["  }", "  chain input { type filter hook input priority 0; policy accept;"]
        script += [f"    {line}" for line in into]
        script += ["  }", "}"]
        _run("ip", "netns", "exec", host.netns, "nft", "-f", "-", input="\n".join(script) + "\n")

    # ---- teardown -------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            _kill_group(proc.pid)
        teardown(self.tag)
        reaper = getattr(self, "_reaper", None)
        if reaper is not None and reaper.poll() is None:
            reaper.kill()
            reaper.wait()

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _kill_group(pid: int) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list", check=False).splitlines()
            if line.strip()]


def teardown(tag: str) -> None:
    """Kill every process in the namespaces of run ``tag``, delete them and the observer's
    interface."""
    for ns in _namespaces():
        if ns.startswith(tag + "-"):
            for pid in _run("ip", "netns", "pids", ns, check=False).split():
                _kill_group(int(pid))
            _run("ip", "netns", "del", ns, check=False)
    _run("ip", "link", "del", f"{tag}o"[:15], check=False)


def sweep() -> None:
    """Tear down what runs whose builder process is gone left behind."""
    for ns in _namespaces():
        m = _NAME.match(ns)
        if m and not _alive(int(m.group(1))):
            teardown(f"{PREFIX}{m.group(1)}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _free_subnet() -> str:
    """A /24 under 10.77.0.0/16 that no route of this (observer) namespace uses yet."""
    used = _run("ip", "-4", "route", "show", check=False)
    for third in range(256):
        net = f"10.77.{third}.0/24"
        if net not in used:
            return net
    raise NetworkUnavailable("no free /24 left under 10.77.0.0/16")


def _reap(pid: int) -> None:
    """Wait for ``pid`` to end, then tear its network down (the reaper process)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while _alive(pid):
        time.sleep(0.5)
    teardown(f"{PREFIX}{pid}")


if __name__ == "__main__":      # python -m bkspark.testing.netns --reap PID | --sweep
    if len(sys.argv) == 3 and sys.argv[1] == "--reap":
        _reap(int(sys.argv[2]))
    elif sys.argv[1:] == ["--sweep"]:
        sweep()
    else:
        sys.exit("usage: python -m bkspark.testing.netns --reap PID | --sweep")
