"""Issue 48, "read the embedded store and journals as any local user": every file and
directory a local cluster creates -- the embedded metadata store, journals, entry logs, the
index, cookies, the cluster's records -- is private to the user running it. Before,
``metadata.db`` and journals were created 0644 in 0755 directories, readable by anyone on
the host.

The cluster lives under a world-traversable directory (as ``/var/lib`` or ``/srv`` would be);
the attacker is a process of user ``nobody`` (the test runs as root, as CI does; elsewhere
it checks the modes and then skips -- or fails with ``BKSPARK_REQUIRE_ALL=1``). A control file readable by everyone shows that the attacker does read what it
may.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile

from bkspark.client import BookKeeper
from bkspark.testing.cluster import BookieCluster
from metadata.testing import skip_or_fail

NOBODY = 65534


def _attacker_reads(path: str) -> bool:
    """Whether user nobody (no supplementary groups) can read the first byte of ``path``."""
    done = subprocess.run(["head", "-c", "1", path], user=NOBODY, group=NOBODY,
                          extra_groups=[], capture_output=True)
    return done.returncode == 0


def test_another_local_user_reads_nothing_a_local_cluster_wrote():
    base = tempfile.mkdtemp(prefix="bkspark-private-")
    os.chmod(base, 0o755)                       # (a world-traversable parent)
    data = os.path.join(base, "cluster")
    try:
        with BookieCluster(f"sqlite:///{data}/metadata.db", num_bookies=3, data_dir=data) as c, \
                BookKeeper(c.metadata_uri) as bk:
            lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw")
            for _ in range(20):
                lh.append(b"secret " * 200)
            lh.close()
            dirs = [d for d, _, _ in os.walk(data)]
            files = [os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs]
            names = " ".join(files)
            assert "metadata.db" in names and "journal" in names and "ledgers" in names, names
            created = [data] + [os.path.join(data, f"bookie-{i}", sub) for i in range(3)
                                for sub in ("", "journal", "ledgers")]
            for d in created:                   # every directory bkspark created: 0700
                assert stat.S_IMODE(os.stat(d).st_mode) & 0o077 == 0, (d, oct(os.stat(d).st_mode))
            opened = [f for f in files if stat.S_IMODE(os.stat(f).st_mode) & 0o077]
            assert not opened, [(f, oct(os.stat(f).st_mode)) for f in opened]
            if os.geteuid() != 0:       # (CI runs as root: BKSPARK_REQUIRE_ALL fails here)
                skip_or_fail("the attack as user nobody needs root (the modes were checked)")
            control = os.path.join(base, "public")
            with open(control, "w") as f:
                f.write("x")
            os.chmod(control, 0o644)
            assert _attacker_reads(control)     # the attacker reads what it may
            leaked = [f for f in files if _attacker_reads(f)]
            assert not leaked, leaked
            assert len(dirs) > 6
    finally:
        shutil.rmtree(base, ignore_errors=True)
