"""Money where features cross: kinds (classify, prompt, extract) x modes (direct, batch) x
budgets (none, the job's tokens, the job's USD, the owner's day) x the request cache (cold,
warm: the same job twice, with failures: answers thrown away, then the model fixed and the
job run again), against the stand-in provider that bills every answer (direct and batch).
Every cell checks the same four things: what was billed is what was counted, no budget was
passed, no request was asked twice (but those whose answer was thrown away, once each, by the
re-run that follows the fix), and every stored result is the right one.

The 12 cells cover every pair of those four dimensions (not the 216 of the full product); the
batch cells (a provider batch per part, looked at every 0.5 s) run in the slow lane. Faults
run in cells of their own: a worker and its work-horse SIGKILLed with calls held at the
provider (which bills them all the same: it finishes generating for no one), with no budget,
a job's token budget and an owner's day -- the killed calls are counted, as estimated calls,
before the job reads ended, so their tokens are checked within 10 %, their count exactly; and
the test's own Redis restarted mid-job while answers are delivered (they are counted once,
never asked again). Figures per cell: docs/BENCHMARKS.md."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import psutil
import pytest
import redis

from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from jobs.models.structured import DEFAULT_TEMPLATE
from jobs.usage.meter import utc_day
from tests.conftest import BATCH_POLL, run_burst, wait_for
from tests.fake_openai import Reply
from tests.fake_schema import schema_value
from tests.test_items_workers import ended, stored
from tests.test_redis_outage import own_redis  # noqa: F401  (a Redis of the test's own, restartable)

PRICES = '{"fake-model": {"input": 1.0, "output": 2.0, "batch": 0.5}}'
LABELS = ["positive", "negative"]
SCHEMA = {"type": "object", "additionalProperties": False,
          "properties": {"product": {"type": "string"}, "stars": {"type": "integer"}},
          "required": ["product", "stars"]}
TEMPLATE = "Say it back: {item}"
ITEMS = 24
FAILING = (3, 10, 17)  # the items whose answers are thrown away in a "failures" cell's first run
#: Budgets that bind: less than a job of 24 items needs (a few worst cases of a call).
BUDGET_TOKENS = 900
BUDGET_USD = 0.0012
FOLLOW = 120  # seconds run_burst follows a batch job's looks: one part after another under a budget

CELLS = [
    ("classify", "direct", "none", "cold"),
    ("prompt", "direct", "none", "warm"),
    ("extract", "batch", "none", "failures"),
    ("prompt", "direct", "tokens", "cold"),
    ("extract", "direct", "tokens", "warm"),
    ("extract", "direct", "usd", "cold"),
    ("classify", "direct", "usd", "warm"),
    ("prompt", "batch", "usd", "failures"),
    ("extract", "direct", "owner_day", "failures"),
    ("classify", "batch", "tokens", "failures"),
    ("classify", "batch", "owner_day", "cold"),
    ("prompt", "batch", "owner_day", "warm"),
]


def cell_id(cell) -> str:
    return "-".join(cell)


def texts(kind: str) -> list[str]:
    if kind == "classify":
        return [f"review {i:02d}: the kettle is fine -> positive" for i in range(ITEMS)]
    return [f"review {i:02d} of kettle{i}: fine, a little loud" for i in range(ITEMS)]


def first_message(kind: str, item: str) -> str:
    """The first user message of an item's first request (the stand-in's rules key on it)."""
    if kind == "prompt":
        return TEMPLATE.replace("{item}", item)
    if kind == "extract":
        return DEFAULT_TEMPLATE.replace("{item}", item)
    return item


def expected(kind: str, item: str):
    if kind == "classify":
        return "positive"
    if kind == "prompt":
        return f"echo: {first_message(kind, item)}"
    return schema_value(SCHEMA, first_message(kind, item))


def payload(kind: str, mode: str, budget: str) -> dict:
    body: dict = {"items": texts(kind)}
    if kind == "classify":
        body["labels"] = LABELS
    elif kind == "prompt":
        body["template"] = TEMPLATE
    else:
        body.update(schema=SCHEMA, max_invalid=ITEMS)
    if mode == "batch":
        body["mode"] = "batch"
    if budget == "tokens":
        body["budget"] = {"tokens": BUDGET_TOKENS}
    elif budget == "usd":
        body["budget"] = {"usd": BUDGET_USD}
    return body


def break_answers(server, kind: str) -> None:
    """The failing items' answers are thrown away: off-label twice (classify), cut off at
    max_tokens (prompt), not JSON through the repair (extract)."""
    for i in FAILING:
        item = first_message(kind, texts(kind)[i])
        if kind == "classify":
            server.on(item, Reply("it is hard to say"), times=2)
        elif kind == "prompt":
            server.on(item, Reply("word " * 200))
        else:
            server.on(item, Reply("not json"), times=2)


def sent(server) -> list[str]:
    """Every request the stand-in ran (direct, and in batches: not those of a batch canceled
    before it ran them, which cost nothing), as its messages and max_tokens."""
    with server.lock:
        bodies = [s.body for s in server.requests]
    with server.batches.lock:
        bodies += [body for batch in server.batches.batches.values() for name, body in batch.requests
                   if batch.results.get(name) is not None]
    return [json.dumps([b.get("messages"), b.get("max_tokens") or b.get("max_completion_tokens")], sort_keys=True)
            for b in bodies]


def billed(server) -> tuple[int, int, int]:
    """(calls, prompt, completion tokens) billed, direct and batch."""
    with server.lock, server.batches.lock:
        every = list(server.billed) + list(server.batches.batch_billed)
    return len(every), sum(p for p, _ in every), sum(c for _, c in every)


def run_job(conn, kind: str, body: dict, mode: str) -> dict:
    job_id, _ = enqueue(conn, kind, body, owner="dana")
    run_burst(follow=FOLLOW if mode == "batch" else 0)
    return ended(conn, job_id, timeout=120) | {"job_id": job_id}


def check_run(conn, server, kind: str, budget: str, final: dict, before: tuple[int, int, int],
              thrown_away: set[int], abandoned: int = 0) -> dict:
    """The four checks on one run; returns its figures. ``abandoned``: calls killed in flight,
    billed by the provider and counted as estimates (their tokens within 10 %)."""
    after = billed(server)
    paid = tuple(a - b for a, b in zip(after, before, strict=True))
    usage = final["usage"]
    if abandoned:
        # Every call billed is counted; a call the killed work-horse had admitted (reserved) but not
        # yet sent is counted too, as an estimate: nothing tells it from one the provider is answering.
        assert paid[0] <= usage["calls"] <= paid[0] + 8 and usage["estimated_calls"] >= abandoned, (usage, paid)
        assert paid[1] + paid[2] <= (usage["input_tokens"] + usage["output_tokens"]) * 1.1, (usage, paid)
    else:
        assert (usage["calls"], usage["input_tokens"], usage["output_tokens"]) == paid, (usage, paid)
    tokens = max(usage["input_tokens"] + usage["output_tokens"], paid[1] + paid[2])
    share = None
    if budget == "tokens":
        share = tokens / BUDGET_TOKENS
    elif budget == "usd":
        share = (final["cost_usd"] or 0) / BUDGET_USD
    elif budget == "owner_day":
        day = conn.hmget(keys.usage_owner_day("dana", utc_day()), "input_tokens", "output_tokens")
        share = sum(int(v or 0) for v in day) / BUDGET_TOKENS
    assert share is None or share <= 1.0, share
    if final["state"] == "failed":
        assert final["error"].startswith("budget reached"), final["error"]
    else:
        assert budget == "none" or final["state"] == "succeeded"
    items = texts(kind)
    for index, value in stored(conn, final["job_id"]).items():
        if index in thrown_away:
            assert isinstance(value, dict) and "error" in value, (index, value)
        else:
            assert value == expected(kind, items[index]), (index, value)
    return {"state": final["state"], "done": final["done"], "calls": paid[0], "tokens": paid[1] + paid[2],
            "share": share, "hits": usage.get("cache_hits", 0)}


@pytest.fixture
def stand_in(model_server, env):
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    env.setenv("LEASH_MODEL_MAX_TOKENS", "48")
    env.setenv("LEASH_REPAIR_ATTEMPTS", "1")
    env.setenv("LEASH_ITEM_CONCURRENCY", "8")
    env.setenv("LEASH_BATCH_POLL_SECONDS", BATCH_POLL)
    env.setenv("LEASH_BATCH_POLL_MAX", BATCH_POLL)  # a job of several parts looks at each every 0.5 s
    return model_server


def run_cell(conn, server, env, kind: str, mode: str, budget: str, cache: str) -> list[dict]:
    if budget == "owner_day":
        env.setenv("LEASH_OWNER_DAILY_TOKENS", str(BUDGET_TOKENS))
    body = payload(kind, mode, budget)
    thrown_away = set(FAILING) if cache == "failures" else set()
    if thrown_away:
        break_answers(server, kind)
    figures = []
    final = run_job(conn, kind, body, mode)
    figures.append(check_run(conn, server, kind, budget, final, (0, 0, 0), thrown_away))
    first = sent(server)
    assert not [r for r, n in Counter(first).items() if n > 1], "a request asked twice in one run"
    if cache == "cold":
        return figures
    asked = set(stored(conn, final["job_id"]))
    before = billed(server)
    again = run_job(conn, kind, body, mode)
    figures.append(check_run(conn, server, kind, budget, again, before, set()))
    # What the re-run sent: every request now less those of the first run (direct requests are
    # listed before batch ones, so the re-run's are not simply the list's tail).
    second = Counter(sent(server)) - Counter(first)
    repeated = [r for r, n in second.items() for _ in range(n) if r in set(first)]
    # Only the first requests of items whose answers were thrown away are asked again, once each
    # (stored as errors, or not stored: a budget stopped the job before their corrections).
    thrown = [json.dumps(first_message(kind, texts(kind)[i]))[1:-1] for i in thrown_away]
    assert all(any(t in r for t in thrown) for r in repeated), repeated
    assert len(repeated) == len(set(repeated)) <= len(thrown_away), (len(repeated), thrown_away & asked)
    if cache == "warm" and budget == "none":
        assert figures[-1]["calls"] == 0 and figures[-1]["hits"] == ITEMS
    return figures


def report(cell, figures: list[dict]) -> None:
    runs = "; ".join(f"{f['state']} {f['done']}/{ITEMS}, {f['calls']} calls, {f['tokens']:,} tokens"
                     + (f" ({f['share']:.1%} of the budget)" if f["share"] is not None else "")
                     + (f", {f['hits']} hits" if f["hits"] else "") for f in figures)
    print(f"matrix {cell_id(cell)}: {runs}")


@pytest.mark.parametrize("cell", [pytest.param(c, id=cell_id(c), marks=[pytest.mark.slow] if c[1] == "batch" else [])
                                  for c in CELLS])
def test_a_cell_bills_what_it_counts_passes_no_budget_repeats_no_call_and_stores_right_results(
        conn, stand_in, env, cell):
    report(cell, run_cell(conn, stand_in, env, *cell))


FAULT_CELLS = [("extract", "none"), ("prompt", "tokens"), ("classify", "owner_day")]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "budget"), FAULT_CELLS, ids=[f"{k}-direct-{b}-cold-sigkill" for k, b in FAULT_CELLS])
def test_a_worker_killed_mid_job_leaves_the_cell_holding(conn, workers, stand_in, env, kind, budget):
    """SIGKILL of the worker and its work-horse with calls held at the provider, which bills
    them all the same (it finishes generating for no one): the job is reclaimed and finishes or
    stops at its budget, the killed calls counted as estimates before it reads ended; every call
    billed is counted (tokens within 10 %; a call admitted but not yet sent at the kill is counted
    as an estimate too), no budget passed, only the calls in flight at the kill asked again,
    results right."""
    if budget == "owner_day":
        env.setenv("LEASH_OWNER_DAILY_TOKENS", str(BUDGET_TOKENS))
    env.setenv("LEASH_LEASE_SECONDS", "5")
    stand_in.latency = 0.05
    stand_in.bills_abandoned = True
    job_id, _ = enqueue(conn, kind, payload(kind, "direct", budget), owner="dana", max_attempts=3)
    stand_in.hold_after(4)
    first = workers.start("--no-scheduler")
    wait_for(lambda: len(stand_in.requests) >= 6, 30, message="calls held in flight")
    wait_for(lambda: states.status(conn, job_id)["done"] == 4, 30, message="the 4 answered items stored")
    horse = workers.horse(first)
    os.kill(first.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    first.wait(timeout=30)
    wait_for(lambda: not psutil.pid_exists(horse) or psutil.Process(horse).status() == psutil.STATUS_ZOMBIE, 30,
             message="the work-horse gone")
    held = len(stand_in.requests) - 4
    stand_in.release()
    wait_for(lambda: len(stand_in.billed) == len(stand_in.requests), 30, message="the held calls billed")
    workers.start("--no-scheduler")
    final = wait_for(lambda: (s := states.status(conn, job_id))["state"] in ("succeeded", "failed") and s, 120,
                     interval=0.2, message="the job to end after the SIGKILL")
    figures = check_run(conn, stand_in, kind, budget, final | {"job_id": job_id}, (0, 0, 0), set(), abandoned=held)
    asked = Counter(sent(stand_in))
    again = sum(n - 1 for n in asked.values())
    report((kind, "direct", budget, "cold-sigkill"), [figures])
    print(f"  {held} calls killed in flight (billed, counted as estimates), {again} requests sent again")
    assert again <= held  # only what was in flight at the kill is asked again


@pytest.mark.slow
def test_a_redis_restart_mid_job_leaves_the_cell_holding(own_redis, workers, stand_in, env):  # noqa: F811
    """The test's own Redis (AOF on) stops while calls are held at the provider, which answers
    them meanwhile, and starts again 3 s later: the job goes on under its token budget; billed =
    counted, the budget not passed, no request asked twice, results right."""
    client = redis.Redis.from_url(own_redis.url)
    env.setenv("LEASH_LEASE_SECONDS", "10")
    env.setenv("LEASH_MODEL_TIMEOUT", "60")  # the calls held while Redis goes away are answered, not timed out
    kind = "prompt"
    job_id, _ = enqueue(client, kind, payload(kind, "direct", "tokens"), owner="dana")
    stand_in.hold_after(4)
    workers.start()
    wait_for(lambda: len(stand_in.requests) >= 6, 30, message="calls held in flight")
    client.close()
    own_redis.stop()
    held = len(stand_in.requests) - 4
    stand_in.release()  # answered (and billed) while Redis is away
    wait_for(lambda: len(stand_in.billed) >= 4 + held, 30, message="the held calls answered")
    gone_at = time.monotonic()
    while time.monotonic() - gone_at < 3:
        time.sleep(0.2)  # the outage itself: nothing to poll for while Redis is down
    own_redis.start()
    client = redis.Redis.from_url(own_redis.url)
    final = wait_for(lambda: (s := states.status(client, job_id))["state"] in ("succeeded", "failed") and s, 120,
                     interval=0.2, message="the job to end after the restart")
    figures = check_run(client, stand_in, kind, "tokens", final | {"job_id": job_id}, (0, 0, 0), set())
    assert not [r for r, n in Counter(sent(stand_in)).items() if n > 1], "a request asked twice"
    report((kind, "direct", "tokens", "cold-redis-restart"), [figures])
    client.close()
