"""A pipeline's status (``GET /pipelines/<id>``, its page, ``leash pipeline status``): each
stage's job read as ``GET /jobs/<id>`` reads it, cut to what a pipeline's reader wants, and the
pipeline's own state: the first stage that has not succeeded decides it (all succeeded:
succeeded). A stage whose job record has expired shows as ``expired``."""

from __future__ import annotations

from typing import Any

from redis import Redis

from jobs.core import states
from jobs.core.outcome import words
from jobs.errors import NoSuchJob

#: Each stage's fields, taken from its job's status.
STAGE_FIELDS = ("state", "outcome", "canceled", "done", "total", "item_errors", "error", "cost_usd", "usage",
                "waiting", "started_at", "finished_at", "after")


def status(connection: Redis, record: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's status from its record (jobs.intake.pipelines.read_record)."""
    stages = [_stage(connection, entry) for entry in record["stages"]]
    deciding = next((s for s in stages if s["state"] != states.State.SUCCEEDED.value), None)
    state = deciding["state"] if deciding else states.State.SUCCEEDED.value
    costs = [s["cost_usd"] for s in stages if s.get("cost_usd") is not None]
    tokens = sum((s.get("usage") or {}).get("input_tokens", 0) + (s.get("usage") or {}).get("output_tokens", 0)
                 for s in stages)
    calls = sum((s.get("usage") or {}).get("calls", 0) for s in stages)
    return {
        "pipeline_id": record["pipeline_id"], "name": record["name"], "state": state,
        "canceled": any(s.get("canceled") for s in stages),
        "deciding_stage": deciding["name"] if deciding else None,
        "created_at": record["created_at"], "stages": stages,
        "cost_usd": round(sum(costs), 6) if costs or not stages else None,
        "usage": {"calls": calls, "tokens": tokens}, "budget": record["budget"],
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
        return out | {"state": "expired", "words": "expired (its record is kept for a limited time)"}
    return out | {name: fields.get(name) for name in STAGE_FIELDS} | {"words": words(fields)}


def ended(status_fields: dict[str, Any]) -> bool:
    """Whether the pipeline has ended: its last stage ended, or a stage failed or was canceled and
    nothing of it is queued or running any more."""
    return status_fields["ended"]
