"""What a canceled batch answered before its cancel, counted.

A person cancels a batch job waiting at its provider (``leash cancel``, the API, the job page):
the job ends canceled at once and its provider batches are canceled
(``jobs.batch.run.cancel_at_provider``). The provider still bills the requests it completed
before the cancel, and returns them once the canceled batch has ended (OpenAI: ``cancelling``
-> ``cancelled`` with an output file; Anthropic: ``canceling`` -> ``ended``, those requests
``succeeded``). So the cancel schedules a look (a plain RQ job: RQ's scheduler runs in every
``leash worker``) that reads each canceled batch once it has ended and counts the usage of every
answered request -- at the batch price, to the job, its owner's UTC day and the model -- and
stores nothing: the job stays canceled. A batch that has not ended within
LEASH_BATCH_CANCEL_GRACE of the cancel is given up, with one WARNING.

Counted once, whatever happens around it:

- each look schedules the next one *before* it reads, so a worker killed mid-look leaves the
  next look in place (the chain ends when every batch is counted or given up);
- a batch's answers are one usage write whose once-only id names the batch (add_usage_once in
  jobs/lua/_lib.lua): a second look that reads the same batch -- a look repeated after a worker
  died, two workers at once -- writes usage that is not counted again;
- the ``cancel_counted:<batch id>`` marker in the job's batch record tells later looks that
  the batch is done, and ``cancel_gave_up`` lets exactly one look say the WARNING;
- a counted batch is also marked read to its end (``ended:<part>``): a replay of the job asks
  its items directly instead of reading (and counting) the batch again; a look that finds the
  job replayed stops, its own looks reading the batch with its items.
"""

from __future__ import annotations

import collections
import logging
from datetime import UTC, datetime
from typing import Any

from redis import Redis
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.batch.looks import LOOK_AGAIN
from jobs.config import batches, settings
from jobs.core import clock, rq_side
from jobs.lifecycle import transitions
from jobs.usage.meter import Meter, day_ttl, utc_day

log = logging.getLogger("leash.batch")

#: The function RQ runs for each look. RQ stores this dotted path in every scheduled look, so it
#: never moves and is never renamed: a look scheduled before a deploy must still run after it.
#: It sits beside ``jobs.runner.execute`` (the other path RQ stores) in the one module that may
#: reach both this core and the model backends a look needs.
LOOK = "jobs.runner.count_canceled_batch"
#: Once-only id of a batch's usage write (slot and sequence of add_usage_once): the write is
#: sent under the batch id as its token, so each batch is counted at most once.
WRITE_ID = "cancel:1"
COUNTED, GAVE_UP = "cancel_counted:", "cancel_gave_up"
#: A batch whose cancel the provider confirmed (by the door, else by a worker's look).
CANCEL_SENT = "cancel_sent:"


def schedule(connection: Redis, job_id: str, batch_ids: list[str], canceled_at: float,
             at: float | None = None) -> str:
    """Schedule a look at the job's canceled ``batch_ids`` (at ``at``, by default one
    LEASH_BATCH_POLL_SECONDS from now, never past the grace). Returns RQ's job id."""
    now = clock.wall()
    if at is None:
        at = min(now + batches().batch_poll_seconds, canceled_at + batches().batch_cancel_grace)
    queue_name = (connection.hget(keys.job(job_id), "queue") or b"").decode() or settings().queue
    ttl = settings().result_ttl
    look = rq_side.rq_queue(connection, queue_name).enqueue_at(
        datetime.fromtimestamp(max(at, now), UTC), LOOK, job_id, list(batch_ids), canceled_at,
        result_ttl=0, failure_ttl=ttl, description=f"count what the canceled batch of job {job_id} answered")
    return look.id


def look(connection: Redis, backend: Any, job_id: str, batch_ids: list[str], canceled_at: float) -> None:
    """One look (RQ runs it through ``LOOK``): count each canceled batch that has ended; past the
    grace, give up on the rest; else look again later. ``backend`` is the configured model
    backend (``jobs.models.backends.get_backend()``)."""
    record = keys.provider_batches(job_id)
    if connection.hget(keys.job(job_id), "state") not in (b"failed", None):
        return  # replayed: the job's own looks read its batches (and count them with its items)
    parts = _parts(connection, record)
    counted = connection.hmget(record, [COUNTED + b for b in batch_ids]) if batch_ids else []
    left = [b for b, done in zip(batch_ids, counted, strict=True) if done is None and not parts[b][1]]
    if not left:
        return
    now = clock.wall()
    grace = batches().batch_cancel_grace
    if now - canceled_at >= grace:
        if connection.hsetnx(record, GAVE_UP, repr(now)):
            connection.expire(record, 2 * settings().result_ttl)
            log.warning("job %s: the canceled batch %s did not end within LEASH_BATCH_CANCEL_GRACE (%gs) of the "
                        "cancel: what it answered before the cancel is not counted", job_id, ", ".join(left), grace)
        return
    successor = schedule(connection, job_id, left, canceled_at)  # first: a look that dies leaves the next
    _cancel_unconfirmed(connection, backend, job_id, record, left)
    for batch_id in left:
        try:
            if not backend.batch_poll(batch_id).ended:
                continue
            calls = _count(connection, backend, job_id, batch_id)
        except Exception as exc:  # noqa: BLE001 - judged below: the provider may answer at the next look
            if not _gone(backend, exc):
                log.warning("job %s: could not read the canceled batch %s (%s: %s); it is looked at again",
                            job_id, batch_id, type(exc).__name__, str(exc)[:300])
                continue
            log.warning("job %s: the canceled batch %s cannot be read (%s: %s): what it answered before the "
                        "cancel is not counted", job_id, batch_id, type(exc).__name__, str(exc)[:300])
            calls = 0
        # Read to its end: a replay of the job asks its items directly instead of reading it
        # again (its answers' usage is counted here, not stored).
        connection.hset(record, mapping={COUNTED + batch_id: calls, f"ended:{parts[batch_id][0]}": "1"})
        connection.expire(record, 2 * settings().result_ttl)
        log.info("job %s: the canceled batch %s answered %d request(s) before the cancel; counted",
                 job_id, batch_id, calls)
        left = [b for b in left if b != batch_id]
    if not left:
        _drop(connection, successor)


def _cancel_unconfirmed(connection: Redis, backend: Any, job_id: str, record: str, batch_ids: list[str]) -> None:
    """The batches whose cancel the provider has not confirmed (the door that canceled the job
    could not reach it, or had other model settings): asked here, with the worker's settings,
    the deployment's."""
    sent = connection.hmget(record, [CANCEL_SENT + b for b in batch_ids]) if batch_ids else []
    for batch_id, done in zip(batch_ids, sent, strict=True):
        if done is not None:
            continue
        try:
            backend.batch_cancel(batch_id)
        except Exception as exc:  # noqa: BLE001 - asked again at the next look
            log.warning("job %s: the provider did not confirm the cancel of batch %s (%s: %s); asked again at the "
                        "next look", job_id, batch_id, type(exc).__name__, str(exc)[:300])
            continue
        connection.hset(record, CANCEL_SENT + batch_id, "1")
        log.info("job %s: batch %s canceled at the provider by a worker", job_id, batch_id)


def _count(connection: Redis, backend: Any, job_id: str, batch_id: str) -> int:
    """Count the usage of every request ``batch_id`` answered (billed, whether or not the job
    could have used the answer) in one write; items the job stored before the cancel were
    counted with them. Returns the calls this batch answered."""
    stored = {int(i) for i in connection.hkeys(keys.items(job_id)) if i.isdigit()}
    kind, owner, attempts = (v.decode() if v else "" for v in
                             connection.hmget(keys.job(job_id), "kind", "owner", "attempts"))
    model = backend.settings.name
    meter = Meter(kind)
    seen: set[str] = set()
    for name, _outcome, used in backend.batch_results(batch_id):
        head, _, tail = name.rpartition("-")
        if used is None or name in seen or (head == job_id and tail.isdigit() and int(tail) in stored):
            continue
        seen.add(name)
        meter.record(model, used.input_tokens, used.output_tokens, used.cached_input_tokens or 0,
                     used.estimated, backend.price, batch=True)
    pending = meter.take()
    if pending is None or not pending.calls:
        return 0
    pending.write_id = WRITE_ID
    day = utc_day(clock.wall())
    transitions.batch_usage_record(
        connection, job_id, owner, day, model,
        [batch_id, pending.encode(), day, attempts or 0, settings().result_ttl + 24 * 3600, day_ttl()])
    return pending.calls


def _parts(connection: Redis, record: str) -> dict[str, tuple[str, bool]]:
    """Each batch id of the job's record: (its part number, whether it was read to its end)."""
    raw = {k.decode(): v.decode() for k, v in connection.hgetall(record).items()}
    parts = {v: (k[3:], raw.get(f"ended:{k[3:]}") == "1") for k, v in raw.items() if k.startswith("id:")}
    return collections.defaultdict(lambda: ("", True), parts)  # a batch no longer recorded: nothing to do


def _gone(backend: Any, exc: Exception) -> bool:
    """The provider refused the read for good (no such batch, a refusal): no look will do better."""
    judge = getattr(backend, "look_failure", None)
    verdict = judge(exc) if judge is not None else None
    return verdict is not None and verdict[0] != LOOK_AGAIN


def _drop(connection: Redis, rq_job_id: str) -> None:
    """Every batch is counted: the look scheduled next has nothing to do."""
    try:
        Job.fetch(rq_job_id, connection=connection, serializer=JSONSerializer).delete()
    except NoSuchJobError:
        pass


def cancel_parts(backend, batch_ids: list[str], job_id: str) -> list[tuple[str, str]]:
    """Ask the provider to stop the job's batches (best effort: each is tried); the batches it
    did not confirm, each with why."""
    refused = []
    for batch_id in batch_ids:
        try:
            backend.batch_cancel(batch_id)
            log.info("job %s: batch %s canceled at the provider", job_id, batch_id)
        except Exception as exc:
            refused.append((batch_id, f"{type(exc).__name__}: {exc}"[:300]))
            log.warning("job %s: batch %s not canceled at the provider: %s", job_id, batch_id, exc)
    return refused


def open_batch_ids(connection, job_id: str) -> list[str]:
    raw = {k.decode(): v.decode() for k, v in connection.hgetall(keys.provider_batches(job_id)).items()}
    return [v for k, v in raw.items() if k.startswith("id:") and raw.get(f"ended:{k[3:]}") != "1"]


def cancel_at_provider(connection, job_id: str, backend) -> tuple[list[str], list[tuple[str, str]]]:
    """After ``cancel`` of a waiting batch job (``control.WAITING``): its provider batches are
    canceled, through ``backend`` (the door's: ``jobs.models.backends.get_backend()``), and what
    they answered before the cancel is counted once they have ended (``canceled_batch``).
    Returns the batches that were open and those the provider did not confirm canceled (with
    why): a door's model settings may not be the deployment's, so a worker's look, with its own,
    asks the provider again at once."""
    ids = open_batch_ids(connection, job_id)
    if not ids:
        return [], []
    try:  # ``backend`` may be a factory: no model settings at this door is a refusal like any other
        refused = cancel_parts(backend() if callable(backend) else backend, ids, job_id)
    except Exception as exc:  # noqa: BLE001 - no backend here at all: the worker's look cancels
        refused = [(batch_id, f"{type(exc).__name__}: {exc}"[:300]) for batch_id in ids]
    not_sent = {batch_id for batch_id, _ in refused}
    sent = {CANCEL_SENT + batch_id: "1" for batch_id in ids if batch_id not in not_sent}
    if sent:
        connection.hset(keys.provider_batches(job_id), mapping=sent)
    now = clock.wall()
    schedule(connection, job_id, ids, now, at=now if refused else None)
    return ids, refused


def cancel_words(ids: list[str], refused: list[tuple[str, str]]) -> tuple[str, bool]:
    """What a cancel of a job waiting at its provider says, and whether the provider confirmed it.
    Only what the provider said: never "canceled at the provider" unless it was."""
    if not ids:
        return "canceled (its batch had already ended at the provider)", True
    if not refused:
        return "canceled, and its batch at the provider too", True
    why = "; ".join(f"{batch_id}: {error}" for batch_id, error in refused)
    return (f"canceled in leash, but the provider did not confirm the cancel of its batch ({why}); a worker asks "
            "the provider again now, with the deployment's model settings (`leash status` shows the batch)"), False
