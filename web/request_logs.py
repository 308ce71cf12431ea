"""The web app's log lines and error reports say which job and owner a request is about:
``job_id`` from the address (``/jobs/<job_id>...``), ``owner`` once auth has decided it.

And one access line per request (logger ``leash.access``), a JSON object: method, path (no
query string: a token may travel there), status, duration in milliseconds, owner. It is on by
default in production (LEASH_API_TOKENS or a trusted user header set) and off in development;
LEASH_ACCESS_LOG=1 or 0 decides. With LEASH_LOG_FORMAT=json its fields are the line's own.
"""

from __future__ import annotations

import json
import logging
import time

from flask import Flask, g, has_request_context, request

from jobs.observability import logs, reporting

from . import app_settings

access_log = logging.getLogger("leash.access")

SWITCH = ("auto", "1", "0", "true", "false", "on", "off", "yes", "no")


def init_app(app: Flask) -> None:
    logs.configure_web()  # LEASH_LOG_FORMAT=json when nothing set logging up (leash web does)
    logs.add_context_provider(request_context)
    reporting.init("web")  # SENTRY_DSN
    if access_log_on(app_settings.of(app)):
        app.before_request(_start)
        app.after_request(_access_line)


def access_log_on(found: app_settings.AppSettings) -> bool:
    value = str(found.operations.access_log or "auto").strip().lower()
    if value not in SWITCH:
        raise ValueError(f"LEASH_ACCESS_LOG must be auto, 1 or 0, got {value!r}")
    if value == "auto":
        return found.production
    return value in ("1", "true", "on", "yes")


def request_context() -> dict:
    if not has_request_context():
        return {}
    return {"job_id": (request.view_args or {}).get("job_id"), "owner": g.get("leash_owner")}


def _start() -> None:
    g.leash_access_started = time.perf_counter()


def _access_line(response):
    started = g.pop("leash_access_started", None)
    fields = {"method": request.method[:16], "path": request.path[:300], "status": response.status_code,
              "duration_ms": round((time.perf_counter() - started) * 1000, 1) if started is not None else None,
              "owner": g.get("leash_owner")}
    if logs.log_format() == "json":
        access_log.info("%s %s %s", fields["method"], fields["path"], fields["status"], extra=fields)
    else:
        access_log.info(json.dumps(fields))
    return response
