"""A job's price before it runs: ``leash submit --dry-run``, the API's ``dry_run: true`` and the
form's Estimate button write nothing and answer ``estimate(...)`` (through
``jobs.intake.submission``, which checks the payload first).

Each item's request is built exactly as the worker builds it (the kind's ``BatchSpec.request``,
the same for direct and batch mode) and bounded as the worker bounds it before a call
(``CallRequest.input_bound``: the prompt's UTF-8 bytes plus the chat template, which holds for
every tokenizer, plus every output token it may ask for). The requests the request cache
answers cost nothing and are left out of every figure but ``cached_items``. Prices come from
jobs/usage/prices.py, as the worker's do. ``cost_usd_expected`` uses the output tokens per call
this owner's jobs of the kind were billed on the same model over the last
``EXPECTED_FROM_DAYS`` days (None when there were none).

Redis: one MGET for the cache and one pipelined read of the owner's days; nothing is written.
A kind that makes no one call per item (no ``BatchSpec``) has no estimate (``calls`` None).
"""

from __future__ import annotations

import math
from typing import Any

from redis import Redis

from jobs import keys, kinds
from jobs.errors import InvalidJob, PermanentError
from jobs.models import backends, cache
from jobs.models.calls import ModelSettings
from jobs.models.provider import TOKENS_PER_MESSAGE, TOKENS_PER_PROMPT, estimate_text_tokens
from jobs.usage import budget, prices
from jobs.usage.meter import utc_day
from jobs.usage.report import days_back

DRY_RUN_FIELD = "dry_run"
EXPECTED_FROM_DAYS = 30


def _usd(nusd: int | None) -> float | None:
    return None if nusd is None else prices.usd(nusd)


def estimate(connection: Redis, kind_name: str, payload: dict, owner: str, now: float | None = None) -> dict[str, Any]:
    """What the job would cost (see the module's docstring). The payload must have passed the
    door's checks (jobs.enqueue.validate)."""
    definition = kinds.get(kind_name)
    items = list(payload.get("items") or [])
    out: dict[str, Any] = {"items": len(items), "calls": None, "cached_items": 0, "input_tokens": None,
                           "output_tokens_max": None, "cost_usd_max": None, "cost_usd_batch_max": None,
                           "cost_usd_expected": None, "budget_covers_worst_case": None,
                           "owner_day_covers_worst_case": None}
    spec = definition.batch
    if spec is None:
        out["note"] = f"kind {kind_name!r} does not make one model call per item: no estimate"
        return out
    try:
        backend = backends.backend_class()
    except PermanentError as exc:
        raise InvalidJob(str(exc)) from None
    if not hasattr(backend, "default_url"):  # the offline backend: no provider, no cost
        out.update(calls=len(items), input_tokens=0, output_tokens_max=0, cost_usd_max=0.0, cost_usd_batch_max=0.0,
                   cost_usd_expected=0.0, note="the offline `local` backend calls no provider")
        return out
    try:
        settings = ModelSettings.from_env()
        price = prices.price_for(settings.name, settings.url or backend.default_url)
    except (PermanentError, ValueError) as exc:
        raise InvalidJob(f"no estimate: {exc}") from None
    requests = [spec.request(payload, item, settings.max_tokens) for item in items]
    digests = [cache.request_digest(backend.name, settings.url or backend.default_url, settings.name,
                                    settings.temperature, r) for r in requests]
    try:
        hits = cache.RequestCache(connection, owner, payload).get_many(digests)
    except ValueError as exc:
        raise InvalidJob(f"no estimate: {exc}") from None
    if cache.shared_scope():
        # A shared cache holds other owners' answers: counting its hits would let a dry run test
        # guesses of their inputs for free. The worst case counts every item as a call.
        hits = [None] * len(digests)
        out["note"] = "the request cache is shared (LEASH_CACHE_SCOPE=shared): an estimate counts no cached answers"
    todo = [r for r, hit in zip(requests, hits, strict=True) if hit is None]
    day_fields = ("input_tokens", "output_tokens", "cost_nusd", "reserved_tokens", "reserved_nusd")
    with connection.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.usage_owner_day(owner, utc_day(now)), day_fields)
        for day in days_back(EXPECTED_FROM_DAYS, now):
            pipe.hmget(keys.usage_owner_day(owner, day), [f"by|{settings.name}|{kind_name}|calls",
                                                          f"by|{settings.name}|{kind_name}|output_tokens",
                                                          f"by|{settings.name}|{kind_name}|estimated_calls"])
        today, *history = pipe.execute()
    input_tokens = sum(r.input_bound() for r in todo)
    output_max = sum(r.max_tokens for r in todo)
    out.update(calls=len(todo), cached_items=len(items) - len(todo), input_tokens=input_tokens,
               output_tokens_max=output_max)
    seen_calls = sum(int(c or 0) - int(e or 0) for c, _, e in history)
    seen_output = sum(int(o or 0) for _, o, _ in history)
    worst_nusd = None if price is None else sum(price.nano_usd(r.input_bound(), r.max_tokens) for r in todo)
    if price is not None:
        out["cost_usd_max"] = _usd(worst_nusd)
        out["cost_usd_batch_max"] = _usd(sum(price.nano_usd(r.input_bound(), r.max_tokens, batch=True) for r in todo))
        if seen_calls > 0:
            per_call = math.ceil(seen_output / seen_calls)
            out["cost_usd_expected"] = _usd(sum(price.nano_usd(_likely_input(r), min(r.max_tokens, per_call))
                                                for r in todo))
    else:
        out["note"] = "cost unknown: " + prices.why_no_price(settings.name)
    worst_tokens = input_tokens + output_max
    out["budget_covers_worst_case"] = _covers(budget.parse(payload.get(budget.BUDGET_FIELD)), worst_tokens, worst_nusd)
    out["owner_day_covers_worst_case"] = _day_covers(today, worst_tokens, worst_nusd)
    return out


def _likely_input(request) -> int:
    """The input tokens a request probably costs (a tokenizer's likely count, not the bound)."""
    overhead = TOKENS_PER_MESSAGE * len(request.messages) + TOKENS_PER_PROMPT
    return min(request.input_bound(), estimate_text_tokens(request.prompt_text) + overhead)


def _covers(job_budget, worst_tokens: int, worst_nusd: int | None) -> bool | None:
    """Whether the job's budget covers the worst case (None: the job has no budget, or a USD
    budget and no price)."""
    if job_budget is None:
        return None
    if job_budget.tokens is not None and worst_tokens > job_budget.tokens:
        return False
    if job_budget.usd is not None:
        if worst_nusd is None:
            return None
        return worst_nusd <= prices.nano(job_budget.usd)
    return True


def _day_covers(today, worst_tokens: int, worst_nusd: int | None) -> bool | None:
    """Whether what is left of the owner's UTC day (LEASH_OWNER_DAILY_*: used and held by calls
    in flight) covers the worst case (None: no daily limit)."""
    limit_tokens, limit_nusd = budget.owner_daily_limits()
    if not limit_tokens and not limit_nusd:
        return None
    used_in, used_out, used_nusd, held_tokens, held_nusd = (int(v or 0) for v in today)
    if limit_tokens and worst_tokens > limit_tokens - used_in - used_out - held_tokens:
        return False
    if limit_nusd:
        if worst_nusd is None:
            return None
        return worst_nusd <= limit_nusd - used_nusd - held_nusd
    return True


def _money(usd: float | None) -> str:
    if usd is None:
        return "unknown"
    return f"${usd:.4f}" if usd >= 0.0001 or usd == 0 else f"${usd:.6f}"


def text(figures: dict[str, Any]) -> str:
    """An estimate for people, a few lines (``leash submit --dry-run``, the form)."""
    if figures.get("calls") is None:
        return f"{figures['items']:,} items: {figures.get('note', 'no estimate')}"
    lines = [f"{figures['items']:,} items: {figures['calls']:,} calls, {figures['cached_items']:,} answered from "
             f"the request cache (free)",
             f"worst case: {figures['input_tokens']:,} input + {figures['output_tokens_max']:,} output tokens, "
             f"{_money(figures['cost_usd_max'])} (batch mode {_money(figures['cost_usd_batch_max'])})"]
    if figures.get("cost_usd_expected") is not None:
        lines.append(f"expected (from the answers your jobs of this kind got): {_money(figures['cost_usd_expected'])}")
    for field, what in (("budget_covers_worst_case", "the job's budget"),
                        ("owner_day_covers_worst_case", "what is left of your daily budget")):
        if figures.get(field) is not None:
            lines.append(f"{what} {'covers' if figures[field] else 'does NOT cover'} the worst case")
    if figures.get("note"):
        lines.append(figures["note"])
    return "\n".join(lines)
