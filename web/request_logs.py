"""The web app's log lines and error reports say which job and owner a request is about:
``job_id`` from the address (``/jobs/<job_id>...``), ``owner`` once auth has decided it."""

from __future__ import annotations

from flask import Flask, g, has_request_context, request

from jobs.observability import logs, reporting


def init_app(app: Flask) -> None:
    logs.configure_web()  # LEASH_LOG_FORMAT=json when nothing set logging up (leash web does)
    logs.add_context_provider(request_context)
    reporting.init("web")  # SENTRY_DSN


def request_context() -> dict:
    if not has_request_context():
        return {}
    return {"job_id": (request.view_args or {}).get("job_id"), "owner": g.get("leash_owner")}
