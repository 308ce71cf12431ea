"""The job page from one read (jobs/read/job_page.py): its status, a page of results, the
inputs beside them, the extract columns, the price and a batch job's record come from one
Redis round trip, the stored payload parsed once; web/ names no Redis key."""

from __future__ import annotations

import ast

import pytest

from jobs.core import payload_copy
from jobs.enqueue import enqueue
from tests.conftest import ROOT
from tests.web_support import HTML, RoundTrips, finish_job

ITEMS = [f"review {n}: the kettle boils fast but the lid is loose" for n in range(1000)]


@pytest.fixture
def thousand_items(conn):
    job_id, _ = enqueue(conn, "classify", {"items": ITEMS, "labels": ["positive", "negative"]}, owner="shared",
                        price={"items": 1000, "calls": 1000, "cached_items": 0, "input_tokens": 20_000,
                               "output_tokens_max": 5000, "cost_usd_max": 0.01, "cost_usd_batch_max": 0.005})
    finish_job(conn, job_id, ["positive"] * 1000)
    return job_id


def test_the_page_of_a_1000_item_job_is_one_round_trip_and_parses_its_payload_once(app, conn, thousand_items,
                                                                                   monkeypatch):
    client = app.test_client()
    parsed = []
    decode = payload_copy.decode
    monkeypatch.setattr(payload_copy, "decode", lambda raw: (parsed.append(1), decode(raw))[1])
    trips = RoundTrips(app.extensions["leash_redis"], monkeypatch)
    page = client.get(f"/jobs/{thousand_items}?offset=950", headers=HTML)
    html = page.get_data(as_text=True)
    assert page.status_code == 200, html[:2000]
    assert trips.count == 1, trips.commands
    assert len(parsed) == 1
    assert ITEMS[950] in html and ITEMS[999] in html and ITEMS[949] not in html  # the inputs of its page
    assert "1,000 calls" in html  # the price it was given at submission


def test_another_owners_job_page_is_a_404_in_the_same_one_read(app, conn, thousand_items, monkeypatch):
    from web.reads import read_job_page

    trips = RoundTrips(conn, monkeypatch)
    with app.app_context(), pytest.raises(Exception) as refused:
        read_job_page(conn, thousand_items, "mallory", 0, 50)
    assert getattr(refused.value, "code", None) == 404 and trips.count == 1


def _names_keys(path) -> list[str]:
    """Where a module of web/ imports jobs.keys (key names belong to jobs/)."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "jobs" and any(a.name == "keys" for a in node.names):
            found.append(f"{path.name}:{node.lineno}")
        elif isinstance(node, ast.ImportFrom) and node.module == "jobs.keys":
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_job_page_and_its_look_name_no_redis_key():
    for name in ("pages.py", "api.py", "reads.py"):
        assert _names_keys(ROOT / "web" / name) == [], name
    assert not (ROOT / "web" / "batch_look.py").exists(), "a look moved earlier is written by jobs/batch/look_now.py"
