"""An estimate (jobs/intake/estimate.py) in words for people: ``leash submit --dry-run``, the
form's Estimate, each stage of a pipeline's dry run."""

from __future__ import annotations

from typing import Any

from jobs.usage.prices import money


def _batch_line(figures: dict[str, Any]) -> str:
    one = f"{figures['batch_one_part_budget_tokens']:,} tokens"
    if figures.get("batch_one_part_budget_usd") is not None:
        one += f" or {_money(figures['batch_one_part_budget_usd'])}"
    line = f"batch mode: a budget of {one} sends the job as one batch"
    if figures.get("batch_parts") is not None:
        line += (f"; under this job's budget it goes in {figures['batch_parts']:,} part(s), answering "
                 f"{figures['batch_items_in_budget']:,} of {figures['calls']:,} items (expected)")
    return line


def _money(usd: float | None) -> str:
    return money(usd)


def text(figures: dict[str, Any]) -> str:
    """An estimate for people, a few lines (``leash submit --dry-run``, the form)."""
    if figures.get("calls") is None:
        return f"{figures['items']:,} items: {figures.get('note', 'no estimate')}" + (
            f"\n{figures['model_settings']}" if figures.get("model_settings") else "")
    lines = [f"{figures['items']:,} items: {figures['calls']:,} calls, {figures['cached_items']:,} answered from "
             f"the request cache (free)",
             f"worst case: {figures['input_tokens']:,} input + {figures['output_tokens_max']:,} output tokens, "
             f"{_money(figures['cost_usd_max'])} (batch mode {_money(figures['cost_usd_batch_max'])})"]
    if figures.get("cost_usd_expected") is not None:
        repairs = figures.get("follow_ups_per_item") or 0
        also = f", with {repairs:.2f} repairs or corrections an item as they needed" if repairs else ""
        lines.append(f"expected (from the answers your jobs of this kind got{also}): "
                     f"{_money(figures['cost_usd_expected'])}")
    if figures.get("levels"):
        lines.append(f"reduce: {' + '.join(f'{n:,}' for n in figures['levels'])} calls, level by level, the answer last"
                     + (" (items assumed, not yet known)" if figures.get("items_assumed") else ""))
    elif figures.get("items_assumed"):
        lines.append("items assumed, not yet known: each as long as an item may be, none answered from the request "
                     "cache; the expected cost is unknown until it starts")
    if figures.get("batch_one_part_budget_tokens") is not None:
        lines.append(_batch_line(figures))
    for field, what in (("budget_covers_worst_case", "the job's budget"),
                        ("owner_day_covers_worst_case", "what is left of your daily budget")):
        if figures.get(field) is not None:
            lines.append(f"{what} {'covers' if figures[field] else 'does NOT cover'} the worst case")
    if figures.get("note"):
        lines.append(figures["note"])
    if figures.get("model_settings"):  # whose model settings priced it (jobs.intake.deployed_model)
        lines.append(figures["model_settings"])
    return "\n".join(lines)
