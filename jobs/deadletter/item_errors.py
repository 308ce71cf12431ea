"""What a replay reads of a job's item errors: which of its items ended in an error, and
whether the job failed by them (every item errored, or more than its ``max_item_errors``).

A job that failed by its item errors is replayed by asking those items again, whichever door
the replay came through (``leash replay``, the job page's Replay, ``POST /jobs/<id>/replay``,
the failures page): kept, they would count over the limit again and the job would fail again
at once, having asked nothing. ``--errored-items`` asks them of any ended job (jobs.deadletter.errored).
"""

from __future__ import annotations

import json

from redis import Redis

from jobs import keys
from jobs.core import outcome
from jobs.core.text import decoded


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


def failed_by_them(connection: Redis, job_ids: list[str], archived: dict[str, dict] | None = None) -> dict[str, int]:
    """Of ``job_ids``, the failed jobs whose error is their item errors, each with how many of
    its items ended in an error (the count recorded as it ended: read from the job hash alone,
    so it answers for an archived job whose items left Redis, and for a dry run). ``archived``:
    the records of jobs Redis no longer holds, as the archive has them (a dry run's)."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), "state", "error", outcome.FIELD)
        rows = pipe.execute()
    archived = archived or {}
    rows = [[record.get(field) for field in ("state", "error", outcome.FIELD)]
            if state is None and (record := archived.get(job_id)) else (state, error, count)
            for job_id, (state, error, count) in zip(job_ids, rows, strict=True)]
    found = {}
    for job_id, (state, error, count) in zip(job_ids, rows, strict=True):
        if decoded(state) == "failed" and outcome.failed_by_item_errors(decoded(error)) and int(count or 0):
            found[job_id] = int(count)
    return found
