"""One look at a batch job's provider batches (the ``look`` step of jobs/batch/run.py):
read each part the provider has ended, then end the job, or park it until the next look.

Two things a look does not give up on lightly, because each costs money or fails work:

- **A canceled batch is still read.** Past LEASH_BATCH_MAX_WAIT the job's open batches are
  canceled, but a provider bills what it answered before the cancel and returns it once the
  batch has ended (OpenAI: ``cancelling`` -> ``cancelled`` with an output file; Anthropic:
  ``canceling`` -> ``ended``, the requests done before it ``succeeded``). So the job keeps
  parking (status ``batch.phase`` ``canceling``) and reads those answers like any ended part's;
  only what is still missing then runs direct. A batch that has not ended within
  LEASH_BATCH_CANCEL_GRACE of the cancel is left: the rest runs direct, and what it answers
  later is not read (one WARNING says so). The cancel's time is in the job's batch record, so a
  worker that stops in between changes nothing.
- **A failed look is looked at again.** A provider error while polling or reading results that
  may pass (connection error, timeout, 429, 5xx, after the SDK's own retries) is logged, counted
  (``failed_looks`` in the batch record, ``batch.failed_looks`` in status) and the job parks
  for the next look: the attempt does not fail. A refusal (401, 403...) fails the job as the same
  answer to a direct call would (PermanentError: no retry, replayable once fixed); a batch the
  provider no longer has (404) too, its part marked ended so a replay asks its items directly.
  Failing looks do not stop the clock: past LEASH_BATCH_MAX_WAIT the job goes the max-wait way.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from jobs.batch import room
from jobs.config import batches
from jobs.core import clock
from jobs.errors import PermanentError

if TYPE_CHECKING:
    from jobs.batch.parts import Part
    from jobs.batch.turn import Turn

log = logging.getLogger("leash.batch")

#: ``look_failure``'s verdicts (jobs.models.batch_api.batching: the core names no model module).
LOOK_AGAIN, BATCH_GONE = "look again", "batch gone"
#: The job's stage at its provider, as park_v1 records it.
WAITING, CANCELING = "waiting", "canceling"
#: A waiting batch is looked at again after this share of the time it has waited (within
#: LEASH_BATCH_POLL_SECONDS and LEASH_BATCH_POLL_MAX): an answer is read at most a tenth later
#: than it could have been, and a job that waits a day costs ~120 looks instead of 1,440.
LOOK_GAP_SHARE = 0.1


def next_look_in(waited: float, stage: str = WAITING) -> float:
    """Seconds to the next look at a batch that has waited ``waited`` seconds. Looks back off
    as the wait grows, so jobs that only wait cost little: a look is a turn on a worker. A
    canceled batch (its grace is minutes) is looked at every LEASH_BATCH_POLL_SECONDS."""
    waits = batches()
    base = waits.batch_poll_seconds
    if stage == CANCELING:
        return base
    return min(max(base, waits.batch_poll_max), max(base, waited * LOOK_GAP_SHARE))


def look(run: Turn, done: dict) -> list[Any]:
    record = run.record
    counts: list[int] | None = [0, 0, 0]
    failed: str | None = None
    for part in sorted(record.parts.values(), key=lambda p: p.number):
        if part.ended:
            counts[2] += len(part.indexes)
            continue
        try:
            progress = _look_at(run, part, done)
        except Exception as exc:
            failed = _judge(run, part, exc)
            counts = None  # the provider's counts as of the last look stay
            break
        counts = [counts[0] + int(progress.done or 0), counts[1] + int(progress.failed or 0),
                  counts[2] + int(progress.total or len(part.indexes))]
    _count_failed_look(run, failed)
    if run.cut is not None:
        run.stop_cut()
    if failed is None and record.canceled_at is None:
        sent = room.send_more(run, done)  # items a budget held back, in the room freed
        if counts is not None:
            counts[2] += sent
    ended = all(p.ended for p in record.parts.values())
    if ended and (record.canceled_at is not None or not room.unsent(run, done)):
        return run.finish()
    now = clock.wall()
    grace = batches().batch_cancel_grace
    if record.canceled_at is None and now - (record.first_at or now) > batches().batch_max_wait:
        log.warning("job %s: waited LEASH_BATCH_MAX_WAIT for the provider; its batch is canceled, what it answered "
                    "before the cancel is read once it ends, and the rest runs direct", run.ctx.job_id)
        run.cancel_open()
        record.canceled_at = now
        record.note("canceled_at", now)
    if record.canceled_at is not None and now - record.canceled_at >= grace:
        unread = [p for p in record.parts.values() if not p.ended]
        if grace > 0:
            log.warning("job %s: the canceled batch %s did not end within LEASH_BATCH_CANCEL_GRACE (%gs): the items "
                        "left run direct, and answers the provider gives later are not read", run.ctx.job_id,
                        ", ".join(str(p.batch_id) for p in unread), grace)
        run.give_back(unread)
        return run.finish()
    run.park(counts, CANCELING if record.canceled_at is not None else WAITING)


def _look_at(run: Turn, part: Part, done: dict):
    """Poll one part; read it if it has ended. A part being canceled that the provider still
    runs (the cancel did not reach it) is canceled again."""
    with run.ctx.keepalive(run.backend.settings.timeout * 4 + 30):  # the SDK's retries included
        progress = run.backend.batch_poll(part.batch_id)
    if progress.ended:
        log.info("job %s: batch %s ended at the provider (%s%s)", run.ctx.job_id, part.batch_id,
                 progress.status, f": {progress.message}" if getattr(progress, "message", None) else "")
        run.read(part, done)
        run.record.note(f"ended:{part.number}", "1")
        part.ended = True
    elif run.record.canceled_at is not None and not getattr(progress, "canceling", True):
        run.cancel_open([part.batch_id])
    return progress


def _judge(run: Turn, part: Part, exc: Exception) -> str:
    """What a look's error means: returns what happened for an error that may pass (the job
    looks again); raises PermanentError for a refusal; raises ``exc`` itself when it is not the
    provider's answer."""
    judge = getattr(run.backend, "look_failure", None)
    verdict = judge(exc) if judge is not None else None
    if verdict is None:
        raise exc
    kind, message = verdict
    if kind == LOOK_AGAIN:
        return message
    if kind == BATCH_GONE:
        run.record.note(f"ended:{part.number}", "1")  # nothing to read there: a replay asks directly
        part.ended = True
    raise PermanentError(f"leash could not look at the provider's batch {part.batch_id}: {message}") from None


def _count_failed_look(run: Turn, failed: str | None) -> None:
    record = run.record
    if failed is None:
        if record.failed_looks:
            record.failed_looks = 0
            record.note("failed_looks", 0)
            record.note("batch_failed_looks", 0, job_hash=True)  # status's copy (a park also writes it)
        return
    record.failed_looks += 1
    record.note("failed_looks", record.failed_looks)
    log.warning("job %s: look %d in a row at its provider batch failed (%s); it looks again in %gs",
                run.ctx.job_id, record.failed_looks, failed, batches().batch_poll_seconds)
