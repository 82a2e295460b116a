"""Certificates for tests of TLS bookies (``openssl`` on the PATH)."""
from __future__ import annotations

import pathlib
import subprocess


def self_signed(directory, name: str, host: str = "127.0.0.1") -> tuple[pathlib.Path, pathlib.Path]:
    """``(key, cert)``: a self-signed certificate for ``host`` (an IP address), valid 2 days,
    written to ``directory/name.key`` and ``directory/name.pem``. The certificate is its own
    CA: a bookie serves with both files, a client is given the ``.pem`` as ``tls_ca_file``."""
    directory = pathlib.Path(directory)
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", f"/CN={host}", "-addext", f"subjectAltName=IP:{host}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key, cert


def tls_bookie_args(key, cert) -> list[str]:
    """The flags of ``bkspark bookie`` that make it serve TLS only with ``key``/``cert``."""
    return ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
