"""Asking a job's errored items again (`leash replay --errored-items`, ``POST /jobs/<id>/replay``
with ``errored_items``, the job page's "Retry the N errored items"): only the items that ended in
an error are asked again; the answered ones stay in the job's checkpoint and cost nothing.

One step: ``replay`` finds each job's errored items, then the ordinary replay (``replayer.replay``,
replay_v4) drops their results and puts the job back to queued in the same script, through its
owner's queued cap and with its audit entry. A job that succeeded with item errors is taken too
(its RQ record rebuilt first from leash's copy of the payload: RQ keeps only part of a finished
job). A job refused (its owner at the queued cap) is left exactly as it was, its errored items
and its outcome with it: no moment reads "failed (reopened ...)".
"""

from __future__ import annotations

from redis import Redis
from rq.registry import FinishedJobRegistry

from jobs import keys
from jobs.config import settings
from jobs.core.text import decoded
from jobs.deadletter.item_errors import errored_items
from jobs.deadletter.replayer import Candidate, ReplayOutcome, Restore, rebuild_rq_jobs
from jobs.deadletter.replayer import replay as replay_jobs
from jobs.usage.budget import Budget

#: The reason a job at its owner's queued cap gives (the rest of it: jobs.intake.door).
LEFT_AS_IT_WAS = "left as it was, its errored items kept: "

__all__ = ["LEFT_AS_IT_WAS", "errored_items", "prepare", "replay"]


def prepare(connection: Redis, job_ids: list[str], restore: Restore | None = None
            ) -> tuple[list[Candidate], dict[str, list[int]], list[tuple[str, str]]]:
    """The jobs whose errored items can be asked again, each one's errored items, and those
    skipped with the reason (no errored items, not ended, nothing left to run). Nothing of a job
    changes here but a succeeded job's RQ record, rebuilt whole (still finished) to run again."""
    if restore is not None:
        restore(connection, job_ids)  # an archived job's items and payload copy back in Redis first
    ready: list[Candidate] = []
    reopen: dict[str, list[int]] = {}
    skipped: list[tuple[str, str]] = []
    for job_id in job_ids:
        state, kind, error, ended_at = (decoded(v) for v in connection.hmget(
            keys.job(job_id), "state", "kind", "error", "ended_at"))
        errored = errored_items(connection, job_id)
        if state not in ("succeeded", "failed"):
            skipped.append((job_id, f"{state or 'missing'}: only an ended job's errored items can be asked again"))
        elif not errored:
            skipped.append((job_id, f"{state}: no item of it ended in an error"))
        elif state == "succeeded" and job_id not in rebuild_rq_jobs(connection, [job_id], status="finished"):
            skipped.append((job_id, "its payload has expired, there is nothing left to run"))
        else:
            ready.append(Candidate(job_id, kind or "", float(ended_at) if ended_at else None,
                                   (error or "").strip().split("\n", 1)[0]))
            reopen[job_id] = errored
    return ready, reopen, skipped


def replay(connection: Redis, job_ids: list[str], actor: str, selector: dict, restore: Restore | None = None,
           budget: Budget | None = None, now: float | None = None) -> ReplayOutcome:
    """Ask the errored items of ``job_ids`` again (see the module's docstring)."""
    ready, reopen, skipped = prepare(connection, job_ids, restore)
    done = replay_jobs(connection, ready, actor, selector | {"errored_items": True}, skipped=skipped, now=now,
                       budget=budget, restore=restore, reopen=reopen)
    done.left_failed = [(job_id, LEFT_AS_IT_WAS + reason.removeprefix("left failed: "))
                        for job_id, reason in done.left_failed]
    for candidate in done.replayed:  # RQ's registry of finished jobs no longer holds a running one
        queue = decoded(connection.hget(keys.job(candidate.job_id), "queue")) or settings().queue
        FinishedJobRegistry(queue, connection=connection).remove(candidate.job_id)
    return done
