"""The dashboard's census of every log and ledger (:class:`bkspark.dashboard.collector.Census`)
against a real SQLite metadata store: its totals equal the true counts after a full pass, its
rows equal what :class:`LogStore` says of each log, its rankings and search, its bounds, and
what it does when a log changes under it. No bookie: the ledgers are closed ones written to the
metadata directly (a client opens a closed ledger from its metadata alone)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from bkspark.dashboard import collector as col
from bkspark.log.position import Position

N_LOGS = 300
NEEDLE = "zz-needle-42"         # beyond the first 100 logs by name


def closed_ledger(store, entries: int, length: int) -> int:
    """A CLOSED ledger of ``entries`` entries and ``length`` bytes (metadata only; legacy
    keys: no key derivation to pay for each)."""
    from metadata import ledgers
    from metadata.ledger_keys import KeyRecord
    from metadata.ledger_metadata import LedgerMetadata
    md = LedgerMetadata.new(["a:1", "b:1", "c:1"], 2, 2).copy(keys=KeyRecord.legacy(b""))
    md = ledgers.create_ledger(store, md)
    ledgers.write_ledger(store, md.with_closed(entries - 1, length), 0)
    return md.ledger_id


@pytest.fixture
def store(tmp_path):
    from metadata import open_store
    with open_store(f"sqlite://{tmp_path}/meta.db", create=True) as s:
        yield s


@pytest.fixture
def logs(store):
    from bkspark.client import BookKeeper
    from bkspark.log import LogStore
    with BookKeeper(store=store) as bk:
        yield LogStore(bk)


def fill(logs, name: str, sizes: list[int]) -> list[int]:
    """Ledgers of ``sizes`` entries (10 bytes each) appended to log ``name``, one commit each
    (so the list has that many segments)."""
    ids = []
    for n in sizes:
        ids.append(closed_ledger(logs.store, n, 10 * n))
        logs.append_ledgers(name, [ids[-1]])
    return ids


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """300 logs (and the needle) of 1 to 7 ledgers: some lists longer than the tail a census
    reads, cursors in the middle of lists (read through the ledger index), one cursor on a
    ledger truncated away, one log truncated and one whose first segment is unlisted. Shared
    by the tests that only read: ``(LogStore, names)``."""
    from bkspark.client import BookKeeper
    from bkspark.log import LogStore
    from metadata import open_store
    with open_store(f"sqlite://{tmp_path_factory.mktemp('census')}/meta.db", create=True) as store, \
            BookKeeper(store=store) as bk:
        logs = LogStore(bk)
        names = []
        for i in range(N_LOGS):
            name = f"log-{i:04d}"
            ids = fill(logs, name, [1 + (i * 7 + k) % 23 for k in range(1 + i % 7)])
            if i % 10 == 3:
                logs.commit_cursor(name, "reader", Position(ids[len(ids) // 2], i % 3))
            if i % 30 == 5:
                logs.commit_cursor(name, "behind", Position(ids[0], 0))
            names.append(name)
        ids = fill(logs, NEEDLE, [5, 6, 7, 8, 9, 10, 11])
        logs.commit_cursor(NEEDLE, "gone", Position(ids[0], 2))
        logs.truncate(NEEDLE, Position(ids[2], 0), force=True)     # the cursor's ledger too
        logs.unlist_ledger("log-0006", logs.segments("log-0006")[0].ledger_id)
        yield logs, names + [NEEDLE]


def truth(logs, name: str) -> dict:
    """What LogStore says of a log (reading it the slow way)."""
    stats = logs.stats(name)
    lags = {c: lag for c, (_, lag) in logs.cursor_lags(name).items()}
    return {"entries": stats["entries"], "bytes": stats["bytes"],
            "segments": stats["segments"], "lag": max(lags.values()) if lags else None,
            "cursor_lags": lags}


def test_a_full_pass_counts_every_log_and_ledger_exactly(many, monkeypatch):
    from metadata import ledgers
    logs, many = many
    monkeypatch.setattr(col, "LOG_CHUNK", 64)          # several chunks of logs
    monkeypatch.setattr(col, "LEDGER_CHUNK", 100)
    census = col.Census(logs.store, logs.bk)
    steps = 1
    while not census.step():
        steps += 1
    assert steps >= len(many) // 64 + 2
    rows = {r["log"]: r for r in census.rows()}
    assert sorted(rows) == sorted(many)
    expected = {name: truth(logs, name) for name in many}
    for name, want in expected.items():
        got = {k: rows[name][k] for k in ("entries", "bytes", "segments", "lag")}
        got["cursor_lags"] = rows[name]["cursor_lags"]
        assert got == want, name
    assert rows[NEEDLE]["cursor_lags"] == {"gone": rows[NEEDLE]["entries"]}    # the whole log
    totals = census.totals
    assert totals["logs"] == totals["summarized"] == len(many)
    assert totals["entries"] == sum(w["entries"] for w in expected.values())
    assert totals["bytes"] == sum(w["bytes"] for w in expected.values())
    assert totals["segments"] == sum(w["segments"] for w in expected.values())
    assert totals["cursors"] == sum(len(w["cursor_lags"]) for w in expected.values())
    assert totals["entries_unknown"] == totals["bytes_unknown"] == totals["errors"] == 0
    all_ids = list(ledgers.list_ledgers(logs.store))
    assert census.ledger_states["ledgers"] == totals["ledgers"] == len(all_ids)
    assert census.ledger_states["counts"] == {"CLOSED": len(all_ids)}


def test_the_rankings_and_the_search(many):
    logs, many = many
    census = col.Census(logs.store, logs.bk)
    census.run_pass()
    rows = census.rows()
    largest = census.rank("largest", "", 100)["logs"]
    assert [r["log"] for r in largest] == [r["log"] for r in sorted(
        rows, key=lambda r: (-r["bytes"], -r["entries"], r["log"]))][:100]
    lagging = [r["log"] for r in census.rank("lagging", "", 100)["logs"]]
    with_lag = sorted((r for r in rows if r["lag"] is not None), key=lambda r: (-r["lag"], r["log"]))
    assert lagging[:len(with_lag)] == [r["log"] for r in with_lag]
    by_name = census.rank("name", "", 100)
    assert by_name["matched"] == len(many) and len(by_name["logs"]) == 100
    assert NEEDLE not in [r["log"] for r in by_name["logs"]]
    for query in ("needle", "NEEDLE-4", "zz-"):             # substring, any case, prefix
        found = census.rank("busiest", query, 10)
        assert found["matched"] == 1 and [r["log"] for r in found["logs"]] == [NEEDLE]
    assert census.rank("name", "log-02", 500)["matched"] == 100
    assert census.rank("name", "no such log", 10) == {
        "sort": "name", "query": "no such log", "matched": 0, "logs": []}
    # bounded: the query's length, the rows answered, the orders
    for bad in ({"sort": "biggest"}, {"query": "x" * (col.MAX_QUERY + 1)},
                {"limit": 0}, {"limit": col.MAX_SHOWN + 1}):
        with pytest.raises(ValueError):
            census.rank(**{"sort": "name", "query": "", "limit": 10, **bad})


def test_the_busiest_are_those_that_grew_since_the_previous_pass(logs):
    for i in range(20):
        fill(logs, f"b-{i:02d}", [3, 4])
    census = col.Census(logs.store, logs.bk)
    census.run_pass()
    assert all(r["rate"] is None for r in census.rows())          # one pass: no rate yet
    assert census.totals["entries_per_s"] is None
    for name, n in (("b-07", 50), ("b-13", 20), ("b-02", 5)):
        fill(logs, name, [n])
    census.run_pass()
    busiest = census.rank("busiest", "", 4)["logs"]
    assert [(r["log"], r["added"]) for r in busiest] == [
        ("b-07", 50), ("b-13", 20), ("b-02", 5), ("b-00", 0)]
    assert busiest[0]["rate"] > busiest[1]["rate"] > busiest[2]["rate"] > 0
    assert census.totals["entries_per_s"] == pytest.approx(sum(r["rate"] for r in census.rows()))


def test_a_burst_keeps_its_log_among_the_busiest_for_the_rate_window(logs, monkeypatch):
    """A log written once ranks first in every pass of the next minute, not only in the one
    pass that saw the burst (a page polling every 2 s would miss a rank that lasts one pass);
    once the window has passed twice, its rate is 0 again."""
    for i in range(5):
        fill(logs, f"w-{i}", [3])
    census = col.Census(logs.store, logs.bk)
    census.run_pass()
    fill(logs, "w-3", [40])
    for _ in range(4):                                  # passes well within a minute
        census.run_pass()
        top = census.rank("busiest", "", 2)["logs"]
        assert top[0]["log"] == "w-3" and top[0]["added"] == 40 and top[0]["rate"] > 0, top
        assert top[1]["added"] == 0
    monkeypatch.setattr(col, "RATE_WINDOW_S", 0.0)      # every pass is a window: the burst ages out
    census.run_pass()
    assert {r["log"]: r["added"] for r in census.rows()}["w-3"] == 40   # from the oldest mark
    census.run_pass()
    assert all(r["added"] == 0 for r in census.rows()), census.rows()
    assert all(len(r["rate_marks"]) <= 2 for r in census.rows())


def _row(mono: float, end, entries, **kw) -> dict:
    return {"log": "x", "uid": 1, "end_offset": end, "entries": entries, "t_mono": mono, **kw}


def _rates(rows: list[dict]) -> list:
    prev = None
    for row in rows:
        col._rate(row, prev)
        prev = row
    return [(r.get("added"), None if r.get("rate") is None else round(r["rate"], 3))
            for r in rows]


def test_rate_rules_on_rows():
    """The pure rule of a row's rate (col._rate): a new log's first entries count (it had no
    end offset yet); a row read without its open ledger's LAC is never a mark (its missing
    entries would count as added for a whole window); the clock is monotonic time, so a step
    of the wall clock changes nothing; a re-created log starts again."""
    assert _rates([_row(0, None, 0), _row(1, 500, 500)]) == [(None, None), (500, 500.0)]
    # (partial at t=1: 100,000 entries of the open ledger left out; steady 10 entries/s)
    steady = [_row(0, 1000, 1000), _row(1, 10, 10, entries_partial=True),
              _row(2, 1020, 1020), _row(3, 1030, 1030)]
    assert _rates(steady) == [(None, None), (0, 0.0), (20, 10.0), (30, 10.0)]
    stale = [_row(0, 10, 10, entries_stale=True), _row(1, 20, 20), _row(2, 30, 30)]
    assert _rates(stale) == [(None, None), (None, None), (10, 10.0)]
    wall = [_row(0, 0, 0, t=1e9), _row(1, 10, 10, t=1e9 + 3600), _row(2, 20, 20, t=1e9 - 5)]
    assert _rates(wall) == [(None, None), (10, 10.0), (20, 10.0)]
    again = [_row(0, 0, 0), _row(1, 50, 50), dict(_row(2, 5, 5), uid=2)]
    assert _rates(again)[2] == (None, None)


def test_an_open_ledger_counts_up_to_its_lac_and_shows_its_age(logs, monkeypatch):
    """Its LAC comes from its bookies (here: a stand-in); when they do not answer, the LAC of
    the previous pass stands (stale); with none, the entries count up to it (partial) and no
    cursor lag is guessed."""
    from bkspark.errors import BookieUnavailableError
    from metadata import ledgers
    from metadata.ledger_keys import KeyRecord
    from metadata.ledger_metadata import LedgerMetadata
    from metadata.log_entry import OPEN
    fill(logs, "tailing", [4, 6])
    md = ledgers.create_ledger(logs.store, LedgerMetadata.new(["a:1", "b:1", "c:1"], 2, 2).copy(
        keys=KeyRecord.legacy(b"")))
    logs.update("tailing", lambda edit: edit.append(md.ledger_id, state=OPEN))
    logs.commit_cursor("tailing", "r", Position(md.ledger_id, 3))
    lacs = {md.ledger_id: 9}

    def lac(bk, metadata, version):
        if metadata.ledger_id not in lacs:
            raise BookieUnavailableError("no bookie answered")
        return lacs[metadata.ledger_id]
    monkeypatch.setattr(col, "_read_lac", lac)
    census = col.Census(logs.store, logs.bk)
    census.run_pass()
    (row,) = census.rows()
    assert (row["entries"], row["open_ledger"], row["open_lac"], row["lag"]) == (20, md.ledger_id, 9, 7)
    assert not row["entries_partial"] and not row["entries_stale"]
    assert 0 <= row["open_age_s"] < 60
    assert census.totals["open_ledgers"] == 1 and census.totals["lac_reads"] == 1
    assert census.ledger_states["counts"] == {"CLOSED": 2, "OPEN": 1}
    del lacs[md.ledger_id]                              # its bookies stop answering
    census.run_pass()
    (row,) = census.rows()
    assert (row["entries"], row["open_lac"], row["entries_stale"], row["lag"]) == (20, 9, True, 7)
    assert census.totals["lac_unread"] == 1
    blind = col.Census(logs.store, None)                # no client: no LAC
    blind.run_pass()
    (row,) = blind.rows()
    assert (row["entries"], row["entries_partial"], row["lag"]) == (10, True, None)
    assert blind.totals["entries_unknown"] == 1
    lacs[md.ledger_id] = 14
    monkeypatch.setattr(col, "LAC_BUDGET_S", 0.0)       # the pass's LAC budget is spent
    census.run_pass()
    assert census.rows()[0]["open_lac"] == 9 and census.totals["lac_unread"] == 1


def test_a_deleted_log_drops_out_and_a_new_one_comes_in_at_the_next_pass(logs):
    for i in range(5):
        fill(logs, f"d-{i}", [2])
    collector = col.Collector(logs.store, logs.bk)
    census = collector.census
    census.run_pass()
    logs.delete("d-3")
    fill(logs, "d-9", [4])
    census.run_pass()
    assert sorted(r["log"] for r in census.rows()) == ["d-0", "d-1", "d-2", "d-4", "d-9"]
    assert census.totals["logs"] == 5 and census.totals["entries"] == 12
    overview = collector.overview()
    assert overview["log_totals"]["logs"] == 5 and len(overview["logs"]) == 5
    assert overview["ledger_states"]["counts"] == {"CLOSED": 5}


def test_the_rows_of_a_pass_show_as_its_chunks_are_read(logs, monkeypatch):
    monkeypatch.setattr(col, "LOG_CHUNK", 3)
    for i in range(7):
        fill(logs, f"c-{i}", [1 + i])
    census = col.Census(logs.store, logs.bk)
    assert census.step() is False
    assert sorted(r["log"] for r in census.rows()) == ["c-0", "c-1", "c-2"]
    assert census.totals is None                    # totals only once a pass completed
    assert census.view()["census"]["progress"]["logs_read"] == 3
    census.run_pass()
    assert census.totals["entries"] == sum(range(1, 8)) and census.passes == 1
    assert census.view()["census"]["progress"] is None


def test_a_log_that_changes_while_read_is_read_again(logs):
    """Its segments gone between the read of its head and theirs (a truncation collected
    them): read again; if it keeps changing, the previous row stays, marked stale."""
    fill(logs, "moving", [1, 2, 3, 4, 5, 6, 7])

    class Racing:
        """The store, whose segment reads answer 'gone' the first ``times`` rounds."""

        def __init__(self, store, times):
            self.store, self.times = store, times

        def get_many(self, paths):
            got = self.store.get_many(paths)
            if self.times and any("/segments/" in p for p in paths):
                self.times -= 1
                return [None if "/segments/" in p else g for p, g in zip(paths, got)]
            return got

        def __getattr__(self, name):
            return getattr(self.store, name)

    census = col.Census(Racing(logs.store, 2), logs.bk)
    census.run_pass()
    (row,) = census.rows()
    assert row["entries"] == 28 and "stale" not in row
    census.store = Racing(logs.store, 3)
    census.run_pass()
    (row,) = census.rows()
    assert row["stale"] is True and row["entries"] == 28


def test_a_metadata_error_ends_the_step_and_the_pass_resumes(logs, monkeypatch):
    from bkspark.errors import MetadataConnectionError
    monkeypatch.setattr(col, "LOG_CHUNK", 2)
    for i in range(4):
        fill(logs, f"e-{i}", [1])
    census = col.Census(logs.store, logs.bk)
    census.step()
    real = logs.store.get_many

    def down(paths):
        raise MetadataConnectionError("metadata store unreachable")
    monkeypatch.setattr(logs.store, "get_many", down)
    with pytest.raises(MetadataConnectionError):
        census.step()
    assert census.view()["errors"] == {"logs": "metadata store unreachable"}
    monkeypatch.setattr(logs.store, "get_many", real)
    census.run_pass()
    assert census.totals["logs"] == census.totals["summarized"] == 4
    assert census.view()["errors"] == {}


def test_the_logs_table_over_http_is_bounded_and_needs_the_token(logs):
    from bkspark.dashboard import Dashboard
    fill(logs, "alpha", [3])
    fill(logs, NEEDLE, [9])
    collector = col.Collector(logs.store, logs.bk)
    collector.census.run_pass()
    dash = Dashboard(collector, token="t0ken").start()
    try:
        def get(query, token="t0ken"):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            request = urllib.request.Request(dash.url + "api/logs" + query, headers=headers)
            with urllib.request.urlopen(request, timeout=10) as resp:
                return json.loads(resp.read())
        got = get("?sort=largest&q=needle&limit=5")
        assert [r["log"] for r in got["logs"]] == [NEEDLE] and got["matched"] == 1
        assert got["log_totals"]["logs"] == 2 and got["log_totals"]["entries"] == 12
        assert [r["log"] for r in get("")["logs"]] == ["alpha", NEEDLE]     # busiest, then name
        for bad in ("?sort=random", f"?q={'x' * (col.MAX_QUERY + 1)}", "?limit=0",
                    f"?limit={col.MAX_SHOWN + 1}", "?limit=-1", "?limit=9e9"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                get(bad)
            assert refused.value.code == 400, bad
        with pytest.raises(urllib.error.HTTPError) as refused:
            get("?q=needle", token=None)
        assert refused.value.code == 401
    finally:
        dash.stop()


def test_a_log_that_offloads_shows_what_is_offloaded_and_the_lag(logs, tmp_path):
    """Issue 52: the census row and the log page give what ``bkspark shell logs`` gives (the
    head's progress mark against the list's ends: no extra reads)."""
    from bkspark.log import offload
    fill(logs, "history", [4, 6, 5])
    logs.set_offload("history", offload.OffloadPolicy(str(tmp_path), after_ms=1))
    census = col.Census(logs.store, logs.bk)
    census.run_pass()
    (row,) = census.rows()
    assert (row["offloaded_entries"], row["offload_lag"]) == (0, 15)
    first, second = logs.segments("history")[:2]
    done = {e.ledger_id: {"location": str(tmp_path), "files": []} for e in (first, second)}
    offload.record(logs, "history", done, offload.progress_after(second))
    census.run_pass()
    (row,) = census.rows()
    assert (row["offloaded_entries"], row["offloaded_bytes"], row["offload_lag"]) == (10, 100, 5)
    stats = logs.stats("history")
    assert {k: row[k] for k in ("offload", "offloaded_entries", "offloaded_bytes", "offload_lag")} \
        == {k: stats[k] for k in ("offload", "offloaded_entries", "offloaded_bytes", "offload_lag")}
    from bkspark.dashboard.server import _log_page
    page = _log_page({"log": "history", **stats, "cursors": {}, "segments_shown": []})
    assert b"10 entries, 100 bytes; 5 entries not yet" in page
    assert b"only there" not in page

    def dropped(edit):                  # the bookies' copy of the first dropped
        edit.properties[offload.DROPPED] = offload.progress_after(first)
    logs.update("history", dropped)
    census.run_pass()
    (row,) = census.rows()
    assert (row["dropped_entries"], row["dropped_bytes"]) == (4, 40)
    assert logs.stats("history")["dropped_entries"] == 4
    page = _log_page({"log": "history", **logs.stats("history"), "cursors": {},
                      "segments_shown": []})
    assert b"4 entries, 40 bytes only there" in page
