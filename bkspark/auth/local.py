"""A local cluster's own credentials, made at its first start (``<data_dir>/security``, 0700).

* ``token.key`` (Ed25519, 0600) signs tokens; ``token.pub`` is what bookies verify with;
* ``client.token``, ``autorecovery.token``, ``admin.token``: one token per role, valid
  :data:`TOKEN_DAYS` days and minted again when less than :data:`RENEW_DAYS` remain;
* ``ca.pem`` / ``ca.key``: the cluster's CA, and ``bookie-<i>.pem`` / ``.key`` for each bookie
  that listens beyond loopback (TLS: a token is never sent in clear on a network).

Clients on the same machine find them through the cluster's records
(:func:`bkspark.cluster_registry.local_credentials`); every file is readable by the user that
runs the cluster only. Rotating: stop the cluster, delete ``security/``, start it again -- new
keys, tokens and certificates; tokens minted before no longer verify.
"""
from __future__ import annotations

import os
import time

import jwt

from bkspark import private
from bkspark.auth import tokens
from bkspark.auth.certs import CertificateAuthority
from bkspark.auth.roles import Role

TOKEN_DAYS = 365
RENEW_DAYS = 30


class ClusterCredentials:
    """The files of one local cluster's credentials (:meth:`ensure` creates what is missing)."""

    def __init__(self, data_dir: str) -> None:
        self.directory = os.path.join(os.path.abspath(data_dir), "security")
        self.signing_key_file = os.path.join(self.directory, "token.key")
        self.public_key_file = os.path.join(self.directory, "token.pub")
        self.ca = CertificateAuthority(self.directory)

    def token_file(self, role: Role | str) -> str:
        label = role.label if isinstance(role, Role) else str(role)
        return os.path.join(self.directory, f"{label}.token")

    def ensure(self) -> "ClusterCredentials":
        private.make_dir(self.directory)
        if not os.path.exists(self.signing_key_file):
            key = tokens.new_signing_key()
            with private.open_file(self.public_key_file, "wb") as f:
                f.write(tokens.public_key_of(key))
            tmp = self.signing_key_file + ".tmp"
            with private.open_file(tmp, "wb") as f:
                f.write(key)
            os.replace(tmp, self.signing_key_file)
            for role in Role:
                _remove(self.token_file(role))      # signed by a key that is gone
        with open(self.signing_key_file, "rb") as f:
            key = f.read()
        for role in Role:
            path = self.token_file(role)
            if _expires_within(path, RENEW_DAYS * 86400):
                tmp = path + ".tmp"
                with private.open_file(tmp) as f:
                    f.write(tokens.mint(key, f"localcluster-{role.label}", role,
                                        TOKEN_DAYS * 86400))
                os.replace(tmp, path)
        if not self.ca.exists():
            self.ca.create("bkspark local cluster CA")
        return self

    def bookie_certificate(self, index: int, host: str) -> tuple[str, str]:
        """``(key, cert)`` of bookie ``index`` serving TLS on ``host`` (issued once per host)."""
        name = f"bookie-{index}-{host.replace(':', '_')}"
        key, cert = (os.path.join(self.directory, f"{name}.key"),
                     os.path.join(self.directory, f"{name}.pem"))
        if not (os.path.exists(key) and os.path.exists(cert)):
            key, cert = self.ca.issue(name, hosts=[host])
        return key, cert

    def client_settings(self, role: Role | str = Role.CLIENT, tls: bool = False) -> dict:
        """ClientConfig fields that present ``role``'s token (and trust the CA, for bookies
        that serve TLS)."""
        settings = {"auth_token_file": self.token_file(role)}
        if tls:
            settings["tls_ca_file"] = self.ca.cert_file
        return settings


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _expires_within(path: str, seconds: float) -> bool:
    """Whether the token in ``path`` is missing, unreadable or expires within ``seconds``."""
    try:
        with open(path) as f:
            claims = jwt.decode(f.read().strip(), options={"verify_signature": False})
        return float(claims["exp"]) - time.time() < seconds
    except (OSError, ValueError, KeyError, jwt.InvalidTokenError):
        return True
