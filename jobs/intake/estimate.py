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
``EXPECTED_FROM_DAYS`` days (None when there were none), and as many repairs (``extract``) or
corrections (``classify``) per item as those jobs needed (``follow_ups_per_item``: an item's
next calls, counted as the worker writes them: ``jobs.core.running.context.JobContext.settle_answered``),
at the batch rate in batch mode (the first calls go in the provider's batch; repairs are direct).
``one_call_tokens_min`` / ``one_call_usd_min``: the least one call of the job can cost (its
smallest prompt and ``MIN_OUTPUT_TOKENS``) -- the door refuses a job its owner's day has not
that much left for (``jobs.intake.admission.owner_day_room``). In batch mode
``batch_one_part_budget_*`` is the budget that sends the job as one batch and ``batch_parts``
how many parts the job's budget allows (jobs/usage/batch_parts.py, the worker's own rule).

Redis: one MGET for the cache and one pipelined read of the owner's days; nothing is written.
A kind that makes no one call per item (no ``BatchSpec``) has no estimate (``calls`` None).
"""

from __future__ import annotations

import math
from typing import Any

from redis import Redis

from jobs import config, keys, kinds
from jobs.core.running import chunk_tree
from jobs.errors import InvalidJob, PermanentError
from jobs.intake.modes import mode_of
from jobs.models import backends, cache
from jobs.models.calls import ModelSettings
from jobs.models.prompts import reduce_messages
from jobs.models.provider import TOKENS_PER_MESSAGE, CallRequest, estimate_text_tokens
from jobs.models.spending import TIGHTEN_MARGIN
from jobs.usage import batch_parts, budget, prices
from jobs.usage.meter import follow_ups_field, utc_day
from jobs.usage.report import days_back

DRY_RUN_FIELD = "dry_run"
EXPECTED_FROM_DAYS = 30


def _usd(nusd: int | None) -> float | None:
    return None if nusd is None else prices.usd(nusd)


#: What a price assumes of an item it cannot know (an earlier job's result, read as the job
#: starts): LEASH_MAX_ITEM_CHARS characters of this one, four UTF-8 bytes each -- the most a
#: character has, and what the worker's input bound counts -- so any text the job may take
#: (held to that many characters as it starts) costs at most as much.
WIDEST_CHARACTER = "\U00010000"


def assumed_item(chars: int | None = None) -> str:
    """The item a price assumes when it cannot know it: ``chars`` (default LEASH_MAX_ITEM_CHARS)
    of ``WIDEST_CHARACTER``."""
    return WIDEST_CHARACTER * (config.limits().max_item_chars if chars is None else chars)


def estimate(connection: Redis, kind_name: str, payload: dict, owner: str, now: float | None = None,
             item_count: int | None = None) -> dict[str, Any]:
    """What the job would cost (see the module's docstring). The payload must have passed the
    door's checks (jobs.enqueue.validate). ``item_count``: a job whose items are another job's
    results, not known before it starts (a pipeline's stage fed by an earlier one's), priced for
    that many items, each ``assumed_item()`` and none answered from the request cache: the worst
    case (``items_assumed``; no expected cost)."""
    definition = kinds.get(kind_name)
    if kind_name == REDUCE:
        return estimate_reduce(connection, payload, owner, item_count=item_count, now=now)
    assumed = item_count is not None and not payload.get("items")
    count = item_count if assumed else len(payload.get("items") or [])
    out: dict[str, Any] = {"items": count, "calls": None, "cached_items": 0, "input_tokens": None,
                           "output_tokens_max": None, "cost_usd_max": None, "cost_usd_batch_max": None,
                           "cost_usd_expected": None, "budget_covers_worst_case": None,
                           "owner_day_covers_worst_case": None, "follow_ups_per_item": None,
                           "one_call_tokens_min": None, "one_call_usd_min": None} \
        | ({"items_assumed": True} if assumed else {})
    spec = definition.batch
    if spec is None:
        out["note"] = f"kind {kind_name!r} does not make one model call per item: no estimate"
        return out
    backend = _deployed_backend()
    if not hasattr(backend, "default_url"):  # the offline backend: no provider, no cost
        out.update(calls=count, input_tokens=0, output_tokens_max=0, cost_usd_max=0.0, cost_usd_batch_max=0.0,
                   cost_usd_expected=0.0, note="the offline `local` backend calls no provider")
        return out
    settings, price = _deployed_price(backend)
    batch = mode_of(payload) == "batch"
    if assumed:  # one request, the same for every item; no cached answer can be known for it
        todo = [spec.request(payload, assumed_item(), settings.max_tokens)] * count
    else:
        requests = [spec.request(payload, item, settings.max_tokens) for item in payload.get("items") or []]
        todo = _not_cached(connection, backend, settings, owner, payload, requests, out)
    bounds = _measured(todo, CallRequest.input_bound)
    day_fields = ("input_tokens", "output_tokens", "cost_nusd", "reserved_tokens", "reserved_nusd")
    with connection.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.usage_owner_day(owner, utc_day(now)), day_fields)
        for day in days_back(EXPECTED_FROM_DAYS, now):
            pipe.hmget(keys.usage_owner_day(owner, day), [f"by|{settings.name}|{kind_name}|calls",
                                                          f"by|{settings.name}|{kind_name}|output_tokens",
                                                          f"by|{settings.name}|{kind_name}|estimated_calls",
                                                          follow_ups_field(settings.name, kind_name)])
        today, *history = pipe.execute()
    input_tokens = sum(bounds)
    output_max = sum(r.max_tokens for r in todo)
    out.update(calls=len(todo), cached_items=count - len(todo), input_tokens=input_tokens,
               output_tokens_max=output_max)
    seen_calls = sum(int(c or 0) - int(e or 0) for c, _, e, _ in history)
    seen_output = sum(int(o or 0) for _, o, _, _ in history)
    seen_follow_ups = min(sum(int(f or 0) for *_, f in history), max(0, seen_calls - 1))
    follow_ups = seen_follow_ups / (seen_calls - seen_follow_ups) if seen_calls > seen_follow_ups else 0.0
    worst_nusd = None if price is None else sum(price.nano_usd(b, r.max_tokens)
                                                for b, r in zip(bounds, todo, strict=True))
    if todo:
        # Unknown items may be as short as nothing: the least call is an empty item's.
        smallest = spec.request(payload, "", settings.max_tokens).input_bound() if assumed else min(bounds)
        least_output = min(budget.MIN_OUTPUT_TOKENS, min(r.max_tokens for r in todo))
        out["one_call_tokens_min"] = smallest + least_output
        if price is not None:
            out["one_call_usd_min"] = _usd(price.nano_usd(smallest, least_output))
    if price is not None:
        out["cost_usd_max"] = _usd(worst_nusd)
        out["cost_usd_batch_max"] = _usd(sum(price.nano_usd(b, r.max_tokens, batch=True)
                                             for b, r in zip(bounds, todo, strict=True)))
        if seen_calls > 0 and not assumed:  # nothing honest to expect of items not known yet
            per_call = math.ceil(seen_output / seen_calls)
            out["follow_ups_per_item"] = round(follow_ups, 3)
            out["cost_usd_expected"] = _usd(sum(_expected_nusd(price, r, per_call, follow_ups, batch) for r in todo))
    else:
        out["note"] = "cost unknown: " + prices.why_no_price(settings.name)
    worst_tokens = input_tokens + output_max
    job_budget = budget.parse(payload.get(budget.BUDGET_FIELD))
    out["budget_covers_worst_case"] = _covers(job_budget, worst_tokens, worst_nusd)
    if batch:  # how many parts the budget allows (expected: not of assumed items), and what budget sends it as one
        out.update(batch_parts.dry_run(
            bounds, _measured(todo, _likely_input), settings.max_tokens,
            math.ceil(seen_output / seen_calls) if seen_calls > 0 and not assumed else None,
            job_budget and job_budget.tokens, job_budget and job_budget.usd and prices.nano(job_budget.usd), price,
            TIGHTEN_MARGIN))
        out["batch_one_part_budget_usd"] = _usd(out.pop("batch_one_part_budget_nusd"))
    out["owner_day_covers_worst_case"] = _day_covers(today, worst_tokens, worst_nusd)
    return out


def _not_cached(connection: Redis, backend, settings: ModelSettings, owner: str, payload: dict,
                requests: list[CallRequest], out: dict[str, Any]) -> list[CallRequest]:
    """The requests the request cache does not answer (one MGET)."""
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
    return [r for r, hit in zip(requests, hits, strict=True) if hit is None]


def _measured(requests: list[CallRequest], measure) -> list[int]:
    """``measure`` of each request, once per request object: an assumed item's repeats."""
    seen: dict[int, int] = {}
    return [seen[id(r)] if id(r) in seen else seen.setdefault(id(r), measure(r)) for r in requests]


REDUCE = "reduce"


def estimate_reduce(connection: Redis, payload: dict, owner: str, item_count: int | None = None,
                    item_chars: int | None = None, now: float | None = None) -> dict[str, Any]:
    """A ``reduce`` job's price: its chunk tree (jobs/core/running/chunk_tree.py), the same
    figures as ``estimate``'s plus ``levels`` (the calls of each level, the answer last).

    Its items are the payload's; a job whose items are another job's (``items_from``) has none
    before it starts and prices 0 items, unless ``item_count`` says how many to assume (a
    pipeline's dry run gives its parent stage's count), each ``assumed_item(item_chars)`` (default
    LEASH_MAX_ITEM_CHARS characters of four bytes each: the worst case). Levels whose texts are known (the items; the
    partials the request cache holds for them) are priced request by request, cached ones free;
    the levels above, from their count: each partial ``max_tokens`` long for the worst case, as
    long as this owner's reduce calls answered for the expected cost."""
    texts = list(payload.get("items") or [])
    assumed = not texts and item_count is not None
    if assumed:
        texts = [assumed_item(item_chars)] * item_count
    out: dict[str, Any] = {"items": len(texts), "calls": 0, "cached_items": 0, "input_tokens": 0,
                           "output_tokens_max": 0, "cost_usd_max": 0.0, "cost_usd_batch_max": 0.0,
                           "cost_usd_expected": None, "budget_covers_worst_case": None,
                           "owner_day_covers_worst_case": None, "follow_ups_per_item": None,
                           "one_call_tokens_min": None, "one_call_usd_min": None, "levels": [],
                           "items_assumed": assumed}
    if not texts:
        out["note"] = "its items are another job's, read as it starts: priced as 0 items"
        return out
    bound, instruction = config.settings().reduce_chunk_tokens, str(payload.get("instruction") or "")
    backend = _deployed_backend()
    if not hasattr(backend, "default_url"):  # the offline backend: no provider, no cost
        levels = _reduce_levels(len(chunk_tree.pack(texts, bound, estimate_text_tokens)), bound, LOCAL_PARTIAL_TOKENS)
        out.update(calls=sum(levels), levels=levels, cost_usd_expected=0.0,
                   note="the offline `local` backend calls no provider")
        return out
    settings, price = _deployed_price(backend)
    asked = cache.RequestCache(connection, owner, payload)
    shared = cache.shared_scope()  # other owners' answers: never counted (see ``estimate``)
    todo: list[CallRequest] = []  # the known requests no cached answer answers
    levels: list[int] = []
    while texts is not None:  # a level whose texts are known: each request as the worker sends it
        chunks = chunk_tree.pack(texts, bound, estimate_text_tokens)
        if levels and len(chunks) >= len(texts) > 1:
            chunks = [texts[n:n + 2] for n in range(0, len(texts), 2)]
        last = len(chunks) == 1
        requests = [CallRequest(reduce_messages(instruction, chunk, not last), settings.max_tokens)
                    for chunk in chunks]
        hits = [None] * len(requests) if assumed or shared else asked.get_many(
            [cache.request_digest(backend.name, settings.url or backend.default_url, settings.name,
                                  settings.temperature, r) for r in requests])
        todo += [r for r, hit in zip(requests, hits, strict=True) if hit is None]
        out["cached_items"] += sum(hit is not None for hit in hits)
        levels.append(len(chunks))
        known = all(hit is not None and hit.text is not None for hit in hits)
        texts = None if last else [hit.text for hit in hits] if known else None
    partials = 0 if levels[-1] == 1 else levels[-1]  # the unknown levels reduce these
    today, seen_calls, seen_output = _owner_days(connection, owner, settings.name, REDUCE, now)
    worst_above = _reduce_above(partials, bound, settings.max_tokens, instruction)
    levels += [len(level) for level in worst_above]
    input_tokens = sum(r.input_bound() for r in todo) + sum(n for level in worst_above for n in level)
    calls = len(todo) + sum(len(level) for level in worst_above)
    output_max = calls * settings.max_tokens
    out.update(calls=calls, levels=levels, input_tokens=input_tokens, output_tokens_max=output_max,
               cached_items=out["cached_items"])
    if todo:
        out["one_call_tokens_min"] = min(r.input_bound() for r in todo) + min(budget.MIN_OUTPUT_TOKENS,
                                                                               settings.max_tokens)
    worst_nusd = None
    if price is not None:
        worst_nusd = (sum(price.nano_usd(r.input_bound(), r.max_tokens) for r in todo)
                      + sum(price.nano_usd(n, settings.max_tokens) for level in worst_above for n in level))
        out["cost_usd_max"] = out["cost_usd_batch_max"] = _usd(worst_nusd)
        if out["one_call_tokens_min"] is not None:
            out["one_call_usd_min"] = _usd(price.nano_usd(min(r.input_bound() for r in todo),
                                                          min(budget.MIN_OUTPUT_TOKENS, settings.max_tokens)))
        if seen_calls > 0:
            per_call = min(settings.max_tokens, max(1, math.ceil(seen_output / seen_calls)))
            likely_above = _reduce_above(partials, bound, per_call, instruction)
            out["cost_usd_expected"] = _usd(
                sum(price.nano_usd(_likely_input(r), per_call) for r in todo)
                + sum(price.nano_usd(n, per_call) for level in likely_above for n in level))
    else:
        out["note"] = "cost unknown: " + prices.why_no_price(settings.name)
    out["budget_covers_worst_case"] = _covers(budget.parse(payload.get(budget.BUDGET_FIELD)),
                                              input_tokens + output_max, worst_nusd)
    out["owner_day_covers_worst_case"] = _day_covers(today, input_tokens + output_max, worst_nusd)
    return out


#: About how long the offline backend's partials are, in tokens (it costs nothing: calls only).
LOCAL_PARTIAL_TOKENS = 100


def _reduce_levels(first: int, bound: int, partial_tokens: int) -> list[int]:
    """The calls of each level from a first level of ``first`` calls, the answer last."""
    return [first, *(len(level) for level in _reduce_above(first if first > 1 else 0, bound, partial_tokens, ""))]


#: The tokens a partial's mark and the blank line before it may take ("\n\n[12] ").
MARK_TOKENS = 6


def _reduce_above(partials: int, bound: int, partial_tokens: int, instruction: str) -> list[list[int]]:
    """The levels that reduce ``partials`` partials of ``partial_tokens`` tokens each, as the
    worker packs them (two a call when one is as long as the bound): each call's input tokens."""
    overhead = CallRequest(reduce_messages(instruction, [], True), 0).input_bound()
    per_call = max(2, bound // max(1, partial_tokens)) if partial_tokens <= bound else 2
    levels, count = [], partials
    while count > 1:
        sizes = [min(per_call, count - n) for n in range(0, count, per_call)]
        levels.append([overhead + n * (partial_tokens + MARK_TOKENS) for n in sizes])
        count = len(sizes)
    return levels


def _owner_days(connection: Redis, owner: str, model: str, kind_name: str, now: float | None):
    """What the owner's UTC day has used, and the calls and output tokens of its jobs of the
    kind on the model over the last EXPECTED_FROM_DAYS days (estimated calls left out)."""
    day_fields = ("input_tokens", "output_tokens", "cost_nusd", "reserved_tokens", "reserved_nusd")
    with connection.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.usage_owner_day(owner, utc_day(now)), day_fields)
        for day in days_back(EXPECTED_FROM_DAYS, now):
            pipe.hmget(keys.usage_owner_day(owner, day), [f"by|{model}|{kind_name}|calls",
                                                          f"by|{model}|{kind_name}|output_tokens",
                                                          f"by|{model}|{kind_name}|estimated_calls"])
        today, *history = pipe.execute()
    return (today, sum(int(c or 0) - int(e or 0) for c, _, e in history), sum(int(o or 0) for _, o, _ in history))


#: The tokens a repair's or correction's request adds to the first one besides its answer
#: (the words that ask again, the chat template's per message).
FOLLOW_UP_WORDS = 40


def _expected_nusd(price, request, per_call: int, follow_ups: float, batch: bool) -> int:
    """One item's likely cost: its first call (at the batch rate in batch mode) and its share
    of follow-ups (direct calls that carry the first prompt and its answer)."""
    output = min(request.max_tokens, per_call)
    first_input = _likely_input(request)
    first = price.nano_usd(first_input, output, batch=batch)
    follow_up = price.nano_usd(first_input + output + FOLLOW_UP_WORDS + 2 * TOKENS_PER_MESSAGE, output)
    return first + math.ceil(follow_ups * follow_up)


def _likely_input(request) -> int:
    """The input tokens a request probably costs: a tokenizer's likely count and a few tokens a
    message for the chat template -- not the bound (which adds TOKENS_PER_PROMPT in case)."""
    template = TOKENS_PER_MESSAGE * len(request.messages)
    return min(request.input_bound(), estimate_text_tokens(request.prompt_text) + template)


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


def _deployed_backend():
    """The backend class the deployment's settings name (InvalidJob when they name none that works)."""
    try:
        return backends.backend_class()
    except PermanentError as exc:
        raise InvalidJob(str(exc)) from None


def _deployed_price(backend) -> tuple[ModelSettings, Any]:
    """The deployment's model settings and the price of its model (InvalidJob naming what is missing)."""
    try:
        settings = ModelSettings.from_env()
        return settings, prices.price_for(settings.name, settings.url or backend.default_url)
    except (PermanentError, ValueError) as exc:
        raise InvalidJob(f"no estimate: {exc}") from None
