"""Pipelines over HTTP: several stage jobs in one request (jobs/intake/pipelines.py), one page
and one status for all of them, one cancel for every stage.

    POST /pipelines               202 {pipeline_id, stages: [{name, job_id, url}], url};
                                  Idempotency-Key repeat -> 200, the same pipeline;
                                  with "dry_run": true, 200 {estimate} and nothing written;
                                  a stage refused: 422 naming it, nothing written
    GET  /pipelines               the caller's pipelines, newest first, ?offset=&limit=
    GET  /pipelines/<id>          its status (jobs/read/pipeline_view.py); a browser gets the page
    POST /pipelines/<id>/cancel   202, every stage canceled (each as POST /jobs/<id>/cancel does)

A pipeline that is not the caller's is a 404, exactly like an unknown id (as jobs are).
"""

from __future__ import annotations

import json

from flask import Blueprint, jsonify, redirect, render_template, request, url_for
from werkzeug.exceptions import NotFound

from jobs.core import states
from jobs.errors import InvalidJob, NoSuchJob
from jobs.intake import pipelines, submission
from jobs.intake.submission import Refused
from jobs.read import humane, money, pipeline_view, poll_schedule

from .api import _IDEMPOTENCY_KEY, cancel_job
from .auth import Need, browser_owner, request_owner
from .error_replies import api_error, wants_html
from .reads import int_arg, redis_conn

bp = Blueprint("pipelines", __name__)

EXAMPLE = ('{"stages": [{"name": "classify", "kind": "classify", "items": ["..."], "labels": ["positive", '
           '"negative"]}, {"name": "extract", "kind": "extract", "schema": {"type": "object"}, '
           '"items_from": {"stage": "classify", "label": "negative"}}]}')


class NoSuchPipelineHere(NotFound):
    description = "no such pipeline"


def _owned(connection, pipeline_id: str, owner: str) -> dict:
    try:
        return pipeline_view.owned(connection, pipeline_id, owner)
    except NoSuchJob:
        raise NoSuchPipelineHere() from None


def _stage_links(stages) -> list[dict]:
    return [{"name": name, "job_id": job_id, "url": url_for("api.job", job_id=job_id)} for name, job_id in stages]


@bp.post("/pipelines")
def submit():
    owner = request_owner(Need.ACT)
    key = request.headers.get("Idempotency-Key")
    if key is not None and not _IDEMPOTENCY_KEY.match(key):
        return api_error(400, "the Idempotency-Key header must be 1-200 characters of letters, digits and _.:@- "
                              "(a UUID works)")
    if not request.is_json:
        got = request.mimetype or "no Content-Type"
        return api_error(415, f"send the pipeline as JSON with 'Content-Type: application/json' (got {got}), "
                              f"e.g. {EXAMPLE}")
    try:
        body = json.loads(request.get_data(cache=False))
    except (ValueError, RecursionError) as exc:
        return api_error(400, f"the body is not valid JSON ({str(exc)[:200]}); send an object like {EXAMPLE}")
    dry = body.get("dry_run", False) if isinstance(body, dict) else False
    if not isinstance(dry, bool):
        return api_error(422, f"'dry_run' must be true or false, got {json.dumps(dry)[:60]}")
    connection = redis_conn()
    try:
        pipeline = pipelines.read(body, owner, key, address=request.remote_addr or "unknown")
        submitted = pipelines.submit(connection, pipeline, submission, dry_run=dry)
    except Refused as refused:
        refusal = refused.refusal
        return api_error(refusal.status, refusal.message, {"Retry-After": str(refusal.retry_after)})
    except InvalidJob as exc:
        status = 400 if str(exc).startswith("missing field 'stages'") or not isinstance(body, dict) else 422
        return api_error(status, str(exc))
    if dry:
        return jsonify(estimate=submitted.estimate)
    url = url_for("pipelines.pipeline", pipeline_id=submitted.pipeline_id)
    response = jsonify(pipeline_id=submitted.pipeline_id, stages=_stage_links(submitted.stages), url=url)
    response.status_code = 202 if submitted.created else 200
    response.headers["Location"] = url
    return response


@bp.get("/pipelines")
def pipeline_list():
    """The caller's pipelines, newest first, each with its status."""
    owner = request_owner(Need.LIST)
    offset = int_arg("offset", 0, 0, 10**9)
    limit = int_arg("limit", 20, 1, 100)
    found, total = pipeline_view.listed(redis_conn(), owner, offset, limit)
    following = offset + limit if offset + limit < total else None
    response = jsonify(pipelines=found, offset=offset, limit=limit, total=total,
                       next=url_for("pipelines.pipeline_list", offset=following, limit=limit)
                       if following is not None else None)
    response.headers["Cache-Control"] = "no-cache, private"
    response.vary.update(("Accept", "Authorization", "Cookie"))
    return response


@bp.get("/pipelines/<pipeline_id>")
def pipeline(pipeline_id: str):
    if wants_html():
        return pipeline_page(pipeline_id)
    connection = redis_conn()
    fields = pipeline_view.status(connection, _owned(connection, pipeline_id, request_owner()))
    response = jsonify(fields)
    response.headers["Cache-Control"] = "no-cache, private"
    response.vary.update(("Accept", "Authorization", "Cookie"))
    response.add_etag()
    return response.make_conditional(request)


@bp.post("/pipelines/<pipeline_id>/cancel")
def cancel(pipeline_id: str):
    connection = redis_conn()
    owner = request_owner(Need.ACT)
    _owned(connection, pipeline_id, owner)
    providers: dict[str, dict] = {}  # what the provider said of a batch stage's batch, as POST /jobs/<id>/cancel

    def cancel_stage(conn, job_id: str) -> str:
        previous, provider = cancel_job(conn, job_id)
        if provider is not None:
            providers[job_id] = provider
        return previous

    canceled = pipelines.cancel(connection, pipeline_id, cancel_stage)
    if wants_html():
        return redirect(url_for("pipelines.pipeline", pipeline_id=pipeline_id), 303)
    ended = (states.State.SUCCEEDED, states.State.FAILED)
    response = jsonify(pipeline_id=pipeline_id, cancel="requested",
                       stages=[{"name": name, "job_id": job_id, "was": was, "canceled": was not in ended}
                               | ({"provider_batch": providers[job_id]} if job_id in providers else {})
                               for name, job_id, was in canceled],
                       url=url_for("pipelines.pipeline", pipeline_id=pipeline_id))
    response.status_code = 202
    return response


def pipeline_page(pipeline_id: str):
    connection = redis_conn()
    fields = pipeline_view.status(connection, _owned(connection, pipeline_id, browser_owner(Need.READ)))
    # static/job.js stops polling at an ended state: a pipeline's ends as its stages' do.
    schedule = {"fast": poll_schedule.FAST_POLL, "period": poll_schedule.FAST_PERIOD,
                "slow": poll_schedule.SLOW_POLL, "terminal": " ".join(sorted(states.TERMINAL))}
    from .pages import _page

    return _page(render_template(
        "pipeline.html", pipeline=fields, schedule=schedule, money=money.money, ago=humane.relative,
        refresh=None if fields["ended"] else int(poll_schedule.SLOW_POLL)))
