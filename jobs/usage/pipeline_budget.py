"""A budget for a whole pipeline (jobs/intake/pipelines.py), kept with the job budgets that
model_admit_v3 already enforces: the stages of a pipeline with a budget run one at a time (each
waits for the one before it), and each stage, as it starts, gets as its own budget what the other
stages left of the pipeline's (at most the budget it was submitted with). A stage's calls can then
not spend past what is left, so the stages together never pass the pipeline's budget; a stage
that finds nothing left fails with ``budget reached`` before its first call (replayable, as any
budget stop, with ``leash replay --budget-tokens``: see below).

A resumed stage (its worker killed, a replay) counts the same others again: its own spending is
in its own record, checked against the budget it gets. A replay that raised the stage's budget
above the one it was submitted with (``leash replay --budget-tokens``, as its ``budget reached``
says) is its owner's choice to spend past what the pipeline left: that budget stays; one a
replay lowered stays too."""

from __future__ import annotations

import json

from redis import Redis

from jobs import keys
from jobs.core.text import decoded
from jobs.usage import prices
from jobs.usage.budget import BUDGET_FIELD, Budget, BudgetReached, parse
from jobs.webhooks import pipeline_hooks


def start_stage(connection: Redis, job_id: str, payload: dict) -> None:
    """As a stage of a pipeline with a budget starts: set its budget to what is left (see the
    module's docstring), or raise BudgetReached when nothing is. Any other job: nothing."""
    pipeline_id = decoded(connection.hget(keys.job(job_id), "pipeline"))
    if not pipeline_id:
        return
    pipeline_hooks.keep(connection, pipeline_id)  # it lives on while its stages run
    stages, whole_tokens, whole_nusd = (decoded(v) for v in connection.hmget(
        keys.pipeline(pipeline_id), "stages", "budget_tokens", "budget_nusd"))
    if not stages or not (whole_tokens or whole_nusd):
        return
    own = parse(payload.get(BUDGET_FIELD)) or Budget()
    tokens_now, nusd_now = _budget_now(connection, job_id)
    others = [s["job_id"] for s in json.loads(stages) if s.get("job_id") and s["job_id"] != job_id]
    with connection.pipeline(transaction=False) as pipe:
        for other in others:
            pipe.hmget(keys.job(other), "usage_input_tokens", "usage_output_tokens", "usage_cost_nusd")
        spent = pipe.execute()
    spent_tokens = sum(int(i or 0) + int(o or 0) for i, o, _ in spent)
    spent_nusd = sum(int(n or 0) for _, _, n in spent)
    fields: dict = {}
    if whole_tokens and not _raised(tokens_now, own.tokens):
        left = int(whole_tokens) - spent_tokens
        if left <= 0:
            raise BudgetReached(f"budget reached: the pipeline's budget of {int(whole_tokens):,} tokens was spent "
                                f"by its other stages ({spent_tokens:,} tokens)")
        fields["budget_tokens"] = _least(left, tokens_now, own.tokens)
    own_nusd = prices.nano(own.usd) if own.usd is not None else None
    if whole_nusd and not _raised(nusd_now, own_nusd):
        left_nusd = int(whole_nusd) - spent_nusd
        if left_nusd <= 0:
            raise BudgetReached(f"budget reached: the pipeline's budget of {prices.money(prices.usd(int(whole_nusd)))} "
                                f"was spent by its other stages ({prices.money(prices.usd(spent_nusd))})")
        fields["budget_nusd"] = _least(left_nusd, nusd_now, own_nusd)
    if fields:
        connection.hset(keys.job(job_id), mapping=fields)


def _budget_now(connection: Redis, job_id: str) -> tuple[int | None, int | None]:
    """The stage's budget as its record holds it now (tokens, nano-USD): what its last start
    left it, or what a replay set (``leash replay --budget-tokens``)."""
    tokens, nusd = (decoded(v) for v in connection.hmget(keys.job(job_id), "budget_tokens", "budget_nusd"))
    return (int(tokens) if tokens else None), (int(nusd) if nusd else None)


def _raised(now: int | None, own: int | None) -> bool:
    """A limit above the one the stage was submitted with: a replay raised it (what its ``budget
    reached`` says to do), its owner choosing to spend past what the pipeline left. It stays."""
    return now is not None and own is not None and now > own


def _least(left: int, now: int | None, own: int | None) -> int:
    """What the pipeline left, at most the stage's budget now (a replay may have lowered it; an
    earlier start left at most what is left now, the others' spending only grows) and its own."""
    return min(limit for limit in (left, now, own) if limit is not None)
