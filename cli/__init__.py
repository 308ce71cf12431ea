"""The ``leash`` command. Options that are settings can also be set by the environment
variable ``--help`` shows beside them (each declared in jobs/config/, read as the option's
default by cli/option_defaults.py). Redis is
``REDIS_URL``, else the one a running ``leash dev`` recorded, else one line saying there is
none (see cli/redis_target.py); any Redis error is one line naming the URL tried."""

from __future__ import annotations

import logging
import os
import sys

import click
import redis

from jobs.core.store.connection import is_out_of_memory
from jobs.errors import ArchiveUnreachable
from jobs.observability import logs, reporting

from . import exit_codes, job_commands
from .option_defaults import setting_option
from .redis_target import connect_checked, resolve, shown


class LeashGroup(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except redis.exceptions.RedisError as exc:
            # After the first ping: Redis went away, or refused a command. Say which Redis.
            if is_out_of_memory(exc):
                raise exit_codes.NoRedisError(
                    f"Redis at {shown(resolve()[0])} is full: it reached its maxmemory and refuses writes, "
                    "so nothing was written; free memory or raise maxmemory") from None
            raise exit_codes.NoRedisError(f"Redis at {shown(resolve()[0])}: {exc}") from None
        except ArchiveUnreachable as exc:  # a job only the archive holds, while it does not answer
            raise exit_codes.Unreachable(str(exc)) from None
        except BrokenPipeError:
            # The reader stopped reading (`leash results JOB | head -2`): end quietly, as Unix tools do;
            # stdout goes to /dev/null so Python's flush at exit does not raise again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(exit_codes.OK)


# Options that are settings read their declared variable through cli/option_defaults.py (shown
# in --help); click reads nothing from the environment itself.
EXIT_STATUSES = "Exit status: " + "; ".join(f"{code} {meaning}" for code, meaning in exit_codes.TABLE) + "."


@click.group(cls=LeashGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_STATUSES)
@click.version_option(package_name="leash", message="leash %(version)s")
def main() -> None:
    """leash: a queue for long-running AI jobs whose states are never wrong.
    Every command takes --json (one JSON answer for scripts); docs/CLI.md lists them."""
    from jobs.core.store.connection import check_settings

    try:
        check_settings()  # a bad setting is one line naming it and exit 2, not a traceback later
    except ValueError as exc:
        raise exit_codes.BadInput(str(exc)) from None
    from jobs.models import cache

    cache.archived = _archived_answers  # a dry run's price counts the answers that moved to the archive


def _archived_answers(names: list[str], connection) -> dict[str, str]:
    """The request cache's answers in the archive (imported only when Redis misses one): the
    configured archive, else that of the ``leash dev`` whose Redis this command uses."""
    from jobs.archive import answers

    return answers.lookup(names, connection)


@main.command()
@setting_option("--queue", "queues", multiple=True, setting="LEASH_QUEUE",
                help="Queue(s) to work on (default: leash).")
@setting_option("--burst", is_flag=True, setting="LEASH_BURST", help="Quit when the queues are empty.")
@setting_option("--name", setting="LEASH_WORKER_NAME", help="Worker name (default: random).")
@setting_option("--scheduler/--no-scheduler", setting="LEASH_WITH_SCHEDULER",
                help="Run RQ's scheduler (retry backoff) in this worker.")
@setting_option("--log-level", setting="LEASH_LOG_LEVEL")
@setting_option("--import", "imports", multiple=True, setting="LEASH_IMPORTS",
                help="Module(s) that register your job kinds (comma-separated in the env var).")
@click.option("--tracebacks/--no-tracebacks", default=True, hidden=True,
              help="--no-tracebacks: an error's traceback is its last line (leash dev's quiet terminal).")
def worker(queues, burst, name, scheduler, log_level, imports, tracebacks):
    """Run a worker (RQ Worker with leases, reaping and deploy hand-off)."""
    from jobs.archive import answers as archive_answers
    from jobs.archive import database as archive_database
    from jobs.config import settings
    from jobs.kinds import import_kinds
    from jobs.models import cache as request_cache
    from jobs.read.redis_health import eviction_warning
    from jobs.worker.leash_worker import LeashWorker

    try:
        import_kinds(imports)
    except ImportError as exc:
        raise click.UsageError(f"cannot import job kinds: {exc}") from None

    try:
        logs.configure(log_level, tracebacks=tracebacks)  # LEASH_LOG_FORMAT: text or json
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    conn = connect_checked(for_worker=True)
    from jobs.core.store import schema

    try:
        schema.ensure(conn)  # the layout Redis holds: migrated if older, refused if too new
    except schema.SchemaTooNew as exc:
        raise exit_codes.BadInput(str(exc)) from None
    names = [q.strip() for spec in (queues or settings().queues) for q in spec.split(",") if q.strip()]
    w = LeashWorker(names, connection=conn, name=name)  # names: it builds its own LeashQueue objects
    request_cache.archived = archive_answers.lookup_to_use  # answers that left Redis, marked used
    for warning in (eviction_warning(conn), archive_database.startup_warning()):
        if warning:
            logging.getLogger("leash.worker").warning(warning)
    try:
        reporting.init_worker(w)  # SENTRY_DSN
    except ValueError as exc:
        raise exit_codes.BadInput(str(exc)) from None
    w.work(burst=burst, with_scheduler=scheduler, logging_level=log_level.upper())
    if w.died:  # RQ's loop quit on an exception: a supervisor that restarts on failure must see one
        logging.getLogger("leash.worker").error("the worker stopped on an error: %s", w.died)
        sys.exit(exit_codes.FAILED)


@main.command()
@click.option("--host", default="0.0.0.0", show_default=True, help="The address to listen on.")
@setting_option("--port", type=click.IntRange(1, 65535), setting="PORT", show_default=True,
                help="The web app's port.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="The least severe log lines printed.")
def web(host, port, log_level):
    """Serve the web app (waitress: requests are read whole before a thread takes them)."""
    from web.serve import serve

    sys.exit(serve(host, port, log_level.upper()))


@main.command()
@setting_option("--port", type=click.IntRange(1, 65535), setting="PORT", show_default=True,
                help="The web app's port.")
@setting_option("--workers", "n_workers", type=int, setting="LEASH_DEV_WORKERS", show_default=True)
@click.option("--fresh", is_flag=True, help="Start with no jobs: forget what earlier runs on this port kept.")
@click.option("-v", "--verbose", is_flag=True,
              help="Print every log line of the workers and the web app, not only one line per job event.")
def dev(port, n_workers, fresh, verbose):
    """Run Redis (REDIS_URL, a redis-server on PATH, or the bundled one), the web app and
    workers on this machine; Ctrl-C stops all of it. Jobs and results are kept across runs
    (per port, in the state directory) unless --fresh."""
    import os

    from cli.devserver import DataInUse, free_port, port_in_use, run_dev

    from .devrecord import remove_record, write_record

    if port_in_use(port):
        raise exit_codes.BadInput(f"port {port} is in use by another program; "
                                    f"run leash dev --port {free_port(preferred=port + 1)} (or stop that program)")
    pid = os.getpid()
    try:
        code = run_dev(port=port, n_workers=n_workers, fresh=fresh, verbose=verbose,
                       on_ready=lambda redis_url, web_url: write_record(redis_url, web_url, pid),
                       on_stop=lambda: remove_record(pid))
    except (DataInUse, RuntimeError) as exc:
        raise exit_codes.BadInput(str(exc)) from None
    sys.exit(code)


for _command in job_commands.COMMANDS:
    main.add_command(_command)

# Dead-letter commands (failures, alert, replay) live in their own module.
from .failure_commands import register as _register_deadletter  # noqa: E402

_register_deadletter(main)

from .archive_commands import archive  # noqa: E402
from .doctor import doctor  # noqa: E402
from .operator_commands import COMMANDS as _operator_commands  # noqa: E402
from .pipeline_commands import COMMANDS as _pipeline_commands  # noqa: E402
from .usage_commands import usage_command  # noqa: E402

main.add_command(usage_command)
main.add_command(doctor)
main.add_command(archive)
for _command in (*_operator_commands, *_pipeline_commands):
    main.add_command(_command)

if __name__ == "__main__":
    main()
