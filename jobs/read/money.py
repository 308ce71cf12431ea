"""Tokens and money in words for people: the pages, the CLI and the overview say amounts the
same way.

An amount keeps its significant digits: ``$0.000037``, never ``$0.0000``; ``$0.012``,
``$1.25``, ``$1,234.50``. A cost leash cannot know (a call of a model without a price) is the
word "unknown", never ``$?``; "~" marks figures estimated where the server reported no usage.
"""

from __future__ import annotations

from typing import Any

# Amounts are worded where costs are computed (jobs.usage.report); every reader uses that.
from jobs.usage.report import SIGNIFICANT, money  # noqa: F401


def tokens_of(fields: dict[str, Any]) -> int | None:
    """Input plus output tokens of a job's calls, or None before any call was answered."""
    usage = fields.get("usage") or {}
    if not usage.get("calls"):
        return None
    return int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)


def tokens_text(fields: dict[str, Any]) -> str:
    """``~12,345`` (estimated), ``12,345``, or ``-`` before any answer."""
    count = tokens_of(fields)
    if count is None:
        return "-"
    return f"{'~' if (fields.get('usage') or {}).get('estimated') else ''}{count:,}"


def cost_cell(fields: dict[str, Any]) -> str:
    """A job's cost for a list: ``$0.000037``, ``unknown`` (no price for its model), ``-``
    before any answer."""
    if tokens_of(fields) is None:
        return "-"
    return money(fields.get("cost_usd"))


def _cost_words(fields: dict[str, Any]) -> str:
    if fields.get("cost_usd") is None:
        return "cost unknown (no price for the model: LEASH_MODEL_PRICES)"
    return money(fields["cost_usd"])


def no_calls_text(fields: dict[str, Any]) -> str:
    """What a job without an answered call says about its usage: nothing was billed, and why."""
    history = fields.get("history") or []
    tried = fields.get("state") in ("running", "succeeded", "failed") or any(a.get("ended") for a in history)
    if fields.get("error") and tried:
        return "no model answer received: every call failed before one was answered, nothing was billed"
    if fields.get("state") == "running":
        return "no model answer yet"
    return "no model calls yet"


def cache_text(fields: dict[str, Any]) -> str | None:
    """"3 of 10 answered from the request cache (free)", or None when none was."""
    hits = int((fields.get("usage") or {}).get("cache_hits") or 0)
    if not hits:
        return None
    return f"{hits:,} of {max(int(fields.get('total') or 0), hits):,} answered from the request cache (free)"


def spend_text(fields: dict[str, Any]) -> str:
    """What a job's calls used and cost, in one short phrase: "1,234 tokens (1,000 in / 234
    out, 5 calls), $0.0012"; "~" marks estimated figures; the budget beside it when it has one;
    then the items the request cache answered, free."""
    usage = fields.get("usage") or {}
    calls = usage.get("calls") or 0
    cached = cache_text(fields)
    if not calls:
        return f"no model calls: {cached}" if cached else no_calls_text(fields)
    approx = "~" if usage.get("estimated") else ""
    text = (f"{approx}{tokens_of(fields):,} tokens ({usage.get('input_tokens', 0):,} in / "
            f"{usage.get('output_tokens', 0):,} out, {calls:,} call{'s' if calls != 1 else ''}), "
            f"{_cost_words(fields)}")
    budget = fields.get("budget")
    if budget:
        limits = [f"{budget['tokens']:,} tokens" if "tokens" in budget else None,
                  money(budget["usd"]) if "usd" in budget else None]
        text += f" of a budget of {' / '.join(x for x in limits if x)}"
    return f"{text}; {cached}" if cached else text
