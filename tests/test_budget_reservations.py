"""Budget reservations that hold: each admitted call (or provider batch) reserves its worst case
on its own, with a deadline, on the owner's UTC day it was admitted on, and its usage is counted
on that day. Against a real Redis (and, for the call loop, the fake OpenAI-compatible server)."""

from __future__ import annotations

import calendar
import threading
import time

import pytest

from jobs import keys
from jobs.core import lease
from jobs.core.running.context import JobContext
from jobs.enqueue import enqueue
from jobs.usage import budget as budgets
from jobs.usage.meter import Pending, utc_day
from tests.fake_openai import Error

NOW = 1_790_000_000.0  # 14:13 UTC: an hour either side is the same UTC day
DAY = utc_day(NOW)
MIDNIGHT = calendar.timegm(time.gmtime(NOW)[:3] + (0, 0, 0)) + 86400
BEFORE_MIDNIGHT, AFTER_MIDNIGHT = MIDNIGHT - 5.0, MIDNIGHT + 5.0
RATE_KEYS = [keys.model_rate("m", b) for b in ("requests", "tokens", "paused")]


def submit(conn, owner="alice", max_attempts=None, **payload) -> str:
    payload = {"items": ["a", "b", "c"], "labels": ["x", "y"]} | payload
    job_id, _ = enqueue(conn, "classify", payload, owner=owner, max_attempts=max_attempts, now=NOW)
    return job_id


def admit(conn, attempt, tokens, now=NOW):
    return budgets.admit(conn, RATE_KEYS, 0, 0, 0, attempt, tokens, None, now=now)


def settling(admission, **used) -> Pending:
    """The usage write of an admitted call: counted on its day, settling its reservation."""
    return Pending("m", "classify", calls=1, day=admission.day, reservations=[admission.reservation], **used)


def job_tokens(conn, job_id) -> int:
    fields = conn.hmget(keys.job(job_id), "usage_input_tokens", "usage_output_tokens")
    return sum(int(v or 0) for v in fields)


def test_a_zombies_call_in_flight_stays_reserved_so_the_next_attempt_cannot_pass_the_job_budget(conn, env):
    """The first attempt's worker stalls mid-call (lease expires, reaper requeues the job); its
    call is still at the provider and is paid when it answers. The next attempt's first admit
    must not drop that reservation, or both calls run at their worst case under a budget that
    holds one."""
    job_id = submit(conn, budget={"tokens": 250})
    first = lease.claim(conn, job_id, "leash", "w1", now=NOW)
    first_call = admit(conn, first, 200)
    assert first_call.code == budgets.ADMITTED
    assert lease.reclaim(conn, job_id, "leash", "lease expired", now=NOW + 10) == "queued"
    second = lease.claim(conn, job_id, "leash", "w2", now=NOW + 10)
    second_call = admit(conn, second, 200)
    # Both answers come back within their worst case; the zombie's is counted (it was paid).
    with pytest.raises(lease.LeaseLost):
        first.heartbeat(item=(0, '"x"'), now=NOW + 11, usage=settling(first_call, input=150, output=50))
    if second_call.code == budgets.ADMITTED:
        second.heartbeat(item=(0, '"x"'), now=NOW + 11, usage=settling(second_call, input=150, output=50))
    assert job_tokens(conn, job_id) <= 250, f"the job used {job_tokens(conn, job_id)} tokens on a budget of 250"


def test_a_reservation_of_an_attempt_that_never_comes_back_does_not_block_its_owners_other_jobs(conn, env):
    """A job whose worker died mid-call and that then fails for good (no attempts left) is never
    admitted again; its call's reservation must still leave the owner's day once that call can
    no longer answer, or the owner's other jobs are refused for calls nobody is making."""
    env.setenv("LEASH_OWNER_DAILY_TOKENS", "1000")
    dead = submit(conn, max_attempts=1)
    attempt = lease.claim(conn, dead, "leash", "w1", now=NOW)
    assert admit(conn, attempt, 800).code == budgets.ADMITTED  # then the worker is SIGKILLed
    assert lease.reclaim(conn, dead, "leash", "lease expired", now=NOW + 10) == "failed"
    other = submit(conn)
    later = NOW + 3600  # an hour later: no call of the dead attempt can still be running
    other_attempt = lease.claim(conn, other, "leash", "w2", now=later)
    admission = admit(conn, other_attempt, 300, now=later)
    reserved = conn.hget(keys.usage_owner_day("alice", DAY), "reserved_tokens")
    assert admission.code == budgets.ADMITTED, (
        f"owner alice used 0 tokens today and has no call in flight, yet: {admission.refusal} "
        f"(reserved_tokens of the day: {reserved})")


def test_a_call_admitted_before_utc_midnight_and_settled_after_it_frees_none_of_the_new_days_reservations(
        conn, env):
    """A call reserved at 23:59:55 and written at 00:00:05 is settled (and counted) on the day it
    was reserved on: it must not take away the reservation of a call admitted at 00:00:05 that
    is still in flight, or the owner's other job is admitted past the daily budget."""
    env.setenv("LEASH_OWNER_DAILY_TOKENS", "1000")
    new_day = utc_day(AFTER_MIDNIGHT)
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w1", now=BEFORE_MIDNIGHT)
    before = admit(conn, attempt, 600, now=BEFORE_MIDNIGHT)
    assert before.code == budgets.ADMITTED
    after = admit(conn, attempt, 300, now=AFTER_MIDNIGHT)
    assert after.code == budgets.ADMITTED  # in flight
    # The 23:59:55 call answers at 00:00:05 at its worst case and is written with its item.
    attempt.heartbeat(item=(0, '"x"'), now=AFTER_MIDNIGHT, usage=settling(before, input=500, output=100))
    reserved = conn.hget(keys.usage_owner_day("alice", new_day), "reserved_tokens")
    # Today: 600 used + 300 still in flight; another job's 400 would pass 1000.
    other = lease.claim(conn, submit(conn), "leash", "w2", now=AFTER_MIDNIGHT)
    other_call = admit(conn, other, 400, now=AFTER_MIDNIGHT)
    if other_call.code == budgets.ADMITTED:
        other.heartbeat(item=(0, '"y"'), now=AFTER_MIDNIGHT, usage=settling(other_call, input=300, output=100))
    attempt.heartbeat(item=(1, '"z"'), now=AFTER_MIDNIGHT,  # the 00:00:05 call, at its worst case too
                      usage=settling(after, input=200, output=100))
    day = conn.hgetall(keys.usage_owner_day("alice", new_day))
    used = int(day.get(b"input_tokens", 0)) + int(day.get(b"output_tokens", 0))
    assert used <= 1000, (f"owner alice used {used} tokens on {new_day}, its daily budget is 1000 (after the "
                          f"23:59:55 call was settled the day's reserved_tokens read {reserved}, with 300 in flight)")
    assert conn.hget(keys.usage_owner_day("alice", DAY), "input_tokens") == b"500"  # counted on its own day


def test_a_call_retried_after_a_429_is_not_stopped_by_its_own_earlier_reservations(conn, env, model_server):
    """A 429 sends the call through the admission again: it must keep the reservation it has
    rather than reserve its worst case again, or a job with room for one call's worst case
    twice over is stopped with "budget reached" having used nothing."""
    model_server.on("busy", Error(429, "slow down", headers={"retry-after-ms": "10"}), times=2)
    from jobs.models.openai_backend import OpenAIBackend
    from jobs.models.provider import CallRequest

    worst = CallRequest([{"role": "user", "content": "busy"}], 10).worst_case_tokens()
    job_id = submit(conn, budget={"tokens": worst * 5 // 2})  # room for it twice, not thrice
    attempt = lease.claim(conn, job_id, "leash", "w1")

    backend = OpenAIBackend(JobContext(attempt, {}))
    try:
        answer = backend.complete("busy", max_tokens=10)
    except budgets.BudgetReached as exc:
        answer = f"BudgetReached: {exc}"
    assert answer == "echo: busy", f"{answer} (job used {job_tokens(conn, job_id)} tokens)"
    assert int(conn.hget(keys.job(job_id), "in_flight_tokens")) == worst  # one reservation, until the item is written


def test_a_batch_reserved_before_utc_midnight_is_held_against_the_day_its_results_are_counted_on(conn, env):
    """A batch job reserves its worst case on the owner's day it is created on; its results,
    hours later, must be counted on that day too. Counted on the day they are stored, the new
    day would end past the owner's daily budget: it never held that reservation."""
    env.setenv("LEASH_OWNER_DAILY_TOKENS", "1000")
    new_day = utc_day(AFTER_MIDNIGHT)
    batch_job = submit(conn)
    batch_attempt = lease.claim(conn, batch_job, "leash", "w1", now=BEFORE_MIDNIGHT)
    batch = admit(conn, batch_attempt, 900, now=BEFORE_MIDNIGHT)  # the batch is created
    assert batch.code == budgets.ADMITTED
    direct = lease.claim(conn, submit(conn), "leash", "w2", now=AFTER_MIDNIGHT)
    direct_call = admit(conn, direct, 900, now=AFTER_MIDNIGHT)
    # The provider ends the batch after midnight: its results are stored (store_items_v2).
    batch_attempt.store_items([(0, '"x"', "1,800,100")], settling(batch, input=800, output=100), now=AFTER_MIDNIGHT)
    if direct_call.code == budgets.ADMITTED:
        direct.heartbeat(item=(0, '"y"'), now=AFTER_MIDNIGHT, usage=settling(direct_call, input=800, output=100))
    day = conn.hgetall(keys.usage_owner_day("alice", new_day))
    used = int(day.get(b"input_tokens", 0)) + int(day.get(b"output_tokens", 0))
    assert used <= 1000, f"owner alice used {used} tokens on {new_day}; its daily budget is 1000"


def test_many_threads_admitted_at_once_never_pass_a_job_budget_or_an_owners_daily_budget(conn, env):
    """Calls of a zombie attempt and of the attempt after it, and of the owner's other jobs, all
    asking at once: what is admitted fits the job's budget and the owner's day."""
    env.setenv("LEASH_OWNER_DAILY_TOKENS", "2000")
    job_id = submit(conn, budget={"tokens": 1000})
    zombie = lease.claim(conn, job_id, "leash", "w1", now=NOW)
    admitted: list[tuple[str, int]] = []
    lock = threading.Lock()

    def ask(attempt, tokens: int) -> None:
        if admit(conn, attempt, tokens).code == budgets.ADMITTED:
            with lock:
                admitted.append((attempt.job_id, tokens))

    def storm(calls: list[tuple]) -> None:
        threads = [threading.Thread(target=ask, args=call) for call in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)

    storm([(zombie, 100)] * 6)  # then its worker stalls: the lease goes, its calls may still answer
    assert lease.reclaim(conn, job_id, "leash", "lease expired", now=NOW + 10) == "queued"
    successor = lease.claim(conn, job_id, "leash", "w2", now=NOW + 10)
    others = [lease.claim(conn, submit(conn), "leash", f"w{i}", now=NOW) for i in range(3)]
    storm([(successor, 100)] * 12 + [(other, 150) for other in others for _ in range(6)])
    for_job = sum(tokens for job, tokens in admitted if job == job_id)
    assert for_job <= 1000, f"the job's calls reserved {for_job} tokens at once on a budget of 1000"
    for_owner = sum(tokens for _, tokens in admitted)
    assert 2000 - 150 < for_owner <= 2000, f"the owner's calls reserved {for_owner} tokens on a daily budget of 2000"
    assert int(conn.hget(keys.usage_owner_day("alice", DAY), "reserved_tokens")) == for_owner
    assert int(conn.hget(keys.job(job_id), "in_flight_tokens")) == for_job


def test_a_settle_sent_again_gives_nothing_back_twice_and_expired_reservations_are_pruned_a_few_at_a_time(
        conn, env):
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w1", now=NOW)
    calls = [admit(conn, attempt, 10) for _ in range(25)]  # their worker dies
    day_key = keys.usage_owner_day("alice", DAY)
    assert conn.hget(day_key, "reserved_tokens") == b"250"
    attempt.heartbeat(item=(0, '"x"'), now=NOW, usage=settling(calls[0], input=5, output=1))
    budgets_flush = Pending("m", "classify", day=DAY, reservations=[calls[0].reservation])
    attempt.heartbeat(item=(1, '"y"'), now=NOW, usage=budgets_flush)  # the same reservation named again
    assert conn.hget(day_key, "reserved_tokens") == b"240" and conn.hget(keys.job(job_id), "in_flight_tokens") == b"240"
    later = NOW + 3600
    other = lease.claim(conn, submit(conn), "leash", "w2", now=later)
    admit(conn, other, 7, now=later)  # gives back at most PRUNED_PER_ADMISSION expired ones
    assert conn.zcard(keys.owner_reservations("alice")) == 24 - budgets.PRUNED_PER_ADMISSION + 1
    admit(conn, other, 7, now=later)
    assert conn.hget(day_key, "reserved_tokens") == b"14" and conn.hget(keys.job(job_id), "in_flight_tokens") == b"0"
    assert conn.hlen(keys.owner_reservation_records("alice")) == 2
    assert 0 < conn.ttl(keys.owner_reservations("alice")) and 0 < conn.ttl(keys.owner_reservation_records("alice"))


def _reserve_as_the_release_before(conn, job_id: str, token: str, tokens: int, day_key: str) -> None:
    """An admitted call's reservation as the release before wrote it: one pool in the job hash,
    owned by the attempt's token, on its UTC day, and added to the owner's day (no price known)."""
    pipe = conn.pipeline(transaction=True)
    pipe.hset(keys.job(job_id), mapping={"reserved_tokens": tokens, "reserved_nusd": 0, "reserved_by": token,
                                         "reserved_day": DAY})
    pipe.hincrby(day_key, "reserved_tokens", tokens)
    pipe.expire(day_key, 3600)
    pipe.execute()


def test_a_reservation_made_by_a_worker_of_the_release_before_is_given_back_once_as_then(conn, env):
    """During a deploy a job may hold the earlier release's reservation (one pool in the job
    hash, as model_admit_v1 wrote it): the next attempt's first admission gives it back to its day, and a
    pool the writing attempt holds (a batch parked by the earlier release) goes with its write."""
    env.setenv("LEASH_OWNER_DAILY_TOKENS", "1000")
    day_key = keys.usage_owner_day("alice", DAY)
    job_id = submit(conn)
    old = lease.claim(conn, job_id, "leash", "w1", now=NOW)
    _reserve_as_the_release_before(conn, job_id, old.token, 700, day_key)
    assert conn.hget(day_key, "reserved_tokens") == b"700"
    assert lease.reclaim(conn, job_id, "leash", "lease expired", now=NOW + 10) == "queued"
    new = lease.claim(conn, job_id, "leash", "w2", now=NOW + 10)
    assert admit(conn, new, 600, now=NOW + 10).code == budgets.ADMITTED  # 700 + 600 would pass 1000
    assert conn.hget(day_key, "reserved_tokens") == b"600" and conn.hget(keys.job(job_id), "reserved_by") is None

    parked = submit(conn)
    looking = lease.claim(conn, parked, "leash", "w3", now=NOW)
    _reserve_as_the_release_before(conn, parked, looking.token, 300, day_key)
    looking.store_items([(0, '"x"', "1,100,20")], Pending("m", "classify", calls=1, input=100, output=20), now=NOW)
    assert conn.hget(day_key, "reserved_tokens") == b"600" and conn.hget(keys.job(parked), "reserved_by") is None


def test_calls_of_one_thread_wait_apart_per_day_and_an_items_earlier_calls_stay_reserved_while_it_calls_again(
        conn, env):
    from jobs.usage.meter import Meter

    meter = Meter("classify")
    meter.reserved("m", "r1", "2026-01-01")
    meter.record("m", 10, 2)
    meter.reserved("m", "r1", "2026-01-01")  # sent again after a 429: named once
    meter.reserved("m", "r2", "2026-01-02")  # admitted after midnight
    meter.record("m", 5, 1)
    assert meter.reservations("m") == ["r2"]
    written = {p.day: (p.calls, p.input, p.reservations) for p in meter.take_all()}
    assert written == {"2026-01-01": (1, 10, ["r1"]), "2026-01-02": (1, 5, ["r2"])}

    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w1", now=NOW)
    first = admit(conn, attempt, 10)
    hold = budgets.call_hold(60 + 10, attempt)
    later = NOW + hold - 1  # the item's first call answered long ago; its second is admitted now
    second = budgets.admit(conn, RATE_KEYS, 0, 0, 0, attempt, 10, None, now=later, extend=[first.reservation])
    assert second.code == budgets.ADMITTED
    assert conn.zscore(keys.owner_reservations("alice"), first.reservation) == later + hold


def test_an_items_calls_of_the_day_before_are_written_with_the_next_item_not_at_the_attempts_end(conn, env):
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w1", now=BEFORE_MIDNIGHT)
    ctx = JobContext(attempt, {})
    before = admit(conn, attempt, 50, now=BEFORE_MIDNIGHT)
    ctx.meter.reserved("m", before.reservation, before.day)
    ctx.meter.record("m", 30, 10)
    after = admit(conn, attempt, 50, now=AFTER_MIDNIGHT)  # the item's next call, after midnight
    ctx.meter.reserved("m", after.reservation, after.day)
    ctx.meter.record("m", 20, 5)
    ctx.checkpoint(0, "x")
    assert conn.hget(keys.usage_owner_day("alice", DAY), "input_tokens") == b"30"
    assert conn.hget(keys.usage_owner_day("alice", utc_day(AFTER_MIDNIGHT)), "input_tokens") == b"20"
    assert conn.zcard(keys.owner_reservations("alice")) == 0 and conn.hget(keys.job(job_id), "in_flight_tokens") == b"0"
