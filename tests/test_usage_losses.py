"""A call the provider answered is counted even when what follows it fails: a Redis blip on the
limits' bookkeeping, a cancel the keepalive learns as the call ends, an item write that gives up.
And what a replay or /metrics says about money matches what was asked and spent. Real Redis, and
the loopback OpenAI-compatible server (tests/fake_openai.py) for the call loop."""

from __future__ import annotations

import pytest
import redis

from jobs import keys
from jobs.core import control, lease
from jobs.core.running.context import JobContext
from jobs.deadletter.replayer import Candidate, replay
from jobs.enqueue import enqueue
from jobs.errors import Canceled
from jobs.lifecycle import scripts
from jobs.models import concurrency, rate
from jobs.models.openai_backend import OpenAIBackend
from jobs.usage.budget import Budget
from jobs.usage.meter import Pending
from tests.fake_openai import Slow

NOW = 1_790_000_000.0


def submit(conn, **payload) -> str:
    job_id, _ = enqueue(conn, "classify", {"items": ["a", "b", "c"], "labels": ["x", "y"]} | payload,
                        owner="alice", now=NOW)
    return job_id


def counted_calls(conn, job_id) -> int:
    return int(conn.hget(keys.job(job_id), "usage_calls") or 0)


def _blip(*args, **kwargs):
    raise redis.exceptions.ConnectionError("Connection reset by peer")


@pytest.mark.parametrize("blip_at", ["the concurrency gate's report", "the TPM limit's spend"])
def test_an_answer_is_kept_and_counted_when_redis_blips_on_the_limits_bookkeeping_after_it(
        conn, env, model_server, monkeypatch, blip_at):
    if blip_at == "the TPM limit's spend":
        env.setenv("LEASH_MODEL_TPM", "1000000")
        monkeypatch.setattr(rate.ModelRateLimit, "spend", _blip)
    else:
        monkeypatch.setattr(concurrency.SharedLimit, "answered", _blip)
    job_id = submit(conn)
    ctx = JobContext(lease.claim(conn, job_id, "leash", "w1"), {})
    answer = OpenAIBackend(ctx).complete("hello", max_tokens=10)
    assert answer  # the answer the provider billed is used, not thrown away for a bookkeeping write
    ctx.flush_usage(all_threads=True)
    assert (len(model_server.billed), counted_calls(conn, job_id)) == (1, 1)


def test_a_call_answered_while_its_keepalive_learned_of_a_cancel_is_counted(conn, env, model_server):
    model_server.on("slow", Slow(1.5))  # longer than a keepalive round (a third of the 2 s lease)
    job_id = submit(conn)
    ctx = JobContext(lease.claim(conn, job_id, "leash", "w1"), {})
    backend = OpenAIBackend(ctx)
    control.cancel(conn, job_id)  # the owner cancels while the call runs
    with pytest.raises(Canceled):
        backend.complete("slow", max_tokens=10)
    ctx.flush_usage(all_threads=True)  # what runner.execute does before recording the cancel
    assert (len(model_server.billed), counted_calls(conn, job_id)) == (1, 1)


def test_an_item_whose_write_gave_up_has_its_calls_counted_once_by_the_closing_flush(conn, env, monkeypatch):
    job_id = submit(conn)
    ctx = JobContext(lease.claim(conn, job_id, "leash", "w1"), {"items": ["a"]})
    real, state = scripts.run, {"away": True, "landed_first": False}

    def run(connection, name, *args, **kwargs):
        if name == "heartbeat_v4" and state["away"]:
            if state["landed_first"]:
                real(connection, name, *args, **kwargs)  # it landed; the reply, and Redis, went away
            raise redis.exceptions.ConnectionError("Connection refused")
        return real(connection, name, *args, **kwargs)

    monkeypatch.setattr(scripts, "run", run)
    monkeypatch.setattr(ctx.attempt, "lease_seconds", 0.3)  # how long a write rides out a blip
    ctx.meter.record("m", 100, 10)  # the item's model call answered
    with pytest.raises(redis.exceptions.ConnectionError):
        ctx.checkpoint(0, "x")
    state["away"] = False  # Redis is back when the attempt ends (runner.execute's finally)
    ctx.flush_usage(all_threads=True)
    assert counted_calls(conn, job_id) == 1  # the write never landed: the flush counted it

    # The same, but the first try landed before Redis went away: still counted once.
    state.update(away=True, landed_first=True)
    ctx.meter.record("m", 100, 10)
    with pytest.raises(redis.exceptions.ConnectionError):
        ctx.checkpoint(1, "y")
    state["away"] = False
    ctx.flush_usage(all_threads=True)
    assert counted_calls(conn, job_id) == 2
    assert conn.hget(keys.items(job_id), "1") == b'"y"'


def test_a_replay_that_skips_a_job_leaves_its_budget_as_it_was(conn, env):
    job_id = submit(conn, budget={"tokens": 250})
    assert lease.claim(conn, job_id, "leash", "w1", now=NOW) is not None  # running again already
    outcome = replay(conn, [Candidate(job_id, "classify", NOW, "budget reached")], "ops", {},
                     now=NOW, budget=Budget(tokens=1_000_000))
    assert [skipped for skipped, _ in outcome.skipped] == [job_id]
    assert conn.hget(keys.job(job_id), "budget_tokens") == b"250"


def test_a_replay_with_a_budget_writes_it_onto_the_jobs_it_replays(conn, env):
    job_id = submit(conn, budget={"tokens": 250})
    attempt = lease.claim(conn, job_id, "leash", "w1", now=NOW)
    assert attempt.fail("budget reached", permanent=True, now=NOW) == "failed"
    outcome = replay(conn, [Candidate(job_id, "classify", NOW, "budget reached")], "ops", {},
                     now=NOW, budget=Budget(tokens=10**15, usd=2_000_000.0))
    assert [c.job_id for c in outcome.replayed] == [job_id]
    fields = conn.hmget(keys.job(job_id), "state", "budget_tokens", "budget_nusd")
    # Large figures are written whole (never as 1e+15).
    assert fields == [b"queued", b"1000000000000000", b"2000000000000000"]


def test_metrics_show_the_tokens_of_a_model_used_only_through_its_batch_api(conn, client):
    job_id = submit(conn)
    attempt = lease.claim(conn, job_id, "leash", "w1")
    attempt.store_items([(0, '"x"', "1,1000,10")], Pending("batch-model", "classify", calls=1, input=1000,
                                                            output=10, nusd=150_000))
    text = client.get("/metrics").data.decode()
    assert 'leash_model_tokens_total{direction="input",model="batch-model"} 1000.0' in text
