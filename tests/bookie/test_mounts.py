"""Which directories sit on a filesystem mounted with online discard (bkspark/bookie/mounts.py)."""
from bkspark.bookie import mounts

PROC_MOUNTS = """\
/dev/vda / ext4 rw,relatime,discard,resv_strict 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
/dev/vdb /data xfs rw,relatime,nodiscard 0 0
/dev/vdc /data/journal ext4 rw,discard=sync 0 0
/dev/vdd /mnt/btrfs btrfs rw,ssd,discard=async 0 0
/dev/vde /mnt/my\\040disk ext4 rw,discard 0 0
/dev/vdf /data/journal ext4 rw,relatime 0 0
broken line
"""


def test_online_discard_is_found_on_the_mount_a_directory_lies_on():
    found = dict(mounts.online_discard_dirs(
        ["/var/lib/bookie", "/data/ledgers", "/data/journal2", "/mnt/btrfs/x", "/mnt/my disk/j"],
        PROC_MOUNTS))
    # / has discard; /data (its own mount) has not, and /data/journal2 is not /data/journal
    assert set(found) == {"/var/lib/bookie", "/mnt/my disk/j"}
    assert found["/mnt/my disk/j"].device == "/dev/vde"
    assert found["/mnt/my disk/j"].point == "/mnt/my disk"


def test_the_last_mount_on_a_point_is_the_one_that_counts():
    # /dev/vdc (discard=sync) was mounted over by /dev/vdf (no discard)
    assert mounts.online_discard_dirs(["/data/journal/current"], PROC_MOUNTS) == []
    over = PROC_MOUNTS.replace("/dev/vdf /data/journal ext4 rw,relatime 0 0\n", "")
    ((_, m),) = mounts.online_discard_dirs(["/data/journal/current"], over)
    assert m.device == "/dev/vdc" and m.online_discard


def test_the_warning_names_the_problem_and_the_fix():
    ((d, m),) = mounts.online_discard_dirs(["/var/lib/bookie"], PROC_MOUNTS)
    text = mounts.discard_warning(d, m)
    assert "/var/lib/bookie" in text and "/dev/vda" in text
    assert "mount -o remount,nodiscard /" in text and "fstrim" in text


def test_no_mount_table_reports_nothing():
    assert mounts.online_discard_dirs(["/x"], "") == []
