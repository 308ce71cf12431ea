"""What a job's page shows, read in one round trip: the status fields (the job hash, RQ's
status, the error and attempt lists), one page of results with each item's usage, the payload
copy (the page's inputs and, for an extract job, its result columns: parsed once), the price
the job was given at submission and a batch job's record at its provider -- one pipeline.

More round trips only where the data is not in this release's keys: a job waiting for a
retry (when RQ's scheduler brings it back), a job of a release that kept no payload copy (RQ's
record), an archived job whose Redis copy has left (the archive answers, in SQL). A job whose
record Redis no longer holds is read whole from the archive: its row, then the page's rows
(inputs beside results), two queries (jobs/read/job_status.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redis import Redis

from jobs import keys
from jobs.archive import reading
from jobs.core import payload_copy, states
from jobs.core.text import decoded
from jobs.errors import NoSuchJob
from jobs.read import job_status, job_view, results


@dataclass
class JobPage:
    fields: dict[str, Any]  # the status fields (jobs.core.states.FIELDS)
    page: results.Page  # the results of [offset, offset + limit)
    inputs: list[Any]  # the submitted items of the same range
    columns: list[str]  # an extract job's result columns ([]: results are text or one value)
    schema: dict[str, Any] | None  # an extract job's JSON Schema (None: the job has none)
    attempts: list[dict[str, Any]]  # the history, each replay's first attempt marked
    run: dict[str, Any]  # the latest run's timing and speed (job_view.run_timing)
    batch: dict[str, Any] | None  # a batch job's details at its provider (job_view.batch_details)
    estimate: dict[str, Any] | None  # the price it was given at submission (jobs/intake/estimate.py)


def read(connection: Redis, job_id: str, owner: str, offset: int = 0, limit: int = 50,
         now: float | None = None) -> JobPage:
    """The owner's job as its page shows it; ``NoSuchJob`` for an unknown id or another
    owner's job (the same answer, so an id says nothing about whose it is)."""
    indexes = list(range(offset, offset + limit))
    with connection.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.job(job_id))
        pipe.hget(keys.rq_job(job_id), "status")
        pipe.lrange(keys.errors(job_id), 0, -1)
        pipe.lrange(keys.history(job_id), 0, -1)
        pipe.hmget(keys.items(job_id), indexes)
        pipe.hmget(keys.usage(job_id), [f"i{index}" for index in indexes])
        pipe.exists(keys.items(job_id))
        pipe.get(keys.payload(job_id))
        pipe.get(keys.estimate(job_id))
        pipe.hgetall(keys.provider_batches(job_id))
        raw, rq_status, errors, history, values, usages, items_held, payload, estimate, batches = pipe.execute()
    if not raw:
        return _from_archive(connection, job_id, owner, offset, limit, now)
    if decoded(raw.get(b"owner")) != owner:
        raise NoSuchJob(f"no such job: {job_id}")
    rq_status = decoded(rq_status)
    fields = states.from_raw(job_id, raw, rq_status, now=now, errors=errors, history=history,
                             retry_at=states.retry_time(connection, job_id, raw, rq_status))
    fields = job_view.with_every_webhook_attempt(connection, job_id, fields)
    h = {decoded(k): decoded(v) for k, v in raw.items()}
    page = results.page_of(connection, job_id, offset, limit, owner, h.get("state"), h.get("done"), h.get("total"),
                           h.get("archived_at"), values, usages, items_held, kind=h.get("kind"))
    inputs, schema = _inputs_and_schema(connection, job_id, payload, offset, limit)
    if h.get("kind") == results.ONE_ANSWER_KIND:  # its one result answers the instruction
        inputs = [results.answer_item(connection, job_id)] if offset == 0 else []
    attempts = job_view.marked_attempts(fields["history"])
    return JobPage(fields=fields, page=page, inputs=inputs, columns=results.schema_columns(schema), schema=schema,
                   attempts=attempts,
                   run=job_view.run_timing(fields, attempts, h, now=now),
                   batch=job_view.batch_details(fields, {decoded(k): decoded(v) for k, v in batches.items()}),
                   estimate=_estimate(estimate))


def _from_archive(connection: Redis, job_id: str, owner: str, offset: int, limit: int,
                  now: float | None) -> JobPage:
    """The page of an ended job Redis no longer holds, as it read before: its archived record,
    history, payload and estimate (one query), the page's inputs and results (one more)."""
    found = job_status.owned_in_archive(connection, job_id, owner)
    fields = job_status.archived_fields(connection, found, now=now, every_attempt=True)
    rows = reading.page(job_id, offset, limit, connection)
    page = results.archived_page(connection, found, offset, limit, rows=rows)
    inputs = [item for _, item, _, _ in rows]
    if found.record.get("kind") == results.ONE_ANSWER_KIND:  # its one result answers the instruction
        instruction = (found.payload or {}).get("instruction")
        inputs = [instruction if isinstance(instruction, str) else None] if offset == 0 else []
    schema = results.payload_schema(found.payload)
    attempts = job_view.marked_attempts(fields["history"])
    # A batch job's record at its provider is among the keys that leave Redis after LEASH_REDIS_KEEP
    # (keys.archived_heavy), so an archived job's page never shows it: the same here.
    return JobPage(fields=fields, page=page, inputs=inputs, columns=results.schema_columns(schema), schema=schema,
                   attempts=attempts, run=job_view.run_timing(fields, attempts, found.record, now=now),
                   batch=job_view.batch_details(fields, {}), estimate=_estimate(found.estimate))


def _inputs_and_schema(connection: Redis, job_id: str, raw: bytes | None, offset: int,
                       limit: int) -> tuple[list[Any], dict | None]:
    """The page's submitted items and the job's schema, from the payload copy read with the
    rest, parsed once; without a usable copy, where ``jobs.read.results`` finds them."""
    try:
        payload = payload_copy.decode(raw) if raw is not None else None
    except ValueError:
        payload = None
    items = payload.get("items") if isinstance(payload, dict) else None
    if not isinstance(items, list):  # an older release's job (RQ's record), or the archive's
        return results.item_inputs(connection, job_id, offset, limit), results.job_schema(connection, job_id)
    return items[offset:offset + limit], results.payload_schema(payload)


def _estimate(raw: bytes | str | None) -> dict[str, Any] | None:
    try:
        figures = json.loads(raw) if raw else None
    except ValueError:
        return None
    return figures if isinstance(figures, dict) and "items" in figures else None
