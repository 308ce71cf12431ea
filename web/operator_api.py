"""The operator's API and the overview's buttons: the same controls and views as ``leash pause``,
``leash resume``, ``leash quiet``, ``leash workers --json`` and ``leash queue --json``.

    GET  /operator/workers                   {"workers": [...]}   (jobs.read.fleet.workers)
    GET  /operator/queues                    {"queues": [...]}    (jobs.read.fleet.queues)
    GET  /operator/audit                     {"entries": [...]}   the latest operator actions, newest first
    POST /operator/queues/<queue_name>/pause      {"queue", "paused": true, "since", "changed"}
    POST /operator/queues/<queue_name>/resume     {"queue", "paused": false, "changed"}
    POST /operator/workers/<worker_name>/quiet      {"quiet": [name], "newly": [...]}
    POST /operator/workers/quiet             body {"all": true}: every worker running now
    GET  /operator/signin                    a browser signs in as the operator (basic auth), back to /overview

They act on every owner's work, so they are the dashboard operator's
(``LEASH_DASHBOARD_USER`` / ``LEASH_DASHBOARD_PASSWORD``, as for /rq and the failures of every
owner), never an owner's:

- an API client sends the dashboard's credentials as HTTP basic auth. A browser sends basic
  auth on its own once it has it, so a change sent that way must be JSON
  (``Content-Type: application/json``: a page elsewhere cannot send that without a CORS
  preflight, which this app never grants) or carry the CSRF token;
- a browser opens ``/operator/signin`` once (its basic-auth prompt); its session then carries
  a keyed digest of the credentials (changing them signs it out), and the overview shows the
  buttons. Its changes carry the CSRF token (the page's forms do);
- ``LEASH_METRICS_TOKEN`` (``Authorization: Bearer``) reads the workers and queues (a monitor's
  view, as /metrics), and changes nothing;
- under ``leash dev`` (``LEASH_DEV=1``, the dashboard open) everyone is the operator.

An owner's token or session is a 403; no credentials a 401. Every change leaves an audit entry
(who, what, when: ``jobs.core.switches.audit_log``, ``leash operator-log``) and a log line.
"""

from __future__ import annotations

import hashlib
import hmac
import logging

from flask import Blueprint, current_app, jsonify, redirect, request, session, url_for
from rq.serializers import JSONSerializer
from rq.worker import Worker
from werkzeug.exceptions import BadRequest, Forbidden, NotFound, Unauthorized

from jobs.core import clock, switches
from jobs.read import fleet

from . import app_settings, dashboard, guessing
from .auth import owner_for_token
from .confirm import needs_confirming, operator_confirm_page
from .error_replies import wants_html
from .reads import redis_conn

log = logging.getLogger("leash.operator")
bp = Blueprint("operator", __name__, url_prefix="/operator")

#: Queue and worker names as RQ makes them; anything else is a 404 before Redis is asked.
MAX_NAME = 200


class OperatorRequired(Unauthorized):
    description = ("operator actions need the dashboard's credentials: HTTP basic auth with "
                   "LEASH_DASHBOARD_USER / LEASH_DASHBOARD_PASSWORD (a browser: open /operator/signin)")

    def get_headers(self, environ=None, scope=None):
        challenge = ("WWW-Authenticate", 'Basic realm="leash dashboard", charset="UTF-8"')
        return [*super().get_headers(environ, scope), challenge]


def _credentials() -> tuple[str, str] | None:
    web = app_settings.current().web
    user, password = web.dashboard_user, web.dashboard_password
    return (user, password) if user and password else None


def _open_dashboard() -> bool:
    """leash dev: the dashboard is mounted without a password, and so are these controls."""
    return app_settings.current().web.dev and _credentials() is None


def _digest(user: str, password: str) -> str:
    secret = app_settings.current().secret.encode()
    return hmac.new(secret, f"operator\0{user}\0{password}".encode(), hashlib.sha256).hexdigest()[:32]


def _session_operator() -> str | None:
    creds = _credentials()
    kept = session.get("operator")
    if creds is None or not isinstance(kept, str):
        return None
    return creds[0] if hmac.compare_digest(kept, _digest(*creds)) else None


def _metrics_token() -> bool:
    """Whether the request carries LEASH_METRICS_TOKEN. A bearer token that is neither it nor an
    owner's counts as a failed guess, as at /metrics: these reads must not become its oracle."""
    expected = app_settings.current().web.metrics_token
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if not expected or scheme.lower() != "bearer":
        return False
    presented = presented.strip()
    guessing.check("metrics", presented, "metrics tokens")
    if hmac.compare_digest(presented.encode(), expected.encode()):
        return True
    if owner_for_token(presented) is None:
        guessing.failed("metrics", presented, "metrics tokens")
    return False


def operator(change: bool) -> str:
    """Who is acting, for the audit; raises 401 (no credentials, or wrong ones) or 403 (an
    owner, or the metrics token asking for a change)."""
    if _open_dashboard():
        return "dashboard:dev"
    creds = _credentials()
    header = request.headers.get("Authorization", "")
    if creds is not None and header[:6].lower() == "basic ":
        if not dashboard.credentials_ok(*creds):
            raise OperatorRequired("wrong dashboard user name or password")
        if change and not request.is_json:
            current_app.extensions["csrf"].protect()  # a browser's basic auth: prove it is our page
        return f"dashboard:{creds[0]}"
    if (user := _session_operator()) is not None:
        if change:
            current_app.extensions["csrf"].protect()
        return f"dashboard:{user} (browser)"
    if _metrics_token():
        if change:
            raise Forbidden("the metrics token reads the workers and queues; changes need the dashboard's "
                            "credentials (LEASH_DASHBOARD_USER / LEASH_DASHBOARD_PASSWORD)")
        return "metrics-token"
    if header or session.get("owner") or _trusted_owner():
        raise Forbidden("operator actions act on every owner's work: they need the dashboard's credentials "
                        "(LEASH_DASHBOARD_USER / LEASH_DASHBOARD_PASSWORD), not an owner's"
                        + ("" if creds else "; this deployment sets none"))
    raise OperatorRequired()


def _trusted_owner() -> bool:
    name = app_settings.current().web.trusted_user_header
    return bool(name) and name in request.headers


def is_operator() -> bool:
    """Whether this browser may use the overview's buttons (no error either way)."""
    return _open_dashboard() or _session_operator() is not None


def _name(value: str, what: str) -> str:
    if not value or len(value) > MAX_NAME or not value.isprintable():
        raise NotFound(f"no {what} named {value[:MAX_NAME]!r}")
    return value


def _known_queue(queue: str) -> str:
    queue = _name(queue, "queue")
    known = fleet.known_queues(redis_conn(), app_settings.current().jobs.queues)
    if queue not in known:
        raise NotFound(f"no queue named {queue!r}: the queues are {', '.join(sorted(known))}")
    return queue


def _alive() -> list[str]:
    return sorted(w.name for w in Worker.all(connection=redis_conn(), serializer=JSONSerializer))


def _answer(body: dict, status: int = 200):
    """JSON for API clients; a browser (the overview's forms) goes back to the overview."""
    if wants_html():
        return redirect(url_for("overview.overview_page"), 303)
    response = jsonify(body)
    response.status_code = status
    return response


@bp.get("/workers")
def workers():
    operator(change=False)
    return jsonify(workers=[row.as_dict() for row in fleet.workers(redis_conn())])


@bp.get("/queues")
def queues():
    operator(change=False)
    return jsonify(queues=[row.as_dict() for row in fleet.queues(redis_conn())])


@bp.get("/audit")
def audit():
    operator(change=False)
    return jsonify(entries=switches.audit_log(redis_conn(), count=100))


@bp.post("/queues/<queue_name>/pause")
def pause(queue_name: str):
    actor = operator(change=True)
    queue = _known_queue(queue_name)
    connection = redis_conn()
    changed = switches.pause(connection, queue, actor=actor)
    since = switches.paused(connection).get(queue)
    log.warning("operator %s paused queue %s%s", actor, queue, "" if changed else " (already paused)")
    return _answer({"queue": queue, "paused": True, "since": clock.iso(since), "changed": changed})


@bp.post("/queues/<queue_name>/resume")
def resume(queue_name: str):
    actor = operator(change=True)
    queue = _known_queue(queue_name)
    changed = switches.resume(redis_conn(), queue, actor=actor)
    log.warning("operator %s resumed queue %s%s", actor, queue, "" if changed else " (was not paused)")
    return _answer({"queue": queue, "paused": False, "changed": changed})


@bp.post("/workers/<worker_name>/quiet")
def quiet_one(worker_name: str):
    actor = operator(change=True)
    name = _name(worker_name, "worker")
    if name not in _alive():
        raise NotFound(f"no worker named {name!r} is running; GET /operator/workers lists them")
    if needs_confirming():
        return operator_confirm_page("quiet", name, url_for("operator.quiet_one", worker_name=name))
    return _quiet(actor, [name])


@bp.post("/workers/quiet")
def quiet_all():
    actor = operator(change=True)
    body = request.get_json(silent=True) if request.is_json else request.form.to_dict()
    if not isinstance(body, dict) or str(body.get("all")).lower() not in ("true", "1", "yes"):
        raise BadRequest('name the worker (POST /operator/workers/<worker_name>/quiet) or send {"all": true}')
    if needs_confirming():
        return operator_confirm_page("quiet_all", None, url_for("operator.quiet_all"))
    return _quiet(actor, _alive())


def _quiet(actor: str, names: list[str]):
    told = switches.quiet(redis_conn(), names, actor=actor)
    log.warning("operator %s made quiet: %s", actor, ", ".join(names) or "no worker (none running)")
    return _answer({"quiet": names, "newly": told})


@bp.get("/signin")
def signin():
    """The browser's way in: the basic-auth prompt, then the overview with its buttons."""
    creds = _credentials()
    if creds is None:
        if _open_dashboard():
            return redirect(url_for("overview.overview_page"), 303)
        raise Forbidden("no operator is configured: set LEASH_DASHBOARD_USER and LEASH_DASHBOARD_PASSWORD")
    if not (request.headers.get("Authorization", "")[:6].lower() == "basic " and dashboard.credentials_ok(*creds)):
        raise OperatorRequired()
    session["operator"] = _digest(*creds)
    session.permanent = True
    log.warning("operator dashboard:%s signed in from a browser", creds[0])
    return redirect(url_for("overview.overview_page"), 303)
