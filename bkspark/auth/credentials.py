"""The client side: what a client presents to servers, and the roots it verifies them with.

:class:`Credentials` is built from a client's settings (``auth_token`` / ``auth_token_file``,
``tls_cert_file`` + ``tls_key_file``, ``tls_ca_file``:
:class:`~bkspark.client_settings.ClientConfig`) and gives each transport what it needs: a gRPC channel (TLS when there are roots; the token in
every call's metadata), the data port's ``ssl`` context and hello token, HTTP headers.
A token is never part of a message, a ``repr`` or a log line.
"""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import grpc

from bkspark.auth.guard import TOKEN_METADATA_KEY, bearer
from bkspark.auth.tokens import read_token_file
from bkspark.errors import BadRequestError


class Credentials:
    """A client's identity (a token and/or a certificate) and the CA roots of its servers."""

    def __init__(self, *, token: str = "", ca_file: str = "", cert_file: str = "",
                 key_file: str = "") -> None:
        if bool(cert_file) != bool(key_file):
            raise BadRequestError("tls_cert_file and tls_key_file go together (the client "
                                  "certificate and its key)")
        if cert_file and not ca_file:
            raise BadRequestError("a client certificate (tls_cert_file) needs tls_ca_file: the "
                                  "CA that signed the bookies' certificates")
        self._token = token
        self.ca_file = ca_file
        self.cert_file = cert_file
        self.ssl_context: ssl.SSLContext | None = None
        self.channel_credentials = None
        if ca_file:
            try:
                with open(ca_file, "rb") as f:
                    roots = f.read()
                ctx = ssl.create_default_context(cafile=ca_file)
                chain = key = None
                if cert_file:
                    ctx.load_cert_chain(cert_file, key_file)
                    with open(cert_file, "rb") as f:
                        chain = f.read()
                    with open(key_file, "rb") as f:
                        key = f.read()
            except (OSError, ssl.SSLError) as exc:
                raise BadRequestError(f"cannot read the client's TLS files ({ca_file}"
                                      f"{', ' + cert_file if cert_file else ''}): {exc}") from None
            self.ssl_context = ctx
            self.channel_credentials = grpc.ssl_channel_credentials(
                root_certificates=roots, private_key=key, certificate_chain=chain)

    @classmethod
    def from_config(cls, conf) -> "Credentials":
        """From a ClientConfig's ``auth_token``, ``auth_token_file``, ``tls_*`` fields."""
        if conf.auth_token and conf.auth_token_file:
            raise BadRequestError("give auth_token or auth_token_file, not both")
        token = conf.auth_token or (read_token_file(conf.auth_token_file)
                                    if conf.auth_token_file else "")
        return cls(token=token, ca_file=conf.tls_ca_file, cert_file=conf.tls_cert_file,
                   key_file=conf.tls_key_file)

    def __repr__(self) -> str:
        return (f"Credentials(token={'yes' if self._token else 'no'}, ca_file={self.ca_file!r}, "
                f"cert_file={self.cert_file!r})")

    @property
    def tls(self) -> bool:
        return self.ssl_context is not None

    @property
    def token(self) -> str:
        """The bearer token ("" when none); for the transports, not for printing."""
        return self._token

    # ---- transports --------------------------------------------------------------------

    def channel(self, address: str, options=()) -> grpc.Channel:
        """A gRPC channel to ``address``: TLS when there are roots, the token (if any) sent
        with every call."""
        channel = (grpc.secure_channel(address, self.channel_credentials, options=options)
                   if self.tls else grpc.insecure_channel(address, options=options))
        if self._token:
            channel = grpc.intercept_channel(channel, _TokenInterceptor(self._token))
        return channel

    def http_headers(self) -> dict[str, str]:
        return {"Authorization": bearer(self._token)} if self._token else {}

    def url(self, host: str, port: int, path: str, tls: bool | None = None) -> str:
        """The URL of ``path`` on a bkspark HTTP endpoint: HTTPS when the endpoint serves TLS
        (``tls``; None: when this client talks TLS)."""
        scheme = "https" if (self.tls if tls is None else tls) else "http"
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{port}{path}"

    def http_request(self, url: str, method: str = "GET", body: dict | None = None,
                     timeout: float = 10.0) -> tuple[int, bytes, str]:
        """``(status, body, content type)`` of one request to a bkspark HTTP endpoint, with
        this client's token (and certificate, over HTTPS); an HTTP error status is returned,
        not raised (OSError when the endpoint cannot be reached)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self.http_headers(), **({"Content-Type": "application/json"}
                                              if data is not None else {})}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        context = self.ssl_context if url.startswith("https:") else None
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
                return resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), exc.headers.get("Content-Type", "")

    def http_json(self, url: str, method: str = "GET", body: dict | None = None,
                  timeout: float = 10.0):
        """``(status, parsed JSON or text)``: :meth:`http_request`'s answer parsed."""
        status, raw, _ = self.http_request(url, method, body, timeout)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call's metadata."""

    def __init__(self, token: str) -> None:
        self._entry = (TOKEN_METADATA_KEY, bearer(token))

    def _details(self, details):
        metadata = list(details.metadata or ())
        metadata.append(self._entry)
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression
