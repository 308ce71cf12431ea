"""Items many at once, in process against a real Redis: ``ctx.for_each`` with threads, the fenced
write from any thread, what stops a batch, the adaptive limit's arithmetic, and max_tokens."""

from __future__ import annotations

import threading
import time

import pytest

from jobs import keys, kinds, runner
from jobs.core import control, lease
from jobs.core.running.context import JobContext
from jobs.core.running.items import NotStarted
from jobs.enqueue import enqueue
from jobs.errors import Canceled, HandOff, InvalidJob, ItemError, LeaseLost
from jobs.models.backends import get_backend
from jobs.models.concurrency import PROBE_ROUNDS, ConcurrencyGate, SharedLimit, snapshot
from jobs.models.openai_backend import ModelUnavailable, OpenAIBackend
from tests.conftest import wait_for
from tests.fake_openai import MODEL, Error, Reply, Slow


def _running(conn, items: list[str], **payload) -> tuple[lease.Attempt, JobContext]:
    job_id, _ = enqueue(conn, "count", {"items": items, **payload})
    attempt = lease.claim(conn, job_id, "leash", "test-worker")
    assert attempt is not None
    return attempt, JobContext(attempt, {"items": items, **payload})


def _stored(conn, job_id) -> set[int]:
    return {int(k) for k in conn.hkeys(keys.items(job_id))}


class Gates:
    """Items that block until the test lets them through, recording how many ran at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.started: list[str] = []
        self.release = threading.Event()

    def __call__(self, item: str) -> str:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.started.append(item)
        self.release.wait(10)
        with self.lock:
            self.running -= 1
        return item.upper()


def test_for_each_runs_up_to_the_limit_at_once_and_returns_results_in_order(conn, env):
    env.setenv("LEASH_ITEM_CONCURRENCY", "4")
    items = [f"i{n}" for n in range(10)]
    attempt, ctx = _running(conn, items)
    gates = Gates()
    out: list = []
    worker = threading.Thread(target=lambda: out.append(ctx.for_each(items, gates)))
    worker.start()
    wait_for(lambda: gates.running == 4, 5, message="four items running")
    time.sleep(0.2)  # a fifth would have started by now if the limit leaked
    assert gates.running == 4 and _stored(conn, attempt.job_id) == set()
    gates.release.set()
    worker.join(10)
    assert out == [[item.upper() for item in items]]
    assert gates.most == 4
    assert conn.hget(keys.job(attempt.job_id), "done") == b"10"


def test_a_kind_or_a_job_may_ask_for_fewer_items_at_once(conn, env):
    env.setenv("LEASH_ITEM_CONCURRENCY", "8")
    _, ctx = _running(conn, ["a"], item_concurrency=3)
    assert ctx.item_concurrency() == 3
    assert ctx.item_concurrency(2) == 2
    assert ctx.item_concurrency(50) == 3  # never more than the job or the worker allows
    with pytest.raises(InvalidJob, match="'item_concurrency' must be a positive integer"):
        enqueue(conn, "count", {"items": ["a"], "item_concurrency": 0})


def test_items_are_stored_as_they_finish_and_done_counts_stored_items(conn, env):
    env.setenv("LEASH_ITEM_CONCURRENCY", "4")
    items = ["slow", "b", "c", "d"]
    attempt, ctx = _running(conn, items)
    slow_may_finish = threading.Event()

    def work(item):
        if item == "slow":
            slow_may_finish.wait(10)
        return item

    worker = threading.Thread(target=ctx.for_each, args=(items, work))
    worker.start()
    wait_for(lambda: _stored(conn, attempt.job_id) == {1, 2, 3}, 5, message="the fast items stored first")
    assert conn.hget(keys.job(attempt.job_id), "done") == b"3"  # stored items, not launched ones
    slow_may_finish.set()
    worker.join(10)
    assert _stored(conn, attempt.job_id) == {0, 1, 2, 3}


def test_results_redis_lost_after_they_were_stored_are_stored_again_before_the_job_ends(conn, env, monkeypatch):
    """A failover loses the writes the replica had not received, while the attempt goes on under
    the new primary: before it ends, what it stored and Redis no longer holds is stored again."""
    items = [f"i{n}" for n in range(6)]
    attempt, ctx = _running(conn, items)
    results = ctx.for_each(items, lambda item: item.upper())
    conn.hdel(keys.items(attempt.job_id), "1", "4")  # acknowledged, then lost with the old primary
    assert ctx.restore_lost_items() == 2
    assert {int(k): v for k, v in conn.hgetall(keys.items(attempt.job_id)).items()} == {
        n: f'"{r}"'.encode() for n, r in enumerate(results)}
    assert conn.hget(keys.job(attempt.job_id), "done") == b"6"
    assert ctx.restore_lost_items() == 0  # nothing lost: one read, no write

    # The runner does it before every finish: a job never succeeds without what it stored.
    job_id, _ = enqueue(conn, "count", {"items": items, "delay": 0})
    claimed = lease.claim(conn, job_id, "leash", "test-worker")

    def run_then_lose_one(ctx_, payload):
        out = ctx_.for_each(payload["items"], lambda item: item)
        conn.hdel(keys.items(job_id), "0")
        return {"items": len(out)}

    monkeypatch.setattr(kinds.KINDS["count"], "func", run_then_lose_one)
    runner.execute("count", {"items": items, "delay": 0}, attempt=claimed)
    assert conn.hget(keys.job(job_id), "state") == b"succeeded"
    assert conn.hlen(keys.items(job_id)) == 6


def test_a_resumed_batch_skips_every_stored_item(conn, env):
    items = [f"i{n}" for n in range(6)]
    attempt, ctx = _running(conn, items)
    for index in (0, 2, 5):
        ctx.checkpoint(index, f"earlier {index}")
    ran: list[str] = []
    results = ctx.for_each(items, lambda item: ran.append(item) or item)
    assert sorted(ran) == ["i1", "i3", "i4"]
    assert results == ["earlier 0", "i1", "earlier 2", "i3", "i4", "earlier 5"]


def _for_each_in_thread(ctx, items, fn) -> tuple[threading.Thread, list[BaseException]]:
    """``ctx.for_each(items, fn)`` started on a thread; the list gets what it raised."""
    raised: list[BaseException] = []

    def run():
        try:
            ctx.for_each(items, fn)
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    return worker, raised


def test_a_lost_lease_stops_launching_and_every_thread_s_write_is_refused(conn, env):
    env.setenv("LEASH_ITEM_CONCURRENCY", "3")
    items = [f"i{n}" for n in range(9)]
    attempt, ctx = _running(conn, items)
    gates = Gates()
    worker, raised = _for_each_in_thread(ctx, items, gates)
    wait_for(lambda: gates.running == 3, 5)
    rejected_before = int(conn.get(keys.REJECTED_WRITES) or 0)
    lease.reclaim(conn, attempt.job_id, "leash", "taken back by the test", token=attempt.token)
    gates.release.set()
    worker.join(10)
    assert len(raised) == 1 and isinstance(raised[0], LeaseLost)
    assert len(gates.started) == 3, "an item started after the lease was lost"
    assert _stored(conn, attempt.job_id) == set()
    assert int(conn.get(keys.REJECTED_WRITES)) - rejected_before == 3  # one refused write per thread


@pytest.mark.parametrize("stop, raised", [("cancel", Canceled), ("handoff", HandOff)])
def test_a_cancel_or_hand_off_stops_launching_and_stores_what_was_in_flight(conn, env, stop, raised):
    env.setenv("LEASH_ITEM_CONCURRENCY", "3")
    items = [f"i{n}" for n in range(9)]
    attempt, ctx = _running(conn, items)
    gates = Gates()
    worker, errors = _for_each_in_thread(ctx, items, gates)
    wait_for(lambda: gates.running == 3, 5)
    if stop == "cancel":
        control.cancel(conn, attempt.job_id)
    else:
        attempt.handoff_requested = True  # what the work-horse's SIGTERM handler does
    gates.release.set()
    worker.join(10)
    assert len(errors) == 1 and isinstance(errors[0], raised)
    assert len(gates.started) == 3, "an item started after the stop"
    assert _stored(conn, attempt.job_id) == {0, 1, 2}, "the calls in flight were not stored"
    assert conn.hget(keys.job(attempt.job_id), "state") == b"running"  # the runner decides what follows


def test_an_item_that_raises_stops_the_batch_after_the_others_in_flight_are_stored(conn, env):
    env.setenv("LEASH_ITEM_CONCURRENCY", "4")
    items = ["a", "b", "bad", "d", "e", "f", "g", "h"]
    attempt, ctx = _running(conn, items)

    def work(item):
        if item == "bad":
            raise ModelUnavailable("the model server failed (500)")
        time.sleep(0.2)
        return item

    with pytest.raises(ModelUnavailable):
        ctx.for_each(items, work)
    # "a" and "b" were in flight when "bad" failed: they finish and are stored; "d" may have been
    # launched beside them; nothing after the first four.
    assert {0, 1} <= _stored(conn, attempt.job_id) <= {0, 1, 3}


def test_one_keepalive_thread_serves_the_whole_batch(conn, env):
    env.setenv("LEASH_ITEM_CONCURRENCY", "8")
    items = [f"i{n}" for n in range(8)]
    _, ctx = _running(conn, items)
    seen_threads: set[int] = set()

    def work(item):
        with ctx.keepalive(timeout=30):
            seen_threads.add(sum(1 for t in threading.enumerate() if t.name.startswith("leash-keepalive")))
            time.sleep(0.2)
        return item

    ctx.for_each(items, work)
    assert seen_threads == {1}
    assert not any(t.name.startswith("leash-keepalive") for t in threading.enumerate())


def test_a_wait_inside_a_stopping_batch_gives_up_before_its_call(conn, env):
    _, ctx = _running(conn, ["a"])
    from jobs.core.running.items import Renewer, StopReason

    stop = StopReason()
    with Renewer(ctx, stop.record) as renewer:
        ctx.enter_items(stop, renewer)
        stop.record(Canceled())
        with pytest.raises(NotStarted):
            ctx.sleep(5)
        ctx.leave_items()


# --- the adaptive limit --------------------------------------------------------------------

def test_an_overload_halves_the_limit_once_per_round_and_clean_answers_grow_it_back(conn):
    shared = SharedLimit(conn, "m", ceiling=16)
    assert shared.read()[:2] == (16, 0)
    # A burst of 429s from calls that all started under limit 16 (epoch 0): one halving.
    assert shared.overloaded(0, "429")[:2] == (8, 1)
    assert shared.overloaded(0, "429")[:2] == (8, 1)
    assert shared.overloaded(1, "timeout")[:2] == (4, 2)  # the last overload was at 8
    # A window is one round: `limit` clean answers.
    for _ in range(3):
        assert shared.answered()[0] == 4
    assert shared.answered()[:] == (5, 2, 3)  # three changes so far: 16 -> 8 -> 4 -> 5
    for _ in range(5 + 6):
        shared.answered()
    assert shared.read()[0] == 7
    # The step back up to the level that hurt (8) takes PROBE_ROUNDS rounds.
    for _ in range(7 * PROBE_ROUNDS - 1):
        shared.answered()
    assert shared.read()[0] == 7
    assert shared.answered()[0] == 8
    # Past it, the server took more: quick growth again.
    for _ in range(8):
        shared.answered()
    assert shared.read()[0] == 9
    assert shared.overloaded(2, "429")[:2] == (5, 3)  # halving rounds up: 9 -> 5
    [model] = snapshot(conn)
    assert (model.model, model.limit, model.rate_limited, model.timed_out) == ("m", 5, 3, 1)


def test_the_limit_never_grows_past_the_callers_ceiling(conn):
    shared = SharedLimit(conn, "m", ceiling=2)
    for _ in range(10):
        assert shared.answered()[0] == 2


def test_a_gate_holds_calls_beyond_the_shared_limit_and_learns_a_halving_from_another_job(conn):
    one = ConcurrencyGate(SharedLimit(conn, "m", ceiling=4), "job-1")
    other = ConcurrencyGate(SharedLimit(conn, "m", ceiling=4), "job-2")
    epochs = [one.acquire() for _ in range(4)]
    blocked = threading.Event()
    threading.Thread(target=lambda: (one.acquire(), blocked.set()), daemon=True).start()
    assert not blocked.wait(0.3)
    other.release(other.acquire(), "429")  # another job's call was refused: 4 -> 2 for everyone
    one.release(epochs[0], "ok")  # this job learns it from its next answer
    assert one.width() == 2
    assert not blocked.wait(0.3)  # 3 still in flight, limit 2
    for epoch in epochs[1:]:
        one.release(epoch, "ok")
    assert blocked.wait(2)


def test_a_waiting_call_gives_up_when_its_batch_stops(conn):
    gate = ConcurrencyGate(SharedLimit(conn, "m", ceiling=1))
    gate.acquire()
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(NotStarted):
        gate.acquire(stopping)


# --- calls to the model ----------------------------------------------------------------------

def test_every_call_asks_for_at_most_max_tokens_and_classify_for_few(conn, provider_server, env):
    get_backend().complete("x")
    assert provider_server.seen("x")[-1].body["max_tokens"] == 1024
    env.setenv("LEASH_MODEL_MAX_TOKENS", "100")
    get_backend().complete("y")
    assert provider_server.seen("y")[-1].body["max_tokens"] == 100
    get_backend().classify("great -> positive", ["positive", "negative"])
    assert provider_server.seen("great -> positive")[-1].body["max_tokens"] == 32


def test_an_answer_cut_off_at_max_tokens_is_an_item_error_unless_truncation_is_fine(conn, provider_server, env):
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    cut_off = provider_server.cut_off  # "length" (OpenAI), "max_tokens" (Anthropic)
    provider_server.on("story", Reply("Once upon a time", finish_reason=cut_off), times=2)
    with pytest.raises(ItemError, match="answer cut off at max_tokens=64; raise LEASH_MODEL_MAX_TOKENS"):
        get_backend().complete("story")
    assert get_backend().complete("story", truncation_ok=True) == "Once upon a time"
    provider_server.on("ok?", Reply("positive", finish_reason=cut_off))
    assert get_backend().classify("ok?", ["positive", "negative"]) == "positive"


def test_a_server_that_wants_max_completion_tokens_gets_it(conn, model_server):
    model_server.on("x", Error(400, "Unsupported parameter: 'max_tokens' is not supported with this model. "
                                    "Use 'max_completion_tokens' instead.", code="unsupported_parameter"))
    assert OpenAIBackend().complete("x") == "echo: x"
    refused, answered = model_server.seen("x")
    assert "max_tokens" in refused.body and answered.body.get("max_completion_tokens") == 1024
    assert "max_tokens" not in answered.body


def test_a_429_and_a_timeout_halve_the_models_limit(conn, provider_server, env):
    env.setenv("LEASH_ITEM_CONCURRENCY", "8")
    env.setenv("LEASH_MODEL_TIMEOUT", "0.5")
    provider_server.on("busy", Error(429, "slow down", headers={"retry-after-ms": "10"}))
    assert get_backend().complete("busy") == "echo: busy"
    assert conn.hget(keys.model_concurrency(MODEL), "limit") == b"4"
    provider_server.on("hang", Slow(3))
    with pytest.raises(ModelUnavailable, match="timed out"):
        get_backend().complete("hang")
    assert conn.hget(keys.model_concurrency(MODEL), "limit") == b"2"


def test_a_gate_keeps_the_newest_limit_when_replies_arrive_out_of_order(conn):
    from jobs.models.concurrency import Reading

    gate = ConcurrencyGate(SharedLimit(conn, "m", ceiling=16))
    gate._learn(Reading(limit=7, epoch=1, version=5), cause="")
    gate._learn(Reading(limit=6, epoch=1, version=4), cause="")  # sent earlier by another thread
    assert gate.width() == 7


def test_the_api_refuses_a_bad_item_concurrency_with_a_clear_error(env, conn):
    from tests.web_support import CLASSIFY, create_app_with

    client = create_app_with().test_client()
    refused = client.post("/jobs", json={**CLASSIFY, "item_concurrency": "lots"})
    assert refused.status_code in (400, 422) and "item_concurrency" in refused.get_json()["error"]
    accepted = client.post("/jobs", json={**CLASSIFY, "item_concurrency": 2})
    assert accepted.status_code == 202


def test_a_blank_first_label_gets_the_correction_from_every_provider(conn, provider_server):
    # Anthropic refuses a blank assistant turn (400): the correction must still be sendable.
    provider_server.on("fine -> positive", Reply(" "))
    assert get_backend().classify("fine -> positive", ["positive", "negative"]) == "positive"
    first, second = provider_server.seen("fine -> positive")
    assert "is not one of the labels" in second.last
