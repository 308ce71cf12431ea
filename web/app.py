"""The Flask app factory. Served by ``leash web`` (web/serve.py) from the Procfile.

Configuration comes from the environment, read once into web/app_settings.py (``settings``
names declared variables read in its place, as tests do):

    REDIS_URL                       the job store
    SECRET_KEY                      signs the session cookie that carries a browser's owner id;
                                    required, except under ``leash dev`` (a random key per run);
                                    LEASH_SECRET_KEY, its deprecated name, still works
    LEASH_API_TOKENS                owner=token,... for the API; unset: open API, one shared owner
    LEASH_MAX_BODY_BYTES            request body limit (default 1 MiB), checked before parsing
    LEASH_DASHBOARD_USER/_PASSWORD  mount rq-dashboard at /rq behind basic auth
    LEASH_DEV=1                     (set by ``leash dev``) mount rq-dashboard without a password
    LEASH_SECURE_COOKIES=1          cookies only over HTTPS (set it in production)
    LEASH_REDIS_TIMEOUT             seconds before an unanswered Redis call is a 503 (default 5);
                                    after one, every request is a 503 at once until Redis
                                    answers again (web.redis_guard)
    LEASH_METRICS_TOKEN             GET /metrics needs 'Authorization: Bearer <it>'; unset: open in
                                    development, a 403 in production unless LEASH_METRICS_PUBLIC=1
    LEASH_TRUSTED_USER_HEADER       a header an auth proxy sets to the signed-in owner (web/auth.py)
    LEASH_PUBLIC_SUBMIT=1           the form without signing in, as the owner 'public'
    LEASH_IMPORTS                   modules that register job kinds
    LEASH_LOG_FORMAT                text (default) or json (jobs/observability/logs.py)
    SENTRY_DSN                      report unhandled errors to Sentry (jobs/observability/reporting.py)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from urllib.parse import urlsplit

from flask import Flask, jsonify, request
from flask_wtf.csrf import CSRFProtect
from redis.exceptions import RedisError
from werkzeug.exceptions import RequestEntityTooLarge

from jobs import kinds
from jobs.archive import answers as archive_answers
from jobs.archive import database as archive_database
from jobs.core import clock, switches
from jobs.core.store.connection import connect
from jobs.models import cache as request_cache
from jobs.read.redis_health import eviction_warning, readiness

from . import (
    api,
    app_settings,
    auth,
    dashboard,
    error_replies,
    failures_page,
    metrics,
    operator_api,
    overview_page,
    pages,
    pipeline_routes,
    proxy_check,
    request_logs,
    signin,
)
from .app_settings import SECRET_KEY_MISSING, SecretKeyMissing  # noqa: F401 (leash web names them)
from .redis_guard import guarded_connection

log = logging.getLogger(__name__)

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def create_app(settings: Mapping[str, object] | None = None) -> Flask:
    """The app, its settings read from the environment once; ``settings`` names declared
    variables to read in the environment's place (None: unset), as the tests do."""
    found = app_settings.read(settings)
    app = Flask(__name__)
    app.config.from_mapping(
        SESSION_COOKIE_NAME="leash_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        # The cookie is the browser's identity: a bookmarked job page must still open weeks later.
        PERMANENT_SESSION_LIFETIME=timedelta(days=365),
        # CSRF is checked where a cookie authenticates (see _csrf_policy), not on token requests.
        WTF_CSRF_CHECK_DEFAULT=False,
        WTF_CSRF_TIME_LIMIT=None,
        # Flask's own keys, from leash's settings:
        SECRET_KEY=found.secret,
        SESSION_COOKIE_SECURE=found.web.secure_cookies,
        MAX_CONTENT_LENGTH=found.web.max_body_bytes,
        # Werkzeug caps form fields separately (500 kB); one limit for every kind of body.
        MAX_FORM_MEMORY_SIZE=found.web.max_body_bytes,
    )
    app_settings.keep(app, found)
    # Werkzeug answers '/static//x' with a redirect to an absolute URL built from the Host
    # header (any host a client names): no merging, so such a path is a plain 404.
    app.url_map.merge_slashes = False
    request_logs.init_app(app)  # LEASH_LOG_FORMAT, SENTRY_DSN: before anything logs
    if found.web.trusted_user_header:
        log.warning("LEASH_TRUSTED_USER_HEADER=%s: requests carrying it are signed in as the owner it names; "
                    "the auth proxy in front must strip it from clients", found.web.trusted_user_header)
    elif not found.tokens:
        log.warning("LEASH_API_TOKENS is not set: the API is open and its callers share one owner "
                    "(development only)")
    if (no_archive := archive_database.startup_warning()) and not found.web.dev:
        log.warning(no_archive)
    request_cache.archived = archive_answers.lookup  # a dry run's price counts answers in the archive
    kinds.import_kinds()
    # A request must not hang on a Redis that accepts connections but does not answer.
    app.extensions["leash_redis"] = guarded_connection(found.redis_url, found.redis.redis_timeout)
    _at_start(app, found.redis_url)

    metrics.init_app(app)  # first, so its timer starts before any hook can answer early
    app.before_request(_body_limit)
    app.before_request(_form_field_limit)
    proxy_check.watch(app)
    CSRFProtect(app)
    error_replies.init_app(app)
    dashboard.init_app(app)
    app.before_request(_dashboard_fails_fast)
    app.before_request(_forms_take_form_data)
    app.before_request(_csrf_policy)
    app.register_blueprint(api.bp)
    app.register_blueprint(pages.bp)
    signin.init_app(app)
    app.register_blueprint(overview_page.bp)
    app.register_blueprint(operator_api.bp)
    app.register_blueprint(failures_page.bp)
    app.register_blueprint(pipeline_routes.bp)
    # A browser asking for an API address gets the page (the API does not import the pages).
    app.extensions["leash_html_views"] = {"api.job": pages.job_page, "api.job_list": pages.jobs_page}
    app.after_request(_security_headers)

    @app.get("/healthz")
    def healthz():
        """Liveness, for a load balancer: this process answers and Redis is reachable, so reads
        are served (200) even while Redis is full or no worker runs."""
        if request.args.get("deep") in ("1", "true"):
            return readyz()
        app.extensions["leash_redis"].ping()  # unreachable -> the 503 handler
        return jsonify(ok=True)

    @app.get("/readyz")
    def readyz():
        """Readiness, for monitoring: 503 with what is wrong when Redis refuses writes or no
        worker is registered (docs/OPERATIONS.md, "Health checks")."""
        problems = readiness(app.extensions["leash_redis"])  # unreachable -> the 503 handler
        # A paused queue is the operator's choice, not a fault: said, never a 503.
        paused = {queue: clock.iso(since) for queue, since in switches.paused(app.extensions["leash_redis"]).items()}
        said = {"paused": paused} if paused else {}
        if problems:
            return jsonify(ok=False, error="; ".join(problems), problems=problems, **said), 503
        return jsonify(ok=True, **said)

    return app


# Our pages load nothing but their own script and stylesheet; rq-dashboard's pages get a policy
# of their own (web/dashboard.py: its inline script by hash, its templates' eval).
CONTENT_SECURITY_POLICY = ("default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                           "form-action 'self'; base-uri 'none'; object-src 'none'")


def _security_headers(response):
    _relative_location(response)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")  # no clickjacking of the cancel button
    response.headers.setdefault("Referrer-Policy", "same-origin")
    if response.mimetype == "text/html" and request.blueprint != dashboard.BLUEPRINT:
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    return response


def _relative_location(response) -> None:
    """Redirects Werkzeug builds itself (``/rq`` to ``/rq/``) name the Host header's host, which
    the client chose: keep only the path, never starting with '//' (a scheme-relative URL)."""
    location = response.headers.get("Location")
    if location and "://" in location:
        parts = urlsplit(location)
        if parts.netloc == request.host:
            path = "/" + parts.path.lstrip("/")
            response.headers["Location"] = path + (f"?{parts.query}" if parts.query else "")


def _body_limit():
    """413 from the Content-Length header alone, before anything reads the body."""
    from flask import current_app

    length = request.content_length
    if length is not None and length > current_app.config["MAX_CONTENT_LENGTH"]:
        raise RequestEntityTooLarge()


def _form_field_limit():
    """A urlencoded form of more fields than MAX_FORM_PARTS (Werkzeug counts them for multipart
    only, after parsing every one: 350,000 fields cost 170 ms) is a 413, counted before parsing."""
    from flask import current_app

    if request.mimetype == "application/x-www-form-urlencoded" and request.method in UNSAFE_METHODS:
        most = current_app.config["MAX_FORM_PARTS"]
        fields = request.get_data(cache=True).count(b"&") + 1
        if fields > most:
            return error_replies.error_response(
                413, f"the form has {fields} fields; at most {most}: send the items in the text box, or as a file")
    return None


def _dashboard_fails_fast():
    """rq-dashboard has its own Redis client, outside the breaker: while the app knows Redis
    is unreachable, its pages are a 503 at once too, instead of holding a thread each."""
    if request.blueprint == dashboard.BLUEPRINT:
        from flask import current_app

        current_app.extensions["leash_redis"].breaker.check()


#: The views that read a form (flask-wtf would read a JSON body as one, and a list, a number or
#: a string there, or a value that is not text, is a TypeError deep in WTForms: a 500).
FORM_VIEWS = frozenset({"signin.signin", "signin.signout", "pages.index"})


def _forms_take_form_data():
    if request.method in UNSAFE_METHODS and request.endpoint in FORM_VIEWS and request.is_json:
        return error_replies.error_response(
            415, "this address takes a form (application/x-www-form-urlencoded or multipart/form-data), "
                 "not JSON; API clients submit with POST /jobs")
    return None


def _csrf_policy():
    if request.method in UNSAFE_METHODS and request.blueprint != dashboard.BLUEPRINT and auth.csrf_required():
        from flask import current_app

        current_app.extensions["csrf"].protect()


def _at_start(app: Flask, url: str | None) -> None:
    """What the web app asks of Redis as it starts: one WARNING when Redis may evict leash's keys,
    and the sweep of sessions whose token was removed (web/auth.py). Asked on a connection of its
    own, briefly: a Redis that is away at start must neither delay it nor open the breaker that
    the app's own connection keeps (it is said elsewhere; the sweep waits for the next start)."""
    client = connect(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except RedisError:
        log.warning("Redis did not answer at start: sessions of removed tokens are swept at the next start")
        client.close()
        return
    try:
        if warning := eviction_warning(client):
            log.warning(warning)
        auth.forget_removed_tokens(app, client)
    finally:
        client.close()
