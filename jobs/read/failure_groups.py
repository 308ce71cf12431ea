"""Failed jobs grouped by kind and error, for people: the ``/failures`` page and ``leash
failures`` read the same groups (``jobs.deadletter.failures.report``), here with what a page
needs beside them — a stable key per group (its anchor and its Replay button), the HTTP
status its jobs met said plainly, the newest jobs of each group with their names, and the
failure rate over the same window.

An owner sees the groups of their own jobs; ``owner=None`` (the dashboard's operator) sees
every owner's.
"""

from __future__ import annotations

import hashlib
import re

from redis import Redis

from jobs import keys
from jobs.core import clock
from jobs.core.text import decoded
from jobs.deadletter import alerts, failures
from jobs.read import listing

#: Jobs of a group a page lists (the rest are counted; Replay takes them all).
JOBS_SHOWN = 20
#: An HTTP status in an error's text: "failed (HTTP 500)"; "(500)" in errors stored before 0.3.
_STATUS = re.compile(r"\((?:HTTP )?(\d{3})\)")


def group_key(kind: str, error: str) -> str:
    """A short stable name for a group: the same kind and normalised error, the same key."""
    return hashlib.sha1(f"{kind}\0{error}".encode()).hexdigest()[:12]


def key_of_job(fields: dict) -> str | None:
    """The key of the group a failed job's status fields put it in; None unless it failed."""
    if fields.get("state") != "failed" or fields.get("canceled") or not fields.get("error"):
        return None
    head = fields["error"].strip().split("\n", 1)[0][:failures.HEAD_CHARS]
    return group_key(fields["kind"] or "", failures.normalise(head))


def with_status(connection: Redis, group: dict) -> str:
    """A group's error with the HTTP status its jobs met, plainly: grouping reads every number
    as ``<n>`` (so one bug is one group), which hides "(HTTP 500)"; the examples' own errors say it."""
    text = group["error"]
    placeholder = "(HTTP <n>)" if "(HTTP <n>)" in text else "(<n>)"
    if placeholder not in text:
        return text
    found: list[str] = []
    for job_id in group["examples"]:
        error = decoded(connection.hget(keys.job(job_id), "error")) or ""
        found += [code for code in _STATUS.findall(error.strip().split("\n", 1)[0]) if code not in found]
    if not found:
        return text
    return text.replace(placeholder, f"(HTTP {', '.join(sorted(found))})", 1)


def rate(connection: Redis, owner: str | None, since: float | None, now: float | None = None) -> dict:
    """Failed of ended jobs over the window: every owner's from the outcome counters (kept two
    days), one owner's from their newest jobs. ``None`` figures when the window is longer
    than what is counted."""
    now = clock.wall() if now is None else now
    if owner is None:
        if since is None or since > alerts.MAX_WINDOW:
            return {"failed": None, "ended": None, "ratio": None}
        result = alerts.check(connection, since, now=now)
        ended = result.failed + result.succeeded
        return {"failed": result.failed, "ended": ended, "ratio": result.failed / ended if ended else None}
    low = float("-inf") if since is None else now - since
    failed = ended = 0
    for row in listing.scan(connection, owner, listing.Filters(), now):
        if row.ended is not None and row.ended >= low and row.view in ("succeeded", "failed"):
            ended += 1
            failed += row.view == "failed"
    return {"failed": failed, "ended": ended, "ratio": failed / ended if ended else None}


def _jobs(connection: Redis, job_ids: list[str]) -> list[dict]:
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), "name")
            pipe.zscore(keys.FAILED_INDEX, job_id)
        replies = pipe.execute()
    return [{"job_id": job_id, "name": decoded(replies[2 * n]) or None,
             "failed_at": clock.iso(replies[2 * n + 1]) if replies[2 * n + 1] is not None else None}
            for n, job_id in enumerate(job_ids)]


def groups(connection: Redis, owner: str | None, since: float | None = 24 * 3600, kind: str | None = None,
           now: float | None = None) -> dict:
    """The report with, per group, ``key``, ``error_shown``, ``jobs`` (the newest JOBS_SHOWN:
    id, name, when it failed) and ``job_ids`` (all of them); and the window's ``rate``."""
    found = failures.report(connection, since=since, kind=kind, now=now, owner=owner, with_ids=True)
    for group in found["groups"]:
        group["key"] = group_key(group["kind"], group["error"])
        group["error_shown"] = with_status(connection, group)
        group["jobs"] = _jobs(connection, group["job_ids"][:JOBS_SHOWN])
    found["rate"] = rate(connection, owner, since, now=now)
    return found


def group_ids(connection: Redis, owner: str | None, key: str, since: float | None = 24 * 3600,
              kind: str | None = None, now: float | None = None) -> list[str]:
    """Every job of the group named ``key`` (empty when no group has that key now)."""
    found = failures.report(connection, since=since, kind=kind, now=now, owner=owner, with_ids=True)
    for group in found["groups"]:
        if group_key(group["kind"], group["error"]) == key:
            return list(group["job_ids"])
    return []


def owned_failed(connection: Redis, owner: str | None, job_ids: list[str]) -> list[str]:
    """Those of ``job_ids`` that are failed jobs the viewer may replay (``owner=None``: any)."""
    index = keys.FAILED_INDEX if owner is None else keys.owner_state(owner, "failed")
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.zscore(index, job_id)
        return [job_id for job_id, score in zip(job_ids, pipe.execute(), strict=True) if score is not None]
