"""Issue 48: the pure rules of ``bkspark.auth`` -- the role table covers every RPC and is the
one docs/security.md prints, tokens are verified strictly, and a daemon may listen without
authentication on loopback only."""
from __future__ import annotations

import pathlib
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from bkspark.auth import roles, tokens
from bkspark.auth.guard import check_listen, is_loopback
from bkspark.auth.roles import Role
from bkspark.errors import BadRequestError, UnauthorizedError
from bkspark.proto import bookie_pb2 as pb

README = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()


def test_every_rpc_has_a_role_and_the_readme_names_it():
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["Bookie"].methods}
    assert methods == set(roles.GRPC_METHODS), methods ^ set(roles.GRPC_METHODS)
    table = README[README.index("**Roles**"):README.index("**Secure by default")]
    for method, role in roles.GRPC_METHODS.items():
        row = next(line for line in table.splitlines() if f"`{method}`" in line)
        assert row.startswith(f"| `{role.label}`"), (method, row)


def test_http_routes_and_unlisted_ones():
    assert roles.http_role("GET", "/heartbeat") is None
    assert roles.http_role("GET", "/metrics") is Role.CLIENT
    assert roles.http_role("PUT", "/api/v1/bookie/state/readonly") is Role.ADMIN
    assert roles.http_role("GET", "/api/v1/autorecovery/status") is Role.CLIENT
    assert roles.http_role("PUT", "/api/v1/autorecovery/status") is Role.ADMIN
    assert roles.http_role("GET", "/api/v1/autorecovery") is Role.CLIENT
    for method, path in [("GET", "/api/v1/newroute"), ("DELETE", "/heartbeat"),
                         ("HEAD", "/metrics"), ("GET", "/heartbeatx")]:
        assert roles.http_role(method, path) is Role.ADMIN, (method, path)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_may_listen_open(host):
    assert is_loopback(host)
    check_listen("x", host, authenticated=False, tls=False, allow_insecure_network=False)


def test_localhost_counts_as_loopback_only_if_it_resolves_to_loopback(monkeypatch):
    """A hosts file may point localhost elsewhere: then it is a network address."""
    import socket
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **kw: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", 0))]
        if host == "localhost" else real(host, *a, **kw))
    assert not is_loopback("localhost")
    with pytest.raises(BadRequestError, match="--allow-insecure-network"):
        check_listen("x", "localhost", authenticated=False, tls=False,
                     allow_insecure_network=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "bookie1.example",
                                  "::ffff:10.0.0.5"])
def test_beyond_loopback_needs_authentication_and_tls(host):
    with pytest.raises(BadRequestError, match="--allow-insecure-network"):
        check_listen("x", host, authenticated=False, tls=False, allow_insecure_network=False)
    with pytest.raises(BadRequestError, match="in clear text"):
        check_listen("x", host, authenticated=True, tls=False, allow_insecure_network=False)
    check_listen("x", host, authenticated=True, tls=True, allow_insecure_network=False)
    check_listen("x", host, authenticated=False, tls=False, allow_insecure_network=True)


@pytest.fixture(scope="module")
def keys():
    key = tokens.new_signing_key()
    return key, tokens.TokenVerifier(tokens.public_key_of(key))


def _forge(key_pem: bytes, **claims) -> str:
    base = {"iss": "bkspark", "sub": "x", "role": "admin", "exp": int(time.time()) + 600}
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None},
                      serialization.load_pem_private_key(key_pem, None), algorithm="EdDSA")


def test_a_good_token_is_its_subject_and_role(keys):
    key, verifier = keys
    identity = verifier.verify(tokens.mint(key, "etl", "client", 60))
    assert (identity.subject, identity.role) == ("etl", Role.CLIENT)
    assert time.time() + 60 <= identity.expires <= time.time() + 61 + tokens.LEEWAY_S


@pytest.mark.parametrize("claims, why", [
    ({"exp": int(time.time()) - 3600}, "expired"),
    ({"exp": None}, "exp"),
    ({"role": None}, "role"),
    ({"role": "root"}, "role"),
    ({"iss": "someone-else"}, "issuer"),
])
def test_bad_claims_are_refused(keys, claims, why):
    key, verifier = keys
    with pytest.raises(UnauthorizedError, match=why):
        verifier.verify(_forge(key, **claims))


def test_unsigned_and_hmac_tokens_are_refused(keys):
    key, verifier = keys
    claims = {"iss": "bkspark", "sub": "x", "role": "admin", "exp": int(time.time()) + 600}
    unsigned = jwt.encode(claims, None, algorithm="none")
    public = tokens.public_key_of(key)
    with pytest.raises(UnauthorizedError):
        verifier.verify(unsigned)
    with pytest.raises(UnauthorizedError):          # the public key used as an HMAC secret
        import base64
        import hashlib
        import hmac
        import json
        head = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        body = base64.urlsafe_b64encode(json.dumps(claims).encode())
        signing = head.rstrip(b"=") + b"." + body.rstrip(b"=")
        mac = hmac.new(public, signing, hashlib.sha256).digest()
        verifier.verify((signing + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode())


def test_a_remembered_token_still_expires(keys, monkeypatch):
    key, verifier = keys
    token = tokens.mint(key, "short", "client", 1)
    assert verifier.verify(token).subject == "short"
    later = time.time() + 1 + tokens.LEEWAY_S + 1
    monkeypatch.setattr(tokens.time, "time", lambda: later)
    with pytest.raises(UnauthorizedError, match="expired"):
        verifier.verify(token)


def test_the_verification_cache_is_bounded(keys):
    key, _ = keys
    verifier = tokens.TokenVerifier(tokens.public_key_of(key))
    for i in range(tokens.CACHE_ENTRIES + 50):
        verifier.verify(tokens.mint(key, f"s{i}", "client", 60))
    assert len(verifier._cache) == tokens.CACHE_ENTRIES


def test_a_data_port_connection_ends_with_its_token(keys, monkeypatch):
    """Admitted once at its hello, a connection must not outlive its credentials: a frame
    after the token's expiry closes it unanswered (the client reconnects, and its new hello
    is judged afresh). In-process data port over a recording service."""
    import socket
    import types

    from bkspark.auth.guard import Guard
    from bkspark.bookie.data_port import DataPortServer
    from bkspark.proto import wire
    key, _ = keys
    monkeypatch.setattr(tokens, "LEEWAY_S", 0)
    stored = []
    service = types.SimpleNamespace(_stopping=False,
                                    process_add_batch=lambda p: stored.append(p) or b"ack")
    guard = Guard(tokens.TokenVerifier(tokens.public_key_of(key)))
    server = DataPortServer(service, "127.0.0.1", 0, max_frame_bytes=1 << 20,
                            guard=guard).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(wire.hello(tokens.mint(key, "brief", "client", 2)))
            rfile = sock.makefile("rb")
            assert rfile.read(4) == wire.DATA_MAGIC
            sock.sendall(wire.frame(wire.KIND_ADD_BATCH, [b"first"]))
            assert wire.read_frame(rfile, 1 << 20) == (wire.KIND_ADD_RESPONSES, b"ack")
            time.sleep(3.1)
            sock.sendall(wire.frame(wire.KIND_ADD_BATCH, [b"after expiry"]))
            assert rfile.read() == b""      # closed, unanswered
        assert stored == [b"first"]
    finally:
        server.stop()
