"""One submission, whichever door it comes through: the form, the API and ``leash submit``
each build a ``Submission`` and call ``submit``; what differs between them is only how they
read the request and how they word the answer.

    submit(connection, submission, dry_run=False)
      ├─ a repeat of the owner's idempotency key ─▶ the first job (nothing checked, nothing written)
      ├─ a web dry run: its rate, owner and address ▶ Refused (LEASH_DRY_RUN_RATE)
      ├─ check the payload, once ──────────────────▶ Invalid (every field's problem, for the form)
      ├─ dry run: the estimate ───────────────────▶ Submitted(estimate=...), nothing written
      ├─ the door's refusals (``_refusal``) ─────────▶ Refused(status, message, retry_after)
      ├─ the price, kept with the job (None without one)
      └─ write: the queued cap taken in one step ──▶ Submitted(job_id, created) or Refused (cap)

The payload is checked once (``jobs.enqueue.check``) and the checked job is what is priced and
written: the kind's validator does not run again on the way.

A new door check goes in ``_refusal`` (it sees the checked job, its price and whether this is a
dry run) or, when it needs only the owner, in ``jobs.intake.admission.check``; the three doors
then answer it without a change: the API with its status and ``Retry-After``, the form with the
message on the page, ``leash submit`` with the message and exit status 1.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from redis import Redis

from jobs import kinds
from jobs.enqueue import Checked, check, check_name, repeat_of, write
from jobs.errors import InvalidJob, LeashError, PermanentError, QueueFull
from jobs.intake import admission, deployed_model, estimate, limits
from jobs.intake.admission import Refusal
from jobs.intake.modes import check_mode
from jobs.models import backends
from jobs.models.calls import ModelSettings
from jobs.usage import prices


class Submission(NamedTuple):
    """What a door read from its request: a job as ``jobs.enqueue.enqueue`` takes it."""

    kind: str
    payload: dict
    owner: str
    max_attempts: int | None = None
    queue: str | None = None
    name: str | None = None
    idempotency_key: str | None = None
    webhook_url: str | None = None  # where its completion webhook goes (jobs/webhooks/)
    #: The client's address at a web door (None elsewhere): its dry runs are counted per owner and
    #: per address (LEASH_DRY_RUN_RATE).
    address: str | None = None
    after: Any = None  # job ids it waits for (jobs/core/parents.py)
    after_policy: str | None = None
    pipeline: str | None = None  # the pipeline it is a stage of (jobs/intake/pipelines.py)


class Submitted(NamedTuple):
    """A submission's answer: the job (``created`` False for a repeat of an idempotency key),
    or for a dry run the estimate and no job."""

    job_id: str | None = None
    created: bool = False
    estimate: dict[str, Any] | None = None


class Refused(LeashError):
    """Not now: the door answers ``refusal.status`` with its message and ``Retry-After``; the
    same submission may succeed later (``leash submit`` exits 1)."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.message)
        self.refusal = refusal


class Invalid(InvalidJob):
    """The payload is refused (400/422, ``leash submit`` exits 2). The message is the first
    problem, as ``jobs.enqueue.enqueue`` words it; ``problems`` lists every field's problem as
    ``(field, message)`` (field None: the message names no one field) so the form shows all
    that is wrong at once."""

    def __init__(self, message: str, problems: list[tuple[str | None, str]]):
        super().__init__(message)
        self.problems = problems


def submit(connection: Redis, submission: Submission, dry_run: bool = False) -> Submitted:
    """Answer a submission (see the module's docstring): Submitted, or raise Invalid or Refused."""
    owner, key = submission.owner, submission.idempotency_key
    if not dry_run:
        existing = repeat_of(connection, owner, key)
        if existing is not None:
            return Submitted(existing, False)
    # A web door's dry run is counted before the check (the check is what it costs); the CLI
    # and Python callers hold the job store itself, and no limit of the door binds them.
    if dry_run and submission.address is not None:
        refusal = admission.check_dry_run(connection, owner, submission.address)
        if refusal is not None:
            raise Refused(refusal)
    job = _check(submission)
    # What depends on the model (its price, the door's USD-budget check, the estimate the job
    # keeps) is read from the settings the workers of the job's queue published, not this
    # process's environment (jobs.intake.deployed_model).
    with deployed_model.priced_with(connection, job.queue) as source:
        return _priced(connection, submission, job, dry_run, source)


def _priced(connection: Redis, submission: Submission, job: Checked, dry_run: bool, source: str) -> Submitted:
    unpriced = _unpriced_usd_budget(job)
    if unpriced:  # the worker would stop it at its first call: refused here instead
        raise Invalid(unpriced, [("budget_usd", unpriced)])
    if dry_run:
        refusal = _refusal(connection, job, None, dry_run=True)
        if refusal is not None:
            raise Refused(refusal)
        try:
            return Submitted(estimate=_estimate(connection, job) | {"model_settings": source})
        except InvalidJob as exc:  # no estimate here (no model configured): said as a refusal of the payload
            raise Invalid(str(exc), [(None, str(exc))]) from None
    refusal = _refusal(connection, job, None, dry_run=False)
    if refusal is not None:
        raise Refused(refusal)
    try:
        price = _estimate(connection, job) | {"model_settings": source}
    except InvalidJob:  # no estimate here (no model configured): the job goes without one
        price = None
    refusal = admission.owner_day_room(connection, job.owner, price)
    if refusal is not None:  # its owner's day has not room for one call: it would fail at its first
        raise Refused(refusal)
    try:
        job_id, created = write(connection, job, price=price)
    except QueueFull as exc:  # the place was taken by a submission racing this one
        raise Refused(Refusal(exc.status, str(exc), exc.retry_after)) from None
    except InvalidJob as exc:  # the idempotency key raced by many submissions at once
        raise Invalid(str(exc), [(None, str(exc))]) from None
    return Submitted(job_id, created)


def _refusal(connection: Redis, job: Checked, price: dict | None, dry_run: bool) -> Refusal | None:
    """The door's refusals of a checked job, in order; None lets it in. A submission (not a dry
    run) is counted against the owner's rate here. ``price`` is None until it is known."""
    if dry_run:
        return None
    return admission.check(connection, job.owner)


def _unpriced_usd_budget(job: Checked) -> str | None:
    """Why a USD budget cannot be kept (no known price for the deployment's model), or None."""
    budget = job.payload.get("budget")
    if not isinstance(budget, dict) or budget.get("usd") is None:
        return None
    try:
        backend = backends.backend_class()
        if not hasattr(backend, "default_url"):
            return None  # the offline backend calls no provider: nothing to pay
        settings = ModelSettings.from_env()
        url = settings.url or backend.default_url
        if prices.price_for(settings.name, url) is not None:
            return None
    except (PermanentError, ValueError):
        return None  # no model configured here: the job's estimate says so, the worker decides
    return (f"a budget in USD needs the model's price, and there is none: {prices.why_no_price(settings.name, url)}; "
            "or give the budget in tokens (budget.tokens, --budget-tokens)")


def _estimate(connection: Redis, job: Checked) -> dict[str, Any]:
    return estimate.estimate(connection, job.kind, job.payload, job.owner)


def checked(submission: Submission) -> Checked:
    """The submission after every check ``submit`` makes of its payload, writing nothing and
    pricing nothing (Invalid): a pipeline checks each of its stages so before writing any."""
    job = _check(submission)
    unpriced = _unpriced_usd_budget(job)
    if unpriced:
        raise Invalid(unpriced, [("budget_usd", unpriced)])
    return job


def price_assuming(connection: Redis, submission: Submission, item_count: int) -> dict[str, Any]:
    """The dry run of a submission whose items are not known before it starts (``items_from``
    another job's *results*, or the items of one fed so), assuming at most ``item_count`` of them,
    as a pipeline's dry run prices a stage fed by an earlier one: each as long as an item may be
    (LEASH_MAX_ITEM_CHARS, which the job holds them to as it starts), priced with the job's own
    kind, fields and model (``estimate.estimate``; a ``reduce``, its chunk tree) -- the worst case."""
    job = _check(submission)
    with deployed_model.priced_with(connection, job.queue) as source:
        try:
            figures = estimate.estimate(connection, job.kind, job.payload, job.owner, item_count=item_count)
        except InvalidJob as exc:  # no estimate here (no model configured): said as a refusal of the payload
            raise Invalid(str(exc), [(None, str(exc))]) from None
        return figures | {"model_settings": source}


def _check(submission: Submission) -> Checked:
    kind, payload, owner, max_attempts, queue, name, key = submission[:7]
    try:
        return check(kind, payload, owner, max_attempts, queue, name, key, submission.webhook_url,
                     submission.after, submission.after_policy, submission.pipeline)
    except InvalidJob as exc:
        # Refused already: ask each field apart only now, so a person sees all that is wrong.
        raise Invalid(str(exc), problems(kind, payload, name) or [(None, str(exc))]) from None


def problems(kind: str, payload, name=None) -> list[tuple[str | None, str]]:
    """Each field's problem, checked apart: the items, the kind's declared fields, the mode and
    the name (``(field, message)``; empty when no one field is wrong)."""
    checks = [("items", limits.check_items)]
    if kind in kinds.KINDS:
        checks += [(field.name, field.check) for field in kinds.KINDS[kind].fields]
        checks.append(("mode", lambda p: check_mode(p, kind, kinds.KINDS[kind].batch, backends.batch_problem)))
    checks.append(("name", lambda _: check_name(name)))
    found: list[tuple[str | None, str]] = []
    for field, field_check in checks:
        try:
            field_check(payload)
        except InvalidJob as exc:
            found.append((field, str(exc)))
        except (TypeError, AttributeError):  # a payload that is not an object: the first message says so
            pass
    return found


def dry_run(connection: Redis, kind: str, payload: dict, owner: str = "default", max_attempts: int | None = None,
            queue: str | None = None, name: str | None = None, webhook_url: str | None = None) -> dict[str, Any]:
    """The job's estimate after every check ``jobs.enqueue.enqueue`` makes; writes nothing
    (InvalidJob as ``enqueue`` raises it). For Python callers: the doors call ``submit``."""
    return submit(connection, Submission(kind, payload, owner, max_attempts, queue, name, webhook_url=webhook_url),
                  dry_run=True).estimate


def price_or_none(connection: Redis, kind: str, payload: dict, owner: str, **options) -> dict[str, Any] | None:
    """The estimate a job submitted with ``jobs.enqueue.enqueue`` from Python may keep; None
    when there is none (the payload is refused, or no model is configured here)."""
    try:
        return dry_run(connection, kind, payload, owner, **options)
    except InvalidJob:
        return None
