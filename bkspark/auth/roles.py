"""Roles, and the one table of what each surface's requests need (issue 48).

A role includes the ones below it: ``admin`` may do what ``autorecovery`` may, which may do
what ``client`` may. ``None`` in a table: no authentication (a liveness probe).

* ``client`` -- create, add to, read, fence and recover ledgers (a ledger's adds and fencing
  reads also check its master key, as BookKeeper's ``checkAccess``), which includes
  RECOVERY_ADD and listing a bookie's entries of a ledger (a client's recovery writes back and
  lists, as autorecovery does); learn a bookie's data port; read its state and metrics.
* ``autorecovery`` -- on bookies, what a client may (BookKeeper's autorecovery is a client);
  its own name so that its credentials can be told apart and revoked.
* ``admin`` -- read-only mode, garbage collection, autorecovery enable/disable and audits,
  the dashboard's actions, fault injection (test builds).

docs/security.md prints this table.
"""
from __future__ import annotations

import enum


class Role(enum.IntEnum):
    CLIENT = 1
    AUTORECOVERY = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()


def role_named(name: str) -> Role:
    """``"client"`` -> Role.CLIENT, spelled exactly (a certificate's OU ``Admin`` of some
    other scheme grants nothing); ValueError naming the roles for anything else."""
    for role in Role:
        if name == role.label:
            return role
    raise ValueError(f"unknown role {name!r}: one of {', '.join(r.label for r in Role)}")


def role_of(value: "Role | str") -> Role:
    return value if isinstance(value, Role) else role_named(value)


def permits(have: Role, need: Role | None) -> bool:
    """Whether a peer with role ``have`` may make a request that needs ``need``."""
    return need is None or have >= need


# gRPC methods of bookie.proto's Bookie service.
GRPC_METHODS: dict[str, Role] = {
    "Add": Role.CLIENT,
    "AddStream": Role.CLIENT,
    "Read": Role.CLIENT,
    "ReadRange": Role.CLIENT,
    "ReadLac": Role.CLIENT,
    "WriteLac": Role.CLIENT,
    "GetBookieInfo": Role.CLIENT,
    "Force": Role.CLIENT,
    "ListEntries": Role.CLIENT,
    "SetFaults": Role.ADMIN,
}

# The data port carries AddStream and ReadRange: one role for the connection.
DATA_PORT: Role = Role.CLIENT

# HTTP routes: (method, path, or a prefix ending in "/"), the first match wins.
HTTP_ROUTES: list[tuple[str, str, Role | None]] = [
    ("GET", "/heartbeat", None),
    ("GET", "/metrics", Role.CLIENT),
    ("GET", "/api/v1/bookie/info", Role.CLIENT),
    ("GET", "/api/v1/bookie/state", Role.CLIENT),
    ("PUT", "/api/v1/bookie/state/readonly", Role.ADMIN),
    ("POST", "/api/v1/bookie/gc", Role.ADMIN),
    ("GET", "/api/v1/autorecovery/", Role.CLIENT),
    ("PUT", "/api/v1/autorecovery/", Role.ADMIN),
    ("POST", "/api/v1/autorecovery/", Role.ADMIN),
    ("DELETE", "/api/v1/autorecovery/", Role.ADMIN),
]


def http_role(method: str, path: str) -> Role | None:
    """The role an HTTP request needs; an unlisted route needs ``admin`` (a new route is
    closed until the table says otherwise)."""
    for m, route, role in HTTP_ROUTES:
        if m == method and (path == route or (route.endswith("/") and
                                              (path + "/").startswith(route))):
            return role
    return Role.ADMIN
