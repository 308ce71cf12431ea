"""A budget is a limit to spend up to, on real leash workers (in this process, the owner's three
jobs on two worker processes) against a stand-in
provider that bills every answer it generates (as a tokenizer would: Japanese costs about two
tokens a character, far more than characters / 4): a job whose whole need is under its budget
succeeds at any concurrency; a job that runs out has billed at least 90 % of its budget when
it stops, never more than all of it; an owner's day is shared by its jobs without failing them
at a fraction of it."""

from __future__ import annotations

import pytest

from jobs.core import states
from jobs.enqueue import enqueue
from jobs.models.provider import TOKENS_PER_MESSAGE, TOKENS_PER_PROMPT
from tests.conftest import wait_for
from tests.fake_openai import billed_tokens
from tests.test_items_workers import ended
from tests.test_usage_workers import billed, counted

ENGLISH = [f"review {i:03d}: the blender works well but is loud" for i in range(200)]
JAPANESE = [f"レビュー{i:03d}：このミキサーはよく動くが、音が大きい。" for i in range(200)]
TEMPLATE = "Summarise: {item}"
MAX_TOKENS = 64


def need_of(items: list[str]) -> int:
    """What the stand-in bills for the whole job: each prompt and its echoed answer."""
    return sum(billed_tokens(TEMPLATE.format(item=i)) + billed_tokens(f"echo: {TEMPLATE.format(item=i)}")
               for i in items)


def run(conn, burst, env, items, budget_tokens: int, concurrency: int, owner: str = "dana") -> dict:
    """The job on a worker in this process (its items on threads of a forked work-horse)."""
    env.setenv("LEASH_ITEM_CONCURRENCY", str(concurrency))
    env.setenv("LEASH_MODEL_MAX_TOKENS", str(MAX_TOKENS))
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": TEMPLATE, "budget": {"tokens": budget_tokens}},
                        owner=owner)
    burst()
    return ended(conn, job_id)


@pytest.mark.parametrize("concurrency", [1, 16, 64])
@pytest.mark.parametrize("language", ["english", "japanese"])
def test_a_job_whose_need_is_under_its_budget_succeeds_at_any_concurrency(
        conn, burst, model_server, env, concurrency, language):
    items = (ENGLISH if language == "english" else JAPANESE)[:40]
    need = need_of(items)
    # Room for the need and a little more, far less than 40 calls' worst cases at once.
    final = run(conn, burst, env, items, budget_tokens=int(need * 1.15), concurrency=concurrency)
    spent = billed(model_server)
    print(f"{language}, {concurrency} at once: need {need:,} tokens, budget {int(need * 1.15):,}, "
          f"billed {spent[1] + spent[2]:,} in {spent[0]} calls -> {final['state']}")
    assert final["state"] == "succeeded", final["error"]
    assert final["done"] == 40 and counted(final) == spent


@pytest.mark.parametrize("concurrency", [1, 16, 64])
@pytest.mark.parametrize("language", ["english", "japanese"])
def test_a_job_that_runs_out_bills_at_least_90_percent_of_its_budget_and_never_more(
        conn, burst, model_server, env, concurrency, language):
    items = ENGLISH if language == "english" else JAPANESE
    # One call's worst case (its prompt's bytes and the chat template's tokens, plus 64 output
    # tokens) is under a tenth of the budget; the job needs several times the budget.
    worst = max(len(TEMPLATE.format(item=i).encode()) for i in items) + TOKENS_PER_MESSAGE + TOKENS_PER_PROMPT + MAX_TOKENS
    budget_tokens = 10 * worst + 100
    assert need_of(items) > 3 * budget_tokens
    final = run(conn, burst, env, items, budget_tokens=budget_tokens, concurrency=concurrency)
    calls, prompt, completion = billed(model_server)
    share = (prompt + completion) / budget_tokens
    print(f"{language}, {concurrency} at once: budget {budget_tokens:,} tokens, billed {prompt + completion:,} "
          f"({share:.1%}) in {calls} calls, {final['done']} items stored")
    assert final["state"] == "failed" and final["error"].startswith("budget reached"), final["error"]
    assert counted(final) == (calls, prompt, completion)
    assert 0.9 <= share <= 1.0
    assert final["budget_wait"] is None


@pytest.mark.slow
def test_an_owners_jobs_share_its_day_and_wait_for_each_other_instead_of_failing(conn, workers, model_server, env):
    """Three jobs of one owner whose needs add up to less than its daily budget all succeed,
    though their calls' worst cases at once are many times that budget; while one waits for
    room its status says so."""
    model_server.latency = 0.05
    items = ENGLISH[:30]
    need = need_of(items)
    env.setenv("LEASH_OWNER_DAILY_TOKENS", str(int(3 * need * 1.1)))
    env.setenv("LEASH_ITEM_CONCURRENCY", "16")
    env.setenv("LEASH_MODEL_MAX_TOKENS", "512")  # 16 calls' worst cases: ~10,000 tokens a job
    jobs = [enqueue(conn, "prompt", {"items": items, "template": TEMPLATE}, owner="erin")[0] for _ in range(3)]
    workers.start()
    workers.start()
    seen_waiting = wait_for(lambda: any((states.status(conn, j).get("budget_wait") or {}).get("text")
                                        for j in jobs), 60, interval=0.02, message="a job waiting for room")
    finals = [ended(conn, job_id) for job_id in jobs]
    assert [f["state"] for f in finals] == ["succeeded"] * 3, [f["error"] for f in finals]
    _, prompt, completion = billed(model_server)
    print(f"3 jobs of one owner, day budget {int(3 * need * 1.1):,}: billed {prompt + completion:,}; "
          f"one waited: {seen_waiting!r}")
    assert prompt + completion <= int(3 * need * 1.1)
    assert all(f["budget_wait"] is None for f in finals)


def test_a_job_waiting_long_for_room_gives_its_worker_back_and_is_not_failed(conn, burst, model_server, env,
                                                                             monkeypatch):
    """Room held for long (a batch part waiting at its provider holds its worst case for hours):
    after waiting in place, the job is deferred -- its worker free for others, the batch's looks
    among them -- and says what it waits for; the deferrals do not count toward
    LEASH_MAX_DEFERS; once the room is free it runs to its end."""
    from jobs import keys
    from jobs.core import lease
    from jobs.models import spending
    from jobs.usage import budget
    from jobs.usage.meter import Pending, flush

    monkeypatch.setattr(spending, "ROOM_WAIT_IN_PLACE", 0.5)
    monkeypatch.setattr(spending, "ROOM_DEFER_SECONDS", 1.0)
    env.setenv("LEASH_OWNER_DAILY_TOKENS", "3000")
    env.setenv("LEASH_MAX_DEFERS", "1")
    env.setenv("LEASH_MODEL_MAX_TOKENS", str(MAX_TOKENS))
    # Leases that outlast the test on a busy machine: the holder's stands for a call in flight elsewhere.
    env.setenv("LEASH_LEASE_SECONDS", "60")
    holder, _ = enqueue(conn, "prompt", {"items": ["x"], "template": TEMPLATE}, owner="fay")
    holding = lease.claim(conn, holder, "leash", "elsewhere")
    held = budget.admit(conn, ["leash:t:rq", "leash:t:rt", "leash:t:rp"], 0, 0, 10**9, holding, 2990, None,
                        hold=3600, call=budget.CallEstimate("m", 10, 0, None))
    assert held.code == budget.ADMITTED  # 2,990 of the owner's 3,000 tokens held, for an hour
    waiting, _ = enqueue(conn, "prompt", {"items": ENGLISH[:5], "template": TEMPLATE}, owner="fay")
    burst(follow=4)
    status = states.status(conn, waiting)
    assert status["state"] == "queued" and status["budget_wait"] is not None, status
    assert "owner's daily budget" in status["budget_wait"]["text"]
    assert len(model_server.requests) == 0
    # The holder's call settles (it used 10 tokens): the room is free.
    flush(holding, [Pending("m", "prompt", calls=1, input=10, day=held.day, reservations=[held.reservation])])
    burst(follow=5)
    final = states.status(conn, waiting)
    assert final["state"] == "succeeded", final["error"]
    assert final["budget_wait"] is None and int(conn.hget(keys.job(waiting), "defers") or 0) == 0
