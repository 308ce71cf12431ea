"""A pipeline's status (``GET /pipelines/<id>``, its page, ``leash pipeline status``): each
stage's job read as ``GET /jobs/<id>`` reads it, cut to what a pipeline's reader wants, and the
pipeline's own state: the first stage that has not succeeded decides it (all succeeded:
succeeded). A stage whose job record left Redis is read from the archive, as its job's address
reads it (``source: "archive"``): an earlier stage's record expires before the pipeline's, which
each later stage's start and end keeps alive. Without an archive (or not in it) it shows as
``expired``."""

from __future__ import annotations

import json
from typing import Any

from redis import Redis

from jobs import keys
from jobs.archive import reading
from jobs.core import clock, states
from jobs.core.outcome import words
from jobs.core.text import decoded
from jobs.errors import NoSuchJob
from jobs.usage import prices

#: Each stage's fields, taken from its job's status.
STAGE_FIELDS = ("state", "outcome", "canceled", "done", "total", "item_errors", "error", "cost_usd", "usage",
                "waiting", "started_at", "finished_at", "after", "source")


def read_record(connection: Redis, pipeline_id: str) -> dict[str, Any] | None:
    """The pipeline's record (None: no such pipeline, or it expired)."""
    if not isinstance(pipeline_id, str) or not 0 < len(pipeline_id) <= 200:
        return None
    raw = {decoded(k): decoded(v) for k, v in connection.hgetall(keys.pipeline(pipeline_id)).items()}
    if not raw:
        return None
    budget = {}
    if raw.get("budget_tokens"):
        budget["tokens"] = int(raw["budget_tokens"])
    if raw.get("budget_nusd"):
        budget["usd"] = prices.usd(int(raw["budget_nusd"]))
    return {"pipeline_id": pipeline_id, "owner": raw["owner"], "name": raw.get("name"),
            "created_at": clock.iso(float(raw["created_at"])), "stages": json.loads(raw["stages"]),
            "budget": budget or None, "webhook_url": raw.get("webhook_url"), "webhook": _webhook(raw)}


def _webhook(raw: dict) -> dict | None:
    """Where the pipeline's webhook goes and how its delivery went (jobs/webhooks/pipeline_hooks.py);
    None without one. ``waiting``: the pipeline has not ended."""
    if not raw.get("webhook_url"):
        return None
    return {"url": raw["webhook_url"], "state": raw.get("webhook_state") or "waiting",
            "attempts": int(raw.get("webhook_attempts") or 0),
            "status": int(raw["webhook_status"]) if raw.get("webhook_status") else None,
            "error": raw.get("webhook_error") or None}


def owned(connection: Redis, pipeline_id: str, owner: str | None) -> dict[str, Any]:
    """The record of a pipeline of this owner's (None: any owner's); NoSuchJob otherwise."""
    record = read_record(connection, pipeline_id)
    if record is None or (owner is not None and record["owner"] != owner):
        raise NoSuchJob(f"no such pipeline: {pipeline_id}")
    return record


def status(connection: Redis, record: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's status from its record (jobs.intake.pipelines.read_record)."""
    stages = [_stage(connection, entry) for entry in record["stages"]]
    deciding = next((s for s in stages if s["state"] != states.State.SUCCEEDED.value), None)
    state = deciding["state"] if deciding else states.State.SUCCEEDED.value
    # Summed as the stages show them (to the hundred-millionth usd rounds to), so the total is
    # theirs to the last digit; unknown when any stage's is, as a job's cost is unknown when any
    # call's price is (a partial sum shown as the cost would be a guess).
    costs = [s.get("cost_usd") for s in stages if s["state"] not in ("not submitted", "expired")]
    known = None not in costs
    tokens = sum((s.get("usage") or {}).get("input_tokens", 0) + (s.get("usage") or {}).get("output_tokens", 0)
                 for s in stages)
    calls = sum((s.get("usage") or {}).get("calls", 0) for s in stages)
    return {
        "pipeline_id": record["pipeline_id"], "name": record["name"], "state": state,
        "canceled": any(s.get("canceled") for s in stages),
        "deciding_stage": deciding["name"] if deciding else None,
        "created_at": record["created_at"], "stages": stages,
        "cost_usd": round(sum(costs), 8) if known else None,
        "usage": {"calls": calls, "tokens": tokens}, "budget": record["budget"], "webhook": record["webhook"],
        "ended": state in (states.State.SUCCEEDED.value, states.State.FAILED.value) and all(
            s["state"] in (states.State.SUCCEEDED.value, states.State.FAILED.value, "expired") for s in stages),
    }


def _stage(connection: Redis, entry: dict) -> dict[str, Any]:
    out: dict[str, Any] = {"name": entry["name"], "kind": entry["kind"], "job_id": entry["job_id"],
                           "url": f"/jobs/{entry['job_id']}" if entry["job_id"] else None}
    if not entry["job_id"]:
        return out | {"state": "not submitted", "words": "not submitted"}
    try:
        fields = states.status(connection, entry["job_id"])
    except NoSuchJob:
        # Read as its address reads it (jobs.read.job_status.archived_fields, whose webhook
        # reading a stage's fields leave out): the same record through the same builder.
        found = reading.ended_job(entry["job_id"], connection)
        if found is None:
            return out | {"state": "expired", "words": "expired (its record is kept for a limited time)"}
        fields = states.from_raw(found.job_id, found.record, None, errors=found.errors, history=found.history)
        fields["source"] = states.FROM_ARCHIVE
    return out | {name: fields.get(name) for name in STAGE_FIELDS} | {"words": words(fields)}


def listed(connection: Redis, owner: str, offset: int = 0, limit: int = 20) -> tuple[list[dict[str, Any]], int]:
    """An owner's pipelines, newest first, each with its status (``GET /pipelines``), and how many
    there are. A pipeline whose record expired leaves the list as it is read."""
    key = keys.owner_pipelines(owner)
    ids = [decoded(p) for p in connection.zrevrange(key, offset, offset + limit - 1)]
    found, gone = [], []
    for pipeline_id in ids:
        record = read_record(connection, pipeline_id)
        if record is None:
            gone.append(pipeline_id)
        else:
            found.append(status(connection, record))
    if gone:
        connection.zrem(key, *gone)
    return found, connection.zcard(key)
