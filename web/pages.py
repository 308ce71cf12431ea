"""Server-rendered pages for people: submit a job, watch it, come back to it.

    GET/POST /            the form; a valid submission is a 303 to the job's page
    GET /jobs/<id>        (Accept: text/html) state, progress, timing and speed, why it
                          waits, attempt history, error (first line; traceback folded),
                          results while it runs, downloads, cancel button
    POST /jobs/<id>/replay a failed job back to queued: the same path as ``leash replay``, with
                          an audit entry naming the web user; 303 to the page (JSON: 202)
    GET /jobs             (Accept: text/html) your jobs, filtered by state (canceled apart
                          from failed), with a count per state

The API answers browsers at its addresses by calling ``job_page`` / ``jobs_page`` (wired by
the app factory), so this module and web.api never import each other.

Every page works without JavaScript (a meta refresh while something runs); with it,
static/job.js and static/jobs.js poll on the backoff schedule of ``jobs.read.poll_schedule.poll_delay``
and swap in the fresh page's content when it changed.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

from flask import Blueprint, jsonify, make_response, redirect, render_template, request, url_for

from jobs import deadletter, kinds
from jobs.archive import restore as archive_restore
from jobs.batch.look_now import look_now, too_soon
from jobs.core import clock, outcome, states
from jobs.core.text import printable
from jobs.deadletter import errored
from jobs.enqueue import check_name
from jobs.errors import InvalidJob
from jobs.intake import admission, submission
from jobs.intake.estimate_words import text as estimate_text
from jobs.intake.modes import MODE_FIELD
from jobs.models.cache import CACHE_FIELD
from jobs.read import failure_groups, humane, job_status, job_view, listing, money, poll_schedule, results
from jobs.read.job_page import JobPage
from jobs.usage.budget import BUDGET_FIELD

from .auth import PUBLIC_OWNER, Need, browser_owner, request_owner
from .confirm import confirm_page, needs_confirming
from .error_replies import api_error, wants_html
from .forms import BaseSubmitForm, submit_form
from .reads import FILTER_ARGS, filters_arg, int_arg, read_job_page, read_status, redis_conn

bp = Blueprint("pages", __name__)

RESULTS_PER_PAGE = 50
JOBS_PER_PAGE = 25
STALE_TEXT = "stale — the worker stopped reporting, the job will be retried"
#: A batch job waiting at its provider holds no worker: what is late is its look (why: "waiting").
STALE_LOOK_TEXT = "stale — its look at the provider's batch is late"


def plain(message: str) -> str:
    """A validator's message in words for the form: "items[4]" is "Item 5", field names lose
    their quotes, and the sentence starts with a capital."""
    # items[4] is "Item 5", labels[0] "Label 1": an entry of any list field
    message = re.sub(r"\b([a-z_]+?)s?\[(\d+)\]", lambda m: f"{m.group(1).capitalize()} {int(m.group(2)) + 1}",
                     message)
    for name, words in (("'items' is empty; give at least one item", "Give at least one item: one per line, "
                         "or upload a file"),
                        ("'labels' must be a non-empty list of non-empty strings", "Give the labels to choose "
                         "from, separated by commas"),
                        ("'template' must be a non-empty string containing {item}", "Write the template: your "
                         "instruction with {item} where each item goes"),
                        ("'template' must contain {item}, where each item goes", "The template must contain "
                         "{item}, where each item goes"),
                        ("'labels' contains duplicates", "A label is given twice; give each label once")):
        message = message.replace(name, words)
    for field in ("items", "name", "mode", *(f.name for f, _ in kinds.fields())):
        message = message.replace(f"'{field}'", f"the {field}")
    return message[:1].upper() + message[1:]


def _field_for(message: str, form: BaseSubmitForm) -> str:
    """Which field a validator's message is about."""
    names = ("items", *(f.name for f, _ in kinds.fields()))
    positions = {name: message.find(name) for name in names if name in message}
    name = min(positions, key=positions.get) if positions else "kind"
    if name == "items" and form.items_file.data and getattr(form.items_file.data, "filename", ""):
        name = "items_file"
    return name


def _payload(form: BaseSubmitForm, items: list[str], owner: str) -> dict:
    payload: dict = {"items": items, **form.payload_fields()}
    if form.budget():
        payload[BUDGET_FIELD] = form.budget()
    if form.mode.data == "batch":
        payload[MODE_FIELD] = "batch"
    if form.no_cache.data or owner == PUBLIC_OWNER:
        # Anonymous visitors share one owner: a cache between them would tell one what another asked.
        payload[CACHE_FIELD] = False
    return payload


def _page(html: str, status: int = 200):
    # Every page shows stored text (items, results, errors), some of which UTF-8 cannot carry.
    response = make_response(printable(html), status)
    response.headers["Cache-Control"] = "no-cache, private"
    response.vary.update(("Accept", "Cookie"))
    return response


@bp.route("/", methods=["GET", "POST"])
def index():
    owner = browser_owner(Need.SUBMIT)
    form = submit_form()
    refusal = None
    if form.validate_on_submit():
        items = form.item_list()
        if items is None:  # the upload could not be read (its error is on the field); the name still
            _name_problem(form)
        else:
            estimate_only = bool(request.form.get("estimate"))  # the Estimate button: the price, nothing written
            try:
                submitted = submission.submit(redis_conn(), submission.Submission(
                    form.kind.data, _payload(form, items, owner), owner, name=form.name.data,
                    idempotency_key="form:" + form.submission.data, address=request.remote_addr or "unknown"),
                    dry_run=estimate_only)
            except submission.Refused as refused:
                refusal = refused.refusal
            except submission.Invalid as exc:  # every field's problem on its field, at once
                for field, message in exc.problems:
                    where = field if field not in (None, "items") else _field_for(message if field is None
                                                                                  else "items", form)
                    getattr(form, where).errors.append(plain(message))
            else:
                if estimate_only:
                    return _page(render_template("index.html", form=form, kind_names=sorted(kinds.KINDS),
                                                 refusal=None, estimate=plain(estimate_text(submitted.estimate))))
                return redirect(url_for("api.job", job_id=submitted.job_id), 303)
    status = 422 if form.is_submitted() and form.errors else 200
    response = _page(render_template("index.html", form=form, kind_names=sorted(kinds.KINDS),
                                     refusal=refusal and plain(refusal.message)), refusal.status if refusal else status)
    if refusal:
        response.headers["Retry-After"] = str(refusal.retry_after)
    return response


def _name_problem(form: BaseSubmitForm) -> None:
    try:
        check_name(form.name.data)
    except InvalidJob as exc:
        form.name.errors.append(plain(str(exc)))


def _schedule() -> dict:
    """The poll backoff the pages' scripts follow (static/job.js, static/jobs.js)."""
    return {"fast": poll_schedule.FAST_POLL, "period": poll_schedule.FAST_PERIOD, "slow": poll_schedule.SLOW_POLL,
            "terminal": " ".join(sorted(states.TERMINAL))}


def _age(fields: dict) -> float:
    created = fields.get("created_at")
    if not created:
        return 0.0
    return max(0.0, clock.wall() - datetime.fromisoformat(created).timestamp())


def _show(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _results_table(job_id: str, seen: JobPage) -> dict | None:
    """One page of items with their results (pending ones too, while the job runs)."""
    fields, page, inputs, columns = seen.fields, seen.page, seen.inputs, seen.columns
    if not fields["total"] or not (fields["done"] or fields["state"] in states.TERMINAL):
        return None
    offset = page.offset
    found = dict(page.items)
    last = min(offset + RESULTS_PER_PAGE, page.total)
    rows = [(index, inputs[index - offset] if index - offset < len(inputs) else None,
             _show(found[index]) if index in found else None,
             results.cells(found.get(index), columns) if columns and index in found else None)
            for index in range(offset, last)]
    return {"rows": rows, "columns": columns, "first": offset + 1, "last": last, "total": page.total,
            "next": url_for("api.job", job_id=job_id, offset=page.next_offset)
            if page.next_offset is not None else None,
            "previous": url_for("api.job", job_id=job_id, offset=page.previous_offset)
            if page.previous_offset is not None else None}


def _traceback(error: str | None) -> str | None:
    """The error without its first line (shown already), or None when there is no more."""
    if not error or "\n" not in error.strip():
        return None
    return error.strip().split("\n", 1)[1]


def job_page(job_id: str):
    owner = browser_owner(Need.READ)
    # One round trip: status, the results' page, its inputs, the price, the batch record.
    seen = read_job_page(redis_conn(), job_id, owner, int_arg("offset", 0, 0, 10**7), RESULTS_PER_PAGE)
    fields, attempts, batch = seen.fields, seen.attempts, seen.batch
    terminal = fields["state"] in states.TERMINAL
    schedule = _schedule()
    refresh = None if terminal else int(poll_schedule.poll_delay(_age(fields)))
    waiting_at_provider = (fields.get("batch") or {}).get("phase") == "waiting"
    look_requested = waiting_at_provider and request.args.get("look") == "requested"
    return _page(render_template(
        "job.html", job=fields, stale_text=STALE_LOOK_TEXT if waiting_at_provider else STALE_TEXT,
        terminal=terminal, table=_results_table(job_id, seen),
        submitted=[(f, given[f.name]) for f, _ in kinds.fields() if f.name in (given := fields.get("submitted", {}))],
        refresh=refresh, schedule=schedule, percent=_percent(fields),
        shown_state=outcome.words(fields), shown_view=listing.view_of(fields),
        attempts=humane.attempts(fields), history=attempts,
        run=seen.run, batch=batch,
        per_request=job_view.cost_per_request(fields, batch["answered"]) if batch else None,
        traceback=_traceback(fields["error"]), duration=humane.duration, money=money.money,
        replay_command=f"leash replay {job_id}", replay_asks_errored=_failed_by_item_errors(fields),
        spend_text=money.spend_text, ago=humane.relative,
        cancel_requested=not terminal and request.args.get("cancel") == "requested",
        look_requested=look_requested, waiting_text=_waiting_text(fields, look_requested),
        summary=fields["result"]["summary"] if fields["result"] else None,
        estimate=" · ".join(estimate_text(seen.estimate).splitlines()) if seen.estimate else None,
        failure_group=_failure_group(fields),
        schema=_schema_text(seen.schema, fields),
        archive_note=job_status.ARCHIVE_NOTE if job_status.from_archive(fields) else None,
    ))


def _schema_text(schema: dict | None, fields: dict) -> dict | None:
    """An extract job's schema, indented for reading on its page, and its fields' names."""
    kind = kinds.KINDS.get(fields["kind"])
    if kind is None or not any(f.name == "schema" for f in kind.fields):
        return None
    if schema is None:
        return None
    props = schema.get("properties")
    return {"text": json.dumps(schema, indent=2, ensure_ascii=False),
            "fields": [str(name) for name in props] if isinstance(props, dict) else []}


def _waiting_text(fields: dict, look_requested: bool) -> str | None:
    """Why the job waits; after Look now, "a worker looks within seconds", not the look's old time."""
    text = fields.get("waiting")
    if look_requested and text and "; leash looks next at" in text:
        return text.split("; leash looks next at")[0] + "; a worker looks within seconds (no worker held)"
    return text


def _failure_group(fields: dict) -> str | None:
    """The address of the failures page's group this failed job is in (its anchor)."""
    key = failure_groups.key_of_job(fields)
    if key is None:
        return None
    return url_for("failures.failures_page", since="all", kind=fields["kind"]) + f"#group-{key}"


@bp.post("/jobs/<job_id>/look")
def look(job_id: str):
    """Look at a waiting batch job's provider batch now rather than at its next scheduled look
    (the "Look now" button): the look is moved earlier, never later; a worker takes it within
    seconds. 409 when the job is not waiting at its provider."""
    owner = request_owner(Need.ACT)
    connection = redis_conn()
    fields = read_status(connection, job_id, owner)  # 404 unless it is the caller's job
    if job_status.from_archive(fields):
        return api_error(409, f"no look to move: {job_status.ONLY_ARCHIVED} ({outcome.words(fields)})")
    if (fields.get("batch") or {}).get("phase") != "waiting":
        return api_error(409, "no look to move: the job is not waiting at its provider")
    wait = too_soon(connection, job_id)
    if wait:
        return api_error(429, f"the provider was asked about this job less than 30 s ago; look again in {wait} s",
                         {"Retry-After": str(wait)})
    if not look_now(connection, job_id):
        return api_error(409, "no look to move: the job is not waiting at its provider")
    if wants_html():
        return redirect(url_for("api.job", job_id=job_id, look="requested"), 303)
    response = jsonify(job_id=job_id, look="requested", url=url_for("api.job", job_id=job_id))
    response.status_code = 202
    return response


def _percent(fields: dict) -> int:
    if fields["state"] == states.State.SUCCEEDED:
        return 100
    return int(100 * fields["done"] / fields["total"]) if fields["total"] else 0


@bp.post("/jobs/<job_id>/replay")
def replay(job_id: str):
    """Replay the caller's failed job from its page: ``leash replay``'s own select and replay,
    the audit entry naming the web user. CSRF is checked for browsers by the app's policy."""
    owner = request_owner(Need.ACT)
    connection = redis_conn()
    fields = read_status(connection, job_id, owner)  # 404 unless it is the caller's job
    only_errored = _asks_errored_items()
    if needs_confirming():
        action = "replay_errored" if only_errored else "replay_item_errors" if _failed_by_item_errors(fields) \
            else "replay"
        return confirm_page(action, fields, "pages.replay", **({"errored_items": 1} if only_errored else {}))
    selector = {"ids_given": 1, "kind": None, "error_contains": None, "since": None}
    archive_restore.records(connection, [job_id])  # Redis lost its record: back from the archive first
    if only_errored:  # only the items that ended in an error are asked again; the rest stay
        replayed = errored.replay(connection, [job_id], f"web:{owner}", selector, restore=archive_restore.restore)
    else:
        selection = deadletter.select(connection, [job_id])
        if not selection.matched:
            reason = selection.skipped[0][1] if selection.skipped else "only failed jobs can be replayed"
            return api_error(409, f"not replayed: {reason}")
        replayed = deadletter.replay(connection, selection.matched, f"web:{owner}", selector,
                                    skipped=selection.skipped, restore=archive_restore.restore)
    if replayed.left_failed:  # its owner is at the queued cap: the same replay works once some start
        return api_error(429, f"not replayed: {replayed.left_failed[0][1]}",
                         {"Retry-After": str(admission.QUEUED_RETRY_AFTER)})
    if not replayed.replayed:
        return api_error(409, f"not replayed: {replayed.skipped[0][1]}")
    if wants_html():
        return redirect(url_for("api.job", job_id=job_id), 303)
    asked = replayed.errored_items_asked.get(job_id)
    response = jsonify(job_id=job_id, state=states.State.QUEUED.value, audit_id=replayed.audit_id,
                       url=url_for("api.job", job_id=job_id),
                       **({"errored_items_asked": asked} if asked else {}))
    response.status_code = 202
    return response


def _failed_by_item_errors(fields: dict) -> bool:
    """A failed job whose error is its item errors: its replay asks those items again."""
    return fields["outcome"] == outcome.FAILED and bool(fields["item_errors"]) \
        and outcome.failed_by_item_errors(fields["error"])


def _asks_errored_items() -> bool:
    """``errored_items``: in the query, the form, or a JSON body (true)."""
    if request.values.get("errored_items", "").lower() in ("1", "true", "yes", "on"):
        return True
    body = request.get_json(silent=True) if request.is_json else None
    return isinstance(body, dict) and body.get("errored_items") is True


#: The jobs list's filter names where the view's own name is not words.
VIEW_LABELS = {outcome.WITH_ITEM_ERRORS: "with item errors", outcome.STOPPED: "stopped by RQ"}

#: Characters of a job's error the jobs list shows (cut at a word; the whole on its page).
LIST_ERROR_CHARS = 80


def _row(job: dict) -> dict:
    error = job["error_summary"] if job["outcome"] == outcome.FAILED else None
    shown_error, cut = humane.cut(error, LIST_ERROR_CHARS) if error else (None, False)
    return dict(job, percent=_percent(job), view=listing.view_of(job), view_words=outcome.words(job),
                shown_error=shown_error, error_cut=cut,
                created_ago=humane.relative(job["created_at"]), created_utc=humane.utc(job["created_at"]),
                tokens=money.tokens_text(job), cost=money.cost_cell(job), cached=money.cache_text(job),
                duration=humane.duration(job["elapsed_seconds"]) if job.get("elapsed_seconds") is not None else "—")


def jobs_page():
    owner = browser_owner(Need.LIST)
    offset = int_arg("offset", 0, 0, 10**9)
    filters = filters_arg()
    found = listing.find(redis_conn(), owner, offset, JOBS_PER_PAGE, filters, counts=True)
    total = found.total
    following = offset + JOBS_PER_PAGE if offset + JOBS_PER_PAGE < total else None
    previous = max(0, offset - JOBS_PER_PAGE) if offset else None
    active = any(job["state"] not in states.TERMINAL for job in found.jobs)
    args = {name: request.args[name] for name in FILTER_ARGS if request.args.get(name)}
    others = {name: value for name, value in args.items() if name != "state"}  # kept by the state links
    return _page(render_template(
        "jobs.html", jobs=[_row(job) for job in found.jobs], total=total, offset=offset, state=filters.view,
        views=listing.VIEWS, view_labels=VIEW_LABELS, counts=found.counts, active=active, args=args, others=others,
        kind_names=sorted(kinds.KINDS), filtered=filters.beyond_view(),
        schedule=_schedule(),
        refresh=int(poll_schedule.SLOW_POLL) if active else None, this_url=request.full_path.rstrip("?"),
        next=url_for("api.job_list", **(args | {"offset": following})) if following is not None else None,
        previous=url_for("api.job_list", **(args | {"offset": previous})) if previous is not None else None,
    ))
