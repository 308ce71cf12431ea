"""Every error leaves as JSON ``{"error": "<what is wrong and how to fix it>"}`` for API
clients, or as a small HTML page for a browser. Never a traceback: an unreachable Redis is a
503 with Retry-After (so is an unreachable archive, read for a job Redis no longer holds),
anything unexpected a logged 500 with a short message."""

from __future__ import annotations

import logging

import redis
from flask import Flask, Response, current_app, jsonify, render_template, request
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException, InternalServerError, default_exceptions

from jobs.core.store.connection import is_out_of_memory
from jobs.core.text import printable
from jobs.errors import ArchiveUnreachable, NoSuchJob

from .redis_guard import RedisUnavailable

log = logging.getLogger(__name__)

#: How long a client should wait before retrying when Redis is unreachable.
RETRY_AFTER_SECONDS = 5


def wants_html() -> bool:
    """True when the client prefers HTML to JSON (a browser navigating). No Accept header or
    ``*/*`` means JSON: API clients and scripts get JSON unless they ask otherwise."""
    best = request.accept_mimetypes.best_match(["application/json", "text/html"])
    return best == "text/html" and request.accept_mimetypes[best] > request.accept_mimetypes["application/json"]


def api_error(status: int, message: str, headers: dict | None = None) -> Response:
    response = jsonify(error=message)
    response.status_code = status
    response.headers.update(headers or {})
    return response


def error_response(status: int, message: str, headers: dict | None = None) -> Response:
    """JSON for API clients, the error page for browsers."""
    if wants_html():
        response = Response(printable(render_template("error.html", status=status, message=message)), status=status)
        response.headers.update(headers or {})
        return response
    return api_error(status, message, headers)


def _message(exc: HTTPException) -> str:
    standard = default_exceptions.get(exc.code)
    custom = standard is None or exc.description != standard.description
    if custom and exc.description:
        return exc.description
    if exc.code == 404:
        return f"no such address: {request.method} {request.path} (the API is POST/GET /jobs, GET /jobs/<id>)"
    if exc.code == 405:
        allowed = ", ".join(sorted(m for m in (exc.valid_methods or []) if m not in ("HEAD", "OPTIONS")))
        return f"{request.method} is not allowed on {request.path}; use {allowed or 'another method'}"
    if exc.code == 413:
        from . import app_settings

        limit = app_settings.current().web.max_body_bytes
        size = request.content_length
        got = f"the request body is {size} bytes; " if size is not None else ""
        return (f"{got}the limit is {limit} bytes (LEASH_MAX_BODY_BYTES): send fewer or shorter items, "
                "or split the batch into several jobs")
    return f"{exc.name}: {exc.description}"


def init_app(app: Flask) -> None:
    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        headers = dict(exc.get_headers())
        headers.pop("Content-Type", None)
        return error_response(exc.code or 500, _message(exc), headers)

    @app.errorhandler(NoSuchJob)
    def no_such_job(exc: NoSuchJob):
        return error_response(404, "no such job")

    @app.errorhandler(ArchiveUnreachable)
    def archive_unreachable(exc: ArchiveUnreachable):
        log.warning("archive unreachable during %s %s: %s", request.method, request.path, exc)
        return error_response(503, str(exc), {"Retry-After": str(RETRY_AFTER_SECONDS)})

    @app.errorhandler(CSRFError)
    def csrf_error(exc: CSRFError):
        return error_response(403, f"refused: {exc.description} Reload the page and submit again; API "
                                   "clients authenticate with 'Authorization: Bearer <token>' instead of a cookie")

    @app.errorhandler(redis.exceptions.ConnectionError)
    @app.errorhandler(redis.exceptions.TimeoutError)
    def redis_unreachable(exc: Exception):
        if isinstance(exc, RedisUnavailable):
            log.debug("redis still unreachable: %s %s answered 503 at once", request.method, request.path)
        else:
            log.warning("redis unreachable during %s %s: %s", request.method, request.path, exc)
            breaker = getattr(current_app.extensions.get("leash_redis"), "breaker", None)
            if breaker is not None:
                breaker.trip(exc)  # also failures outside the guarded calls (e.g. a WATCH)
        return error_response(503, f"the job store (Redis) is unreachable; try again in {RETRY_AFTER_SECONDS} "
                                   "seconds (resubmit with the same Idempotency-Key to avoid a duplicate job)",
                              {"Retry-After": str(RETRY_AFTER_SECONDS)})

    @app.errorhandler(redis.exceptions.ResponseError)
    def redis_refused(exc: redis.exceptions.ResponseError):
        if not is_out_of_memory(exc):
            raise exc  # any other refusal is a bug: the 500 handler logs it
        log.warning("redis is full (maxmemory) during %s %s: %s", request.method, request.path, exc)
        return error_response(503, f"the job store (Redis) is full: it reached its maxmemory and refuses "
                                   f"writes, so nothing was written; try again in {RETRY_AFTER_SECONDS} seconds "
                                   "(the operator must free memory or raise maxmemory)",
                              {"Retry-After": str(RETRY_AFTER_SECONDS)})

    @app.errorhandler(InternalServerError)
    def internal_error(exc: InternalServerError):
        original = getattr(exc, "original_exception", None)
        if original is not None:
            log.error("unhandled error in %s %s", request.method, request.path, exc_info=original)
        return error_response(500, "internal error; it has been logged. Try again, and report it if it persists")
