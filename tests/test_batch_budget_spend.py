"""Batch mode spends its budget, on real ``leash worker`` processes against the loopback
provider's batch API (which bills every answer it generates): once the first part's answers
are read, the next parts bound their input by what was billed and ask each item for the output
the room leaves it (never less than 1.25 times the longest answer seen), so a job whose need is
under its budget goes in a few parts even when ``max_tokens`` is many times an answer; a job
that needs more stops ``budget reached`` having billed at least 90 % of its budget, never more;
and a budget smaller than one request's worst case still gets answers, as direct mode does by
asking for the output that is left."""

from __future__ import annotations

import pytest

from jobs.enqueue import enqueue
from jobs.models.provider import TOKENS_PER_MESSAGE, TOKENS_PER_PROMPT
from tests.test_batch_budget import batch_billed, ending_batches, submit, worst_of
from tests.test_budget_spend import ENGLISH, TEMPLATE, need_of
from tests.test_items_workers import ended
from tests.test_usage_workers import counted

pytestmark = pytest.mark.slow

PRICES = '{"fake-model": {"input": 1.0, "output": 2.0, "batch": 0.5}}'


def figures(server, final: dict, budget: float, unit: str) -> tuple[float, str]:
    calls, prompt, completion = batch_billed(server)
    spent = final["cost_usd"] if unit == "usd" else prompt + completion
    share = spent / budget
    line = (f"budget {budget:,} {unit}, billed {spent:,} ({share:.1%}) in {server.batches.created} parts, "
            f"{final['done']} of {final['total']} items stored -> {final['state']}")
    print(line)
    assert counted(final) == (calls, prompt, completion), line
    assert final["done"] == calls, line  # every answer billed was stored (none cut off, none asked twice)
    return share, line


def test_a_job_under_its_budget_goes_in_a_few_parts_when_max_tokens_is_many_times_an_answer(
        conn, workers, batch_env, env):
    """60 items, a budget 1.38 times their need (the issue's 7,260 under 10,000), max_tokens 512:
    each request's worst case is ~20 times what it costs. Before: a dozen parts one after another."""
    server = batch_env
    ending_batches(server, env)
    env.setenv("LEASH_MODEL_MAX_TOKENS", "512")
    items = ENGLISH[:60]
    budget_tokens = int(need_of(items) * 1.38)
    assert sum(worst_of(items, 512)) > 10 * budget_tokens
    job_id = submit(conn, items, budget_tokens)
    workers.start()
    final = ended(conn, job_id, timeout=120)
    share, line = figures(server, final, budget_tokens, "tokens")
    assert final["state"] == "succeeded", final["error"]
    assert final["done"] == 60 and share <= 1.0, line
    assert server.batches.created <= 3, line
    assert len(server.requests) == 0  # no direct call


@pytest.mark.parametrize("max_tokens", [512, 4096])
def test_a_job_that_needs_more_stops_at_90_percent_or_more_in_a_few_parts(conn, workers, batch_env, env, max_tokens):
    """200 items needing ~3 times the budget; with max_tokens 4,096 not one request's worst case
    fits the budget (before: failed at 0 %; with 512, stopped far under 90 % after many parts)."""
    server = batch_env
    ending_batches(server, env)
    env.setenv("LEASH_MODEL_MAX_TOKENS", str(max_tokens))
    budget_tokens = 3_000
    assert need_of(ENGLISH) > 2 * budget_tokens
    assert (max(worst_of(ENGLISH, max_tokens)) > budget_tokens) == (max_tokens == 4096)
    job_id = submit(conn, ENGLISH, budget_tokens)
    workers.start()
    final = ended(conn, job_id, timeout=180)
    share, line = figures(server, final, budget_tokens, "tokens")
    assert final["state"] == "failed" and final["error"].startswith("budget reached"), final["error"]
    assert 0.9 <= share <= 1.0, line
    assert server.batches.created <= 7, line
    assert len(server.requests) == 0


def test_a_usd_budget_smaller_than_one_requests_worst_case_is_spent_to_90_percent(conn, workers, batch_env, env):
    """$0.0002 at the batch rate (half of $1 / $2 a million tokens): not one request's worst case
    at max_tokens 4,096 fits; before, the job failed at 0 %."""
    server = batch_env
    ending_batches(server, env)
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    env.setenv("LEASH_MODEL_MAX_TOKENS", "4096")
    budget_usd = 0.0002
    worst_usd = (len(TEMPLATE.format(item=ENGLISH[0]).encode()) + TOKENS_PER_MESSAGE + TOKENS_PER_PROMPT
                 + 2 * 4096) * 0.5 / 1e6
    assert worst_usd > budget_usd
    job_id = enqueue(conn, "prompt", {"items": ENGLISH, "template": TEMPLATE, "mode": "batch",
                                      "budget": {"usd": budget_usd}}, owner="dana")[0]
    workers.start()
    final = ended(conn, job_id, timeout=180)
    share, line = figures(server, final, budget_usd, "usd")
    assert final["state"] == "failed" and final["error"].startswith("budget reached"), final["error"]
    assert 0.9 <= share <= 1.0, line
    assert server.batches.created <= 6, line
