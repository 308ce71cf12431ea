"""Errors to Sentry: with ``SENTRY_DSN`` set (and ``pip install 'leash[sentry]'``), the web app
reports unhandled errors (sentry-sdk's Flask integration) and workers report every failed
attempt (its RQ integration, and ``report_failed_attempt`` for the attempts it would not see
as failures because leash retries them). Every event is tagged with the job id, kind, owner
and attempt it is about (``jobs.observability.logs.job_context``).

Not reported, because nothing failed: a deploy's hand-off (``HandOff``), an attempt that lost
its lease to a newer one (``LeaseLost``), a cancel the owner asked for (``Canceled``).
sentry-sdk reads ``SENTRY_ENVIRONMENT`` and ``SENTRY_RELEASE`` (on Heroku the release defaults
to the slug's commit) by itself.
"""

from __future__ import annotations

import logging

from jobs import config
from jobs.core.lease import Outcome
from jobs.errors import Canceled, HandOff, LeaseLost
from jobs.observability.logs import CONTEXT_FIELDS, job_context

log = logging.getLogger("leash.reporting")

NOT_FAILURES = (HandOff, LeaseLost, Canceled)

_initialised = False


def init(component: str) -> bool:
    """Start reporting in this process if SENTRY_DSN is set; True if reporting is on."""
    global _initialised
    dsn = config.logs().sentry_dsn
    if not dsn:
        return False
    if _initialised:
        return True
    try:
        import sentry_sdk
        from sentry_sdk.integrations.flask import FlaskIntegration
        from sentry_sdk.integrations.rq import RqIntegration
    except ImportError:
        log.warning("SENTRY_DSN is set but sentry-sdk is not installed: pip install 'leash[sentry]'")
        return False
    # Only these two: the auto-enabled ones would, e.g., report every 429 the OpenAI SDK raises,
    # which leash waits out or retries by design.
    try:
        sentry_sdk.init(dsn=dsn, integrations=[FlaskIntegration(), RqIntegration()], auto_enabling_integrations=False,
                        before_send=_before_send)
    except ValueError as exc:  # sentry-sdk's BadDsn: say which setting, not only what it disliked
        raise ValueError(f"SENTRY_DSN is not a Sentry DSN ({exc}); copy it from the Sentry project's settings") \
            from None
    scope = sentry_sdk.get_global_scope()
    scope.set_tag("component", component)
    scope.add_event_processor(_tag_with_job)
    _initialised = True
    return True


def init_worker(worker) -> None:
    if init("worker"):
        # RQ calls a handler with the job and the exception; the attempt is the worker's own.
        worker.push_exc_handler(lambda job, *exc_info: report_failed_attempt(worker.attempt, *exc_info))


def _before_send(event, hint):
    exc_info = hint.get("exc_info")
    if exc_info and isinstance(exc_info[1], NOT_FAILURES):
        return None
    return event


def _tag_with_job(event, hint):
    tags = event.setdefault("tags", {})
    for name, value in job_context().items():
        if name in CONTEXT_FIELDS:
            tags.setdefault(name, str(value))
    return event


def report_failed_attempt(attempt, exc_type, exc_value, traceback) -> bool:
    """RQ exception handler (runs in the work-horse): report an attempt that failed, whether
    it will be retried or not. The RQ integration reports only what RQ itself thinks is a
    last attempt (it reads RQ's retry counter before leash has set it), so leash reports
    every failed attempt; when both report one, sentry-sdk's default deduplication (the same
    exception object) keeps one event."""
    failed = attempt is not None and attempt.outcome in (Outcome.RETRY, Outcome.FAILED)
    if failed and not isinstance(exc_value, NOT_FAILURES):
        import sentry_sdk

        sentry_sdk.capture_exception((exc_type, exc_value, traceback))
    return True  # go on to RQ's other handlers
