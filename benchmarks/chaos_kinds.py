"""Job kinds and plain RQ functions for the benchmark and the chaos run.

Workers import this module through ``LEASH_IMPORTS=benchmarks.chaos_kinds`` (run from the
repository root). The chaos kinds count, in Redis, how often their side effect actually ran,
so the chaos run can prove "never twice".
"""

from __future__ import annotations

import time

from jobs.kinds import classify, kind, validate_items

#: Per-job counter incremented by the ``notify`` side effect (harness key, not product data).
NOTIFY_PREFIX = "chaos:notify:"


def notify_key(job_id: str) -> str:
    return NOTIFY_PREFIX + job_id


@kind("noop")
def noop(ctx, payload):
    return {}


@noop.validator
def _(payload):
    return 0


@kind("chaos_classify")
def chaos_classify(ctx, payload):
    """``classify``, then a side effect that must run once per job (a "job done" email)."""
    summary = classify.func(ctx, payload)
    ctx.once("notify", lambda: ctx.connection.incr(notify_key(ctx.job_id)))
    return summary


@chaos_classify.validator
def _(payload):
    return classify.validate(payload)


@kind("chaos_fail")
def chaos_fail(ctx, payload):
    """Does part of its items, then raises on every attempt: must end failed with its error."""
    items = validate_items(payload)
    ctx.progress(0, total=len(items))
    time.sleep(0.05)
    raise RuntimeError(f"built to fail (attempt {ctx.attempt.number})")


@chaos_fail.validator
def _(payload):
    return len(validate_items(payload))


@kind("one_item")
def one_item(ctx, payload):
    """A job of one small item and no model call: what leash's own bookkeeping costs per job
    (claim, the item's checkpoint, finish), against ``plain_rq_jobs.one_item``."""
    return {"items": ctx.for_each(payload["items"], str.upper)}


@one_item.validator
def _(payload):
    return len(validate_items(payload))
