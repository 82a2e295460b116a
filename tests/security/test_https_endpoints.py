"""Issue 48: the standalone autorecovery endpoint and the dashboard authenticate their peers
and speak HTTPS when given a certificate; beyond loopback they need both (or the explicit
--allow-insecure-network). The dashboard's pages need its token once one is set: a browser
opens it once with ``?token=`` and gets a viewer cookie that opens pages, never actions.
Before, both spoke plain HTTP, and the dashboard's pages were open to whoever reached it.
"""
from __future__ import annotations

import json
import logging
import socket
import ssl
import time
import urllib.error
import urllib.request

import pytest

from bkspark.auth.credentials import Credentials
from bkspark.cli.dashboard_cmd import start as start_dashboard
from bkspark.cli.dashboard_cmd import stop_dashboard
from bkspark.dashboard.collector import Collector
from bkspark.errors import BadRequestError
from bkspark.localcluster import LocalCluster
from bkspark.recovery.service import AutoRecovery, AutoRecoveryConfig
from bkspark.recovery.urm import UnderReplicationManager

TOKEN = "dashboard-test-token"
NOT_LOOPBACK = "10.255.255.1"       # refused before anything binds


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(None, 1, str(tmp_path_factory.mktemp("https-cluster"))) as c:
        yield c


@pytest.fixture(scope="module")
def server_cert(cluster):
    """(key, cert) for 127.0.0.1 signed by the cluster's CA, and the CA's file."""
    ca = cluster.auth.ca
    key, cert = ca.issue("https-endpoints-test", hosts=["127.0.0.1"])
    return key, cert, ca.cert_file


def _trusting(ca_file: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file)


def test_a_standalone_autorecovery_serves_https_and_the_dashboard_scrapes_it(cluster,
                                                                            server_cert):
    key, cert, ca = server_cert
    config = AutoRecoveryConfig(run_auditor=False, run_worker=False, retention_interval=0,
                                http_port=0, http_tls_cert_file=cert, http_tls_key_file=key)
    with AutoRecovery(cluster.metadata_uri, config, "https-ar") as ar:
        port = ar.http.port
        admin = Credentials.from_config(_config(cluster, "admin", ca))
        status, body = admin.http_json(admin.url("127.0.0.1", port, "/api/v1/autorecovery/status"))
        assert status == 200 and body == {"enabled": True}, body
        # a peer without the token is refused, over HTTPS too
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"https://127.0.0.1:{port}/api/v1/autorecovery/status",
                                   timeout=10, context=_trusting(ca))
        assert refused.value.code == 401
        # nothing is served in clear
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/heartbeat", timeout=10).read()
        published = UnderReplicationManager(ar.store).endpoints()["https-ar"]
        assert published["scheme"] == "https" and published["http_port"] == port
        with _admin_bk(cluster, ca) as bk:
            collector = Collector(bk.store, bk, interval=0.5, slow_interval=0.5)
            (doc,) = [d for d in collector._sample_autorecovery({"https-ar": published})]
            assert doc["up"] is True, doc


def _config(cluster, role: str, ca: str):
    from bkspark.client_settings import client_config_from
    return client_config_from({**cluster.client_settings(role), "tls_ca_file": ca})


def _admin_bk(cluster, ca):
    from bkspark.client import BookKeeper
    return BookKeeper(cluster.metadata_uri, role="admin", tls_ca_file=ca)


@pytest.mark.parametrize("settings, names", [
    (dict(), "--http-token-public-key-file"),
    (dict(http_token_public_key_file="PUB"), "--http-tls-cert-file"),
])
def test_autorecovery_beyond_loopback_needs_authentication_and_tls(cluster, settings, names):
    settings = {k: (cluster.auth.public_key_file if v == "PUB" else v)
                for k, v in settings.items()}
    config = AutoRecoveryConfig(run_auditor=False, run_worker=False, retention_interval=0,
                                http_port=0, http_host=NOT_LOOPBACK, **settings)
    with pytest.raises(BadRequestError, match=names):
        AutoRecovery(cluster.metadata_uri, config, "refused").start()


def test_half_a_certificate_is_a_clear_error(cluster, server_cert):
    key, cert, _ = server_cert
    config = AutoRecoveryConfig(run_auditor=False, run_worker=False, retention_interval=0,
                                http_port=0, http_tls_cert_file=cert)
    with pytest.raises(BadRequestError, match="both --http-tls-cert-file and"):
        AutoRecovery(cluster.metadata_uri, config, "half").start()
    with pytest.raises(BadRequestError, match="both --https-cert-file and --https-key-file"):
        start_dashboard(cluster.metadata_uri, port=0, https_key_file=key)


def test_the_dashboard_over_https_lets_in_only_holders_of_its_token(cluster, server_cert,
                                                                    caplog):
    caplog.set_level(logging.DEBUG, logger="bkspark.http")
    key, cert, ca = server_cert
    dash = start_dashboard(cluster.metadata_uri, port=0, token=TOKEN, https_cert_file=cert,
                           https_key_file=key)
    try:
        assert dash.url.startswith("https://127.0.0.1:")
        context = _trusting(ca)
        no_redirect = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=context), _NoRedirect())

        def get(path, headers=None):
            return no_redirect.open(urllib.request.Request(dash.url + path,
                                                           headers=headers or {}), timeout=10)

        for path in ("", "api/overview", "api/series?since=0", "?token=guess"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                get(path)
            assert refused.value.code == 401, path
        with pytest.raises(urllib.error.HTTPError) as refused:      # the header, not the token
            get("api/overview", {"Authorization": TOKEN})
        assert refused.value.code == 401
        # the login's redirect stays on this site ("/\\host" is another site to a browser)
        with pytest.raises(urllib.error.HTTPError) as login:
            get(f"%5Cevil.example?token={TOKEN}".replace("%5C", "\\"))
        assert login.value.code == 303 and login.value.headers["Location"] == "/evil.example"
        with pytest.raises(urllib.error.HTTPError) as login:
            get(f"api/overview?token={TOKEN}")
        assert login.value.code == 303 and login.value.headers["Location"] == "/api/overview"
        cookie = login.value.headers["Set-Cookie"]
        for attribute in ("HttpOnly", "SameSite=Strict", "Secure", "Path=/"):
            assert attribute in cookie
        session = cookie.split(";", 1)[0]
        assert TOKEN not in session                     # an HMAC of it, not the token
        with get("api/overview", {"Cookie": session}) as r:
            assert r.status == 200 and json.loads(r.read())["actions"] is True
        with get("api/overview", {"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 200
        # the cookie opens pages, never an action
        action = urllib.request.Request(dash.url + "api/actions/audit", data=b"{}",
                                        method="POST", headers={"Cookie": session})
        with pytest.raises(urllib.error.HTTPError) as refused:
            no_redirect.open(action, timeout=10)
        assert refused.value.code == 403
        assert "token=<hidden>" in caplog.text and TOKEN not in caplog.text    # debug log
    finally:
        stop_dashboard(dash)


def test_stalled_tls_handshakes_hold_the_dashboard_only_briefly(cluster, server_cert,
                                                                monkeypatch):
    """Bare TCP connections that never start their handshake: one address holds at most
    MAX_PER_PEER threads, each for HANDSHAKE_TIMEOUT_S; then a real client is served."""
    from bkspark import httpd
    monkeypatch.setattr(httpd, "HANDSHAKE_TIMEOUT_S", 1.0)
    key, cert, ca = server_cert
    dash = start_dashboard(cluster.metadata_uri, port=0, https_cert_file=cert,
                           https_key_file=key)
    stalled = [socket.create_connection(("127.0.0.1", dash.port)) for _ in range(40)]
    try:
        time.sleep(0.3)
        assert dash._httpd._held <= httpd.MAX_PER_PEER
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(dash.url + "api/overview", timeout=5,
                                            context=_trusting(ca)) as r:
                    assert r.status == 200
                    break
            except (urllib.error.URLError, ConnectionError, ssl.SSLError):
                assert time.monotonic() < deadline, "stalled handshakes held the dashboard"
                time.sleep(0.2)
    finally:
        for s in stalled:
            s.close()
        stop_dashboard(dash)


def test_an_unreadable_certificate_is_a_clear_error(tmp_path):
    from bkspark.auth.certs import server_tls_context
    with pytest.raises(BadRequestError, match="cannot load the certificate"):
        server_tls_context(str(tmp_path / "missing.pem"), str(tmp_path / "missing.key"))


@pytest.mark.parametrize("kwargs, names", [
    (dict(), "--token-file"),
    (dict(token=TOKEN), "--https-cert-file and --https-key-file"),
])
def test_the_dashboard_beyond_loopback_needs_a_token_and_https(cluster, kwargs, names):
    with pytest.raises(BadRequestError, match=names):
        start_dashboard(cluster.metadata_uri, host=NOT_LOOPBACK, port=0, **kwargs)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
