"""rq-dashboard at /rq, never public.

rq-dashboard 0.9.0 has no authentication and no CSRF protection, accepts GET on its
"requeue all" action, and needs ``setup_rq_connection(app)``. So:

- it is mounted only when ``LEASH_DASHBOARD_USER`` and ``LEASH_DASHBOARD_PASSWORD`` are set
  (or under ``leash dev``, ``LEASH_DEV=1``, where it is open); otherwise /rq is a 404;
- HTTP basic auth, compared in constant time, is checked by an APP-level hook that acts when
  ``request.blueprint == "rq_dashboard"``. Its blueprint object is a module global shared
  by every app: a ``before_request`` added to it would run in every app ever created, and
  adding one after a first registration raises (a second ``create_app()`` in tests breaks);
- its POST actions need the CSRF token: its JavaScript sends the ``_csrf_token`` cookie's
  value as ``X-CSRFToken``, so the cookie is set here and flask-wtf checks the header;
- GET on requeue-all is refused (405);
- what its views would answer with a 500 is answered before them: an unknown job id is a 404
  (it fetches without checking), a page size, page, registry, order or instance it cannot use a
  400/404, compacting a queue that does not exist a 404; the login check never raises, whatever
  the Authorization header holds.

Its pages fill their tables in the browser with underscore templates that insert most values
unescaped (``<%= d.exc_info %>``): a failed job's error text (a provider that echoes the request
in its 400 echoes an owner's item) would run as script in the operator's browser. So every text
its data addresses answer is HTML-escaped here (except the few its templates escape themselves),
and its pages get a strict Content-Security-Policy: scripts from /rq/static and the one inline
script each page renders (allowed by its hash), no inline event handlers, nothing from elsewhere.
Its templates compile with ``new Function``, hence ``'unsafe-eval'``; its markup has a few
``style=`` attributes, hence ``'unsafe-inline'`` for styles only.

Two more adaptations: leash's RQ jobs use the JSON serializer (so job pages can show the
progress leash mirrors into ``job.meta``), and its per-request Redis client is replaced by
leash's own client, one per URL (``jobs.core.store.connection.connect``: it would otherwise open a new
connection, and on ``rediss://`` a new TLS handshake, for every poll of every dashboard tab,
and parse Sentinel URLs its own way, without following a failover's new primary the way
leash's other clients do).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import html
import json
import logging
import re

from flask import Flask, Response, current_app, request
from flask_wtf.csrf import generate_csrf
from rq.exceptions import NoSuchJobError
from rq.job import JOB_ID_PATTERN
from rq.serializers import JSONSerializer
from rq.worker import Worker

from jobs.core.store.connection import connect, redis_url
from jobs.read import fleet

from . import app_settings, guessing
from .error_replies import api_error

log = logging.getLogger(__name__)

PREFIX = "/rq"
BLUEPRINT = "rq_dashboard"
CSRF_COOKIE = "_csrf_token"  # the name rq-dashboard's dashboard.js reads


@functools.lru_cache(maxsize=8)
def _client(url: str):
    return connect(url)


def _from_url(url, sentinel_options=None, client_options=None):
    """rq-dashboard's ``from_url`` (it returns a Sentinel and a client): leash's own client for
    the URL, one per URL (rq-dashboard's password options are never set by leash)."""
    return None, _client(url)


class _JsonWorker(Worker):
    """RQ's Worker as rq-dashboard lists them, reading the job each one runs with leash's
    serializer (with RQ's default, pickle, a running leash job made workers.json a 500)."""

    @classmethod
    def all(cls, *args, **kwargs):
        kwargs.setdefault("serializer", JSONSerializer)
        return super().all(*args, **kwargs)


def _patch_rq_dashboard() -> None:
    import rq_dashboard.web as web

    web.config.serializer = JSONSerializer
    web.from_url = _from_url
    web.Worker = _JsonWorker


def credentials_ok(user: str, password: str) -> bool:
    """Whether the basic-auth header names the operator; a header that does not is a failed
    guess (web/guessing.py), a request without one is not (a browser's first ask)."""
    header = request.headers.get("Authorization")
    if header is None:
        return False
    scheme, _, encoded = header.partition(" ")
    try:
        if scheme.lower() != "basic":
            raise ValueError("not basic auth")
        given_user, _, given_password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except ValueError:  # not base64 (binascii.Error), not ASCII at all, not UTF-8 once decoded
        given_user, given_password = "", ""
    guess = f"{given_user}\0{given_password}"  # the failing guess, never the name alone (web/guessing.py)
    guessing.check("dashboard", guess, "dashboard passwords")
    if not _matches(given_user, given_password, user, password):
        guessing.failed("dashboard", guess, "dashboard passwords")
        return False
    return True


def _matches(given_user: str, given_password: str, user: str, password: str) -> bool:
    # Both comparisons always run: no early exit that would time the user name.
    user_ok = hmac.compare_digest(given_user.encode(), user.encode())
    password_ok = hmac.compare_digest(given_password.encode(), password.encode())
    return user_ok and password_ok


def _challenge() -> Response:
    response = api_error(401, "the dashboard needs a user name and password (HTTP basic auth; "
                              "LEASH_DASHBOARD_USER / LEASH_DASHBOARD_PASSWORD)")
    response.headers["WWW-Authenticate"] = 'Basic realm="leash dashboard", charset="UTF-8"'
    return response


def _guard():
    if request.blueprint != BLUEPRINT:
        return None
    web = app_settings.current().web
    user, password = web.dashboard_user, web.dashboard_password
    if user and password and not credentials_ok(user, password):
        return _challenge()
    problem = _bad_address(request.view_args or {})
    if problem:
        return api_error(*problem)
    if request.endpoint == f"{BLUEPRINT}.requeue_all" and request.method == "GET":
        return api_error(405, "requeue-all changes data: use the dashboard's button (POST), not a link",
                         {"Allow": "POST"})
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        current_app.extensions["csrf"].protect()
    if request.endpoint == f"{BLUEPRINT}.compact_queue":
        # RQ's compact renames the queue's list, which Redis refuses for a missing (empty) one.
        name = request.view_args["queue_name"]
        if not fleet.queue_exists(current_app.extensions["leash_redis"], name):
            return api_error(404, f"queue {name!r} is empty or does not exist: nothing to compact")
    return None


#: What rq-dashboard 0.9.0 reads from its addresses without checking (each answered 500 before):
#: the job id, the Redis instance (one here), the registry, the order and the page numbers.
REGISTRIES = frozenset({"queued", "failed", "deferred", "started", "finished", "scheduled", "canceled"})
ORDERS = frozenset({"asc", "dsc"})
MAX_PER_PAGE = 100


def _bad_address(args: dict) -> tuple[int, str] | None:
    if "job_id" in args and not JOB_ID_PATTERN.fullmatch(args["job_id"]):
        return 404, "no such job in RQ (job ids are letters, digits, _ and -)"
    if args.get("instance_number", 0) != 0:
        return 404, "the dashboard shows one Redis: its addresses start /rq/0/"
    if "registry_name" in args and args["registry_name"] not in REGISTRIES:
        return 400, f"no such registry; use one of {', '.join(sorted(REGISTRIES))}"
    if "order" in args and args["order"] not in ORDERS:
        return 400, "the order is asc or dsc"
    for name, most in (("per_page", MAX_PER_PAGE), ("page", 10**6)):
        value = str(args.get(name, "1"))
        if not (value.isascii() and value.isdigit() and 1 <= int(value) <= most):
            return 400, f"{name} must be a whole number from 1 to {most}"
    return None


def _no_such_rq_job(exc: NoSuchJobError):
    return api_error(404, "no such job in RQ (it may have expired or been deleted)")


#: Values its templates escape themselves (escaping them here too would show "&amp;lt;").
ESCAPED_BY_TEMPLATE = {"list_jobs": frozenset({"description", "exc_info"}),
                       "list_workers": frozenset({"description"})}
_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\b(?:src=|type=\"text/template\"))[^>]*>(.*?)</script>", re.S)


def _escaped(value, keep: frozenset, key: str | None = None):
    if isinstance(value, str):
        return value if key in keep else html.escape(value)
    if isinstance(value, list):
        return [_escaped(v, keep) for v in value]
    if isinstance(value, dict):
        return {k: _escaped(v, keep, k) for k, v in value.items()}
    return value


def _escape_data(response: Response) -> None:
    """Every text in a data answer (jobs.json, job.json, workers.json, queues.json) escaped."""
    if response.mimetype != "application/json" or response.status_code >= 400 or response.direct_passthrough:
        return
    view = (request.endpoint or "").partition(".")[2]
    data = json.loads(response.get_data())
    response.set_data(json.dumps(_escaped(data, ESCAPED_BY_TEMPLATE.get(view, frozenset()))))


def content_security_policy(page: str) -> str:
    """The dashboard's policy for one page: its own inline script allowed by hash, no other."""
    hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"
                      for script in _INLINE_SCRIPT.findall(page) if script.strip())
    return ("default-src 'self'; script-src 'self' 'unsafe-eval' " + hashes + "; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; "
            "base-uri 'none'; object-src 'none'")


#: Put into rq-dashboard's pages: a way back to leash on every page, and what its layout needs on
#: a phone (its intro paragraph has a fixed height that the table then overlaps at 390 px).
BACK_BAR = ('<nav class="leash-back" aria-label="leash"><a href="/overview">&larr; Back to leash</a>'
            '<a href="/failures">Failures</a><a href="/jobs">My jobs</a></nav>')
PHONE_STYLE = ("<style>.leash-back{display:flex;flex-wrap:wrap;gap:.3rem 1.2rem;padding:.6rem 1rem;"
               "background:#eef2fb;border-bottom:1px solid #d5dcea;font:15px/1.4 system-ui,sans-serif}"
               ".leash-back a{color:#2854c5;text-decoration:none;font-weight:600}"
               "p.fixed.intro{height:auto}"
               "@media (max-width:600px){.section{padding:1em .6em}.container{padding:0 .3rem}"
               "h1{font-size:1.7rem}#rq-instances{max-width:100%}}</style>")


def _with_way_back(page: str) -> str:
    page = page.replace("</head>", PHONE_STYLE + "</head>", 1)
    return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + BACK_BAR, page, count=1)


def _protect_pages(response: Response) -> Response:
    if request.blueprint != BLUEPRINT:
        return response
    _escape_data(response)
    if response.mimetype == "text/html" and not response.direct_passthrough:
        page = _with_way_back(response.get_data(as_text=True))
        response.set_data(page)
        response.headers["Content-Security-Policy"] = content_security_policy(page)
    return response


def _set_csrf_cookie(response: Response) -> Response:
    if request.blueprint == BLUEPRINT and response.status_code < 400:
        response.set_cookie(CSRF_COOKIE, generate_csrf(), path=PREFIX, samesite="Strict",
                            secure=app_settings.current().web.secure_cookies, httponly=False)
    return response


def init_app(app: Flask) -> None:
    found = app_settings.of(app)
    user, password, dev = found.web.dashboard_user, found.web.dashboard_password, found.web.dev
    app.jinja_env.globals["dashboard_mounted"] = False  # the pages link to /rq/ only where it answers
    if not (user and password) and not dev:
        if user or password:
            log.warning("rq-dashboard is not mounted: set both LEASH_DASHBOARD_USER and LEASH_DASHBOARD_PASSWORD")
        return
    import rq_dashboard
    from rq_dashboard.web import setup_rq_connection

    _patch_rq_dashboard()
    app.config["RQ_DASHBOARD_REDIS_URL"] = found.redis_url or redis_url()  # rq-dashboard's own key
    setup_rq_connection(app)
    app.register_blueprint(rq_dashboard.blueprint, url_prefix=PREFIX)
    # App-level hooks run before the blueprint's own, so the guard runs before rq-dashboard
    # touches Redis.
    app.before_request(_guard)
    app.after_request(_set_csrf_cookie)
    app.after_request(_protect_pages)
    app.register_error_handler(NoSuchJobError, _no_such_rq_job)  # its job views fetch without checking
    app.jinja_env.globals["dashboard_mounted"] = True
    if not (user and password):
        log.warning("rq-dashboard is mounted at %s WITHOUT a password (LEASH_DEV=1, development only)", PREFIX)
