"""One delivery attempt of a pipeline's webhook (jobs/webhooks/pipeline_hooks.py queues it): an RQ
job whose dotted path RQ stores (it never moves). The first attempt builds the body from the
pipeline's status and keeps it in the record, so every attempt sends the same body; the address is
checked again, the body signed, and a 2xx delivers it, as a job's webhook (jobs/webhooks/delivery.py)."""

from __future__ import annotations

import json

from rq import get_current_job

from jobs import keys
from jobs.core import clock
from jobs.core.text import decoded
from jobs.read import pipeline_view
from jobs.webhooks.delivery import ERROR_CHARS, NotDelivered, attempt_once


def body_of(connection, pipeline_id: str, delivery_id: str) -> str:
    """The webhook's body, built once (the delivery's first attempt) and kept in the pipeline's
    record (one per delivery: a pipeline that ends again after a replay is told again)."""
    field = f"webhook_body:{delivery_id}"
    kept = decoded(connection.hget(keys.pipeline(pipeline_id), field))
    if kept:
        return kept
    record = pipeline_view.read_record(connection, pipeline_id)
    status = pipeline_view.status(connection, record) if record else {"pipeline_id": pipeline_id}
    outcome = "canceled" if status.get("canceled") else status.get("state", "failed")
    body = json.dumps({"type": f"pipeline.{outcome}", "timestamp": clock.iso(clock.wall()), "data": status},
                      separators=(",", ":"))
    connection.hsetnx(keys.pipeline(pipeline_id), field, body)
    return decoded(connection.hget(keys.pipeline(pipeline_id), field)) or body


def deliver(pipeline_id: str, delivery_id: str, url: str) -> str:
    """Send the pipeline's webhook once; "delivered", else NotDelivered (RQ retries it)."""
    rq_job = get_current_job()
    body = body_of(rq_job.connection, pipeline_id, delivery_id)
    status, error = attempt_once(url, delivery_id, body)
    retries_left = rq_job.retries_left if rq_job is not None else 0
    state = "delivered" if error is None else ("pending" if retries_left else "given up")
    if rq_job is not None:
        with rq_job.connection.pipeline(transaction=False) as pipe:
            pipe.hset(keys.pipeline(pipeline_id), mapping={"webhook_state": state, "webhook_status": status or "",
                                                           "webhook_error": (error or "")[:ERROR_CHARS]})
            pipe.hincrby(keys.pipeline(pipeline_id), "webhook_attempts", 1)
            pipe.execute()
    if error is not None:
        raise NotDelivered(f"webhook {delivery_id} of pipeline {pipeline_id}: {error}")
    return state
