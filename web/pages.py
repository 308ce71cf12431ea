"""Server-rendered pages for people: submit a job, watch it, come back to it.

    GET/POST /            the form; a valid submission is a 303 to the job's page
    GET /jobs/<id>        (Accept: text/html) state, progress bar, attempts, stale badge,
                          error, paged results, cancel button
    GET /jobs             (Accept: text/html) your jobs

The job page works without JavaScript (a meta refresh while the job runs); with it,
static/job.js polls GET /jobs/<id> on the backoff schedule of ``jobs.watch.poll_delay``
and reloads the page once the job ends, to show the results.
"""

from __future__ import annotations

import json
from datetime import datetime

from flask import Blueprint, current_app, make_response, redirect, render_template, url_for

from jobs import clock, results, states, watch
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob

from .api import int_arg, list_jobs, read_status, redis_conn
from .auth import browser_owner
from .forms import SubmitForm

bp = Blueprint("pages", __name__)

RESULTS_PER_PAGE = 50
JOBS_PER_PAGE = 25
STALE_TEXT = "stale — the worker stopped reporting, the job will be retried"


def _attach_error(form: SubmitForm, message: str) -> None:
    """Show a validator's message on the field it is about."""
    positions = {name: message.find(name) for name in ("items", "labels") if name in message}
    field_name = min(positions, key=positions.get) if positions else "kind"
    if field_name == "items" and form.items_file.data and getattr(form.items_file.data, "filename", ""):
        field_name = "items_file"
    getattr(form, field_name).errors.append(message)


def _page(html: str, status: int = 200):
    response = make_response(html, status)
    response.headers["Cache-Control"] = "no-cache, private"
    response.vary.update(("Accept", "Cookie"))
    return response


@bp.route("/", methods=["GET", "POST"])
def index():
    owner = browser_owner()
    form = SubmitForm()
    if form.validate_on_submit():
        items = form.item_list()
        if items is not None:
            payload: dict = {"items": items}
            if form.label_list():
                payload["labels"] = form.label_list()
            try:
                job_id, _ = enqueue(redis_conn(), form.kind.data, payload, owner=owner,
                                    idempotency_key="form:" + form.submission.data)
            except InvalidJob as exc:
                _attach_error(form, str(exc))
            else:
                return redirect(url_for("api.job", job_id=job_id), 303)
    status = 422 if form.is_submitted() and form.errors else 200
    return _page(render_template("index.html", form=form), status)


def _age(fields: dict) -> float:
    created = fields.get("created_at")
    if not created:
        return 0.0
    return max(0.0, clock.wall() - datetime.fromisoformat(created).timestamp())


def _show(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def job_page(job_id: str):
    owner = browser_owner()
    connection = redis_conn()
    fields = read_status(connection, job_id, owner)
    terminal = fields["state"] in (states.State.SUCCEEDED, states.State.FAILED)
    table = None
    if terminal and fields["done"]:
        offset = int_arg("offset", 0, 0, 10**7)
        page = results.read_page(connection, job_id, offset, RESULTS_PER_PAGE)
        inputs = results.item_inputs(connection, job_id, offset, RESULTS_PER_PAGE)
        rows = [(index, inputs[index - offset] if index - offset < len(inputs) else None, _show(value))
                for index, value in page.items]
        table = {"rows": rows, "page": page,
                 "next": url_for("api.job", job_id=job_id, offset=page.next_offset)
                 if page.next_offset is not None else None,
                 "previous": url_for("api.job", job_id=job_id, offset=page.previous_offset)
                 if page.previous_offset is not None else None}
    schedule = {"fast": watch.FAST_POLL, "period": watch.FAST_PERIOD, "slow": watch.SLOW_POLL}
    refresh = None if terminal else int(watch.poll_delay(_age(fields)))
    return _page(render_template(
        "job.html", job=fields, terminal=terminal, table=table, refresh=refresh, schedule=schedule,
        stale_text=STALE_TEXT, percent=_percent(fields),
        summary=fields["result"]["summary"] if fields["result"] else None,
    ))


def _percent(fields: dict) -> int:
    if fields["state"] == states.State.SUCCEEDED:
        return 100
    return int(100 * fields["done"] / fields["total"]) if fields["total"] else 0


def jobs_page():
    owner = browser_owner()
    offset = int_arg("offset", 0, 0, 10**9)
    total, listing = list_jobs(redis_conn(), owner, offset, JOBS_PER_PAGE)
    following = offset + JOBS_PER_PAGE if offset + JOBS_PER_PAGE < total else None
    previous = max(0, offset - JOBS_PER_PAGE) if offset else None
    return _page(render_template(
        "jobs.html", jobs=[dict(job, percent=_percent(job)) for job in listing], total=total, offset=offset,
        next=url_for("api.job_list", offset=following) if following is not None else None,
        previous=url_for("api.job_list", offset=previous) if previous is not None else None,
        dashboard=current_app.config.get("LEASH_DASHBOARD_MOUNTED", False),
    ))
