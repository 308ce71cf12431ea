"""Batch mode under a budget, on real ``leash worker`` processes against the loopback provider's
batch API (which bills every answer it generates): a batch job whose worst case is many times
its budget is sent in parts as the answers of the first settle and free room, and succeeds when
its need is under the budget; one that needs more stops with ``budget reached`` having billed at
least 90 % of its budget, never more; a part waiting at the provider makes its owner's other
jobs wait for room, not fail, and a batch job whose room its owner's calls in flight hold waits
for them."""

from __future__ import annotations

import pytest

from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from jobs.models.provider import TOKENS_PER_MESSAGE, TOKENS_PER_PROMPT
from jobs.usage.meter import utc_day
from tests.conftest import wait_for
from tests.test_budget_spend import ENGLISH, JAPANESE, TEMPLATE, need_of
from tests.test_items_workers import ended
from tests.test_usage_workers import billed, counted

pytestmark = pytest.mark.slow


def batch_billed(server) -> tuple[int, int, int]:
    """(calls, prompt tokens, completion tokens) of every answer the provider's batches gave."""
    with server.batches.lock:
        done = list(server.batches.batch_billed)
    return len(done), sum(p for p, _ in done), sum(c for _, c in done)


def worst_of(items: list[str], max_tokens: int) -> list[int]:
    """Each request's worst case: its prompt's UTF-8 bytes, the chat template's tokens, max_tokens."""
    return [len(TEMPLATE.format(item=i).encode()) + TOKENS_PER_MESSAGE + TOKENS_PER_PROMPT + max_tokens
            for i in items]


def ending_batches(server, env) -> None:
    """The provider ends every batch at its first look (each look sends what fits next)."""
    env.setenv("LEASH_BATCH_POLL_MAX", "0.5")
    server.batches.auto = True
    server.batches.seconds_per_step = 0.001


def submit(conn, items: list[str], budget_tokens: int | None = None, owner: str = "dana") -> str:
    payload = {"items": items, "template": TEMPLATE, "mode": "batch"}
    if budget_tokens is not None:
        payload["budget"] = {"tokens": budget_tokens}
    return enqueue(conn, "prompt", payload, owner=owner)[0]


@pytest.mark.parametrize("language", ["english", "japanese"])
def test_a_batch_job_whose_worst_case_is_many_times_its_budget_succeeds_in_parts(
        conn, workers, batch_env, env, language):
    server = batch_env
    ending_batches(server, env)
    env.setenv("LEASH_MODEL_MAX_TOKENS", "512")
    items = (ENGLISH if language == "english" else JAPANESE)[:40]
    need = need_of(items)
    budget_tokens = int(need * 1.5)
    assert sum(worst_of(items, 512)) > 3 * budget_tokens
    job_id = submit(conn, items, budget_tokens)
    workers.start()
    final = ended(conn, job_id, timeout=120)
    calls, prompt, completion = batch_billed(server)
    print(f"{language}: need {need:,}, budget {budget_tokens:,}, worst case {sum(worst_of(items, 512)):,}: "
          f"{server.batches.created} parts, billed {prompt + completion:,} -> {final['state']}")
    assert final["state"] == "succeeded", final["error"]
    assert final["done"] == 40 and counted(final) == (calls, prompt, completion) and calls == 40
    assert server.batches.created >= 2 and final["batch"]["batches"] == server.batches.created
    assert len(server.requests) == 0  # no direct call
    assert prompt + completion <= budget_tokens


@pytest.mark.parametrize("language", ["english", "japanese"])
def test_a_batch_job_that_needs_more_than_its_budget_stops_having_billed_at_least_90_percent(
        conn, workers, batch_env, env, language):
    server = batch_env
    ending_batches(server, env)
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    items = ENGLISH if language == "english" else JAPANESE
    budget_tokens = 10 * max(worst_of(items, 64)) + 100  # one request's worst case: under a tenth of it
    assert need_of(items) > 3 * budget_tokens
    job_id = submit(conn, items, budget_tokens)
    workers.start()
    final = ended(conn, job_id, timeout=120)
    calls, prompt, completion = batch_billed(server)
    share = (prompt + completion) / budget_tokens
    print(f"{language}: budget {budget_tokens:,}, billed {prompt + completion:,} ({share:.1%}) in "
          f"{server.batches.created} parts, {final['done']} items stored")
    assert final["state"] == "failed" and final["error"].startswith("budget reached"), final["error"]
    assert counted(final) == (calls, prompt, completion) and final["done"] == calls
    assert 0.9 <= share <= 1.0
    assert server.batches.created >= 2 and len(server.requests) == 0


def test_a_batch_part_waiting_at_the_provider_makes_the_owners_other_jobs_wait_not_fail(
        conn, workers, batch_env, env):
    """The owner's day has room for what both jobs need, not for the batch job's worst case:
    its first part takes the room while the provider works, and the owner's direct job waits
    for it (its status says so) instead of failing; both succeed once the provider answers."""
    server = batch_env  # the provider holds every batch until the test moves it
    env.setenv("LEASH_BATCH_POLL_MAX", "0.5")
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    env.setenv("LEASH_ITEM_CONCURRENCY", "4")
    batch_items, direct_items = ENGLISH[:40], ENGLISH[100:110]
    day = int((need_of(batch_items) + need_of(direct_items)) * 1.5)
    assert sum(worst_of(batch_items, 64)) > 2 * day
    env.setenv("LEASH_OWNER_DAILY_TOKENS", str(day))
    batch_id = submit(conn, batch_items, owner="erin")
    workers.start()
    workers.start()  # the direct job waits for room on a worker; the batch job's looks need another
    wait_for(lambda: server.batches.created == 1 and (states.status(conn, batch_id)["batch"] or {}).get("phase")
             == "waiting", 30, message="the batch job's first part to wait at the provider")
    direct_id = enqueue(conn, "prompt", {"items": direct_items, "template": TEMPLATE}, owner="erin")[0]
    waiting = wait_for(lambda: (states.status(conn, direct_id).get("budget_wait") or {}).get("text"), 30,
                       message="the direct job to wait for room")
    assert "owner's daily budget" in waiting
    assert states.status(conn, direct_id)["state"] == "running"
    server.batches.seconds_per_step = 0.001  # the provider answers the part waiting, and every one after it
    server.batches.auto = True
    for name in list(server.batches.batches):
        server.batches.complete(name)
    finals = [ended(conn, job_id, timeout=120) for job_id in (batch_id, direct_id)]
    assert [f["state"] for f in finals] == ["succeeded", "succeeded"], [f["error"] for f in finals]
    assert server.batches.created >= 2
    spent = billed(server)[1] + billed(server)[2] + sum(batch_billed(server)[1:])
    assert spent <= day


def test_a_batch_job_whose_room_is_held_by_its_owners_calls_in_flight_waits_for_them_then_succeeds(
        conn, workers, batch_env, env):
    """Not one request fits the owner's day while a direct job's calls are in flight: the batch
    job sends nothing and waits for them (its status says so) instead of failing."""
    server = batch_env
    env.setenv("LEASH_BATCH_POLL_MAX", "0.5")
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    env.setenv("LEASH_ITEM_CONCURRENCY", "16")
    direct_items, batch_items = ENGLISH[100:116], ENGLISH[:10]
    worst = worst_of(direct_items + batch_items, 64)
    assert len(set(worst)) == 1
    day = 16 * worst[0] + worst[0] // 2  # the direct job's 16 calls at once leave less than one request
    env.setenv("LEASH_OWNER_DAILY_TOKENS", str(day))
    server.hold_after(0)  # the direct calls wait at the server, their worst cases reserved
    direct_id = enqueue(conn, "prompt", {"items": direct_items, "template": TEMPLATE}, owner="erin")[0]
    workers.start()
    workers.start()
    day_key = keys.usage_owner_day("erin", utc_day())
    wait_for(lambda: int(conn.hget(day_key, "reserved_tokens") or 0) == 16 * worst[0], 30,
             message="the direct job's 16 calls in flight")
    batch_id = submit(conn, batch_items, owner="erin")
    # The wait's text and the status's "waiting" line are written apart: poll until both are there.
    status = wait_for(lambda: (s := states.status(conn, batch_id)).get("waiting")
                      and (s.get("budget_wait") or {}).get("text") and s, 30,
                      message="the batch job to wait for room")
    assert "owner's daily budget" in status["budget_wait"]["text"]
    assert status["state"] == "running" and server.batches.created == 0
    assert "10 more item(s) go as answers free room in a budget" in status["waiting"], status["waiting"]
    server.batches.seconds_per_step = 0.001
    server.batches.auto = True
    server.release()
    finals = [ended(conn, job_id, timeout=120) for job_id in (direct_id, batch_id)]
    assert [f["state"] for f in finals] == ["succeeded", "succeeded"], [f["error"] for f in finals]
    assert finals[1]["done"] == 10 and server.batches.created >= 1
    assert billed(server)[1] + billed(server)[2] + sum(batch_billed(server)[1:]) <= day


def test_a_reservation_left_by_an_attempt_that_died_before_recording_its_part_is_given_back(
        conn, workers, batch_env, env):
    """An attempt reserved part 0 (a smaller one) and died before recording it: the next
    attempt's part 0 holds its own worst case, not the one that stood under the same id."""
    from jobs.core import lease
    from jobs.models.rate import ModelRateLimit
    from jobs.usage import budget

    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    items = ENGLISH[:10]
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": TEMPLATE, "mode": "batch",
                                         "budget": {"tokens": 10_000}}, max_attempts=3)
    dead = lease.claim(conn, job_id, "leash", "w")
    limit = ModelRateLimit(conn, "fake-model", rpm=0, tpm=0)
    assert budget.admit(conn, limit.keys, 0, 0, 10**9, dead, 1, None, hold=3600,
                        reservation=budget.batch_reservation(job_id, 0)).admitted
    dead.abandon("the work-horse died between the reservation and the record")
    workers.start()
    wait_for(lambda: (states.status(conn, job_id)["batch"] or {}).get("phase") == "waiting", 30,
             message="the part to wait at the provider")
    assert batch_env.batches.created == 1
    assert int(conn.hget(keys.job(job_id), "in_flight_tokens")) == sum(worst_of(items, 64))
