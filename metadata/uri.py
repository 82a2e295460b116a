"""Parsing of metadata service URIs.

* ``zk://host:port[,host:port...]/root[?setting=value&...]`` — ZooKeeper; ``root`` is the
  chroot of the store (``/`` or empty for none); the port defaults to 2181. The settings
  secure the connection (:data:`ZK_SETTINGS`; files, never secrets, so the URI may be
  printed): ``digest_file`` (a file holding ``user:password``: digest authentication, and
  every record created is that user's alone) or ``sasl_file`` (``user:password`` for SASL
  DIGEST-MD5; records are the SASL user's), ``read_acl`` (an identity also allowed to read
  every record, ``scheme:id``), ``tls_ca_file`` / ``tls_cert_file`` / ``tls_key_file``
  (ZooKeeper's client TLS).
* ``sqlite:///abs/path/meta.db`` — embedded SQLite database file (absolute path;
  ``sqlite:////abs/path/meta.db``, SQLAlchemy's spelling, is accepted too).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from bkspark.errors import InvalidUriError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.S)
_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
_ZK_ROOT_PART = re.compile(r"^[A-Za-z0-9_.:@+=-]+$")

SCHEMES = ("zk", "sqlite")
ZK_SETTINGS = ("digest_file", "sasl_file", "read_acl", "tls_ca_file", "tls_cert_file",
               "tls_key_file")


@dataclass(frozen=True)
class ZkUri:
    hosts: tuple[tuple[str, int], ...]
    root: str  # "/" for no chroot
    settings: tuple[tuple[str, str], ...] = ()     # (name, value) of ZK_SETTINGS, sorted

    def setting(self, name: str) -> str:
        return dict(self.settings).get(name, "")

    @property
    def hosts_string(self) -> str:
        return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)


@dataclass(frozen=True)
class SqliteUri:
    path: str


def parse_uri(uri) -> ZkUri | SqliteUri:
    """Parse a metadata URI. :raises InvalidUriError: naming the problem."""
    if not isinstance(uri, str):
        raise InvalidUriError(f"metadata URI must be a string, got {type(uri).__name__}: {uri!r}")
    if not uri.strip():
        raise InvalidUriError("metadata URI is empty (expected zk://host:port/root or "
                              "sqlite:///abs/path.db)")
    if uri != uri.strip() or any(c in uri for c in "\r\n\t\x00"):
        raise InvalidUriError(f"metadata URI contains whitespace or control characters: {uri!r}")
    m = _SCHEME.match(uri)
    if not m:
        raise InvalidUriError(
            f"malformed metadata URI {uri!r}: expected scheme://..., e.g. "
            "zk://127.0.0.1:2181/ledgers or sqlite:///abs/path/meta.db")
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme == "zk":
        return _parse_zk(uri, rest)
    if scheme == "sqlite":
        return _parse_sqlite(uri, rest)
    raise InvalidUriError(
        f"unknown metadata URI scheme {scheme!r} in {uri!r}: supported schemes are "
        "zk:// (ZooKeeper) and sqlite:/// (embedded)")


def _parse_sqlite(uri: str, rest: str) -> SqliteUri:
    if "?" in rest or "#" in rest:
        raise InvalidUriError(f"sqlite URI {uri!r} must not have a query or fragment")
    if not rest.startswith("/"):
        raise InvalidUriError(
            f"sqlite URI {uri!r} must name an absolute file path with three slashes, "
            "e.g. sqlite:///tmp/meta.db (a host part is not allowed)")
    # sqlite:////abs/path (SQLAlchemy's spelling of an absolute path) means the same file
    path = "/" + rest.lstrip("/")
    if path.endswith("/"):
        raise InvalidUriError(f"sqlite URI {uri!r} names a directory, not a database file")
    if "//" in path:
        raise InvalidUriError(f"sqlite URI {uri!r} has an empty path component")
    return SqliteUri(path=path)


def _zk_settings(uri: str, query: str) -> tuple[tuple[str, str], ...]:
    from urllib.parse import parse_qsl
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise InvalidUriError(f"zk URI {uri!r}: malformed settings {query!r} (expected "
                              "?name=value&...)") from None
    seen: dict[str, str] = {}
    for name, value in pairs:
        if name not in ZK_SETTINGS:
            raise InvalidUriError(f"zk URI {uri!r}: unknown setting {name!r} (known: "
                                  f"{', '.join(ZK_SETTINGS)})")
        if name in seen or not value:
            raise InvalidUriError(f"zk URI {uri!r}: setting {name!r} given twice or empty")
        seen[name] = value
    if "digest_file" in seen and "sasl_file" in seen:
        raise InvalidUriError(f"zk URI {uri!r}: give digest_file or sasl_file, not both")
    if bool(seen.get("tls_cert_file")) != bool(seen.get("tls_key_file")):
        raise InvalidUriError(f"zk URI {uri!r}: tls_cert_file and tls_key_file go together")
    if ("tls_cert_file" in seen) and "tls_ca_file" not in seen:
        raise InvalidUriError(f"zk URI {uri!r}: a client certificate needs tls_ca_file")
    return tuple(sorted(seen.items()))


def _parse_zk(uri: str, rest: str) -> ZkUri:
    if "#" in rest:
        raise InvalidUriError(f"zk URI {uri!r} must not have a fragment")
    rest, _, query = rest.partition("?")
    settings = _zk_settings(uri, query) if query else ()
    slash = rest.find("/")
    netloc, root = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    if "@" in netloc:
        raise InvalidUriError(f"zk URI {uri!r}: credentials in the URI are not supported")
    if not netloc:
        raise InvalidUriError(f"zk URI {uri!r} names no host (expected zk://host:port/root)")
    hosts = []
    for item in netloc.split(","):
        if not item:
            raise InvalidUriError(f"zk URI {uri!r} has an empty host in its host list")
        if item.startswith("["):  # [ipv6]:port
            end = item.find("]")
            if end < 0:
                raise InvalidUriError(f"zk URI {uri!r}: unterminated IPv6 address {item!r}")
            host, tail = item[1:end], item[end + 1:]
            if tail and not tail.startswith(":"):
                raise InvalidUriError(f"zk URI {uri!r}: malformed host {item!r}")
            port_s = tail[1:] if tail else ""
            if not host or not all(c in "0123456789abcdefABCDEF:." for c in host):
                raise InvalidUriError(f"zk URI {uri!r}: malformed IPv6 address {item!r}")
        else:
            host, sep, port_s = item.partition(":")
            if not sep:
                port_s = ""
            if not _HOSTNAME.match(host or ""):
                raise InvalidUriError(f"zk URI {uri!r}: malformed host name {host!r}")
        if port_s == "" and (":" in item and not item.startswith("[") or item.endswith(":")):
            raise InvalidUriError(f"zk URI {uri!r}: empty port in {item!r}")
        if port_s == "":
            port = 2181
        else:
            if not port_s.isdigit():
                raise InvalidUriError(f"zk URI {uri!r}: port {port_s!r} of {item!r} is not a number")
            port = int(port_s)
            if not 1 <= port <= 65535:
                raise InvalidUriError(f"zk URI {uri!r}: port {port} of {item!r} is out of range")
        hosts.append((host, port))
    if root != "/":
        if root.endswith("/"):
            root = root.rstrip("/") or "/"
    if root != "/":
        for part in root[1:].split("/"):
            if part in ("", ".", "..") or not _ZK_ROOT_PART.match(part):
                raise InvalidUriError(
                    f"zk URI {uri!r}: invalid root path {root!r} (component {part!r})")
    return ZkUri(hosts=tuple(hosts), root=root, settings=settings)
