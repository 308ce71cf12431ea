"""What the API and the pages both read: the Redis connection, the owner's job, query
arguments. (The pages do not import the API, and the API does not import the pages.)"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import current_app, request
from redis import Redis
from werkzeug.exceptions import BadRequest, NotFound

from jobs import kinds
from jobs.errors import NoSuchJob
from jobs.read import job_page, job_status, listing

MAX_JOB_ID = 200
_ASCII_DIGITS = re.compile(r"[0-9]{1,12}")


def redis_conn() -> Redis:
    return current_app.extensions["leash_redis"]


class NoSuchJobHere(NotFound):
    description = "no such job"


def read_status(connection: Redis, job_id: str, owner: str) -> dict[str, Any]:
    """The status fields of the owner's job, in one round trip (two while it waits for a
    retry; the archive's when Redis no longer holds it); 404 for anyone else's."""
    if len(job_id) > MAX_JOB_ID:
        raise NoSuchJobHere()
    try:
        return job_status.owned(connection, job_id, owner)
    except NoSuchJob:
        raise NoSuchJobHere() from None


def read_job_page(connection: Redis, job_id: str, owner: str, offset: int, limit: int) -> job_page.JobPage:
    """What the owner's job page shows, in one round trip (jobs/read/job_page.py); 404 for
    anyone else's."""
    if len(job_id) > MAX_JOB_ID:
        raise NoSuchJobHere()
    try:
        return job_page.read(connection, job_id, owner, offset, limit)
    except NoSuchJob:
        raise NoSuchJobHere() from None


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


#: The query arguments that filter a listing (kept in its paging links).
FILTER_ARGS = ("state", "kind", "q", "from", "to")
#: Longest ``?q=`` a listing searches for.
MAX_SEARCH = 100


def _date_arg(name: str) -> datetime | None:
    raw = request.args.get(name) or None
    if raw is None:
        return None
    try:
        return datetime.strptime(raw, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise BadRequest(f"'{name}' must be a date like 2026-12-01, got {raw[:40]!r}") from None


def filters_arg() -> listing.Filters:
    """A listing's filters: ``?state=`` (a view), ``?kind=``, ``?q=`` (any part of the id,
    name or kind), ``?from=`` / ``?to=`` (dates, UTC, both days included)."""
    kind = request.args.get("kind") or None
    if kind is not None and kind not in kinds.KINDS:
        raise BadRequest(f"'kind' must be one of {', '.join(sorted(kinds.KINDS))}, got {kind[:40]!r}")
    search = (request.args.get("q") or "").strip() or None
    if search is not None and len(search) > MAX_SEARCH:
        raise BadRequest(f"'q' is {len(search)} characters long; search for at most {MAX_SEARCH}")
    since, until = _date_arg("from"), _date_arg("to")
    if since and until and until < since:
        raise BadRequest("'to' is before 'from'")
    return listing.Filters(view=state_arg(), kind=kind, search=search,
                           since=since.timestamp() if since else None,
                           until=(until + timedelta(days=1)).timestamp() if until else None)
