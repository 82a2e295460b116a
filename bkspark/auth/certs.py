"""X.509 for mutual TLS: a cluster CA, bookie (server) certificates, and client certificates
whose first OU names the role (as BookKeeper's ``BookieAuthZFactory`` takes it).

Keys are ECDSA P-256 (fast handshakes; every TLS stack takes them). The files written are
private (0600, :mod:`bkspark.private`). A certificate without a known role in its OU grants
nothing: :func:`identity_of` refuses it.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bkspark import private
from bkspark.auth.roles import Role, role_named, role_of
from bkspark.auth.tokens import Identity
from bkspark.errors import BadRequestError, UnauthorizedError

DEFAULT_DAYS = 825


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: str, data: bytes) -> str:
    with private.open_file(path, "wb") as f:
        f.write(data)
    return path


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


class CertificateAuthority:
    """A CA key and certificate kept in ``directory`` (``ca.pem``, ``ca.key``)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.cert_file = os.path.join(directory, "ca.pem")
        self.key_file = os.path.join(directory, "ca.key")

    def exists(self) -> bool:
        return os.path.exists(self.cert_file) and os.path.exists(self.key_file)

    def create(self, name: str = "bkspark cluster CA", days: int = 3650) -> "CertificateAuthority":
        private.make_dir(self.directory)
        key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                             False, False), critical=True)
                .sign(key, hashes.SHA256()))
        _write(self.key_file, _pem_key(key))
        _write(self.cert_file, cert.public_bytes(serialization.Encoding.PEM))
        return self

    def issue(self, name: str, *, role: Role | str | None = None, hosts: list[str] = (),
              days: int = DEFAULT_DAYS) -> tuple[str, str]:
        """Write ``<name>.key`` / ``<name>.pem`` signed by this CA: a server certificate for
        ``hosts`` (IP addresses or DNS names), or -- with ``role`` -- a client certificate
        whose OU is the role. Returns ``(key file, cert file)``."""
        with open(self.key_file, "rb") as f:
            ca_key = serialization.load_pem_private_key(f.read(), None)
        with open(self.cert_file, "rb") as f:
            ca_cert = x509.load_pem_x509_certificate(f.read())
        key = _key()
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
        if role is not None:
            role = role_of(role)
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role.label))
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(x509.Name(attrs))
                   .issuer_name(ca_cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True))
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        key_file = _write(os.path.join(self.directory, f"{name}.key"), _pem_key(key))
        cert_file = _write(os.path.join(self.directory, f"{name}.pem"),
                           cert.public_bytes(serialization.Encoding.PEM))
        return key_file, cert_file


def identity_of(cert: bytes) -> Identity:
    """``(common name, role)`` of a peer certificate (DER or PEM) that TLS already verified
    against the configured CA; UnauthorizedError when its first OU names no role."""
    try:
        parsed = (x509.load_pem_x509_certificate(cert) if cert.lstrip().startswith(b"-----")
                  else x509.load_der_x509_certificate(cert))
    except ValueError as exc:
        raise UnauthorizedError(f"unreadable client certificate: {exc}") from None
    names = parsed.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    units = parsed.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    subject = str(names[0].value) if names else parsed.subject.rfc4514_string()
    if not units:
        raise UnauthorizedError(f"client certificate {subject!r} names no role (OU)")
    try:
        return Identity(subject, role_named(str(units[0].value)))
    except ValueError as exc:
        raise UnauthorizedError(f"client certificate {subject!r}: {exc}") from None


def server_tls_context(cert_file: str, key_file: str, client_ca_file: str = "", *,
                       require_client_certificate: bool = False) -> ssl.SSLContext:
    """A server's TLS context: its certificate, and -- with ``client_ca_file`` -- client
    certificates signed by that CA verified when given (required with
    ``require_client_certificate``; else a peer may present a token instead)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise BadRequestError(f"cannot load the certificate {cert_file} and its key {key_file}: "
                              f"{exc}") from None
    if client_ca_file:
        try:
            context.load_verify_locations(client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise BadRequestError(f"cannot load the client CA {client_ca_file}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED if require_client_certificate \
            else ssl.CERT_OPTIONAL
    return context
