"""A pipeline's price before it runs: every stage priced as the single job's dry run prices it
(jobs/intake/estimate.py: worst case, expected, the request cache counted), and the sums.

A stage that takes its items from an earlier stage (``items_from: {"stage": ...}``) has no items
until that stage has run. What a dry run knows of them:

- the earlier stage's *inputs* (no ``"results"``), known when that stage's are: the stage is
  priced at *all* of them -- the worst case, since a selection (a label, a field's value, the
  errored ones) takes some of them at most -- and says so;
- the earlier stage's *results* (``"results": true``), or the inputs of a stage fed so: not known,
  but at most as many as the earlier stage has items (a ``reduce`` stage has one result), and
  each held to LEASH_MAX_ITEM_CHARS as the stage starts (a longer one is an item error, never a
  call). So the stage is priced for that many items, each that long (``submission.price_assuming``:
  its own kind, fields and model, as a submitted job's worst case is; a reduce, its chunk tree),
  and says so (``priced_at``: "at most N items, each up to LEASH_MAX_ITEM_CHARS (10,000)
  characters"); its expected cost is not known before it starts.

A stage fed by another job of the owner's is priced the same way from that job: its items when
it has them, else (it has not started: it takes another job's) at most as many as that job's
own source has, and so on. A stage whose kind cannot be priced at the plain items it is given
(its validator wants ``items_from``) is priced for as many, each as long as an item may be. A
stage whose items no dry run can bound (a job that is not the owner's, or not held) has no
worst case (None), and the pipeline's sums none either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from redis import Redis

from jobs import config, keys
from jobs.errors import InvalidJob
from jobs.read import results, selection
from jobs.usage import prices

if TYPE_CHECKING:
    from jobs.intake.submission import Submission

#: The figures summed over the stages (None in a stage: the sum is None, but see ``expected``).
SUMMED = ("items", "calls", "cached_items", "input_tokens", "output_tokens_max", "cost_usd_max",
          "cost_usd_batch_max")
#: The figures a stage whose items cannot be bounded has none of.
WORST = ("input_tokens", "output_tokens_max", "cost_usd_max", "cost_usd_batch_max", "cost_usd_expected",
         "budget_covers_worst_case", "owner_day_covers_worst_case")
WORST_CASE_NOTE = ("stages fed by an earlier stage are priced at all of its items: the worst case, "
                   "a selection takes fewer; a stage fed by results, at most as many items as its source has, "
                   "each up to LEASH_MAX_ITEM_CHARS characters, its expected cost counted at its worst case")
#: How many jobs back a dry run follows a job fed by another job's items to bound its own.
MAX_JOB_HOPS = 20


class Items(NamedTuple):
    """What a dry run knows of a job's items: their texts when they are known; else at most
    ``count`` of them (None: no bound, ``why_unbounded`` says why), each held to
    LEASH_MAX_ITEM_CHARS as the job starts. A job gives the jobs fed by it a result per item."""

    texts: list | None
    count: int | None
    why_unbounded: str | None = None


def _known(texts: list) -> Items:
    return Items(list(texts), len(texts))


def _as_source(kind: str | None, payload: dict, items: Items) -> Items:
    """What a job gives the jobs fed by it: a reduce, one row whose item is its instruction and
    whose result is its answer (docs/STAGES.md); any other kind, its items, a result each."""
    return _known([str(payload.get("instruction") or "")]) if kind == "reduce" else items


def _given(source: Items, chosen) -> Items:
    """What a job whose ``items_from`` chooses from ``source`` is given, at most: its inputs as
    they are, or its results (not known before it runs: as many as its items)."""
    return Items(None, source.count, source.why_unbounded) if _takes_results(chosen) else source


def _takes_results(chosen) -> bool:
    return isinstance(chosen, dict) and chosen.get(selection.RESULTS) is True


def price(connection: Redis, pipeline, door, made: list[Submission]) -> dict[str, Any]:
    """The pipeline's estimate (``made``: each stage as it would be submitted, ``door``: the one
    submission path, jobs.intake.submission, whose dry run prices each): ``stages`` (each
    its name, kind, what its items were priced at and its single-job estimate) and the sums
    (``cost_usd_max``: the worst case; ``cost_usd_expected``: each stage's expected cost, a stage
    with none counted at its worst case)."""
    sources: dict[str, Items] = {}  # each earlier stage as a source of items
    stages = []
    for stage, job in zip(pipeline.stages, made, strict=True):
        chosen = stage.payload.get("items_from")
        if chosen is None:
            figures, priced_at = door.submit(connection, job, dry_run=True).estimate, None
            own = stage.payload.get("items")
            fed = _known(own if isinstance(own, list) else [])
        elif isinstance(chosen, dict) and "stage" in chosen:
            fed, where = _given(sources[chosen["stage"]], chosen), f"stage {chosen['stage']!r}"
            figures, priced_at = _priced(connection, door, job, fed, where, _takes_results(chosen))
        else:
            job_id = chosen.get("job") if isinstance(chosen, dict) else chosen
            fed, where = _given(_job_items(connection, job_id, pipeline.owner, MAX_JOB_HOPS), chosen), f"job {job_id}"
            figures, priced_at = _priced(connection, door, job, fed, where, _takes_results(chosen))
        sources[stage.name] = _as_source(stage.kind, stage.payload, fed)
        stages.append({"name": stage.name, "kind": stage.kind, "priced_at": priced_at, "estimate": figures})
    return _summed(stages, pipeline.budget)


def _job_items(connection: Redis, job_id, owner: str, hops: int) -> Items:
    """Another job of the owner's as a source of items (see the module's docstring)."""
    if not isinstance(job_id, str) or not 0 < len(job_id) <= 200:
        return Items(None, None, "'items_from' names no job")
    kind, found_owner = (v.decode() if v is not None else None
                         for v in connection.hmget(keys.job(job_id), "kind", "owner"))
    if found_owner != owner:
        return Items(None, None, f"job {job_id} is not a job of yours that Redis holds")
    payload = results.stored_payload(connection, job_id) or {}
    if not isinstance(payload.get("items"), list) and payload.get(selection.FIELD) is not None:  # not started
        try:
            chosen = selection.parse(payload[selection.FIELD])
        except InvalidJob:
            return Items(None, None, f"job {job_id}'s 'items_from' cannot be read")
        if hops <= 0:
            return Items(None, None, f"job {job_id} is fed by a chain of more than {MAX_JOB_HOPS} jobs")
        return _as_source(kind, payload, _given(_job_items(connection, chosen["job"], owner, hops - 1), chosen))
    items = payload.get("items")
    return _as_source(kind, payload, _known(items if isinstance(items, list)
                                            else results.submitted_items(connection, job_id)))


def _priced(connection: Redis, door, job: Submission, fed: Items, source: str,
            takes_results: bool) -> tuple[dict[str, Any], str]:
    """The stage's single-job estimate at what it is fed, and the words that say so."""
    if fed.texts is not None:  # the earlier stage's inputs: known, priced as they are
        priced = {k: v for k, v in job.payload.items() if k != "items_from"} | {"items": fed.texts}
        try:
            figures = door.submit(connection, job._replace(payload=priced, after=None), dry_run=True).estimate
            return figures, f"all {len(fed.texts):,} items of {source} (worst case)"
        except InvalidJob:  # its kind takes no plain items (or not so many): as many, each as long as may be
            pass
    if fed.count is None:  # nothing bounds them: no worst case, rather than a wrong one
        figures = door.submit(connection, job, dry_run=True).estimate | dict.fromkeys(WORST)
        return figures, f"no bound on its items ({fed.why_unbounded or 'unknown'}): no worst case"
    figures = door.price_assuming(connection, job, fed.count)
    what = (f"all {fed.count:,} items of {source}" if fed.texts is not None
            else f"the one result of {source}" if takes_results and fed.count == 1
            else f"the results of all {fed.count:,} items of {source}" if takes_results
            else f"all the items of {source}, not known before it runs")
    unknown = "; the expected cost is unknown until it starts" if figures.get("cost_usd_expected") is None else ""
    return figures, (f"{what}: at most {fed.count:,} item{'s' if fed.count != 1 else ''}, each up to "
                     f"LEASH_MAX_ITEM_CHARS ({config.limits().max_item_chars:,}) characters (worst case{unknown})")


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
