"""The server side: authenticate a peer, check its role (:mod:`bkspark.auth.roles`), refuse.

One :class:`Guard` per server process, built from its settings (:meth:`Guard.from_settings`):

* ``token_public_key_file`` -- tokens signed by the matching key are accepted
  (:mod:`bkspark.auth.tokens`);
* ``tls_client_ca_file`` -- mutual TLS: gRPC and the data port require a client certificate
  signed by this CA, and the peer's role is the certificate's (:mod:`bkspark.auth.certs`);
  a token is then not needed and not looked at;
* neither -- the server is open (allowed on loopback, or beyond it only with
  ``allow_insecure_network``: see :func:`check_listen`) to ``client`` requests; an admin
  request is refused (no one can be an admin where no one is authenticated).

A refused request is answered EUA (gRPC ``UNAUTHENTICATED``/``PERMISSION_DENIED``, HTTP
401/403, a refused data-port hello) and logged at WARNING once per peer address -- the
addresses already logged are bounded (``LOGGED_PEERS``), and all of them together get at
most ``REFUSAL_LINES`` lines a minute (the rest are counted), so peers cycling through
addresses cannot fill the log either.
"""
from __future__ import annotations

import collections
import ipaddress
import logging
import socket
import threading

import grpc

from bkspark.auth import certs, roles
from bkspark.auth.roles import Role
from bkspark.auth.tokens import Identity, TokenVerifier
from bkspark.errors import BadRequestError, PermissionDeniedError, UnauthorizedError
from bkspark.logging_setup import LogBudget

log = logging.getLogger("bkspark.auth")

LOGGED_PEERS = 1024
REFUSAL_LINES = 10          # log lines of refusals per minute, all peers together
#: who a peer of a server without authentication is: a client, never an admin (an open
#: endpoint serves reads and writes on loopback, never admin actions)
OPEN_IDENTITY = Identity("unauthenticated (authentication off)", Role.CLIENT)
TOKEN_METADATA_KEY = "authorization"
_CERT_CACHE = 256


def bearer(token: str) -> str:
    """The value of an ``Authorization`` header (HTTP) or gRPC metadata entry for ``token``."""
    return f"Bearer {token}"


def _token_of(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only: a loopback address, or
    ``localhost`` / ``ip6-localhost`` when every address it resolves to is one (a hosts file
    may say otherwise). Any other name counts as reachable from the network."""
    if host in ("localhost", "ip6-localhost"):
        try:
            found = {info[4][0] for info in socket.getaddrinfo(host, None)}
        except OSError:
            return False
        return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback
                                   for a in found)
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(what: str, host: str, *, authenticated: bool, tls: bool,
                 allow_insecure_network: bool,
                 authenticate: str = "auth_token_public_key_file (tokens) or "
                                     "tls_client_ca_file (client certificates)",
                 encrypt: str = "tls_cert_file and tls_key_file") -> None:
    """Refuse (BadRequestError naming the fix) to serve ``what`` on a non-loopback ``host``
    without authentication, or with tokens sent in clear; ``allow_insecure_network`` is the
    operator's statement that the network is protected otherwise. ``authenticate`` and
    ``encrypt`` name the settings that fix each, as ``what`` calls them."""
    if is_loopback(host) or allow_insecure_network:
        return
    if not authenticated:
        raise BadRequestError(
            f"{what} would listen on {host} with no authentication: anyone who reaches it could "
            f"use it. Set {authenticate}, listen on 127.0.0.1, or pass "
            "--allow-insecure-network if the network is protected otherwise")
    if not tls:
        raise BadRequestError(
            f"{what} would listen on {host} and take tokens in clear text: set {encrypt}, or "
            "pass --allow-insecure-network if the network is protected otherwise")


class Guard:
    """Authenticates peers and checks roles for one server process (thread-safe)."""

    def __init__(self, verifier: TokenVerifier | None = None, client_ca_file: str = "") -> None:
        self.verifier = verifier
        self.client_ca_file = client_ca_file
        self._logged: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._certs: collections.OrderedDict[bytes, Identity] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._budget = LogBudget(REFUSAL_LINES, 60.0)
        self.refused = 0            # requests refused since start (bookie_auth_refused_total)

    @classmethod
    def from_settings(cls, token_public_key_file: str = "",
                      tls_client_ca_file: str = "") -> "Guard":
        if tls_client_ca_file:
            try:
                with open(tls_client_ca_file, "rb"):
                    pass
            except OSError as exc:
                raise BadRequestError(f"cannot read tls_client_ca_file {tls_client_ca_file}: "
                                      f"{exc.strerror}") from None
        verifier = TokenVerifier.from_file(token_public_key_file) if token_public_key_file \
            else None
        return cls(verifier, tls_client_ca_file)

    @property
    def enabled(self) -> bool:
        return self.verifier is not None or bool(self.client_ca_file)

    @property
    def mutual_tls(self) -> bool:
        return bool(self.client_ca_file)

    # ---- deciding ---------------------------------------------------------------------

    def identify(self, *, token: str | None = None, cert: bytes | None = None) -> Identity:
        """Who the peer is: its certificate's identity under mutual TLS, else its token's;
        UnauthorizedError saying what is missing or wrong."""
        if not self.enabled:
            return OPEN_IDENTITY
        if self.mutual_tls and (cert or self.verifier is None):
            if not cert:
                raise UnauthorizedError("no client certificate (this server requires mutual TLS)")
            with self._lock:
                hit = self._certs.get(cert)
            if hit is None:
                hit = certs.identity_of(cert)
                with self._lock:
                    self._certs[cert] = hit
                    while len(self._certs) > _CERT_CACHE:
                        self._certs.popitem(last=False)
            return hit
        if not token:
            raise UnauthorizedError("no credentials: this server requires a token "
                                    "(client setting auth_token_file)")
        return self.verifier.verify(token)

    def admit(self, need: Role | None, peer: str, *, token: str | None = None,
              cert: bytes | None = None) -> Identity:
        """:meth:`identify`, then check that its role permits ``need``; a refusal is logged
        (once per peer) and raised as UnauthorizedError."""
        if need is None:
            return OPEN_IDENTITY
        try:
            identity = self.identify(token=token, cert=cert)
            if not self.enabled and not roles.permits(identity.role, need):
                raise PermissionDeniedError(
                    f"this server authenticates no one, so it serves no {need.label} request: "
                    "configure a token key (auth_token_public_key_file) or a client CA")
            if not roles.permits(identity.role, need):
                raise PermissionDeniedError(
                    f"{identity.subject!r} has role {identity.role.label}; this needs "
                    f"{need.label}")
            return identity
        except UnauthorizedError as exc:
            self.note_refusal(peer, str(exc))
            raise

    def note_refusal(self, peer: str, why: str) -> None:
        host = _host_of(peer)
        with self._lock:
            self.refused += 1
            first = host not in self._logged
            self._logged[host] = None
            self._logged.move_to_end(host)
            while len(self._logged) > LOGGED_PEERS:
                self._logged.popitem(last=False)
        if first and (withheld := self._budget.allow()) is not None:
            log.warning("refused a request from %s: %s (further refusals of this peer are "
                        "not logged%s)", host, why,
                        f"; {withheld} refusals of other peers were not logged before this"
                        if withheld else "")

    # ---- gRPC --------------------------------------------------------------------------

    def grpc_interceptor(self, table: dict[str, Role]) -> "grpc.ServerInterceptor":
        return _GrpcGuard(self, table)

    # ---- HTTP --------------------------------------------------------------------------

    def admit_http(self, handler) -> Identity | None:
        """Check an ``http.server`` request against :data:`roles.HTTP_ROUTES`; on refusal
        answer it (401 / 403, JSON) and return None."""
        path = handler.path.split("?", 1)[0].rstrip("/") or "/"
        need = roles.http_role(handler.command, path)
        try:
            return self.admit(need, handler.client_address[0],
                              token=_token_of(handler.headers.get("Authorization")),
                              cert=handler.peer_certificate)
        except PermissionDeniedError as exc:
            handler.close_connection = True     # its body, if any, was not read
            handler.json(403, {"error": str(exc)})
        except UnauthorizedError as exc:
            handler.close_connection = True
            handler.send_response(401)
            body = ('{"error": %s}' % _json_str(str(exc))).encode()
            handler.send_header("WWW-Authenticate", 'Bearer realm="bkspark"')
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
        return None


def _json_str(text: str) -> str:
    import json
    return json.dumps(text)


def _host_of(peer: str) -> str:
    """``ipv4:10.0.0.1:5555`` / ``10.0.0.1`` / ``ipv6:[::1]:5`` -> the address alone."""
    if peer.startswith(("ipv4:", "ipv6:")):
        peer = peer.split(":", 1)[1]
        return peer.rsplit(":", 1)[0].strip("[]")
    return peer


def _refusal_handler(handler, guard: Guard, need: Role, token: str | None):
    """A handler of ``handler``'s kind that checks the call (its certificate needs the
    context) and aborts it when refused, else runs ``handler``'s behaviour."""
    if handler.request_streaming and handler.response_streaming:
        inner, make = handler.stream_stream, grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        inner, make = handler.stream_unary, grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        inner, make = handler.unary_stream, grpc.unary_stream_rpc_method_handler
    else:
        inner, make = handler.unary_unary, grpc.unary_unary_rpc_method_handler

    def check(context):
        cert = None
        if guard.mutual_tls:
            pem = context.auth_context().get("x509_pem_cert")
            cert = pem[0] if pem else None
        try:
            guard.admit(need, context.peer(), token=token, cert=cert)
        except PermissionDeniedError as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except UnauthorizedError as exc:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))

    if handler.response_streaming:
        def behaviour(request, context):
            check(context)
            yield from inner(request, context)
    else:
        def behaviour(request, context):
            check(context)
            return inner(request, context)
    return make(behaviour, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class _GrpcGuard(grpc.ServerInterceptor):
    """Checks each call against the method table before the service sees it. A token call is
    decided here (a cached verification); under mutual TLS the certificate is read from the
    call's context, so the method's handler is wrapped."""

    def __init__(self, guard: Guard, table: dict[str, Role]) -> None:
        self.guard = guard
        self.table = table
        self._by_certificate: dict[str, object] = {}    # method -> wrapped handler (mTLS)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        guard = self.guard
        if handler is None:
            return handler
        need = self.table.get(handler_call_details.method.rsplit("/", 1)[-1], Role.ADMIN)
        if not guard.enabled:
            return handler if roles.permits(OPEN_IDENTITY.role, need) else \
                _refusal_handler(handler, guard, need, None)
        token = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == TOKEN_METADATA_KEY:
                token = _token_of(value)
        if not guard.mutual_tls and token is not None:
            try:
                identity = guard.verifier.verify(token)
                if roles.permits(identity.role, need):
                    return handler              # the common case: no wrapper, no cost
            except UnauthorizedError:
                pass
        if guard.mutual_tls:
            wrapped = self._by_certificate.get(handler_call_details.method)
            if wrapped is None:
                wrapped = self._by_certificate[handler_call_details.method] = \
                    _refusal_handler(handler, guard, need, None)
            return wrapped
        return _refusal_handler(handler, guard, need, token)
