"""The dashboard in a real browser (Debian's chromium, headless, driven by Playwright) against
a real local cluster: the page loads, its plots receive points, a killed bookie turns red, an
under-replicated ledger appears and goes once autorecovery repaired it; actions need the token.

The overview's screenshot in docs/ is taken here (``docs/dashboard.png``).
"""
from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request

import pytest

from bkspark.cli.dashboard_cmd import start as start_dashboard
from bkspark.cli.dashboard_cmd import stop_dashboard
from bkspark.client import BookKeeper
from bkspark.localcluster import LocalCluster
from bkspark.log import LogStore
from metadata.testing import skip_or_fail

CHROMIUM = "/usr/bin/chromium"
SCREENSHOT = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "dashboard.png")
TOKEN = "test-token"


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("playwright is not installed (make install installs it: pip '.[test]')")
    if not shutil.which(CHROMIUM):
        skip_or_fail(f"{CHROMIUM} is missing: apt-get install -y chromium (make install does)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # 4 bookies: a ledger of 3 keeps a bookie to be re-replicated to once one of them dies
    with LocalCluster(None, 4, str(tmp_path_factory.mktemp("dash-cluster"))) as c:
        yield c


@pytest.fixture(scope="module")
def dashboard(cluster):
    dash = start_dashboard(cluster.metadata_uri, port=0, token=TOKEN, interval=0.5,
                           slow_interval=0.5)
    yield dash
    stop_dashboard(dash)


def _get(dashboard, path: str):
    """GET ``path`` of the dashboard with its token (every route needs it once one is set)."""
    return urllib.request.urlopen(urllib.request.Request(
        dashboard.url + path, headers={"Authorization": f"Bearer {TOKEN}"}), timeout=10)


def _wait(page, expression: str, timeout_s: float = 30.0):
    page.wait_for_function(expression, timeout=timeout_s * 1000)


def test_the_overview_loads_and_its_plots_receive_points(browser, cluster, dashboard):
    bk = BookKeeper(cluster.metadata_uri)
    try:
        logs = LogStore(bk)
        with logs.open_writer("dash-log") as w:
            for i in range(200):
                w.append(b"x%d" % i)
        logs.commit_cursor("dash-log", "reader-1", logs.resolve("dash-log", "earliest"))
        page = browser.new_page(viewport={"width": 1400, "height": 1500})
        page.goto(dashboard.url + f"?token={TOKEN}")      # the viewer cookie
        _wait(page, "document.querySelectorAll('#bookies tbody tr[data-state=writable]').length == 4")
        lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        for i in range(300):                # adds the plots must show
            lh.append(b"y" * 100)
            if i % 50 == 0:
                time.sleep(0.3)
        lh.close()
        # a trace per bookie (or cursor): a bookie outside both ledgers' ensembles (3 of 4)
        # took no adds after the log's and has no add latency to plot: some trace must grow
        for plot in ("adds_per_s", "add_p99_ms", "disk_usage", "lag"):
            try:
                _wait(page, f"() => {{ const d = document.getElementById('plot-{plot}').data; "
                            "return d.some(t => t.x.length > 1); }")
            except Exception as exc:        # name the plot and what the page and server hold
                traces = page.evaluate(f"(document.getElementById('plot-{plot}').data || [])"
                                       ".map(t => [t.name, t.x.length])")
                with _get(dashboard, "api/series?since=0") as resp:
                    series = {k: len(v) for k, v in json.loads(resp.read()).items()
                              if isinstance(v, list)}
                raise AssertionError(f"plot {plot}: traces {traces}; server series {series}") \
                    from exc
        _wait(page, "document.querySelector('#logs tbody').textContent.includes('dash-log')")
        _wait(page, "document.getElementById('ledger-states').textContent.includes('CLOSED')")
        adds = page.evaluate("Math.max(...document.getElementById('plot-adds_per_s').data"
                             ".flatMap(t => t.y))")
        assert adds > 0
        os.makedirs(os.path.dirname(SCREENSHOT), exist_ok=True)
        page.screenshot(path=SCREENSHOT, full_page=True)
        # a log's detail page lists its ledger, linked to the ledger's page (its fragments)
        page.click("#logs a")
        page.wait_for_selector("text=newest 1 segments")
        page.click("table >> nth=2 >> a")
        page.wait_for_selector("text=fragments")
        assert "127.0.0.1:" in page.content()
        page.close()
    finally:
        bk.close()


def test_the_logs_table_ranks_every_log_and_searches_them_by_name(browser, cluster, dashboard):
    """More logs than the table shows: the totals count them all; the order selector puts the
    largest, the most lagging and the busiest first; a search finds a log beyond the first 100
    by name; an open ledger counts up to its LAC (read from its bookies)."""
    from bkspark.log.position import Position
    bk = BookKeeper(cluster.metadata_uri)
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    writer = None
    try:
        logs = LogStore(bk)
        for i in range(120):                            # empty logs, first by name
            logs.create(f"aaa-filler-{i:03d}")
        for name, n, size in (("rank-small", 5, 10), ("rank-big", 120, 400), ("rank-lag", 250, 10),
                              ("zz-needle", 3, 10)):
            with logs.open_writer(name) as w:
                for i in range(n):
                    w.append(b"r" * size)
        logs.commit_cursor("rank-lag", "slow-reader", logs.resolve("rank-lag", "earliest"))
        writer = logs.open_writer("rank-open")          # stays open: its LAC counts
        for i in range(30):
            writer.append(b"o%d" % i)
        writer.flush()
        page.goto(dashboard.url + f"?token={TOKEN}")    # the viewer cookie
        total = len(logs.list_logs())
        _wait(page, f"document.getElementById('log-totals').textContent.startsWith('{total} logs')")
        first = "document.querySelector('#logs tbody tr').dataset.log"
        rows = "document.querySelectorAll('#logs tbody tr').length"
        assert page.evaluate(rows) == 100
        assert "the first 100 shown" in page.text_content("#log-matched")
        page.select_option("#log-sort", "largest")
        _wait(page, f"{first} == 'rank-big'")
        page.select_option("#log-sort", "lagging")
        _wait(page, f"{first} == 'rank-lag'")
        assert "slow-reader=250" in page.text_content('#logs tr[data-log="rank-lag"]')
        page.select_option("#log-sort", "name")
        _wait(page, f"{first} == 'aaa-filler-000'")
        assert page.query_selector('#logs tr[data-log="zz-needle"]') is None
        page.fill("#log-search", "NEEDL")
        _wait(page, f"{rows} == 1 && {first} == 'zz-needle'")
        assert page.text_content("#log-matched") == "1 matching"
        page.fill("#log-search", "rank-open")
        _wait(page, f"{rows} == 1 && {first} == 'rank-open'")
        cells = "document.querySelectorAll('#logs tbody tr td')"
        _wait(page, f"{cells}[2].textContent == '30'")     # entries: up to the LAC
        assert page.evaluate(f"{cells}[5].querySelector('a') !== null")  # its open ledger's age
        # busiest: rank-open grows between two passes of the census, by more than any other
        # log ever held (a log a pass saw half written keeps a rate for a minute or two)
        page.fill("#log-search", "rank-")
        page.select_option("#log-sort", "busiest")
        for i in range(1000):
            writer.append(b"p%d" % i)
        writer.flush()
        _wait(page, f"{first} == 'rank-open' && {cells}[4].textContent != ''")
    finally:
        if writer is not None:
            writer.close()
        page.close()
        bk.close()


def test_a_ledger_shows_how_its_keys_derive_but_no_key(cluster, dashboard):
    """Anyone who can load the dashboard sees a ledger's metadata: not its master key nor
    its salt (and the metadata holds no password)."""
    import base64
    with BookKeeper(cluster.metadata_uri) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"pw")
        lh.close()
        stored = bk.ledger_metadata(lh.ledger_id).keys
    with _get(dashboard, f"api/ledger/{lh.ledger_id}") as r:
        body = r.read()
    assert json.loads(body)["keys"] == {"scheme": "pbkdf2-sha256-ledger", "iterations": 10_000}
    for secret in (stored.master_key, stored.salt):
        assert base64.b64encode(secret) not in body


def test_actions_need_the_token(cluster, dashboard):
    target = cluster.bookie_ids[0]
    body = json.dumps({"bookie": target, "readOnly": True}).encode()
    request = urllib.request.Request(dashboard.url + "api/actions/readonly", data=body,
                                     method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    for value in (True, False):
        request = urllib.request.Request(
            dashboard.url + "api/actions/readonly", method="POST",
            data=json.dumps({"bookie": target, "readOnly": value}).encode(),
            headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert json.loads(resp.read())["readOnly"] is value


def test_an_abandoned_spark_job_shows_and_is_reclaimed_with_the_token(cluster, dashboard):
    from bkspark.errors import NoSuchLedgerError
    from bkspark.spark import pending
    bk = BookKeeper(cluster.metadata_uri)
    try:
        logs = LogStore(bk)
        key = "dash-job-1"
        alive = pending.begin_task(logs.store, key, "dash-out")
        time.sleep(2)       # a collector snapshot (every 0.5 s) sees the job before its ledger
        lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        pending.register(logs.store, key, lh.ledger_id, {"partition": 0, "attempt": 0})
        lh.append(b"row")
        lh.close()
        pending.end_task(logs.store, key, alive, [lh.ledger_id])      # the driver never commits

        def overview():
            with _get(dashboard, "api/overview") as resp:
                return json.loads(resp.read())
        # the collector snapshots every slow_interval: a snapshot taken between begin_task and
        # register shows the job with no ledger yet (true then), so wait for the ended task's
        deadline = time.monotonic() + 30
        while True:
            jobs = [j for j in overview()["pending_jobs"] if j["job"] == key]
            if jobs and jobs[0]["ledgers"]:
                break
            assert time.monotonic() < deadline, f"the abandoned job never showed whole: {jobs}"
            time.sleep(0.2)
        (job,) = jobs
        assert job["ledgers"] == [lh.ledger_id] and job["log"] == "dash-out"
        request = urllib.request.Request(
            dashboard.url + "api/actions/reclaim-pending", method="POST",
            data=json.dumps({"grace": 0}).encode(), headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            (done,) = [j for j in json.loads(resp.read())["jobs"] if j["job"] == key]
        assert done["verdict"] == "reclaimed" and done["deleted"] == [lh.ledger_id]
        with pytest.raises(NoSuchLedgerError):
            bk.ledger_metadata(lh.ledger_id)
    finally:
        bk.close()


def test_a_killed_bookie_turns_red_and_its_ledger_shows_under_replicated_until_repaired(
        browser, cluster, dashboard):
    from bkspark.recovery.service import AutoRecovery, AutoRecoveryConfig
    bk = BookKeeper(cluster.metadata_uri)
    page = browser.new_page()
    try:
        lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        for _ in range(20):
            lh.append(b"z" * 50)
        lh.close()
        page.goto(dashboard.url + f"?token={TOKEN}")      # the viewer cookie
        victim = bk.ledger_metadata(lh.ledger_id).ensembles[0][1][0]
        row = f"document.getElementById('bookie-{victim}')"
        _wait(page, f"{row} && {row}.dataset.state == 'writable'")
        cluster.kill(cluster.bookie_ids.index(victim))
        _wait(page, f"{row}.dataset.state == 'down'", timeout_s=15)
        color = page.evaluate(f"getComputedStyle({row}.querySelector('.state')).backgroundColor")
        assert color == "rgb(198, 40, 40)"          # red
        base = dict(lost_bookie_recovery_delay=0.0, audit_interval=1.0, session_timeout=10.0,
                    retention_interval=0.0)
        ledger_row = f"document.querySelector('#under-replicated tr[data-ledger=\"{lh.ledger_id}\"]')"
        with AutoRecovery(cluster.metadata_uri, AutoRecoveryConfig(run_worker=False, **base),
                          "dash-auditor"):
            _wait(page, f"{ledger_row} !== null", timeout_s=60)
            assert victim in page.evaluate(f"{ledger_row}.textContent")
            # the worker serves HTTP, so it publishes its endpoint: the page lists it
            with AutoRecovery(cluster.metadata_uri, AutoRecoveryConfig(
                    run_auditor=False, http_port=0, http_host="127.0.0.1", **base),
                    "dash-worker"):
                _wait(page, f"{ledger_row} === null", timeout_s=90)
                _wait(page, "document.querySelector('#autorecovery tr[data-id=\"dash-worker\"]"
                            "[data-state=up]') !== null")
        assert page.evaluate("document.getElementById('auditor').textContent") != ""
    finally:
        page.close()
        bk.close()
