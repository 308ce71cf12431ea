"""Asking a job's errored items again (`leash replay --errored-items`, ``POST /jobs/<id>/replay``
with ``errored_items``, the job page's "Retry the N errored items"): only the items that ended in
an error are asked again; the answered ones stay in the job's checkpoint and cost nothing.

Two steps. ``reopen`` drops the errored items' results (reopen_v1) and, for a job that succeeded
with item errors, makes it failed (its RQ record rebuilt from leash's copy of the payload: RQ kept
only the kind of a succeeded job); then the ordinary replay (``replayer.replay``) puts it back to
queued, through its owner's queued cap and with its audit entry.
"""

from __future__ import annotations

import json

from redis import Redis
from rq.registry import FinishedJobRegistry

from jobs import keys
from jobs.config import settings
from jobs.core import clock, outcome
from jobs.core.text import decoded
from jobs.deadletter.replayer import Restore, rebuild_rq_jobs
from jobs.lifecycle import transitions

#: What a job reopened for its errored items reads for the moment before its replay puts it back.
REOPENED = "reopened to ask its {n} errored items again (leash replay --errored-items)"


def errored_items(connection: Redis, job_id: str) -> list[int]:
    """The indexes of the job's items whose stored result is an item error."""
    found = []
    for index, raw in connection.hscan_iter(keys.items(job_id), count=500):
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if outcome.is_item_error(value):
            found.append(int(decoded(index)))
    return sorted(found)


def reopen(connection: Redis, job_ids: list[str], restore: Restore | None = None,
           now: float | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """The jobs ready for the replay (their errored items dropped; failed), and those skipped
    with the reason: no errored items, or not ended."""
    now = clock.wall() if now is None else now
    if restore is not None:
        restore(connection, job_ids)  # an archived job's items and payload copy back in Redis first
    ready: list[str] = []
    skipped: list[tuple[str, str]] = []
    for job_id in job_ids:
        state, owner, queue = (decoded(v) for v in connection.hmget(keys.job(job_id), "state", "owner", "queue"))
        errored = errored_items(connection, job_id)
        if state not in ("succeeded", "failed"):
            skipped.append((job_id, f"{state or 'missing'}: only an ended job's errored items can be asked again"))
            continue
        if not errored:
            skipped.append((job_id, f"{state}: no item of it ended in an error"))
            continue
        if state == "succeeded" and job_id not in rebuild_rq_jobs(connection, [job_id]):
            skipped.append((job_id, "its payload has expired, there is nothing left to run"))
            continue
        if state == "succeeded":
            FinishedJobRegistry(queue or settings().queue, connection=connection).remove(job_id)
        before = decoded(transitions.reopen(connection, job_id, owner or "", [
            job_id, now, REOPENED.format(n=len(errored)), settings().result_ttl, *errored]))
        if before in ("succeeded", "failed"):
            ready.append(job_id)
        else:
            skipped.append((job_id, f"{before}: only an ended job's errored items can be asked again"))
    return ready, skipped
