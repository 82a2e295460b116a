"""The address a bookie listening on all interfaces tells clients to dial.

A bookie bound to ``0.0.0.0`` must not advertise ``127.0.0.1``: remote clients would dial
their own loopback. :func:`routable_address` picks the IPv4 address of the interface that
carries the default route (or the only non-loopback address when there is no default route)
from the kernel's own tables, without sending a packet; when the choice is not clear it
refuses, naming ``--advertised-address``.
"""
from __future__ import annotations

import fcntl
import socket
import struct

from bkspark.errors import BadRequestError

WILDCARDS = ("0.0.0.0", "::", "")
_SIOCGIFADDR = 0x8915
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1


def interface_addresses() -> dict[str, str]:
    """IPv4 address of every interface that is up and has one (``SIOCGIFFLAGS``,
    ``SIOCGIFADDR``)."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name[:15].encode())
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS,
                                                            request), 16)[0]
                if not flags & _IFF_UP:
                    continue
                reply = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue
            found[name] = socket.inet_ntoa(reply[20:24])
    return found


def default_route_interface(route_table: str = "/proc/net/route") -> str | None:
    try:
        with open(route_table) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def routable_address(addresses: dict[str, str] | None = None,
                     default_interface: str | None = None) -> tuple[str, str]:
    """``(address, why)`` to advertise for a wildcard listen address.

    :raises BadRequestError: no non-loopback address, or several and no default route.
    """
    if addresses is None:
        addresses = interface_addresses()
        default_interface = default_route_interface()
    usable = {name: a for name, a in addresses.items() if not a.startswith("127.")}
    if default_interface in usable:
        return usable[default_interface], f"interface {default_interface}, the default route's"
    if len(usable) == 1:
        name, address = next(iter(usable.items()))
        return address, f"interface {name}, the only one besides loopback"
    if not usable:
        raise BadRequestError(
            "listen_address 0.0.0.0: this host has no address besides loopback to advertise; "
            "clients elsewhere could not reach the bookie. Set --advertised-address (the "
            "address clients dial), or --listen-address to a specific address")
    raise BadRequestError(
        "listen_address 0.0.0.0: which address should clients dial? This host has "
        + ", ".join(f"{a} ({n})" for n, a in sorted(usable.items()))
        + " and no default route; set --advertised-address to one of them")
