"""Batch mode and the request cache (jobs/models/cache.py): before a batch job creates its
provider batch, the items whose requests are cached are stored from the cache (one MGET, then
one write per STORE_CHUNK items) and only the rest are sent; a job whose every request is cached
creates no provider batch at all. The answers a batch brings back are cached by the writes that
store them (store_items_v2), for direct and batch jobs alike."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from jobs.models import cache as answer_cache
from jobs.usage.meter import Pending

if TYPE_CHECKING:
    from jobs.batch.turn import Turn
    from jobs.models.provider import CallRequest


def answer_from_cache(run: Turn, done: dict[int, Any], again: object, chunk_size: int) -> None:
    """Store the items not done whose request the cache answers (``done`` gains them); an
    answer the kind cannot use (``again``: it asks the item directly) is left for the batch."""
    cache = getattr(run.backend, "cache", None)
    todo = [i for i in range(len(run.items)) if i not in done]
    if cache is None or not cache.on or not todo:
        return
    requests = {i: run.request(i) for i in todo}
    digests = {i: run.backend._digest(requests[i]) for i in todo}
    answers = cache.get_many([digests[i] for i in todo])
    chunk: list[tuple[int, str, str]] = []
    usage = Pending(run.model, run.ctx.attempt.kind)
    for index, answer in zip(todo, answers, strict=True):
        if answer is None:
            continue
        value = run.value(index, requests[index], answer)
        if value is again:
            continue
        chunk.append((index, json.dumps(value), "0,0,0,1"))
        usage.hits += 1
        usage.touched.append(cache.key(digests[index]))
        done[index] = value
        if len(chunk) >= chunk_size:
            usage = run.store(chunk, usage)
    if chunk:
        run.store(chunk, usage)


def keep_answer(run: Turn, usage: Pending, request: CallRequest, outcome: Any, value: Any, again: object,
                full: CallRequest | None = None) -> None:
    """A batch's answer that its item kept (``value``: a result, not an item's error nor
    ``again``, asked directly), cached by the write that stores its chunk. An answer thrown
    away -- off-label, breaking the schema, cut off -- is never cached (jobs.models.cache).
    ``full``: the item's request as asked at the deployment's max_tokens, when a budget gave
    ``request`` fewer: an answer that ended on its own within them answers that one too, and is
    cached under it (a re-run asks the item in full)."""
    if full is not None and request.budget_cut and getattr(outcome, "finish", None) != answer_cache.CUT_OFF:
        request = full
    cache = getattr(run.backend, "cache", None)
    if cache is None or not cache.on or not hasattr(outcome, "finish") or not answer_cache.cacheable(outcome, request):
        return
    if value is again or (isinstance(value, dict) and set(value) == {"error"}):
        return
    usage.cache[cache.key(run.backend._digest(request))] = answer_cache.encode(outcome)
