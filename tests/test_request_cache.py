"""The request cache and the price before the run, on a leash worker in the test's process against the stand-in
provider that bills every answer: a request already paid for is not paid for again (whichever
job, mode or re-submission sends it), within its owner's scope; ``cache: false`` asks again; a
batch job whose requests are all cached creates no provider batch; the dry run writes nothing
and its worst case is at least what the run then costs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import main
from jobs import keys
from jobs.enqueue import enqueue
from jobs.intake.submission import dry_run, price_or_none
from jobs.usage.report import owner_usage
from tests.conftest import run_burst, wait_for
from tests.test_batch_jobs import FOLLOW
from tests.test_items_workers import ended, stored
from tests.test_usage_workers import billed

pytestmark = pytest.mark.slow

PRICES = '{"fake-model": {"input": 1.0, "output": 2.0}}'
TEMPLATE = "Say it back: {item}"


def items(start: int, count: int) -> list[str]:
    return [f"review {i}: the kettle is fine" for i in range(start, start + count)]


def run(conn, job_items, owner="dana", **payload) -> dict:
    payload = {"items": job_items, "template": TEMPLATE, **payload}
    job_id, _ = enqueue(conn, "prompt", payload, owner=owner, price=price_or_none(conn, "prompt", payload, owner))
    run_burst()
    return ended(conn, job_id) | {"job_id": job_id}


@pytest.fixture
def worker(conn, model_server, env):
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    return model_server


def test_a_second_identical_job_makes_no_call_and_costs_nothing(conn, worker):
    first = run(conn, items(0, 30))
    assert billed(worker)[0] == 30 and first["usage"]["cache_hits"] == 0
    second = run(conn, items(0, 30))

    assert second["state"] == "succeeded" and billed(worker)[0] == 30  # not one call more
    assert second["usage"]["calls"] == 0 and second["usage"]["cache_hits"] == 30
    assert second["cost_usd"] == 0
    assert stored(conn, second["job_id"]) == stored(conn, first["job_id"])
    item_usage = conn.hget(keys.usage(second["job_id"]), "i0").decode()
    assert item_usage == "0,0,0,1"
    assert owner_usage(conn, "dana", days=1)["total"]["usage"]["cache_hits"] == 30


def test_a_resubmission_with_ten_new_items_pays_for_the_ten(conn, worker):
    run(conn, items(0, 30))
    again = run(conn, items(0, 40))

    assert billed(worker)[0] == 40
    assert again["usage"]["calls"] == 10 and again["usage"]["cache_hits"] == 30
    # Five rows fixed: five requests changed, five calls.
    fixed = items(0, 40)
    for i in (3, 9, 17, 25, 38):
        fixed[i] += " (fixed)"
    third = run(conn, fixed)
    assert billed(worker)[0] == 45 and third["usage"]["calls"] == 5 and third["usage"]["cache_hits"] == 35


def test_no_cache_and_another_owner_ask_the_provider_again(conn, worker):
    run(conn, items(0, 20))
    bypassed = run(conn, items(0, 20), cache=False)
    assert billed(worker)[0] == 40 and bypassed["usage"]["calls"] == 20 and bypassed["usage"]["cache_hits"] == 0
    other = run(conn, items(0, 20), owner="erin")
    assert billed(worker)[0] == 60 and other["usage"]["calls"] == 20


def test_a_shared_scope_answers_another_owner_from_the_cache(conn, model_server, env):
    env.setenv("LEASH_CACHE_SCOPE", "shared")
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    run(conn, items(0, 10), owner="dana")
    other = run(conn, items(0, 10), owner="erin")
    assert billed(model_server)[0] == 10 and other["usage"]["cache_hits"] == 10


def test_cache_off_for_all_asks_again(conn, model_server, env):
    env.setenv("LEASH_CACHE", "off")
    run(conn, items(0, 10))
    run(conn, items(0, 10))
    assert billed(model_server)[0] == 20
    assert conn.zcard(keys.CACHE_INDEX) == 0


def test_the_dry_run_writes_nothing_and_its_worst_case_covers_the_run(conn, worker):
    run(conn, items(0, 10))  # ten of the forty are cached
    job_items = items(0, 40)
    payload = {"items": job_items, "template": TEMPLATE}
    before = set(conn.scan_iter(count=1000))
    figures = dry_run(conn, "prompt", payload, owner="dana")
    # The idle worker's short-lived keys (rate buckets) may expire meanwhile; nothing is added.
    assert set(conn.scan_iter(count=1000)) - before == set()
    assert figures["items"] == 40 and figures["cached_items"] == 10 and figures["calls"] == 30
    assert figures["cost_usd_expected"] is not None  # the owner's earlier prompt job saw answers

    done = run(conn, job_items)
    assert done["usage"]["calls"] == 30
    assert figures["input_tokens"] >= done["usage"]["input_tokens"]
    assert figures["output_tokens_max"] >= done["usage"]["output_tokens"]
    assert figures["cost_usd_max"] >= done["cost_usd"] > 0
    assert figures["cost_usd_expected"] <= figures["cost_usd_max"]
    assert json.loads(conn.get(keys.estimate(done["job_id"])))["calls"] == 30


def test_the_cache_keeps_under_its_cap_evicting_the_least_recently_used(conn, model_server, env):
    env.setenv("LEASH_CACHE_MAX_MB", str(4000 / 1024 / 1024))  # room for about ten entries
    run(conn, items(0, 40))
    total = int(conn.get(keys.CACHE_BYTES))
    sizes = sum(int(v) for v in conn.hvals(keys.CACHE_SIZES))
    assert 0 < total == sizes <= 4000
    kept = conn.zrange(keys.CACHE_INDEX, 0, -1)
    assert 5 <= len(kept) < 40 and all(conn.exists(k) for k in kept)
    # The least recently used went first: what is left is the room's worth, no fewer.
    entry = max(int(v) for v in conn.hvals(keys.CACHE_SIZES))
    assert total > 4000 - entry
    assert len(list(conn.scan_iter(match=keys.cache_entry("*", "*")))) == len(kept)


def test_the_cli_dry_run_prints_an_estimate_and_submits_nothing(conn, worker, tmp_path):
    source = tmp_path / "items.txt"
    source.write_text("\n".join(items(0, 5)))
    before = set(conn.scan_iter(count=1000))
    result = CliRunner().invoke(main, ["submit", "--kind", "prompt", "--template", TEMPLATE, "--dry-run", "--json",
                                       str(source)])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)["estimate"]
    assert figures["calls"] == 5 and figures["cost_usd_max"] > 0
    assert set(conn.scan_iter(count=1000)) - before == set()
    result = CliRunner().invoke(main, ["submit", "--kind", "prompt", "--template", TEMPLATE, "--dry-run",
                                       str(source)])
    assert result.exit_code == 0 and "5 calls" in result.output and "worst case" in result.output


def test_batch_and_direct_share_the_cache_and_an_all_cached_batch_job_creates_no_batch(
        conn, burst, batch_env):
    server = batch_env
    job_items = [f"b{i}" for i in range(12)]
    payload = {"items": job_items[:8], "template": "Say {item}", "mode": "batch"}
    first, _ = enqueue(conn, "prompt", payload)
    burst()
    wait_for(lambda: server.batches.created == 1, 30, message="the first job's batch")
    server.batches.complete(next(iter(server.batches.batches)))
    burst(follow=FOLLOW)
    assert ended(conn, first)["state"] == "succeeded"
    # A direct job of the same requests (4 new): the batch's answers serve the first 8.
    direct_id, _ = enqueue(conn, "prompt", {"items": job_items, "template": "Say {item}"})
    burst()
    done = ended(conn, direct_id)
    assert done["usage"]["cache_hits"] == 8 and done["usage"]["calls"] == 4 and len(server.requests) == 4
    # A batch job whose every request is cached: no provider batch, no call.
    again, _ = enqueue(conn, "prompt", {"items": job_items, "template": "Say {item}", "mode": "batch"})
    burst(follow=FOLLOW)
    final = ended(conn, again)
    assert final["state"] == "succeeded" and final["done"] == 12
    assert server.batches.created == 1 and len(server.requests) == 4
    assert final["usage"]["calls"] == 0 and final["usage"]["cache_hits"] == 12 and final["cost_usd"] in (0, None)
    assert stored(conn, again) == stored(conn, direct_id)


def test_a_shared_cache_does_not_let_a_dry_run_probe_other_owners_inputs(conn, worker, env):
    env.setenv("LEASH_CACHE_SCOPE", "shared")
    run(conn, items(0, 10), owner="dana")  # dana's inputs are now in the shared cache
    guesses = {"items": items(0, 10) + items(100, 10), "template": TEMPLATE}
    figures = dry_run(conn, "prompt", guesses, owner="erin")
    assert figures["cached_items"] == 0 and figures["calls"] == 20  # no guess is confirmed
    assert "LEASH_CACHE_SCOPE=shared" in figures["note"]
    done = run(conn, items(0, 10), owner="erin")  # the run itself still reuses them: that is the setting
    assert done["usage"]["cache_hits"] == 10


def test_anonymous_visitors_of_a_public_form_share_no_cache(conn, worker):
    from jobs.core import payload_copy
    from tests.web_support import HTML, create_app_with, csrf_from

    app = create_app_with(LEASH_PUBLIC_SUBMIT=True, LEASH_API_TOKENS="alice=alice-token-0123456789abcdef")
    visitor = app.test_client()
    token = csrf_from(visitor.get("/", headers=HTML).data)
    form = {"kind": "prompt", "template": TEMPLATE, "items": "\n".join(items(0, 3)), "csrf_token": token}
    first = visitor.post("/", headers=HTML, data={**form, "submission": "visitor-0001"})
    assert first.status_code == 303, first.data[:300]
    job_id = first.headers["Location"].rsplit("/", 1)[1]
    assert payload_copy.decode(conn.get(keys.payload(job_id)))["cache"] is False
    run_burst()
    assert ended(conn, job_id)["usage"]["calls"] == 3
    # Another visitor's Estimate of the same text learns nothing of the first one's.
    other = app.test_client()
    token = csrf_from(other.get("/", headers=HTML).data)
    page = other.post("/", headers=HTML, data={**form, "csrf_token": token, "submission": "visitor-0002",
                                               "estimate": "1"}).data.decode()
    assert "3 calls, 0 answered from" in page, page[page.find("estimate"):][:400]
