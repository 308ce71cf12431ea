"""The failures page: what broke, grouped, and a way to run it again.

    GET  /failures            failed jobs grouped by kind and error (``leash failures``' groups,
                              jobs/read/failure_groups.py), biggest first: count, first and last
                              seen, the failure rate over the window, each group's newest jobs
    POST /failures/replay     replay a group (``group=<key>``) or the ticked jobs (``job_id``):
                              a browser first gets a confirm page; ``leash replay``'s own
                              select and replay, with an audit entry naming who

An owner sees and replays their own failed jobs; the dashboard's operator (the
``LEASH_DASHBOARD_USER`` basic-auth credentials, sent as for /rq) sees and replays every
owner's. JSON callers get the groups (GET) and the outcome (POST) at once.
"""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, make_response, redirect, render_template, request, url_for

from jobs import deadletter
from jobs.archive import restore as archive_restore
from jobs.core.text import printable
from jobs.deadletter import durations
from jobs.intake import admission
from jobs.read import failure_groups, humane

from . import app_settings, dashboard
from .auth import Need, browser_owner, request_owner
from .error_replies import api_error, wants_html
from .reads import redis_conn

bp = Blueprint("failures", __name__)

#: The windows the page offers (the CLI's --since takes any duration).
WINDOWS = (("1h", "last hour"), ("24h", "last 24 hours"), ("7d", "last 7 days"), ("all", "all kept"))
DEFAULT_WINDOW = "24h"
#: Jobs one replay takes at most (a group's jobs beyond it: replay again).
MAX_REPLAY = 5000


def _operator() -> str | None:
    """The dashboard's operator when this request carries their basic-auth credentials."""
    web = app_settings.current().web
    user, password = web.dashboard_user, web.dashboard_password
    header = request.headers.get("Authorization", "")
    if user and password and header[:6].lower() == "basic " and dashboard.credentials_ok(user, password):
        return user
    return None


def _viewer(need: Need) -> tuple[str | None, str]:
    """(the owner whose failures are shown, None for every owner's; who acts, for the audit)."""
    operator = _operator()
    if operator is not None:
        return None, f"dashboard:{operator}"
    owner = browser_owner(need) if wants_html() else request_owner(need)
    return owner, f"web:{owner}"


def _window() -> tuple[str, float | None]:
    given = request.values.get("since") or DEFAULT_WINDOW
    if given not in dict(WINDOWS):
        try:
            seconds = durations.parse(given)
        except ValueError:
            return DEFAULT_WINDOW, durations.parse(DEFAULT_WINDOW)
        return given, seconds
    return given, None if given == "all" else durations.parse(given)


def _page(html: str, status: int = 200):
    response = make_response(printable(html), status)
    response.headers["Cache-Control"] = "no-cache, private"
    response.vary.update(("Accept", "Cookie", "Authorization"))
    return response


@bp.get("/failures")
def failures_page():
    owner, _ = _viewer(Need.LIST)
    window, since = _window()
    kind = request.args.get("kind") or None
    found = failure_groups.groups(redis_conn(), owner, since=since, kind=kind)
    if not wants_html():
        return jsonify(printable(found | {"since": window, "owner": owner}))
    return _page(render_template(
        "failures.html", found=found, window=window, windows=WINDOWS, kind=kind, everyone=owner is None,
        owner=owner, when=humane.utc, ago=humane.relative,
        replayed=request.args.get("replayed", type=int), left=request.args.get("left", type=int)))


def _selection(connection, owner: str | None, since: float | None, kind: str | None) -> tuple[list[str], str]:
    """The jobs a replay form names (a group's key, or ticked ids), those the viewer may replay."""
    key = request.form.get("group")
    if key:
        ids = failure_groups.group_ids(connection, owner, key, since=since, kind=kind)
        what = "group"
    else:
        ids = list(dict.fromkeys(request.form.getlist("job_id")))[:MAX_REPLAY]
        what = "selection"
    return failure_groups.owned_failed(connection, owner, ids[:MAX_REPLAY]), what


@bp.post("/failures/replay")
def replay():
    owner, actor = _viewer(Need.ACT)
    if owner is None and _operator() is not None:
        # Basic auth is sent by the browser on its own, like a cookie: the form must prove it is ours.
        current_app.extensions["csrf"].protect()
    window, since = _window()
    kind = request.form.get("kind") or None
    connection = redis_conn()
    ids, what = _selection(connection, owner, since, kind)
    if not ids:
        return api_error(409, "nothing to replay: no failed job of yours matches (replayed already, or none ticked)")
    if wants_html() and request.form.get("confirm") != "yes":
        response = _page(render_template(
            "failures_confirm.html", ids=ids, shown=ids[:failure_groups.JOBS_SHOWN], what=what,
            group=request.form.get("group"), window=window, kind=kind))
        response.headers["Cache-Control"] = "no-store"
        return response
    selection = deadletter.select(connection, ids)
    outcome = deadletter.replay(connection, selection.matched, actor,
                                {"ids_given": len(ids), "kind": kind, "error_contains": None,
                                 "since": "all" if since is None else since},
                                skipped=selection.skipped, restore=archive_restore.restore)
    if wants_html():
        return redirect(url_for("failures.failures_page", since=window, kind=kind, replayed=len(outcome.replayed),
                                left=len(outcome.left_failed) or None), 303)
    response = jsonify(replayed=[c.job_id for c in outcome.replayed],
                       skipped=[{"job_id": i, "reason": r} for i, r in outcome.skipped],
                       left_failed=[{"job_id": i, "reason": r} for i, r in outcome.left_failed],
                       errored_items_asked=outcome.errored_items_asked, audit_id=outcome.audit_id)
    if outcome.left_failed:
        response.headers["Retry-After"] = str(admission.QUEUED_RETRY_AFTER)
    response.status_code = 202 if outcome.replayed else 409
    return response
