"""Which directories sit on a filesystem mounted with online discard (bkspark/bookie/mounts.py)."""
import os

from bkspark.bookie import mounts

MOUNTINFO = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict
22 27 0:21 / /proc rw,relatime - proc proc rw
30 27 254:16 / /data rw,relatime - xfs /dev/vdb rw,nodiscard
31 30 254:32 / /data/journal rw - ext4 /dev/vdc rw,discard=sync
32 27 0:40 / /mnt/btrfs rw,ssd shared:5 - btrfs /dev/vdd rw,discard=async
33 27 254:64 / /mnt/my\\040disk rw,relatime - ext4 /dev/vde rw,discard
34 30 254:80 / /data/journal rw,relatime - ext4 /dev/vdf rw
broken line
"""


def test_online_discard_is_found_on_the_mount_a_directory_lies_on():
    found = dict(mounts.online_discard_dirs(
        ["/var/lib/nonexistent-bookie", "/data/ledgers", "/data/journal2", "/mnt/btrfs/x",
         "/mnt/my disk/j"], MOUNTINFO))
    # / has discard (a super option); /data (its own mount) has not, and /data/journal2 is
    # not under /data/journal; btrfs's discard=async is not online discard
    assert set(found) == {"/var/lib/nonexistent-bookie", "/mnt/my disk/j"}
    assert found["/mnt/my disk/j"].device == "/dev/vde"
    assert found["/mnt/my disk/j"].point == "/mnt/my disk"


def test_the_last_mount_on_a_point_is_the_one_that_counts():
    # /dev/vdc (discard=sync) was mounted over by /dev/vdf (no discard)
    assert mounts.online_discard_dirs(["/data/journal/current"], MOUNTINFO) == []
    over = MOUNTINFO.replace("34 30 254:80 / /data/journal rw,relatime - ext4 /dev/vdf rw\n", "")
    ((_, m),) = mounts.online_discard_dirs(["/data/journal/current"], over)
    assert m.device == "/dev/vdc" and m.online_discard


def test_a_directory_is_judged_by_its_device_not_a_mount_hidden_under_another(tmp_path):
    """A mount with discard on ``tmp_path/j`` that a later mount over ``tmp_path`` hides:
    the directory's files are on the later mount's device (the real one of tmp_path)."""
    st = os.stat(tmp_path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    (tmp_path / "j").mkdir()
    text = (f"40 1 9999:1 / {tmp_path}/j rw - ext4 /dev/hidden rw,discard\n"
            f"41 1 {dev} / {tmp_path} rw - ext4 /dev/over rw\n")
    assert mounts.online_discard_dirs([str(tmp_path / "j")], text) == []
    flipped = (f"40 1 9999:1 / {tmp_path}/j rw - ext4 /dev/hidden rw\n"
               f"41 1 {dev} / {tmp_path} rw - ext4 /dev/over rw,discard\n")
    ((_, m),) = mounts.online_discard_dirs([str(tmp_path / "j")], flipped)
    assert m.device == "/dev/over"


def test_undecodable_mount_points_do_not_stop_a_bookie(tmp_path, monkeypatch):
    table = tmp_path / "mountinfo"
    table.write_bytes(b"50 1 8:1 / /mnt/caf\xe9 rw - vfat /dev/sdb1 rw\n"
                      b"27 1 254:0 / / rw - ext4 /dev/vda rw,discard\n")
    monkeypatch.setattr(mounts, "MOUNTINFO", str(table))
    found = mounts.online_discard_dirs(["/var/lib/nonexistent-bookie"])
    assert [m.device for _, m in found] == ["/dev/vda"]


def test_the_warning_names_the_problem_and_the_fix():
    ((d, m),) = mounts.online_discard_dirs(["/var/lib/nonexistent-bookie"], MOUNTINFO)
    text = mounts.discard_warning(d, m)
    assert "/var/lib/nonexistent-bookie" in text and "/dev/vda" in text
    assert "mount -o remount,nodiscard /" in text and "fstrim" in text


def test_no_mount_table_reports_nothing():
    assert mounts.online_discard_dirs(["/x"], "") == []


def test_names_with_characters_the_kernel_leaves_unescaped_keep_their_line():
    """Only space, tab, newline and backslash are escaped in mountinfo; a form feed or an
    ideographic space in a mount point is written raw and must not split the line or the field,
    an empty source is two spaces, and a stray backslash is no escape."""
    text = ("27 1 254:0 / / rw - ext4 /dev/vda rw,discard\n"
            "60 27 0:70 / /srv/a\x0cb rw - tmpfs tmp rw\n"
            "61 27 0:71 / /srv/\u30de\u3000\u30c7 rw - ext4 /dev/vdg rw,discard\n"
            "62 27 0:72 / /srv/empty rw - tmpfs  rw\n"
            "63 27 0:73 / /srv/odd\\089 rw - ext4 /dev/vdh rw\n")
    found = dict(mounts.online_discard_dirs(
        ["/srv/a\x0cb/j", "/srv/\u30de\u3000\u30c7/j", "/srv/empty/j", "/srv/odd\\089/j"], text))
    assert set(found) == {"/srv/\u30de\u3000\u30c7/j"}, found
    assert found["/srv/\u30de\u3000\u30c7/j"].device == "/dev/vdg"


def test_discard_with_a_value_is_online_unless_queued():
    text = ("70 1 0:80 / /jfs rw - jfs /dev/vdi rw,discard=4096\n"
            "71 1 0:81 / /f2fs rw - f2fs /dev/vdj rw,discard\n"
            "72 1 0:82 / /btrfs rw - btrfs /dev/vdk rw,discard=async\n")
    found = mounts.online_discard_dirs(["/jfs/j", "/f2fs/j", "/btrfs/j"], text)
    assert [d for d, _ in found] == ["/jfs/j"]
