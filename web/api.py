"""The JSON API: submit a job, poll it, page through its results, cancel it, list yours.

    POST /jobs                 202 {job_id, state, url}; Idempotency-Key repeat -> 200, same job;
                               with "dry_run": true, 200 {estimate} and nothing written
    GET  /jobs/<id>            the status fields (jobs.core.states.FIELDS); ETag, 304 when unchanged
    GET  /jobs/<id>/result     per-item results, ?offset=&limit=
    GET  /jobs/<id>/result.csv every item beside its result, streamed (also .jsonl)
    POST /jobs/<id>/cancel     202; 409 when the job has already ended
    GET  /jobs                 the caller's jobs, newest first, ?offset=&limit=&state=&kind=&q=&from=&to=
    GET  /usage                the caller's tokens and cost per UTC day, model and kind, ?days=

``GET /jobs/<id>`` and ``GET /jobs`` answer a browser (Accept prefers text/html) with the
page instead (web.pages, wired in by the app factory). A job that is not the caller's is a
404, exactly like an unknown id. A status poll is one Redis round trip: the job hash, RQ's
status and the job's two short history lists, pipelined.
"""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, redirect, request, stream_with_context, url_for

from jobs import kinds
from jobs.archive.reading import usage_days_kept
from jobs.batch.run import cancel_at_provider
from jobs.core import control, outcome, states
from jobs.enqueue import check_name
from jobs.errors import InvalidJob, NoSuchJob
from jobs.intake import submission
from jobs.models.backends import get_backend
from jobs.read import job_status, listing, results
from jobs.usage.report import owner_usage

from .auth import Need, request_owner
from .confirm import confirm_page, needs_confirming
from .error_replies import api_error, error_response, wants_html
from .reads import FILTER_ARGS, NoSuchJobHere, filters_arg, int_arg, read_status, redis_conn

bp = Blueprint("api", __name__)

EXAMPLE = '{"kind": "classify", "items": ["first text", "second text"], "labels": ["positive", "negative"]}'
#: Fields of the request body that are options, not part of the job's payload.
OPTIONS = ("kind", "max_attempts", "queue", "name", "dry_run", "webhook_url", "after", "after_policy")
#: Options the submission takes by their own names.
_PASSED = ("webhook_url", "after", "after_policy")
_IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9_.:@-]{1,200}$")
_QUOTED_FIELD = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'")


def missing_field(message: str, payload: dict) -> str | None:
    """The field a validator complains about when the request did not send it at all (a 400),
    else None (present but wrong: type, empty, too many, too long: a 422)."""
    named = _QUOTED_FIELD.findall(message)
    return named[0] if named and named[0] not in payload and named[0] not in OPTIONS else None


class _Fail(Exception):
    """A submission rejected with this status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _parse_submission() -> tuple[str, dict, Any, Any, Any, bool, dict]:
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
    try:
        name = check_name(body.get("name"))
    except InvalidJob as exc:
        raise _Fail(422, str(exc)) from None
    dry = body.get("dry_run", False)
    if not isinstance(dry, bool):
        raise _Fail(422, f"'dry_run' must be true or false, got {json.dumps(dry)[:60]}")
    return kind, payload, body.get("max_attempts"), body.get("queue"), name, dry, {k: body.get(k) for k in _PASSED}


@bp.post("/jobs")
def submit():
    owner = request_owner(Need.ACT)
    idempotency_key = request.headers.get("Idempotency-Key")
    if idempotency_key is not None and not _IDEMPOTENCY_KEY.match(idempotency_key):
        return api_error(400, "the Idempotency-Key header must be 1-200 characters of letters, digits and _.:@- "
                              "(a UUID works)")
    try:
        kind, payload, max_attempts, queue, name, dry, passed = _parse_submission()
    except _Fail as fail:
        return api_error(fail.status, fail.message)
    connection = redis_conn()
    try:  # with dry_run: the price before the run, every check made and nothing written
        submitted = submission.submit(connection, submission.Submission(
            kind, payload, owner, max_attempts, queue, name, idempotency_key,
            address=request.remote_addr or "unknown", **passed), dry_run=dry)
    except submission.Refused as refused:
        refusal = refused.refusal
        return api_error(refusal.status, refusal.message, {"Retry-After": str(refusal.retry_after)})
    except submission.Invalid as exc:
        missing = missing_field(str(exc), payload)
        return api_error(400, f"missing field '{missing}': {exc}") if missing else api_error(422, str(exc))
    if dry:
        return jsonify(estimate=submitted.estimate)
    job_id, created = submitted.job_id, submitted.created
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


def html_view(endpoint: str):
    """The page that answers a browser at an API address (web.pages, wired by the app
    factory: the API does not import the pages)."""
    return current_app.extensions["leash_html_views"][endpoint]


@bp.get("/jobs/<job_id>")
def job(job_id: str):
    if wants_html():
        return html_view("api.job")(job_id)
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
    owner = request_owner(Need.ACT)
    connection = redis_conn()
    fields = read_status(connection, job_id, owner)  # 404 unless it is the caller's job
    if job_status.from_archive(fields):  # ended, and nothing of it left in Redis to change
        return error_response(409, f"not canceled: {job_status.ONLY_ARCHIVED} ({outcome.words(fields)}); "
                                   "only queued or running jobs can be canceled")
    if needs_confirming():
        return confirm_page("cancel", fields, "api.cancel")
    previous, provider = cancel_job(connection, job_id)
    if wants_html():
        # A running job stops at its next heartbeat: until then its page says the cancel is on its way.
        asked = {"cancel": "requested"} if previous == states.State.RUNNING else {}
        return redirect(url_for("api.job", job_id=job_id, **asked), 303)
    if previous in (states.State.SUCCEEDED, states.State.FAILED):
        return api_error(409, f"the job has already {previous}; only queued or running jobs can be canceled")
    state = states.status(connection, job_id)["state"]
    response = jsonify(job_id=job_id, state=state, cancel="requested", url=url_for("api.job", job_id=job_id),
                       **({"provider_batch": provider} if provider is not None else {}))
    response.status_code = 202
    return response


def cancel_job(connection, job_id: str) -> tuple[str, dict | None]:
    """Cancel one job as the API does (a pipeline's cancel too, stage by stage): the state it
    was in, and for a batch job waiting at its provider what the provider said of its batch."""
    previous = control.cancel(connection, job_id)
    provider = None
    if previous == control.WAITING:  # a batch job waiting at its provider: its batch is canceled too
        try:
            backend = get_backend()
        except Exception:  # noqa: BLE001 - no model settings in the web process: a worker's look cancels
            backend = None
        ids, refused = cancel_at_provider(connection, job_id, backend)
        # Only what the provider said; a batch it did not confirm is asked again by a worker.
        provider = {"batches": ids, "canceled": [b for b in ids if b not in dict(refused)],
                    "not_confirmed": [{"batch_id": b, "error": e} for b, e in refused]}
    return previous, provider


@bp.get("/jobs/<job_id>/result.<any(csv, jsonl):fmt>")
def download(job_id: str, fmt: str):
    """Every item beside its result, streamed page by page: any size, constant memory."""
    connection = redis_conn()
    read_status(connection, job_id, request_owner())  # 404 unless it is the caller's job
    rows = results.iter_results(connection, job_id)
    columns = results.result_columns(connection, job_id) if fmt == "csv" else []

    def csv_lines():
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(results.csv_header(columns))
        for row in rows:
            writer.writerow(results.csv_row(*row, columns=columns))
            if buffer.tell() > 32_768:
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
        yield buffer.getvalue()

    def jsonl_lines():
        for row in rows:
            yield results.jsonl_row(*row)

    mimetype = "text/csv" if fmt == "csv" else "application/x-ndjson"
    response = Response(stream_with_context(csv_lines() if fmt == "csv" else jsonl_lines()), mimetype=mimetype)
    response.headers["Content-Disposition"] = f'attachment; filename="{job_id}-results.{fmt}"'
    response.headers["Cache-Control"] = "no-cache, private"
    return response


@bp.get("/usage")
def usage():
    """The caller's own usage only: an owner never sees another's figures."""
    report = owner_usage(redis_conn(), request_owner(), days=int_arg("days", 30, 1, usage_days_kept()))
    return _cacheable(jsonify(report), etag=False)


@bp.get("/jobs")
def job_list():
    if wants_html():
        return html_view("api.job_list")()
    owner = request_owner(Need.LIST)
    offset = int_arg("offset", 0, 0, 10**9)
    limit = int_arg("limit", 20, 1, 100)
    filters = filters_arg()
    found = listing.find(redis_conn(), owner, offset, limit, filters)
    following = offset + limit if offset + limit < found.total else None
    args = {name: request.args[name] for name in FILTER_ARGS if request.args.get(name)}
    return _cacheable(jsonify(
        jobs=found.jobs, offset=offset, limit=limit, total=found.total, state=filters.view,
        next=url_for("api.job_list", offset=following, limit=limit, **args) if following is not None else None,
    ), etag=False)
