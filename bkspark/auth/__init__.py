"""Who may talk to bkspark's servers, and as what (issue 48).

Every surface a bookie listens on -- gRPC, the data port, the HTTP admin endpoint (with the
autorecovery routes it hosts) -- and the standalone autorecovery endpoint authenticate their
peer and check its role before serving a request:

* a **token** (:mod:`bkspark.auth.tokens`): an Ed25519-signed JWT with a subject, a role and an
  expiry; servers hold the public key only, so no server can mint one. Sent in gRPC metadata
  and the HTTP ``Authorization: Bearer`` header, and in the data port's hello;
* or a **client certificate** (mutual TLS, :mod:`bkspark.auth.certs`) signed by the CA the
  server is configured with; the role is the certificate's first OU, as BookKeeper's
  ``BookieAuthZFactory``.

:mod:`bkspark.auth.roles` is the one table of what each role may call; :mod:`bkspark.auth.guard`
applies it on the server side, :mod:`bkspark.auth.credentials` presents a client's identity.
An unauthenticated or under-privileged request gets EUA (gRPC ``UNAUTHENTICATED`` /
``PERMISSION_DENIED``, HTTP 401 / 403, a refused data-port hello) and is logged once per peer
address, not per request.

Imports: :mod:`bkspark.errors`, :mod:`bkspark.private`, ``cryptography``, ``pyjwt``, ``grpc``.
"""
