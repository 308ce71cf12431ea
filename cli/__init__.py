"""The ``leash`` command. Every option can also be set by the environment variable shown
in ``--help``; ``REDIS_URL`` selects Redis for all commands."""

from __future__ import annotations

import json
import sys

import click

from jobs import logs, reporting, states
from .connection import connect_checked
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob, NoSuchJob

from jobs.watch import watch_job



class NotFound(click.ClickException):
    exit_code = 2


@click.group(context_settings={"auto_envvar_prefix": "LEASH", "help_option_names": ["-h", "--help"]})
def main() -> None:
    """leash: a queue for long-running AI jobs whose states are never wrong."""
    from jobs.config import settings

    try:
        settings()  # a bad LEASH_* variable is a message and exit 2, not a traceback later
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@main.command()
@click.option("--queue", "queues", multiple=True, envvar="LEASH_QUEUE", show_envvar=True,
              help="Queue(s) to work on (default: leash).")
@click.option("--burst", is_flag=True, envvar="LEASH_BURST", show_envvar=True,
              help="Quit when the queues are empty.")
@click.option("--name", envvar="LEASH_WORKER_NAME", show_envvar=True, help="Worker name (default: random).")
@click.option("--scheduler/--no-scheduler", default=True, envvar="LEASH_WITH_SCHEDULER", show_envvar=True,
              help="Run RQ's scheduler (retry backoff) in this worker.")
@click.option("--log-level", default="INFO", envvar="LEASH_LOG_LEVEL", show_envvar=True)
@click.option("--import", "imports", multiple=True, envvar="LEASH_IMPORTS", show_envvar=True,
              help="Module(s) that register your job kinds (comma-separated in the env var).")
def worker(queues, burst, name, scheduler, log_level, imports):
    """Run a worker (RQ Worker with leases, reaping and deploy hand-off)."""
    from jobs.config import settings
    from jobs.kinds import import_kinds
    from jobs.worker import LeashWorker

    try:
        import_kinds(imports)
    except ImportError as exc:
        raise click.UsageError(f"cannot import job kinds: {exc}") from None

    try:
        logs.configure(log_level)  # LEASH_LOG_FORMAT: text or json
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    conn = connect_checked()
    names = [q.strip() for spec in (queues or settings().queues) for q in spec.split(",") if q.strip()]
    w = LeashWorker(names, connection=conn, name=name)  # names: it builds its own LeashQueue objects
    reporting.init_worker(w)  # SENTRY_DSN
    w.work(burst=burst, with_scheduler=scheduler, logging_level=log_level.upper())


@main.command()
@click.option("--kind", default="classify", show_default=True)
@click.option("--labels", help="Comma-separated labels (classify).")
@click.option("--template", help="Prompt template containing {item} (kind prompt).")
@click.option("--owner", default="default", envvar="LEASH_OWNER", show_envvar=True, show_default=True)
@click.option("--idempotency-key", help="Submitting again with the same key returns the first job.")
@click.option("--max-attempts", type=int, help="Attempts before the job fails (default LEASH_MAX_ATTEMPTS).")
@click.option("--queue", help="One of the queues in LEASH_QUEUE (default: the first).")
@click.option("--json", "as_json", is_flag=True, help='Print {"job_id": ...}.')
@click.argument("source", type=click.File("r"), default="-")
def submit(kind, labels, template, owner, idempotency_key, max_attempts, queue, as_json, source):
    """Enqueue one job; items are read one per line from SOURCE (a file, or - for stdin)."""
    items = [line.rstrip("\n") for line in source if line.strip()]
    payload: dict = {"items": items}
    if labels is not None:
        payload["labels"] = [x.strip() for x in labels.split(",") if x.strip()]
    if template is not None:
        payload["template"] = template
    conn = connect_checked()
    try:
        job_id, created = enqueue(conn, kind, payload, owner=owner, max_attempts=max_attempts,
                                  idempotency_key=idempotency_key, queue=queue)
    except InvalidJob as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "created": created}))
    else:
        click.echo(job_id if created else f"{job_id} (existing job for this idempotency key)")


def _status_or_exit(conn, job_id):
    try:
        return states.status(conn, job_id)
    except NoSuchJob:
        raise NotFound(f"no such job: {job_id}") from None


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the status fields.")
def status(job_id, as_json):
    """Print a job's status."""
    fields = _status_or_exit(connect_checked(), job_id)
    if as_json:
        click.echo(json.dumps(fields))
        return
    for name in states.FIELDS:
        value = fields[name]
        click.echo(f"{name:>17}: {json.dumps(value) if isinstance(value, dict) else value}")


@main.command()
@click.argument("job_id")
def watch(job_id):
    """Follow a job with a progress bar until it ends (polls 1 s for 10 s, then every 5 s)."""
    conn = connect_checked()
    fields = _status_or_exit(conn, job_id)
    final = watch_job(lambda: states.status(conn, job_id), first=fields, out=sys.stdout)
    if final["state"] == "failed":
        click.echo(f"error: {final['error']}", err=True)
        sys.exit(1)


@main.command()
@click.option("--port", default=5000, envvar="PORT", show_envvar=True, show_default=True)
@click.option("--workers", "n_workers", default=1, envvar="LEASH_DEV_WORKERS", show_envvar=True, show_default=True)
def dev(port, n_workers):
    """Run Redis (REDIS_URL, a redis-server on PATH, or the bundled one), the web app and
    workers on this machine; Ctrl-C stops all of it."""
    from jobs.devserver import run_dev

    sys.exit(run_dev(port=port, n_workers=n_workers))


# Dead-letter commands (failures, alert, replay) live in their own module.
from .deadletter import register as _register_deadletter  # noqa: E402

_register_deadletter(main)

if __name__ == "__main__":
    main()
