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
says) is its owner's choice to spend past what the pipeline left: that budget stays."""

from __future__ import annotations

import json

from redis import Redis

from jobs import keys
from jobs.core.text import decoded
from jobs.usage import prices
from jobs.usage.budget import BUDGET_FIELD, Budget, BudgetReached, parse


def start_stage(connection: Redis, job_id: str, payload: dict) -> None:
    """As a stage of a pipeline with a budget starts: set its budget to what is left (see the
    module's docstring), or raise BudgetReached when nothing is. Any other job: nothing."""
    pipeline_id = decoded(connection.hget(keys.job(job_id), "pipeline"))
    if not pipeline_id:
        return
    stages, whole_tokens, whole_nusd = (decoded(v) for v in connection.hmget(
        keys.pipeline(pipeline_id), "stages", "budget_tokens", "budget_nusd"))
    if not stages or not (whole_tokens or whole_nusd):
        return
    own = parse(payload.get(BUDGET_FIELD)) or Budget()
    raised = _raised_by_replay(connection, job_id, own)
    others = [s["job_id"] for s in json.loads(stages) if s.get("job_id") and s["job_id"] != job_id]
    with connection.pipeline(transaction=False) as pipe:
        for other in others:
            pipe.hmget(keys.job(other), "usage_input_tokens", "usage_output_tokens", "usage_cost_nusd")
        spent = pipe.execute()
    spent_tokens = sum(int(i or 0) + int(o or 0) for i, o, _ in spent)
    spent_nusd = sum(int(n or 0) for _, _, n in spent)
    fields: dict = {}
    if whole_tokens and "tokens" not in raised:
        left = int(whole_tokens) - spent_tokens
        if left <= 0:
            raise BudgetReached(f"budget reached: the pipeline's budget of {int(whole_tokens):,} tokens was spent "
                                f"by its other stages ({spent_tokens:,} tokens)")
        fields["budget_tokens"] = min(left, own.tokens) if own.tokens is not None else left
    if whole_nusd and "usd" not in raised:
        left_nusd = int(whole_nusd) - spent_nusd
        if left_nusd <= 0:
            raise BudgetReached(f"budget reached: the pipeline's budget of {prices.money(prices.usd(int(whole_nusd)))} "
                                f"was spent by its other stages ({prices.money(prices.usd(spent_nusd))})")
        fields["budget_nusd"] = min(left_nusd, prices.nano(own.usd)) if own.usd is not None else left_nusd
    if fields:
        connection.hset(keys.job(job_id), mapping=fields)


def _raised_by_replay(connection: Redis, job_id: str, own: Budget) -> set[str]:
    """The limits ("tokens", "usd") of the stage's budget above the one it was submitted with: a
    replay raised them (``leash replay --budget-tokens``, what its ``budget reached`` says to do),
    the stage's owner choosing to spend past what the pipeline left. They stay as raised."""
    tokens, nusd = (decoded(v) for v in connection.hmget(keys.job(job_id), "budget_tokens", "budget_nusd"))
    raised = set()
    if tokens and own.tokens is not None and int(tokens) > own.tokens:
        raised.add("tokens")
    if nusd and own.usd is not None and int(nusd) > prices.nano(own.usd):
        raised.add("usd")
    return raised
