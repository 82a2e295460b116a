"""CPU accounting from /proc for the bench scripts (Linux)."""
from __future__ import annotations

import ctypes
import os
import time


def process_cpu_seconds(pids) -> float:
    """User+system CPU seconds used so far by these processes (gone ones count 0)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def machine_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]          # idle + iowait
    return sum(v) - idle, sum(v)


def wait_idle(pids, limit: float = 30.0, cores: float = 0.05, also=lambda: True) -> float:
    """Wait until these processes use under ``cores`` CPUs for 0.5 s (and ``also()`` holds),
    at most ``limit`` seconds; return the seconds waited. A bench waits so after writing
    what it then measures: the bookies' write-cache flushes, checkpoints and garbage
    collection of what was just written or deleted would otherwise run under the
    measurement."""
    pids = list(pids)
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        c0 = process_cpu_seconds(pids)
        time.sleep(0.5)
        if process_cpu_seconds(pids) - c0 < cores * 0.5 and also():
            break
    return time.monotonic() - t0


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_cpu_split() -> dict[str, int]:
    """Jiffies of the whole machine since boot by kind (/proc/stat's first line): ``steal``
    is time the hypervisor gave this VM's CPUs to others, ``system``/``softirq`` the kernel's
    own work (writeback, the network stack), which no process's account shows."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:1 + len(CPU_FIELDS)]]
    return dict(zip(CPU_FIELDS, v))


def thread_cpu_by_name(pids) -> dict[str, float]:
    """CPU seconds used so far by these processes' threads, summed by thread name
    (``comm``: RocksDB's ``rocksdb:low``/``rocksdb:high``, the engine's ``bks-*``, Python's
    own threads under the process name). Threads that ended before the call are not counted:
    take two samples and compare names present in both."""
    tick = os.sysconf("SC_CLK_TCK")
    by_name: dict[str, float] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    raw = f.read()
            except OSError:
                continue
            name = raw[raw.index("(") + 1:raw.rindex(")")]
            fields = raw.rsplit(")", 1)[1].split()
            by_name[name] = by_name.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return by_name


def process_io_bytes(pids) -> tuple[int, int]:
    """(read_bytes, write_bytes) these processes have caused to be fetched from or sent to
    the block layer so far (/proc/<pid>/io; page-cache hits and writes not yet written back
    are not in it)."""
    rd = wr = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/io") as f:
                io = dict(line.split(": ") for line in f.read().splitlines())
            rd += int(io["read_bytes"])
            wr += int(io["write_bytes"])
        except (OSError, KeyError, ValueError):
            pass
    return rd, wr


def disk_busy(device: str) -> tuple[float, int, int]:
    """(seconds the device was busy, sectors written, sectors discarded) so far,
    from /proc/diskstats (``device`` as named there, e.g. ``vda``); zeros if absent."""
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                v = line.split()
                if v[2] == device:
                    discarded = int(v[16]) if len(v) > 16 else 0
                    return int(v[12]) / 1000.0, int(v[9]), discarded
    except (OSError, ValueError, IndexError):
        pass
    return 0.0, 0, 0


def block_device(path: str) -> str:
    """The /proc/diskstats name of the block device holding ``path`` (a partition's own, whose
    line counts only its filesystem's I/O since Linux 4.18), or '' if it has none (tmpfs,
    btrfs's anonymous devices, overlay)."""
    try:
        st = os.stat(path)
        name = os.path.basename(os.path.realpath(
            f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"))
    except OSError:
        return ""
    return "" if ":" in name else name


def syncfs(directory: str) -> None:
    """Commit the filesystem holding ``directory`` (syncfs(2)), not every filesystem."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        ctypes.CDLL(None, use_errno=True).syncfs(fd)
    finally:
        os.close(fd)


def disk_discards_counted(device: str) -> bool:
    """Whether /proc/diskstats has ``device`` with its discard columns (Linux 4.18 and later)."""
    try:
        with open("/proc/diskstats") as f:
            return any(len(v) > 16 and v[2] == device for v in map(str.split, f))
    except OSError:
        return False


def discards_settled(directory: str):
    """A test for :func:`wait_idle`'s ``also``: true when the disk holding ``directory`` has
    completed no discard since the previous call. A bookie removes a deleted ledger's entry
    logs a step at a time, sleeping between the cuts, so its CPU is idle long before the files
    are gone; on a filesystem mounted with ``discard`` the disk keeps discarding them, and a
    run started then measures those removals (e.g. 21 GB discarded within a 10 s reference).
    Each call first syncs that filesystem: ext4 sends the discards of freed blocks only once
    the journal transaction that freed them commits -- every 5 s on an idle filesystem -- so
    without it a quiet half second could come before the removals' discards. Watches the
    partition's own counters (other filesystems' discards do not count); says so once and
    always answers true where there are none."""
    device = block_device(directory)
    if not device or not disk_discards_counted(device):
        print(f"    (discards of {directory!r} not watched: no block device with discard "
              "counters holds it)", flush=True)
        return lambda: True
    syncfs(directory)
    last = [disk_busy(device)[2]]

    def settled() -> bool:
        syncfs(directory)
        now = disk_busy(device)[2]
        quiet, last[0] = now == last[0], now
        return quiet
    return settled


class Activity:
    """What these processes and their disk did between ``__init__`` and ``summary()``:
    CPU seconds by thread name (the top ``top``), bytes read and written through the block
    layer, and the disk's busy time and discards -- so a phase's stall can be named
    (RocksDB's compactions, the checkpoint, the journal, Python)."""

    def __init__(self, pids, directory: str, top: int = 8):
        self.pids = list(pids)
        self.device = block_device(directory)
        self.top = top
        self.t0 = time.monotonic()
        self.cpu0 = thread_cpu_by_name(self.pids)
        self.io0 = process_io_bytes(self.pids)
        self.disk0 = disk_busy(self.device)
        self.machine0 = machine_cpu_split()

    def summary(self) -> str:
        elapsed = time.monotonic() - self.t0
        cpu = thread_cpu_by_name(self.pids)
        rd, wr = (b - a for a, b in zip(self.io0, process_io_bytes(self.pids)))
        busy, written, discarded = (b - a for a, b in zip(self.disk0, disk_busy(self.device)))
        used = sorted(((v - self.cpu0.get(k, 0.0), k) for k, v in cpu.items()), reverse=True)
        threads = ", ".join(f"{k} {v:.2f}" for v, k in used[:self.top] if v > 0)
        machine = {k: v - self.machine0[k] for k, v in machine_cpu_split().items()}
        total = max(1, sum(machine.values()))
        split = ", ".join(f"{k} {100 * machine[k] / total:.0f}%"
                          for k in ("user", "system", "softirq", "iowait", "steal", "idle"))
        return (f"    bookie threads' CPU-s: {threads or 'none'}; block I/O: read "
                f"{rd / 1e6:.0f} MB, written {wr / 1e6:.0f} MB; disk {self.device or '?'} busy "
                f"{100 * busy / max(elapsed, 1e-9):.0f}% ({written * 512 / 1e6:.0f} MB written, "
                f"{discarded * 512 / 1e6:.0f} MB discarded); the machine's CPUs: {split}")
