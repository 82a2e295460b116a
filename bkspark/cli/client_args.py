"""Client settings of ``bkspark shell`` and ``bkspark autorecovery``: the flags and the file.

``--client-config FILE`` (default ``$BKSPARK_CLIENT_CONFIG``): ``KEY = VALUE`` lines, one
``ClientConfig`` field each (``tls_ca_file = /etc/bk/ca.pem``, ``add_timeout = 30``; ``#``
starts a comment line); ``--client-option KEY=VALUE`` (repeatable) and ``--tls-ca-file PEM``
override it, in that order. Names and values follow :mod:`bkspark.client_settings`.
"""
from __future__ import annotations

import argparse
import os
import sys

CONFIG_ENV = "BKSPARK_CLIENT_CONFIG"


def add_arguments(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """The flags; ``suppress``: leave them out of the namespace unless given (for the shell's
    flags that are accepted before and after the command)."""
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--tls-ca-file", metavar="PEM", default=default,
                        help="CA certificates (PEM) of TLS bookies: connect with TLS and verify "
                             "them (the client setting tls_ca_file)")
    parser.add_argument("--client-config", metavar="FILE", default=default,
                        help="client settings, KEY = VALUE lines of ClientConfig fields "
                             f"(default: ${CONFIG_ENV})")
    parser.add_argument("--client-option", metavar="KEY=VALUE", action="append",
                        default=default,
                        help="one client setting (a ClientConfig field, e.g. add_timeout=30); "
                             "repeatable; overrides --client-config")


def client_settings(args: argparse.Namespace, environ=os.environ) -> dict:
    """``{ClientConfig field: value}`` of the flags; BadRequestError naming a bad one."""
    from bkspark.client_settings import client_settings as validate
    from bkspark.client_settings import SECRET_FIELDS, parse_assignment, read_settings_file
    from bkspark.errors import BadRequestError
    settings: dict = {}
    path = getattr(args, "client_config", None) or environ.get(CONFIG_ENV)
    if path:
        settings.update(read_settings_file(path))
    pairs = [parse_assignment(text, "--client-option")
             for text in getattr(args, "client_option", None) or ()]
    for key, value in pairs:        # one at a time: a later one overrides an earlier one
        typed = validate([(key, value)], what="--client-option")
        if set(typed) & set(SECRET_FIELDS):
            raise BadRequestError(f"--client-option {key}: a token on the command line is seen "
                                  "by every local user (`ps`); give auth_token_file instead")
        settings.update(typed)
    tls = getattr(args, "tls_ca_file", None)
    if tls is not None:
        settings.update(validate({"--tls-ca-file": tls}, what="flag"))   # names tls_ca_file
    return settings


def metadata_uri(command: str, explicit: str | None) -> str | None:
    """The metadata URI a long-running command uses: ``--metadata``, else
    ``$BKSPARK_METADATA_URI``, else the running local cluster's; None after saying on stderr
    that there is none (the command then exits with 2)."""
    from bkspark.cluster_registry import NO_METADATA_SERVICE, default_metadata_uri
    uri = default_metadata_uri(explicit)
    if not uri:
        print(f"bkspark {command}: "
              + NO_METADATA_SERVICE.replace("pass a URI", "pass --metadata URI"), file=sys.stderr)
    return uri
