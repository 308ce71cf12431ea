"""The function RQ runs for every leash job, inside the work-horse.

The worker claimed the job (an ``Attempt`` with a fencing token) before forking; this maps
how the kind's function ended onto a fenced transition, then lets RQ do its bookkeeping:

    returned         -> finish   (succeeded; refused if the lease was lost; a summary over
                                  LEASH_MAX_SUMMARY_BYTES is stored as a note of its size;
                                  its item errors counted: every item, or more than
                                  max_item_errors, and it fails instead, naming them)
    PermanentError   -> fail     (failed at once)
    Canceled         -> fail     (failed, error "canceled"; also before the kind runs when a job
                                  it waited for did not succeed: jobs.core.parents)
    other exception  -> fail     (queued again while attempts remain, else failed)
    HandOff          -> release  (front of the queue, attempt not counted)
    RetryLater(s)    -> release  (RQ's scheduler brings it back after s seconds, attempt not
                                  counted; after LEASH_MAX_DEFERS deferrals it counts as a failure)
    ProviderDown     -> release  (the provider failed every call: back after 2 s, 4 s ... 60 s,
                                  attempt not counted, until the outage has lasted
                                  LEASH_PROVIDER_OUTAGE_MAX; then it counts as a failure)
    Parked           -> park     (a batch job's batch is at its provider: running, waiting; RQ's
                                  scheduler brings it back for a look, which is not an attempt)
    Redis went away  -> release  (front of the queue, attempt not counted: a failover is not
                                  the job's fault; bounded by LEASH_MAX_DEFERS like deferrals)
    LeaseLost        -> nothing  (another attempt owns the job; this one writes nothing)
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from typing import Any

import redis
from rq import Retry, get_current_job

from jobs import keys, kinds
from jobs.batch import canceled
from jobs.batch import run as batch_run
from jobs.config import settings
from jobs.config.operations import operations
from jobs.config.stores import item_errors as item_error_settings
from jobs.core import clock, deferrals, outcome, parents, payload_copy
from jobs.core.lease import Attempt, Outcome, describe
from jobs.core.running.context import JobContext
from jobs.core.upkeep import consistency
from jobs.errors import (
    Canceled,
    HandOff,
    InvalidJob,
    ItemsTooLong,
    LeaseLost,
    Parked,
    PermanentError,
    PlainWorker,
    ProviderDown,
    RetryLater,
    TooManyItemErrors,
)
from jobs.intake.limits import (
    check_summary,
    item_error_limit,
    json_size,
    over_long_item_error,
    over_long_items,
)
from jobs.models import backends
from jobs.read import results, selection
from jobs.usage import pipeline_budget
from jobs.usage.budget import BudgetReached, WaitingForRoom

log = logging.getLogger("leash.runner")


def execute(kind_name: str, payload: dict, attempt: Attempt | None = None) -> dict[str, Any]:
    """RQ's entry point for every leash job (its dotted path is stored in each queued job, so
    it never moves). ``attempt`` is what the worker claimed (``LeashJob``); without one a
    plain RQ worker took the job."""
    if attempt is None:
        _refuse_plain_worker()
    kind = kinds.get(kind_name)
    why_not = parents.blocked(attempt.connection, attempt.job_id)
    deferrals.clear(attempt.connection, attempt.job_id)  # running again: what it waited for is back
    attempt.settle_abandoned(clock.wall())  # a killed attempt's calls: counted now, their room freed
    ctx = JobContext(attempt, payload, model_factory=backends.get_backend, batch_runner=batch_run.run)
    try:
        if why_not:
            raise Canceled(why_not)  # a job it waited for did not succeed (after_policy cancel)
        pipeline_budget.start_stage(attempt.connection, attempt.job_id, payload)  # what the other stages left
        payload = _with_chosen_items(attempt, kind, payload)
        try:
            summary = kind.func(ctx, payload) or {}
        finally:
            ctx.flush_usage(all_threads=True)  # calls no item write carried (before the outcome)
        summary = _fitting_summary(attempt.job_id, summary)
        ctx.restore_lost_items()  # a failover may have lost some: never succeed without them
        errors = _judge_item_errors(attempt, kind, payload)
        attempt.finish(summary, outcome=outcome.WITH_ITEM_ERRORS if errors else outcome.SUCCEEDED)
        return summary
    except LeaseLost:
        attempt.settle(Outcome.SUPERSEDED)
        raise
    except HandOff:
        attempt.release()
        raise
    except ProviderDown as exc:
        return _wait_for_provider(attempt, exc)
    except RetryLater as exc:
        return _defer(attempt, exc)
    except Parked as exc:
        return _look_later(exc)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        _hand_back_after_redis_blip(attempt, exc)
        raise
    except Canceled as exc:
        attempt.fail("canceled", permanent=True, reason=parents.cancel_reason(exc))
        raise
    except BudgetReached as exc:
        attempt.fail(str(exc), permanent=True)  # "budget reached: ..." says it all; no traceback
        raise
    except (TooManyItemErrors, ItemsTooLong) as exc:
        attempt.fail(str(exc), permanent=True)  # the counts and the limit say it all: no traceback
        raise
    except PermanentError as exc:
        attempt.fail(describe(exc), permanent=True)
        raise
    except Exception as exc:
        attempt.fail(describe(exc), permanent=False)
        raise


def _with_chosen_items(attempt: Attempt, kind: kinds.Kind, payload: dict) -> dict:
    """A job whose items come from another job's results (``items_from``) gets them now, as it
    starts: read from wherever that job's results are (jobs/read/selection.py), and kept in its
    payload copy so its results, downloads, archive and replays show them beside their answers.
    Those items never passed the door: one longer than LEASH_MAX_ITEM_CHARS is not asked
    (``_not_asking_over_long``), so the job never spends past what its price assumed."""
    chosen = selection.parse(payload.get(selection.FIELD))
    if chosen is None:
        return payload
    items = results.chosen_items(attempt.connection, chosen)  # at most the source's, which its limits held
    resolved = {**payload, "items": items}
    attempt.connection.set(keys.payload(attempt.job_id), payload_copy.encode(resolved), keepttl=True)
    _not_asking_over_long(attempt, kind, items)
    return resolved


_STORE_CHUNK = 500


def _not_asking_over_long(attempt: Attempt, kind: kinds.Kind, items: list[str]) -> None:
    """Items longer than a submitted item may be (LEASH_MAX_ITEM_CHARS: a result can be longer
    than any input, and every price assumes at most that) are each stored as that item's error
    before the kind runs, so no call is made for them and they count as item errors (the job's
    ``max_item_errors`` decides its outcome). A kind of one answer over every item (reduce)
    cannot answer without one: it fails before its first call, naming the first."""
    over, max_chars = over_long_items(items)
    if not over:
        return
    if kind.one_answer:
        first = over[0]
        raise ItemsTooLong(f"{len(over)} of its {len(items)} items {'is' if len(over) == 1 else 'are'} longer than "
                           f"the {max_chars:,} characters an item may have (LEASH_MAX_ITEM_CHARS; items[{first}] is "
                           f"{len(items[first]):,}): {kind.name} answers over every item, so it asked nothing")
    stored = {int(i) for i in attempt.connection.hkeys(keys.items(attempt.job_id))}  # an answer stays
    error = json.dumps({"error": over_long_item_error(max_chars)})
    todo = [(i, error, "") for i in over if i not in stored]
    for start in range(0, len(todo), _STORE_CHUNK):  # one fenced write per chunk: a zombie's is refused
        attempt.store_items(todo[start:start + _STORE_CHUNK], None)
    log.info("job %s: %d of its %d items are longer than LEASH_MAX_ITEM_CHARS (%d): stored as item errors, not asked",
             attempt.job_id, len(over), len(items), max_chars)


def count_canceled_batch(job_id: str, batch_ids: list[str], canceled_at: float) -> None:
    """RQ's entry point for a look at a canceled job's provider batches
    (``jobs.batch.canceled.LOOK``: its dotted path is stored in each scheduled look, so it never
    moves). Not a leash job: no attempt, no lease; any worker of the queue runs it."""
    canceled.look(get_current_job().connection, backends.get_backend(), job_id, batch_ids, canceled_at)


def _refuse_plain_worker() -> None:
    """A plain ``rq worker`` took a leash job: it holds no lease, so the job must not run here.
    Record why (the job fails in leash with that text, listed and replayable) and tell RQ not
    to retry it, so a mistaken worker cannot silently burn its attempts."""
    job = get_current_job()
    if job is not None:
        job.retries_left = 0
        consistency.end_outside(job.connection, job.id, consistency.PLAIN_WORKER)
    raise PlainWorker(consistency.PLAIN_WORKER)


def _fitting_summary(job_id: str, summary):
    """The summary to store. Limits apply at the door, never after a job's calls were made: a
    summary over LEASH_MAX_SUMMARY_BYTES (a limit releases before 0.3 did not have, and that
    the labels of a job they accepted may pass) is replaced by a note of its size, and the job
    succeeds with every item's result at its results address. A summary that is not JSON is
    the kind's bug: no retry changes it."""
    try:
        check_summary(summary)
    except InvalidJob as exc:
        log.warning("job %s: its summary is not stored: %s", job_id, exc)
        return {"summary_omitted": f"{json_size(summary)} bytes as JSON, over LEASH_MAX_SUMMARY_BYTES"}
    except (TypeError, ValueError) as exc:
        raise PermanentError(str(exc)) from None
    return summary


def _judge_item_errors(attempt: Attempt, kind: kinds.Kind, payload: dict) -> int:
    """Count the items that ended in an error and record the count on the job (every surface
    reads it from there); raise TooManyItemErrors when they are every item, or more than the
    job's ``max_item_errors`` (extract: ``max_invalid``), else LEASH_MAX_ITEM_ERRORS, else the
    kind's default allows. Read from the job's hash and payload: the limits it was accepted with."""
    texts = _item_errors(attempt.connection, attempt.job_id)
    errors = sum(texts.values())
    attempt.connection.hset(keys.job(attempt.job_id), outcome.FIELD, errors)
    if not errors:
        return 0
    total = int(attempt.connection.hget(keys.job(attempt.job_id), "total") or 0) or errors
    given = (("max_item_errors", payload.get("max_item_errors")),
             ("max_invalid", payload.get("max_invalid") if kind.name == "extract" else None),
             ("LEASH_MAX_ITEM_ERRORS", item_error_settings().max_item_errors),
             (f"{kind.name}'s default max_item_errors", kind.max_item_errors))
    name, value = next(((n, v) for n, v in given if v not in (None, "")), ("max_item_errors", None))
    limit = item_error_limit(value, name)
    if outcome.too_many(errors, total, limit):
        raise TooManyItemErrors(outcome.failure_text(texts, total, f"{name} {value}"))
    return errors


def _item_errors(connection: redis.Redis, job_id: str) -> Counter:
    """The texts of the job's stored item errors, counted."""
    errors: Counter = Counter()
    for _, raw in connection.hscan_iter(keys.items(job_id), count=500):
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if outcome.is_item_error(value):
            errors[str(value["error"])] += 1
    return errors


def _defer(attempt: Attempt, exc: RetryLater) -> Retry:
    """Give the job back for later. Returning RQ's ``Retry`` makes RQ schedule it (its
    scheduler runs in every ``leash worker``) and free its rate-limit slot meanwhile."""
    limit = settings().max_defers
    counted = not isinstance(exc, WaitingForRoom)  # the owner's own calls hold the room: they end
    defers_so_far = int(attempt.connection.hget(keys.job(attempt.job_id), "defers") or 0)
    if counted and defers_so_far >= limit:
        # Bounded: a job deferred too often burns attempts like any other failure.
        error = RuntimeError(f"deferred {defers_so_far} times, the limit (LEASH_MAX_DEFERS={limit}); last: {exc}")
        attempt.fail(describe(error), permanent=False)
        raise error
    if attempt.release(requeue=False) == 0:
        raise LeaseLost()
    if not counted:
        attempt.connection.hincrby(keys.job(attempt.job_id), "defers", -1)
        deferrals.note(attempt.connection, attempt.job_id, "budget", clock.wall())
    log.info("job %s deferred %ds: %s", attempt.job_id, math.ceil(exc.seconds), exc)
    return Retry(max=_rq_retries() + limit + 1, interval=max(1, math.ceil(exc.seconds)))


#: A job waiting for its provider comes back after 2 s, then twice as long each time, at most 60 s.
OUTAGE_FIRST, OUTAGE_STEP_MAX = 2.0, 60.0


def _wait_for_provider(attempt: Attempt, exc: ProviderDown) -> Retry:
    """The provider failed every call: an outage. The job keeps its checkpoint and frees its
    worker; no attempt and no deferral is counted until the outage has lasted
    LEASH_PROVIDER_OUTAGE_MAX. An outage starts again once the job stored items after it."""
    connection, key, now = attempt.connection, keys.job(attempt.job_id), clock.wall()
    since, done_then, tries, done = connection.hmget(key, "provider_down_since", "provider_down_done",
                                                      "provider_down_tries", "done")
    same = since is not None and int(done or 0) <= int(done_then or 0)
    since, tries = (float(since), int(tries or 0)) if same else (now, 0)
    longest = operations().provider_outage_max
    if now - since >= longest:
        error = RuntimeError(f"the model provider failed every call for {now - since:.0f}s "
                             f"(LEASH_PROVIDER_OUTAGE_MAX={longest:g}); last: {exc}")
        attempt.fail(describe(error), permanent=False)
        raise error
    if attempt.release(requeue=False) == 0:
        raise LeaseLost()
    seconds = min(OUTAGE_STEP_MAX, OUTAGE_FIRST * 2 ** tries, max(1.0, since + longest - now))
    with connection.pipeline(transaction=False) as pipe:
        pipe.hincrby(key, "defers", -1)  # an outage is not the job's deferral: LEASH_MAX_DEFERS is for those
        pipe.hset(key, mapping={"provider_down_since": since, "provider_down_done": int(done or 0),
                                "provider_down_tries": tries + 1})
        pipe.execute()
    deferrals.note(connection, attempt.job_id, "provider", since)
    log.warning("job %s waits for its model provider (down since %s, every call failed): back in %ds, "
                "no attempt counted: %s", attempt.job_id, clock.iso(since), math.ceil(seconds), exc)
    return Retry(max=_rq_retries() + settings().max_defers + 1, interval=max(1, math.ceil(seconds)))


def _rq_retries() -> int:
    """Retries RQ has counted for this job (a batch job's looks are Retry results too): RQ's
    own cap must stay beyond them, leash's counters bound deferrals and looks."""
    job = get_current_job()
    return int(getattr(job, "number_of_retries", 0) or 0) if job is not None else 0


def _look_later(exc: Parked) -> Retry:
    """The job is parked (``Attempt.park``, done by the batch flow): RQ's scheduler (in every
    ``leash worker``) brings it back at the next look; its owner's slot is free meanwhile."""
    return Retry(max=_rq_retries() + 2, interval=max(1, math.ceil(exc.look_at - clock.wall())))


def _hand_back_after_redis_blip(attempt: Attempt, exc: Exception) -> None:
    """The job's Redis calls failed (a restart or failover). Hand the job back without
    spending an attempt; once this has happened LEASH_MAX_DEFERS times, count it as failure."""
    try:
        given_back = sum(int(n or 0) for n in attempt.connection.hmget(keys.job(attempt.job_id), "handoffs", "defers"))
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        given_back = 0  # still down: release() below waits for Redis for as long as the lease lasts
    if given_back >= settings().max_defers:
        attempt.fail(describe(exc), permanent=False)
    elif not attempt.release():
        attempt.settle(Outcome.SUPERSEDED)
