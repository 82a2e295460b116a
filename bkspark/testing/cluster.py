"""BookieCluster: a LocalCluster with the test-only fault-injection API switched on.

    with BookieCluster(metadata_uri, num_bookies=3, data_dir=tmp_path) as c:
        c.set_faults(0, [dict(op="add", action="drop", ledger_id=lid, entry_id=12)])
        c.kill(1); c.start(1); c.pause(2); c.resume(2)

Rules: op in add/read/read_range/read_lac/write_lac/fence/any (fence: recovery's fencing
read, which a read rule matches too and a read_lac rule does not); action delay/drop/fail;
error (a status code, for fail), delay_ms, ledger_id (0 = any), entry_id (omit = any),
probability, count (0 = unlimited).
"""
from __future__ import annotations


from bkspark.auth.credentials import Credentials
from bkspark.errors import EIO, BKError
from bkspark.localcluster import LocalCluster
from bkspark.proto import bookie_pb2 as pb
from bkspark.proto import bookie_pb2_grpc as pb_grpc


class BookieCluster(LocalCluster):
    def __init__(self, metadata_uri=None, num_bookies=3, data_dir="./data", fault_injection=True,
                 extra_args=None, raw_ledgers=False, **kwargs):
        """``raw_ledgers``: the bookies take ledger ids no metadata lists (tests of the
        protocol that add to ledgers by number: ``--no-check-new-ledgers``)."""
        args = list(extra_args or [])
        if fault_injection:
            args.append("--fault-injection")
        if raw_ledgers:
            args.append("--no-check-new-ledgers")
        args += ["--metadata-session-timeout-s", str(kwargs.pop("session_timeout", 4.0))]
        super().__init__(metadata_uri, num_bookies, str(data_dir), args, **kwargs)

    def set_faults(self, i: int, rules: list[dict]) -> None:
        """Replace bookie ``i``'s fault rules (an empty list clears them)."""
        request = pb.SetFaultsRequest(rules=[
            pb.FaultRule(op=r.get("op", "any"), action=r.get("action", "fail"),
                         delay_ms=int(r.get("delay_ms", 0)), error=int(r.get("error", EIO)),
                         ledger_id=int(r.get("ledger_id", 0)),
                         entry_id=int(r.get("entry_id", 0)), match_entry="entry_id" in r,
                         probability=float(r.get("probability", 0.0)), count=int(r.get("count", 0)))
            for r in rules])
        with self.credentials("admin").channel(self.bookies[i].bookie_id) as channel:
            reply = pb_grpc.BookieStub(channel).SetFaults(request, timeout=10)
        if reply.status != 0:
            raise BKError(f"bookie {self.bookies[i].bookie_id} refused SetFaults "
                          "(is fault injection on?)")

    def clear_faults(self, i: int | None = None) -> None:
        for j in ([i] if i is not None else range(len(self.bookies))):
            if self.bookies[j].alive:
                self.set_faults(j, [])


def credentials_of_bookie(bookie_id: str, role: str = "admin") -> Credentials:
    """``role``'s credentials of the cluster (running in this process) of ``bookie_id``;
    none (anonymous) if no cluster of this process has it."""
    cluster = LocalCluster.of_bookie(bookie_id)
    return cluster.credentials(role) if cluster is not None else Credentials()


def bookie_channel(bookie_id: str, role: str = "admin", options=()):
    """A gRPC channel to ``bookie_id`` presenting its cluster's ``role`` credentials."""
    return credentials_of_bookie(bookie_id, role).channel(bookie_id, options=options)


def bookie_http(bookie, path: str, method: str = "GET", body: dict | None = None,
                role: str = "admin", timeout: float = 10.0) -> tuple[int, bytes]:
    """``(status, body)`` of a request to a :class:`~bkspark.localcluster.BookieProcess`'s
    admin endpoint, presenting its cluster's ``role`` credentials."""
    creds = credentials_of_bookie(bookie.bookie_id, role)
    status, raw, _ = creds.http_request(creds.url(bookie.address, bookie.http_port, path),
                                        method, body, timeout)
    return status, raw
