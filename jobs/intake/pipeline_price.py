"""A pipeline's price before it runs: every stage priced as the single job's dry run prices it
(jobs/intake/estimate.py: worst case, expected, the request cache counted), and the sums.

A stage that takes its items from an earlier stage (``items_from: {"stage": ...}``) has no items
until that stage has run; it is priced at *all* of the earlier stage's items -- the worst case,
since a selection (a label, a field's value) takes some of them at most -- and says so. A stage
that takes the earlier stage's *results* (``"results": true``) is priced for that many results,
each as long as an item may be (``submission.price_assuming``: the reduce kind's chunk tree). A
stage fed by another job's results is priced at all of that job's items. A stage whose kind cannot be
priced at those items (its validator wants ``items_from``) is priced as its single job's dry run
prices it: without items, and the answer says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis import Redis

from jobs import keys
from jobs.errors import InvalidJob
from jobs.read import results
from jobs.usage import prices

if TYPE_CHECKING:
    from jobs.intake.submission import Submission

#: The figures summed over the stages (None in a stage: the sum is None, but see ``expected``).
SUMMED = ("items", "calls", "cached_items", "input_tokens", "output_tokens_max", "cost_usd_max",
          "cost_usd_batch_max")
WORST_CASE_NOTE = ("stages fed by an earlier stage are priced at all of its items: the worst case, "
                   "a selection takes fewer")


def price(connection: Redis, pipeline, door, made: list[Submission]) -> dict[str, Any]:
    """The pipeline's estimate (``made``: each stage as it would be submitted, ``door``: the one
    submission path, jobs.intake.submission, whose dry run prices each): ``stages`` (each
    its name, kind, what its items were priced at and its single-job estimate) and the sums
    (``cost_usd_max``: the worst case; ``cost_usd_expected``: each stage's expected cost, a stage
    with none counted at its worst case)."""
    items_of: dict[str, list] = {}
    stages = []
    for stage, job in zip(pipeline.stages, made, strict=True):
        items, source = _items(connection, stage.payload, items_of, pipeline.owner)
        figures = _estimate(connection, door, job, items)
        priced_at = None
        takes_results = isinstance(stage.payload.get("items_from"), dict) and stage.payload["items_from"].get("results")
        if items is not None and figures.get("items") == len(items) and "items" not in stage.payload:
            priced_at = (f"the results of all {len(items):,} items of {source}, each as long as an item may be "
                         "(worst case)" if takes_results else f"all {len(items):,} items of {source} (worst case)")
        elif "items" not in stage.payload:
            priced_at = "no items: they are known when the stage starts"
        own = stage.payload.get("items")
        items_of[stage.name] = items if items is not None else list(own) if isinstance(own, list) else []
        if stage.kind == "reduce":  # one result, whose item is its instruction (docs/STAGES.md)
            items_of[stage.name] = [str(stage.payload.get("instruction") or "")]
        stages.append({"name": stage.name, "kind": stage.kind, "priced_at": priced_at, "estimate": figures})
    return _summed(stages, pipeline.budget)


def _items(connection: Redis, payload: dict, items_of: dict[str, list], owner: str) -> tuple[list | None, str | None]:
    """The items a stage is priced at, and where they come from (None: its own ``items``)."""
    chosen = payload.get("items_from")
    if chosen is None:
        return None, None
    if isinstance(chosen, dict) and "stage" in chosen:
        return list(items_of.get(chosen["stage"], [])), f"stage {chosen['stage']!r}"
    job_id = chosen if isinstance(chosen, str) else chosen.get("job") if isinstance(chosen, dict) else None
    if not isinstance(job_id, str) or not 0 < len(job_id) <= 200:
        return None, None
    found_owner = connection.hget(keys.job(job_id), "owner")
    if found_owner is None or found_owner.decode() != owner:
        return None, None
    return results.submitted_items(connection, job_id), f"job {job_id}"


def _estimate(connection: Redis, door, job: Submission, items: list | None) -> dict[str, Any]:
    """The stage's single-job estimate, at ``items`` when it takes them from elsewhere."""
    chosen = job.payload.get("items_from")
    if items is not None and isinstance(chosen, dict) and chosen.get("results"):
        return door.price_assuming(connection, job, len(items))  # the earlier stage's results: not known yet
    if items is not None:
        priced = {k: v for k, v in job.payload.items() if k != "items_from"} | {"items": items}
        try:
            return door.submit(connection, job._replace(payload=priced, after=None), dry_run=True).estimate
        except InvalidJob:
            pass  # its kind takes no plain items (or not so many): priced as submitted, without them
    return door.submit(connection, job, dry_run=True).estimate


def _summed(stages: list[dict], budget) -> dict[str, Any]:
    # Dollars to the hundred-millionth the stages' own figures have (jobs.usage.prices.usd): a
    # coarser sum could fall below theirs, and a worst case below what is spent.
    out: dict[str, Any] = {"stages": stages}
    for field in SUMMED:
        values = [s["estimate"].get(field) for s in stages]
        out[field] = None if any(v is None for v in values) else round(sum(values), 8) \
            if isinstance(values[0], float) else sum(values)
    expected = [s["estimate"].get("cost_usd_expected") for s in stages]
    worst = [s["estimate"].get("cost_usd_max") for s in stages]
    if any(e is None and w is None for e, w in zip(expected, worst, strict=True)):
        out["cost_usd_expected"] = None
    else:
        out["cost_usd_expected"] = round(sum(e if e is not None else w for e, w in zip(expected, worst,
                                                                                      strict=True)), 8)
    out["budget"] = budget.as_dict() if budget else None
    out["budget_covers_worst_case"] = _covers(budget, out)
    out["note"] = WORST_CASE_NOTE
    return out


def _covers(budget, out: dict) -> bool | None:
    if budget is None:
        return None
    if budget.tokens is not None:
        if out["input_tokens"] is None or out["output_tokens_max"] is None:
            return None
        if out["input_tokens"] + out["output_tokens_max"] > budget.tokens:
            return False
    if budget.usd is not None:
        if out["cost_usd_max"] is None:
            return None
        return prices.nano(out["cost_usd_max"]) <= prices.nano(budget.usd)
    return True
