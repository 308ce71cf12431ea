"""Reading usage back: a job's (from the job hash a status read already holds), an owner's
per UTC day, a model's all-time totals, and each item's. No model code, no SDK."""

from __future__ import annotations

import calendar
import time
from typing import Any

from redis import Redis

from jobs import keys
from jobs.usage.prices import SIGNIFICANT, money, usd, why_no_price  # noqa: F401 (money: read here too)

TOTALS = ("calls", "input_tokens", "output_tokens", "cached_input_tokens", "cost_nusd", "unpriced_calls",
          "estimated_calls", "cache_hits")


def _int(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _figures(get) -> dict[str, Any]:
    """The public shape of a set of totals (``get(field)`` reads one)."""
    calls = _int(get("calls"))
    unpriced = _int(get("unpriced_calls"))
    return {
        "usage": {"calls": calls, "input_tokens": _int(get("input_tokens")),
                  "output_tokens": _int(get("output_tokens")),
                  "cached_input_tokens": _int(get("cached_input_tokens")),
                  # Some calls' figures are estimates: their servers reported no usage, or leash
                  # abandoned them (timed out, work-horse killed) and they were probably billed.
                  "estimated": _int(get("estimated_calls")) > 0,
                  "estimated_calls": _int(get("estimated_calls")),
                  # Requests answered from the request cache: no call, no cost.
                  "cache_hits": _int(get("cache_hits"))},
        # Unknown when any call's price is: a partial sum shown as the cost would be a guess.
        "cost_usd": None if unpriced else usd(_int(get("cost_nusd"))),
    }


def job_usage(h: dict[str, str | None]) -> dict[str, Any]:
    """``usage``, ``cost_usd`` and ``budget`` of a job, from its (decoded) hash."""
    out = _figures(lambda field: h.get(f"usage_{field}"))
    budget: dict[str, Any] = {}
    if h.get("budget_tokens"):
        budget["tokens"] = _int(h["budget_tokens"])
    if h.get("budget_nusd"):
        budget["usd"] = usd(_int(h["budget_nusd"]))
    out["budget"] = budget or None
    return out


_WAITS = {
    "job_tokens": "its budget in tokens", "job_usd": "its budget in USD",
    "owner_tokens": "its owner's daily budget in tokens (LEASH_OWNER_DAILY_TOKENS)",
    "owner_usd": "its owner's daily budget in USD (LEASH_OWNER_DAILY_USD)",
}


def budget_wait(h: dict[str, str | None], waiting: bool) -> dict[str, Any]:
    """``budget_wait``: while a running (or deferred, queued) job's next call waits for calls in
    flight (its own, or for an owner's budget its owner's other jobs') to settle and free room in
    a budget, which budget and since when; None otherwise. Set by model_admit_v3, cleared by its
    next admitted call."""
    raw = h.get("budget_wait") if waiting else None
    if not raw or "|" not in raw:
        return {"budget_wait": None}
    what, _, since = raw.partition("|")
    try:
        since_at = float(since)
    except ValueError:
        return {"budget_wait": None}
    whose = "its other calls in flight" if what.startswith("job") else "calls in flight of its owner's jobs"
    return {"budget_wait": {
        "budget": what, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since_at)),
        "text": f"waiting for room in {_WAITS.get(what, what)}: {whose} hold it until they settle"}}


def item_usage(connection: Redis, job_id: str, indexes: list[int]) -> dict[int, dict[str, int]]:
    """{index: {calls, input_tokens, output_tokens, cache_hits}} for the items that have it."""
    if not indexes:
        return {}
    raw = connection.hmget(keys.usage(job_id), [f"i{i}" for i in indexes])
    out = {}
    for index, value in zip(indexes, raw, strict=True):
        if value:
            calls, input_tokens, output_tokens, *hits = (int(n) for n in value.decode().split(","))
            out[index] = {"calls": calls, "input_tokens": input_tokens, "output_tokens": output_tokens,
                          "cache_hits": hits[0] if hits else 0}
    return out


def days_back(days: int, now: float | None = None) -> list[str]:
    """The last ``days`` UTC days, newest first (YYYY-MM-DD)."""
    now = time.time() if now is None else now
    today = calendar.timegm(time.gmtime(now)[:3] + (0, 0, 0))
    return [time.strftime("%Y-%m-%d", time.gmtime(today - n * 86400)) for n in range(days)]


def owner_usage(connection: Redis, owner: str, days: int = 30, now: float | None = None) -> dict[str, Any]:
    """An owner's usage per UTC day (newest first, days without calls left out), each split
    by model and kind, and the total over the period."""
    wanted = days_back(days, now)
    with connection.pipeline(transaction=False) as pipe:
        for day in wanted:
            pipe.hgetall(keys.usage_owner_day(owner, day))
        raw_days = pipe.execute()
    out_days, total = [], dict.fromkeys(TOTALS, 0)
    for day, raw in zip(wanted, raw_days, strict=True):
        h = {k.decode(): v.decode() for k, v in raw.items()}
        if not _int(h.get("calls")) and not _int(h.get("cache_hits")):
            continue
        breakdown: dict[tuple[str, str], dict[str, str]] = {}
        for field, value in h.items():
            if field.startswith("by|"):
                _, model, kind, name = field.split("|", 3)
                breakdown.setdefault((model, kind), {})[name] = value
        for name in TOTALS:
            total[name] += _int(h.get(name))
        out_days.append({"day": day, **_figures(h.get),
                         "by": [{"model": model, "kind": kind, **_figures(fields.get)}
                                for (model, kind), fields in sorted(breakdown.items())]})
    return {"owner": owner, "days": out_days, "total": _figures(total.get)}


def unpriced_models(figures: dict[str, Any]) -> list[str]:
    """The models without a price in one of ``owner_usage``'s days, or (given the whole report)
    in any of its days."""
    days = figures.get("days", [figures])
    return sorted({part["model"] for day in days for part in day.get("by", []) if part["cost_usd"] is None})


def model_totals(connection: Redis) -> dict[str, dict[str, int]]:
    """{model: all-time totals} for every model leash has called (``/metrics``)."""
    models = sorted(m.decode() for m in connection.smembers(keys.MODELS))
    if not models:
        return {}
    with connection.pipeline(transaction=False) as pipe:
        for model in models:
            pipe.hmget(keys.usage_model(model), TOTALS)
        rows = pipe.execute()
    return {model: dict(zip(TOTALS, (_int(v) for v in row), strict=True))
            for model, row in zip(models, rows, strict=True) if any(row)}


def cost_text(cost_usd: float | None, calls: int, models: list[str] | tuple[str, ...] = ()) -> str:
    """A cost for people: "$0.0123", or why there is none: which model has no price and what
    to set (``models``: those whose calls have none; default the configured LEASH_MODEL_NAME)."""
    if cost_usd is None:
        return "cost unknown: " + "; ".join(why_no_price(model) for model in (models or (None,)))
    return money(cost_usd) if calls else "$0"


def spend_text(fields: dict[str, Any]) -> str | None:
    """What a job's calls used and cost, in one short phrase (None before its first call):
    "1,234 tokens (1,000 in / 234 out), $0.0012"; "~" marks estimated figures."""
    usage = fields.get("usage") or {}
    calls = usage.get("calls") or 0
    hits = usage.get("cache_hits") or 0
    if not calls:
        return f"{hits:,} answered from the request cache, $0" if hits else None
    approx = "~" if usage.get("estimated") else ""
    tokens = usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
    text = (f"{approx}{tokens:,} tokens ({usage.get('input_tokens', 0):,} in / {usage.get('output_tokens', 0):,} out, "
            f"{calls:,} calls), {cost_text(fields.get('cost_usd'), calls)}")
    budget = fields.get("budget")
    if budget:
        limits = [f"{budget['tokens']:,} tokens" if "tokens" in budget else None,
                  f"${budget['usd']:g}" if "usd" in budget else None]
        text += f" of a budget of {' / '.join(x for x in limits if x)}"
    if hits:
        text += f"; {hits:,} answered from the request cache"
    return text
