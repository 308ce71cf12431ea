"""The price before the run at the web doors: the API's ``dry_run: true`` and the form's
Estimate button answer an estimate and write nothing; a submitted job keeps its estimate and
its page shows it beside the usage; ``cache`` is checked like any other field."""

from __future__ import annotations

import pytest

from jobs import keys
from tests.test_web_pages import browser, post_form  # noqa: F401 (fixture)
from tests.web_support import HTML

PROMPT = {"kind": "prompt", "items": ["the kettle is fine", "the lid is loose"], "template": "Say: {item}"}


@pytest.fixture
def priced(env):
    env.setenv("LEASH_MODEL_URL", "http://127.0.0.1:9/v1")
    env.setenv("LEASH_MODEL_NAME", "fake-model")
    env.setenv("LEASH_MODEL_PRICES", '{"fake-model": {"input": 1.0, "output": 2.0}}')
    env.setenv("LEASH_MODEL_MAX_TOKENS", "100")


def test_a_dry_run_answers_the_estimate_and_writes_nothing(client, conn, priced):
    before = set(conn.scan_iter(count=1000))
    response = client.post("/jobs", json={**PROMPT, "dry_run": True})
    assert response.status_code == 200, response.json
    figures = response.json["estimate"]
    assert figures["items"] == 2 and figures["calls"] == 2 and figures["cached_items"] == 0
    assert figures["output_tokens_max"] == 200 and figures["input_tokens"] > 0
    assert figures["cost_usd_max"] == pytest.approx((figures["input_tokens"] * 1.0 + 200 * 2.0) / 1e6)
    assert figures["cost_usd_batch_max"] == pytest.approx(figures["cost_usd_max"] / 2)
    assert figures["cost_usd_expected"] is None  # no earlier job of this owner saw an answer
    assert figures["budget_covers_worst_case"] is None
    # A dry run gets every check a submission gets, with the same codes.
    assert client.post("/jobs", json={**PROMPT, "items": [], "dry_run": True}).status_code == 422
    missing = client.post("/jobs", json={"kind": "prompt", "items": ["x"], "dry_run": True})
    assert missing.status_code == 400 and "missing field 'template'" in missing.json["error"]
    # Nothing but the dry runs' own rate counters (LEASH_DRY_RUN_RATE).
    assert {k for k in conn.scan_iter(count=1000) if not k.startswith(keys.SUBMIT_RATE_PREFIX.encode())} == before


def test_a_dry_run_says_whether_the_budget_covers_the_worst_case(client, conn, priced):
    small = client.post("/jobs", json={**PROMPT, "budget": {"tokens": 100}, "dry_run": True}).json["estimate"]
    large = client.post("/jobs", json={**PROMPT, "budget": {"tokens": 10_000}, "dry_run": True}).json["estimate"]
    assert small["budget_covers_worst_case"] is False and large["budget_covers_worst_case"] is True


@pytest.mark.parametrize("body, status, says", [
    ({**PROMPT, "dry_run": "yes"}, 422, "'dry_run' must be true or false"),
    ({**PROMPT, "cache": "no"}, 422, "'cache' must be true or false")])
def test_bad_dry_runs_and_cache_options_are_refused_saying_why(client, conn, priced, body, status, says):
    response = client.post("/jobs", json=body)
    assert response.status_code == status and says in response.json["error"]
    assert "dry_run" not in response.json["error"] or "dry_run" in says  # never "unknown field 'dry_run'"
    assert conn.dbsize() == 0


def test_a_submitted_job_keeps_its_estimate_and_its_page_shows_it(client, conn, priced):
    job_id = client.post("/jobs", json=PROMPT).json["job_id"]
    assert conn.get(keys.estimate(job_id)) and conn.hget(keys.job(job_id), "estimate") is None  # kept apart from the hash
    page = client.get(f"/jobs/{job_id}", headers=HTML).get_data(as_text=True)
    assert 'id="estimate"' in page and "2 calls" in page and "worst case" in page


def test_the_forms_estimate_button_shows_the_price_and_submits_nothing(browser, conn, priced):  # noqa: F811
    before = conn.zcard(keys.ACTIVE)
    response = post_form(browser, kind="prompt", template="Say: {item}", items="one\ntwo\nthree", estimate="1")
    html = response.get_data(as_text=True)
    assert response.status_code == 200 and 'id="estimate"' in html and "3 calls" in html
    assert conn.zcard(keys.ACTIVE) == before and not list(conn.scan_iter(match=keys.job("*")))
