"""The JSON API: submit a job, poll it, page through its results, cancel it, list yours.

    POST /jobs                 202 {job_id, state, url}; Idempotency-Key repeat -> 200, same job
    GET  /jobs/<id>            the status fields (jobs.states.FIELDS); ETag, 304 when unchanged
    GET  /jobs/<id>/result     per-item results, ?offset=&limit=
    POST /jobs/<id>/cancel     202; 409 when the job has already ended
    GET  /jobs                 the caller's jobs, newest first, ?offset=&limit=

``GET /jobs/<id>`` and ``GET /jobs`` answer a browser (Accept prefers text/html) with the
page instead (web.pages). A job that is not the caller's is a 404, exactly like an unknown id.
A status poll is one Redis round trip: the job hash and RQ's status, pipelined.
"""

from __future__ import annotations

import json
import re
from typing import Any

from flask import Blueprint, current_app, jsonify, redirect, request, url_for
from redis import Redis
from werkzeug.exceptions import BadRequest, NotFound

from jobs import control, keys, kinds, results, states
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob, NoSuchJob

from .auth import request_owner
from .errors import api_error, wants_html

bp = Blueprint("api", __name__)

EXAMPLE = '{"kind": "classify", "items": ["first text", "second text"], "labels": ["positive", "negative"]}'
#: Fields of the request body that are options, not part of the job's payload.
OPTIONS = ("kind", "max_attempts", "queue")
_IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9_.:@-]{1,200}$")
_QUOTED_FIELD = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'")
MAX_JOB_ID = 200
_ASCII_DIGITS = re.compile(r"[0-9]{1,12}")


def redis_conn() -> Redis:
    return current_app.extensions["leash_redis"]


class NoSuchJobHere(NotFound):
    description = "no such job"


def read_status(connection: Redis, job_id: str, owner: str) -> dict[str, Any]:
    """The status fields of the owner's job, in one round trip; 404 for anyone else's."""
    if len(job_id) > MAX_JOB_ID:
        raise NoSuchJobHere()
    raw, rq_status = states.read(connection, job_id)
    if not raw or raw.get(b"owner", b"").decode() != owner:
        raise NoSuchJobHere()
    return states.from_raw(job_id, raw, rq_status)


def list_jobs(connection: Redis, owner: str, offset: int, limit: int) -> tuple[int, list[dict[str, Any]]]:
    """(how many jobs the owner has, the status fields of one page of them, newest first)."""
    index = keys.owner_jobs(owner)
    with connection.pipeline(transaction=False) as pipe:
        pipe.zcard(index)
        pipe.zrevrange(index, offset, offset + limit - 1)
        total, ids = pipe.execute()
    if not ids:
        return total, []
    with connection.pipeline(transaction=False) as pipe:
        for raw_id in ids:
            pipe.hgetall(keys.job(raw_id.decode()))
            pipe.hget(keys.rq_job(raw_id.decode()), "status")
        replies = pipe.execute()
    listing = []
    for n, raw_id in enumerate(ids):
        raw, rq_status = replies[2 * n], replies[2 * n + 1]
        if raw:
            listing.append(states.from_raw(raw_id.decode(), raw, rq_status.decode() if rq_status else None))
        else:  # the job's record expired (LEASH_RESULT_TTL after it ended): trim the index as met
            connection.zrem(index, raw_id)
    return total, listing


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


def missing_field(message: str, payload: dict) -> str | None:
    """The field a validator complains about when the request did not send it at all (a 400),
    else None (present but wrong: type, empty, too many, too long: a 422)."""
    named = _QUOTED_FIELD.findall(message)
    return named[0] if named and named[0] not in payload else None


class _Fail(Exception):
    """A submission rejected with this status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _parse_submission() -> tuple[str, dict, Any, Any]:
    if not request.is_json:
        got = request.mimetype or "no Content-Type"
        raise _Fail(415, f"send the job as JSON with 'Content-Type: application/json' (got {got}), e.g. {EXAMPLE}")
    try:
        body = json.loads(request.get_data(cache=False))
    except (ValueError, RecursionError) as exc:
        raise _Fail(400, f"the body is not valid JSON ({str(exc)[:200]}); send an object like {EXAMPLE}") from None
    if not isinstance(body, dict):
        raise _Fail(400, f"the body must be a JSON object, got {type(body).__name__}; e.g. {EXAMPLE}")
    if "kind" not in body:
        raise _Fail(400, f"missing field 'kind': name the job kind, one of: {', '.join(sorted(kinds.KINDS))}")
    kind = body["kind"]
    if not isinstance(kind, str):
        raise _Fail(422, f"'kind' must be a string naming a job kind, one of: {', '.join(sorted(kinds.KINDS))}")
    try:
        kinds.get(kind)
    except InvalidJob as exc:
        raise _Fail(400, str(exc)) from None
    payload = {name: value for name, value in body.items() if name not in OPTIONS}
    return kind, payload, body.get("max_attempts"), body.get("queue")


@bp.post("/jobs")
def submit():
    owner = request_owner()
    idempotency_key = request.headers.get("Idempotency-Key")
    if idempotency_key is not None and not _IDEMPOTENCY_KEY.match(idempotency_key):
        return api_error(400, "the Idempotency-Key header must be 1-200 characters of letters, digits and _.:@- "
                              "(a UUID works)")
    try:
        kind, payload, max_attempts, queue = _parse_submission()
    except _Fail as fail:
        return api_error(fail.status, fail.message)
    connection = redis_conn()
    try:
        job_id, created = enqueue(connection, kind, payload, owner=owner, max_attempts=max_attempts,
                                  idempotency_key=idempotency_key, queue=queue)
    except InvalidJob as exc:
        missing = missing_field(str(exc), payload)
        if missing:
            return api_error(400, f"missing field '{missing}': {exc}")
        return api_error(422, str(exc))
    url = url_for("api.job", job_id=job_id)
    if created:
        response = jsonify(job_id=job_id, state=states.State.QUEUED.value, url=url)
        response.status_code = 202
    else:
        # The same job as the first request with this key; its state is today's, not a replay.
        response = jsonify(job_id=job_id, state=states.status(connection, job_id)["state"], url=url)
    response.headers["Location"] = url
    return response


def _cacheable(response, etag: bool = True):
    # The same address serves the HTML page and this JSON, per owner: caches must keep them apart.
    response.headers["Cache-Control"] = "no-cache, private"
    response.vary.update(("Accept", "Authorization", "Cookie"))
    if etag:
        response.add_etag()
        response.make_conditional(request)
    return response


@bp.get("/jobs/<job_id>")
def job(job_id: str):
    if wants_html():
        from .pages import job_page

        return job_page(job_id)
    fields = read_status(redis_conn(), job_id, request_owner())
    return _cacheable(jsonify(fields))


@bp.get("/jobs/<job_id>/result")
def result(job_id: str):
    owner = request_owner()
    offset = int_arg("offset", 0, 0, kinds.MAX_ITEMS * 100)
    limit = int_arg("limit", 100, 1, results.MAX_PAGE)
    try:
        page = results.read_page(redis_conn(), job_id, offset, limit)
    except NoSuchJob:
        raise NoSuchJobHere() from None
    if page.owner != owner:
        raise NoSuchJobHere()
    following = page.next_offset
    return _cacheable(jsonify(
        job_id=job_id, state=page.state, done=page.done, total=page.total, offset=offset, limit=limit,
        items=[{"index": index, "result": value} for index, value in page.items],
        next=url_for("api.result", job_id=job_id, offset=following, limit=limit) if following is not None else None,
    ))


@bp.post("/jobs/<job_id>/cancel")
def cancel(job_id: str):
    owner = request_owner()
    connection = redis_conn()
    read_status(connection, job_id, owner)  # 404 unless it is the caller's job
    previous = control.cancel(connection, job_id)
    if wants_html():
        return redirect(url_for("api.job", job_id=job_id), 303)
    if previous in (states.State.SUCCEEDED, states.State.FAILED):
        return api_error(409, f"the job has already {previous}; only queued or running jobs can be canceled")
    state = states.status(connection, job_id)["state"]
    response = jsonify(job_id=job_id, state=state, cancel="requested", url=url_for("api.job", job_id=job_id))
    response.status_code = 202
    return response


@bp.get("/jobs")
def job_list():
    if wants_html():
        from .pages import jobs_page

        return jobs_page()
    owner = request_owner()
    offset = int_arg("offset", 0, 0, 10**9)
    limit = int_arg("limit", 20, 1, 100)
    total, listing = list_jobs(redis_conn(), owner, offset, limit)
    following = offset + limit if offset + limit < total else None
    return _cacheable(jsonify(
        jobs=listing, offset=offset, limit=limit, total=total,
        next=url_for("api.job_list", offset=following, limit=limit) if following is not None else None,
    ), etag=False)
