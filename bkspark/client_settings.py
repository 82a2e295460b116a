"""A client's settings: :class:`ClientConfig`, and the one mapping of names and values given as
text to it.

Below both the client and the bookie (whose in-process autorecovery is a client: its
``client_config`` file is read and checked when the bookie starts), so neither imports the
other for it.

Every way to configure a client ends here: ``BookKeeper(**kwargs)``, the Spark connector's
``client.*`` options, and the ``--client-config FILE``, ``--client-option KEY=VALUE`` and
``--tls-ca-file`` flags of ``bkspark shell`` and ``bkspark autorecovery``. Rules:

* a name is a field of :class:`ClientConfig`, matched ignoring case,
  ``_`` and ``-``: ``tls_ca_file``, ``tlsCaFile`` and ``tlscafile`` (Spark lower-cases option
  names) are one setting; naming it twice in one mapping is an error;
* a value takes its field's type: a number >= 0 (finite), an integer >= 0, ``true``/``false``
  (also ``yes``/``no``, ``on``/``off``, ``1``/``0``), a file name; ``add_linger`` also takes
  ``none`` (its transport's default). Typed values (Python, not text) must already be of the
  field's type (an int for a number is fine);
* ``tls_ca_file`` must name a readable file of PEM certificates; ``tls_cert_file``,
  ``tls_key_file`` and ``auth_token_file`` readable files (all made absolute, so Spark's
  executors find them where the driver did); ``""`` means none. ``auth_token`` is the token
  itself: it is never part of an error message.

Anything else raises :class:`~bkspark.errors.BadRequestError` naming the setting as it was
given, the expected type or the closest known name. A settings file (:func:`read_settings_file`)
holds ``KEY = VALUE`` lines; blank lines and lines starting with ``#`` are ignored.
"""
from __future__ import annotations

import math
import os
import ssl
import types
import typing
from dataclasses import dataclass, field
from functools import lru_cache

from bkspark.errors import BadRequestError, did_you_mean


@dataclass
class ClientConfig:
    """Tunables of a :class:`~bkspark.client.BookKeeper` client (seconds, bytes).

    Given as text -- the Spark connector's ``client.*`` options, ``--client-config`` files and
    ``--client-option``/``--tls-ca-file`` flags -- names and values follow this module.
    """

    add_timeout: float = 10.0               # unanswered add -> the bookie is replaced
    read_timeout: float = 10.0              # unanswered read -> unknown / next replica
    speculative_read_timeout: float = 2.0   # ask a second replica after this (0 = never)
    read_range_timeout: float = 120.0
    max_outstanding_bytes: int = 32 << 20   # back-pressure bound of unacknowledged adds
    max_bookie_backlog_bytes: int = 64 << 20  # unsent adds to one bookie beyond this for
                                              # add_timeout: the bookie is replaced; beyond
                                              # twice this, appenders wait for it to drain
    read_window: int = 64                   # per-entry reads in flight
    recovery_read_window: int = 64          # recovery reads in flight
    recovery_negative_grace: float = 1.0    # wait this long for a late positive answer
    use_read_range: bool = True
    metadata_retries: int = 20
    close_flush_timeout: float = 120.0
    bookie_cache_seconds: float = 1.0       # how long the writable-bookie list is reused
    explicit_lac_delay: float = 0.01        # the add stream idle this long (every add
                                            # acknowledged, none since): the writer sends its
                                            # LAC to the ensemble (WriteLac), so tailing
                                            # readers see its last entry; 0 = only after
                                            # explicit_lac_interval (see LedgerHandle)
    explicit_lac_interval: float = 1.0      # idle this long and no bookie stored the LAC
                                            # (delayed send off or failed): send it (again);
                                            # 0 = never send an explicit LAC at all
    tls_ca_file: str = ""                   # PEM roots: talk TLS to bookies and verify them
    tls_cert_file: str = ""                 # client certificate (mutual TLS; its OU: the role)
    tls_key_file: str = ""                  # ... and its key
    auth_token: str = field(default="", repr=False)     # a token (bkspark.auth.tokens);
    auth_token_file: str = ""               # or the file holding it (preferred: never shown)
                                            # none of these: a local cluster's own, found
                                            # through its records (bkspark.cluster_registry)
    overload_retry_delay: float = 0.05      # resend after ETOOMANYREQUESTS
    stall_probe_after: float = 2.0          # an add stream unanswered this long, its socket
                                            # backing off, while a new connection's hello is
                                            # answered, is stuck in TCP back-off (a healed
                                            # partition): it is replaced at once, not after
                                            # add_timeout (0 = off)
    suspect_seconds: float = 30.0           # a failed/slow bookie is read from last this long
    add_linger: float | None = None         # min spacing of two add messages to one bookie
                                            # (None: 0 on data ports, 2 ms over gRPC)
    add_max_linger: float = 0.005           # ... waiting up to this for the previous ones'
                                            # acks (self-clocking; see bookie_client)



_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
_NONE = ("none", "null", "default")
CA_FIELD = "tls_ca_file"
FILE_FIELDS = ("tls_cert_file", "tls_key_file", "auth_token_file")
SECRET_FIELDS = ("auth_token",)


def _normal(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def camel(field_name: str) -> str:
    """``tls_ca_file`` -> ``tlsCaFile``: how the Spark connector documents a field."""
    first, *rest = field_name.split("_")
    return first + "".join(p.title() for p in rest)


@lru_cache(maxsize=1)
def fields() -> dict[str, tuple[type, bool]]:
    """``{field name: (type, None allowed)}`` of ClientConfig."""
    out = {}
    for name, hint in typing.get_type_hints(ClientConfig).items():
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else ()
        base = [a for a in args if a is not type(None)]
        out[name] = (base[0], True) if args else (hint, False)
    return out


@lru_cache(maxsize=1)
def _by_normal() -> dict[str, str]:
    return {_normal(name): name for name in fields()}


def field_named(name: str) -> str | None:
    """The ClientConfig field that ``name`` spells (any case, snake_case or camelCase)."""
    return _by_normal().get(_normal(name))


def _expected(typ: type, optional: bool) -> str:
    text = {bool: "true or false", int: "an integer >= 0", float: "a number >= 0",
            str: "a file name"}[typ]
    return text + (" or 'none'" if optional else "")


def _convert(typ: type, optional: bool, value):
    """The typed value, or raise ValueError (bad text) or TypeError (a value of another
    type)."""
    if value is None:
        if optional:
            return None
        raise ValueError
    if isinstance(value, str):
        v = value.strip()
        if optional and v.lower() in _NONE:
            return None
        if typ is bool:
            if v.lower() in _TRUE:
                return True
            if v.lower() in _FALSE:
                return False
            raise ValueError
        if typ is int:
            n = int(v)
        elif typ is float:
            n = float(v)
        else:
            return v
    elif typ is bool:
        if not isinstance(value, bool):
            raise TypeError
        return value
    elif typ is str:
        if not isinstance(value, str):
            raise TypeError
        return value
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        if typ is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        n = typ(value)
    if not math.isfinite(n) or n < 0:
        raise ValueError
    return n


def _check_ca_file(path: str, label: str) -> str:
    path = os.path.abspath(os.path.expanduser(path))
    try:
        ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise BadRequestError(f"{label}: cannot read the CA file {path!r} (PEM certificates "
                              f"bookies are verified against): {exc}") from None
    return path


def _check_file(path: str, label: str) -> str:
    path = os.path.abspath(os.path.expanduser(path))
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise BadRequestError(f"{label}: cannot read {path!r}: {exc.strerror}") from None
    return path


def client_settings(mapping, *, prefix: str = "", camel_case: bool = False,
                    what: str = "client setting", source: str = "") -> dict:
    """Validate ``mapping`` (a dict, or an iterable of ``(name, value)`` pairs); return
    ``{ClientConfig field: typed value}``.

    ``prefix``: every name starts with it (case-insensitive; e.g. Spark's ``client.``);
    ``camel_case``: suggest names spelled ``tlsCaFile`` rather than ``tls_ca_file``;
    ``what`` and ``source`` word the errors (``unknown option 'client.x' (in FILE)``)."""
    items = mapping.items() if hasattr(mapping, "items") else mapping
    spell = camel if camel_case else (lambda n: n)
    known = [prefix + spell(n) for n in fields()]
    out: dict = {}
    given_as: dict[str, str] = {}
    for key, value in items:
        given = str(key)
        if not given.lower().startswith(prefix.lower()):
            raise BadRequestError(f"{what} {given!r}{source} does not start with {prefix!r}")
        name = field_named(given[len(prefix):])
        if name is None:
            hint = did_you_mean(given, known, key=lambda s: _normal(s[len(prefix):]))
            raise BadRequestError(f"unknown {what} {given!r}{source}{hint} (known, the fields "
                                  f"of ClientConfig: {', '.join(known)})")
        if name in out:
            raise BadRequestError(f"{what}s {given_as[name]!r} and {given!r}{source} both set "
                                  f"{name}")
        typ, optional = fields()[name]
        label = f"{what} {given!r}{source}"
        try:
            typed = _convert(typ, optional, value)
        except (ValueError, TypeError, OverflowError):
            shown = "a value of another type" if name in SECRET_FIELDS else repr(value)
            raise BadRequestError(f"{label} must be {_expected(typ, optional)}, "
                                  f"got {shown}") from None
        if name == CA_FIELD and typed:
            typed = _check_ca_file(typed, label)
        elif name in FILE_FIELDS and typed:
            typed = _check_file(typed, label)
        out[name] = typed
        given_as[name] = given
    return out


def client_config_from(mapping, **how):
    """A :class:`ClientConfig` with the settings of ``mapping`` (see :func:`client_settings`
    for ``how``); the other fields keep their defaults."""
    return ClientConfig(**client_settings(mapping, **how))


def parse_assignment(text: str, where: str) -> tuple[str, str]:
    """``"KEY = VALUE"`` -> ``(KEY, VALUE)`` stripped; ``where`` names it in the error."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        shown = text.strip().split()[0][:40] if text.strip() else ""
        raise BadRequestError(f"{where}: expected KEY=VALUE, got a line starting {shown!r} "
                              "(the rest is not shown: it may hold a secret)")
    return key.strip(), value.strip()


def read_settings_file(path: str, *, what: str = "client setting") -> dict:
    """The validated settings of a file of ``KEY = VALUE`` lines (see the module's rules)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"cannot read client config file {path}: {exc}") from None
    pairs = [parse_assignment(line, f"{path}:{n}") for n, line in enumerate(lines, 1)
             if line.strip() and not line.lstrip().startswith("#")]
    return client_settings(pairs, what=what, source=f" (in {path})")
