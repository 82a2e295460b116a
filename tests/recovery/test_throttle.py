"""The re-replication rate limit, on a fake timeline (pure logic: no wall-clock asserted)."""
from __future__ import annotations

import threading

import pytest

from bkspark.bookie.config import BookieConfig
from bkspark.errors import BadRequestError
from bkspark.recovery.throttle import BURST_S, DEFAULT_DAEMON_MB_PER_S, Throttle


class Timeline:
    """A clock that only sleeps move."""

    def __init__(self):
        self.now = 0.0
        self.slept = 0.0

    def clock(self):
        return self.now

    def sleep(self, s):
        self.now += s
        self.slept += s


def test_unlimited_never_waits():
    t = Timeline()
    th = Throttle(None, 0, clock=t.clock, sleep=t.sleep)
    assert not th.limited and th.describe() == "unlimited"
    for _ in range(1000):
        assert th.acquire(1 << 20) == 0.0
    assert t.slept == 0.0


def test_the_byte_rate_holds_over_a_run():
    t = Timeline()
    th = Throttle(mb_per_s=2, clock=t.clock, sleep=t.sleep)       # 2,000,000 B/s
    for _ in range(100):
        th.acquire(100_000)                                        # 10 MB in all
    # 10 MB at 2 MB/s is 5 s of schedule; the last entry goes at the start of its slot,
    # and a run may start one burst ahead
    assert t.now == pytest.approx(5.0 - 0.05 - BURST_S)


def test_the_entry_rate_holds_and_the_stricter_limit_wins():
    t = Timeline()
    th = Throttle(mb_per_s=1000, entries_per_s=500, clock=t.clock, sleep=t.sleep)
    for _ in range(1000):
        th.acquire(10)
    assert t.now == pytest.approx(2.0 - 1 / 500 - BURST_S)
    assert th.describe() == "1000 MB/s and 500 entries/s"


def test_an_idle_run_gets_one_burst_not_its_idle_time():
    t = Timeline()
    th = Throttle(mb_per_s=1, clock=t.clock, sleep=t.sleep)
    th.acquire(1_000_000)
    t.now += 60.0                           # idle for a minute
    t.slept = 0.0
    for _ in range(10):
        th.acquire(100_000)                 # 1 MB: 1 s of schedule
    assert t.slept == pytest.approx(1.0 - 0.1 - BURST_S)


def test_threads_share_one_limit():
    t = Timeline()
    lock = threading.Lock()

    def sleep(s):                           # the waits of all threads add up on the timeline
        with lock:
            t.slept += s
    th = Throttle(entries_per_s=100, clock=t.clock, sleep=sleep)
    workers = [threading.Thread(target=lambda: [th.acquire(1) for _ in range(50)])
               for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    # 200 entries at 100/s on a clock that never moved: the k-th waits k/100 - burst
    assert t.slept == pytest.approx(sum(max(0.0, k / 100 - BURST_S) for k in range(200)))


@pytest.mark.parametrize("bad", ["fast", "1MB", object()])
def test_a_bad_rate_is_refused_naming_it(bad):
    with pytest.raises(BadRequestError, match="rate"):
        Throttle(mb_per_s=bad)


def test_a_bookie_running_autorecovery_has_the_daemon_default():
    assert BookieConfig().autorecovery_rate_mb_per_s == DEFAULT_DAEMON_MB_PER_S


def test_autorecovery_takes_its_rate_from_the_flags(tmp_path, capsys):
    from bkspark.cli import autorecovery_cmd
    from bkspark.cli.main import build_parser, main
    uri = f"sqlite://{tmp_path}/meta.db"
    args = build_parser().parse_args(["autorecovery", "--metadata", uri, "--rate", "25",
                                      "--rate-entries", "1000"])
    config = autorecovery_cmd.config_from_args(args)
    assert (config.replication_rate_mb_per_s, config.replication_rate_entries_per_s) == (25, 1000)
    args = build_parser().parse_args(["autorecovery", "--metadata", uri])
    assert autorecovery_cmd.config_from_args(args).replication_rate_mb_per_s == \
        DEFAULT_DAEMON_MB_PER_S
    assert main(["autorecovery", "--metadata", uri, "--rate", "-1"]) == 2
    assert "--rate" in capsys.readouterr().err
