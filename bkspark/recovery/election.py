"""Leader elections: exactly one auditor among the autorecovery processes (and one retention
enforcer, :mod:`.retention`, at its own path).

* On ZooKeeper: kazoo's ``Election`` recipe (a lock of ephemeral-sequential znodes under
  ``/underreplication/auditorelection``; each contender watches its predecessor). Losing the
  session ends the leadership.
* On the embedded store: a lease. Every contender creates an ephemeral-sequential record
  ``V_<seq>`` (the record lives as long as the contender's store session heartbeats; a dead
  process' record is reaped after its session timeout) and the lowest sequence leads.
  Contenders poll; the leader re-checks that it still holds the lowest record.

``LeaderElection(store, identifier, lead)`` calls ``lead(still_leader)`` on its own thread
whenever this contender becomes the leader; ``lead`` must return soon after
``still_leader()`` turns False (or :meth:`stop` was called).
"""
from __future__ import annotations

import logging
import threading
import time

from bkspark.errors import BKError, NoNodeError
from metadata.layout import AUDITOR_ELECTION

from .urm import election_contenders

log = logging.getLogger("bkspark.recovery.election")


def _kazoo_client(store):
    client = getattr(store, "client", None)
    try:
        from kazoo.client import KazooClient
    except ImportError:  # pragma: no cover
        return None
    return client if isinstance(client, KazooClient) else None


class LeaderElection:
    def __init__(self, store, identifier: str, lead, path: str = AUDITOR_ELECTION,
                 poll_interval: float = 0.5, role: str = "auditor"):
        self.store = store
        self.identifier = identifier
        self.lead = lead
        self.path = path
        self.poll_interval = poll_interval
        self.role = role            # what the leader is, in logs and the thread's name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.is_leader = False
        self._kz = _kazoo_client(store)
        self._election = None
        self._session_lost = threading.Event()

    def start(self) -> None:
        self.store.ensure_path(self.path)
        target = self._run_kazoo if self._kz is not None else self._run_lease
        self._thread = threading.Thread(target=target, daemon=True, name=f"{self.role}-election")
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._election is not None:
            try:
                self._election.cancel()
            except Exception:  # noqa: BLE001
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- ZooKeeper: kazoo's Election recipe ------------------------------------------
    def _run_kazoo(self):
        from kazoo.protocol.states import KazooState
        from kazoo.recipe.election import Election

        def listener(state):
            if state == KazooState.LOST:
                self._session_lost.set()

        self._kz.add_listener(listener)
        try:
            while not self._stop.is_set():
                self._session_lost.clear()
                self._election = Election(self._kz, self.path, self.identifier)

                def still_leader():
                    return not self._stop.is_set() and not self._session_lost.is_set()

                def elected():
                    self._lead(still_leader)

                try:
                    self._election.run(elected)
                except Exception as exc:  # noqa: BLE001 - connection trouble: try again
                    if not self._stop.is_set():
                        log.warning("%s election on ZooKeeper failed: %s; retrying", self.role, exc)
                        self._stop.wait(1.0)
        finally:
            try:
                self._kz.remove_listener(listener)
            except Exception:  # noqa: BLE001
                pass

    # ---- embedded store: lease records --------------------------------------------------
    def _run_lease(self):
        mine = None
        while not self._stop.is_set():
            try:
                if mine is None or self.store.exists(mine) is None:
                    mine = self.store.create(self.path + "/V_", self.identifier.encode(),
                                             ephemeral=True, sequential=True, makepath=True)
                names = [n for n, _ in election_contenders(self.store, self.path)]
                if names and self.path + "/" + names[0] == mine:
                    def still_leader(mine=mine):
                        if self._stop.is_set():
                            return False
                        try:
                            c = election_contenders(self.store, self.path)
                        except BKError:
                            return True     # transient store trouble: the lease decides
                        return bool(c) and self.path + "/" + c[0][0] == mine
                    self._lead(still_leader)
            except BKError as exc:
                log.warning("%s election: %s", self.role, exc)
            self._stop.wait(self.poll_interval)
        if mine is not None:
            try:
                self.store.delete(mine)
            except (NoNodeError, BKError):
                pass

    def _lead(self, still_leader):
        self.is_leader = True
        log.info("elected %s: %s", self.role, self.identifier)
        try:
            self.lead(still_leader)
        except Exception:  # noqa: BLE001
            log.exception("%s crashed; stepping down", self.role)
            time.sleep(1.0)
        finally:
            self.is_leader = False
            log.info("no longer the %s: %s", self.role, self.identifier)
