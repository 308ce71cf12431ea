"""The price before the run where features cross, against the stand-in provider that bills
every answer: in batch mode the expected cost is at the batch rate; for a kind whose items
need repairs it counts as many as the owner's earlier jobs of the kind needed, so a repeat
run's expected cost is within 25 % of its bill; amounts keep their significant digits; and the
door refuses a job its owner's day has not room for one call of, instead of failing it at its
first call."""

from __future__ import annotations

import pytest

from jobs import keys
from jobs.enqueue import enqueue
from jobs.intake.estimate_words import text as estimate_text
from jobs.intake.submission import Refused, Submission, dry_run, submit
from jobs.read.money import money
from jobs.usage import budget
from jobs.usage.meter import utc_day
from tests.conftest import run_burst
from tests.test_items_workers import ended

PRICES = '{"fake-model": {"input": 1.0, "output": 2.0, "batch": 0.5}}'
SCHEMA = {"type": "object", "additionalProperties": False,
          "properties": {"product": {"type": "string"}, "stars": {"type": "integer"}},
          "required": ["product", "stars"]}


@pytest.fixture
def priced(model_server, env):
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    env.setenv("LEASH_MODEL_MAX_TOKENS", "256")
    env.setenv("LEASH_ITEM_CONCURRENCY", "8")
    return model_server


def items(start: int, count: int) -> list[str]:
    return [f"review {i:03d} of gadget{i}: it works, a little loud" for i in range(start, start + count)]


def run(conn, kind: str, payload: dict) -> dict:
    job_id, _ = enqueue(conn, kind, payload, owner="dana")
    run_burst()
    return ended(conn, job_id)


@pytest.mark.parametrize(("usd", "text"), [(0.002019, "$0.002019"), (0.006, "$0.006"), (0.01234, "$0.01234"),
                                           (0.0013, "$0.0013"), (0.1, "$0.10"), (12.3, "$12.30")])
def test_an_amount_keeps_four_significant_digits(usd, text):
    assert money(usd) == text


def test_an_owners_day_budget_of_six_thousandths_of_a_dollar_is_said_as_it_is(conn, env):
    env.setenv("LEASH_OWNER_DAILY_USD", "0.006")
    conn.hset(keys.usage_owner_day("dana", utc_day()), "cost_nusd", 6_100_000)
    refusal = budget.owner_over_daily(conn, "dana")
    assert "its daily budget is $0.006 " in refusal and "spent $0.0061 " in refusal


def test_repairs_are_in_the_expected_cost_and_a_repeat_run_is_within_a_quarter_of_its_bill(conn, priced):
    priced.schema_answers = "break_first"
    first = run(conn, "extract", {"items": items(0, 20), "schema": SCHEMA})
    assert first["state"] == "succeeded" and first["usage"]["calls"] == 40
    payload = {"items": items(20, 20), "schema": SCHEMA}
    figures = dry_run(conn, "extract", payload, owner="dana")
    assert figures["follow_ups_per_item"] == 1.0
    second = run(conn, "extract", payload)
    ratio = figures["cost_usd_expected"] / second["cost_usd"]
    print(f"extract, every item repaired once: expected {money(figures['cost_usd_expected'])}, "
          f"billed {money(second['cost_usd'])} (expected / actual {ratio:.2f})")
    assert 0.75 <= ratio <= 1.25


def test_batch_mode_expects_the_batch_rate(conn, priced):
    run(conn, "prompt", {"items": items(0, 10), "template": "Say it back: {item}"})
    payload = {"items": items(10, 10), "template": "Say it back: {item}"}
    direct = dry_run(conn, "prompt", payload, owner="dana")
    batch = dry_run(conn, "prompt", {**payload, "mode": "batch"}, owner="dana")
    assert direct["cost_usd_expected"] > 0
    assert batch["cost_usd_expected"] == pytest.approx(direct["cost_usd_expected"] / 2, rel=0.01)


def test_the_door_refuses_a_job_its_owners_day_has_not_room_for_one_call_of(conn, priced, env):
    env.setenv("LEASH_OWNER_DAILY_TOKENS", "1000")
    day = keys.usage_owner_day("dana", utc_day())
    conn.hset(day, mapping={"input_tokens": 900, "output_tokens": 60})  # 40 tokens left
    payload = {"items": items(0, 3), "template": "Say it back: {item}"}
    with pytest.raises(Refused) as refused:
        submit(conn, Submission("prompt", payload, "dana"))
    assert refused.value.refusal.status == 429
    assert "has 40 tokens left of its daily budget of 1,000" in str(refused.value)
    # Room for one call (the smallest prompt and 16 output tokens): accepted.
    conn.hset(day, mapping={"input_tokens": 500})
    assert submit(conn, Submission("prompt", payload, "dana")).created


def test_the_door_refuses_in_usd_with_the_amounts_as_they_are(conn, priced, env):
    env.setenv("LEASH_OWNER_DAILY_USD", "0.006")
    conn.hset(keys.usage_owner_day("dana", utc_day()), "cost_nusd", 5_990_000)
    with pytest.raises(Refused) as refused:
        submit(conn, Submission("prompt", {"items": items(0, 1), "template": "Say it back: {item}"}, "dana"))
    assert "has $0.00001 left of its daily budget of $0.006" in str(refused.value)


def test_the_dry_run_of_a_batch_job_says_how_many_parts_its_budget_allows_and_what_budget_sends_it_as_one(
        conn, priced):
    """Before any job of the kind was billed only the one-batch budget is known (every request's
    worst case); after one, the parts a budget allows: one at the one-batch budget, more under a
    smaller one, and fewer items answered under a budget below the job's need."""
    payload = {"items": items(0, 40), "template": "Say it back: {item}", "mode": "batch"}
    fresh = dry_run(conn, "prompt", {**payload, "budget": {"tokens": 5_000}}, owner="dana")
    one = fresh["batch_one_part_budget_tokens"]
    assert one == fresh["input_tokens"] + fresh["output_tokens_max"]
    assert fresh["batch_one_part_budget_usd"] == fresh["cost_usd_batch_max"]
    assert fresh["batch_parts"] is None  # no answers of the kind seen yet
    run(conn, "prompt", {"items": items(100, 10), "template": "Say it back: {item}"})
    counts = {}
    for tokens in (one, one // 4, one // 40, 500):
        figures = dry_run(conn, "prompt", {**payload, "budget": {"tokens": tokens}}, owner="dana")
        counts[tokens] = (figures["batch_parts"], figures["batch_items_in_budget"])
        print(f"budget {tokens:,} tokens: {figures['batch_parts']} part(s), {figures['batch_items_in_budget']} items")
    assert counts[one] == (1, 40)
    assert counts[one // 4][0] >= 2 and counts[one // 4][1] == 40
    assert counts[500][1] < 40
    text = estimate_text(dry_run(conn, "prompt", {**payload, "budget": {"tokens": one // 4}}, owner="dana"))
    assert f"a budget of {one:,} tokens or $" in text and "part(s)" in text, text
