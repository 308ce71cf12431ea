"""What the API and the pages both read: the Redis connection, the owner's job, query
arguments. (The pages do not import the API, and the API does not import the pages.)"""

from __future__ import annotations

import re
from typing import Any

from flask import current_app, request
from redis import Redis
from werkzeug.exceptions import BadRequest, NotFound

from jobs import listing, states

MAX_JOB_ID = 200
_ASCII_DIGITS = re.compile(r"[0-9]{1,12}")


def redis_conn() -> Redis:
    return current_app.extensions["leash_redis"]


class NoSuchJobHere(NotFound):
    description = "no such job"


def read_status(connection: Redis, job_id: str, owner: str) -> dict[str, Any]:
    """The status fields of the owner's job, in one round trip (two while it waits for a
    retry); 404 for anyone else's."""
    if len(job_id) > MAX_JOB_ID:
        raise NoSuchJobHere()
    raw, rq_status, errors, history = states.read_with_history(connection, job_id)
    if not raw or raw.get(b"owner", b"").decode() != owner:
        raise NoSuchJobHere()
    return states.from_raw(job_id, raw, rq_status, errors=errors, history=history,
                           retry_at=states.retry_time(connection, job_id, raw, rq_status))


def int_arg(name: str, default: int, minimum: int, maximum: int) -> int:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    # ASCII digits only: int() would also take "٣", "5_000", "+5" and " 5".
    if not _ASCII_DIGITS.fullmatch(raw):
        raise BadRequest(f"'{name}' must be an integer from {minimum} to {maximum}, got {raw[:40]!r}")
    value = int(raw)
    if not minimum <= value <= maximum:
        raise BadRequest(f"'{name}' must be an integer from {minimum} to {maximum}, got {value}")
    return value




def state_arg() -> str | None:
    """``?state=`` of a listing: one of the states or ``canceled`` (listing.VIEWS), or absent /
    empty for all."""
    raw = request.args.get("state") or None
    if raw is not None and raw not in listing.VIEWS:
        choices = ", ".join(listing.VIEWS)
        raise BadRequest(f"'state' must be one of {choices}, got {raw[:40]!r}")
    return raw
