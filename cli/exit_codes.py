"""The exit statuses of every ``leash`` command: one table, named once (docs/CLI.md prints it).

A script or scheduler reads the number, so the same situation has the same number in every
command: ``leash status`` of a failed job and ``leash watch`` of it both exit ``FAILED``; no
Redis is ``NO_REDIS`` whichever command found out.
"""

from __future__ import annotations

import click

#: Done, and what was asked for is so (the job succeeded, the check passed, the list printed).
OK = 0
#: The job failed (or was canceled), or a check found a problem (doctor, alert, a declined replay).
FAILED = 1
#: Usage error, bad input, or refused at the door (unknown job id, bad option, admission refusal).
BAD_INPUT = 2
#: No Redis to talk to: none configured, unreachable, or it went away mid-command.
NO_REDIS = 3
#: The job succeeded, but some of its items ended with an error.
ITEM_ERRORS = 4
#: The model provider or another part of the deployment (the SQL archive) could not be reached.
UNREACHABLE = 5
#: Ctrl-C while following a job: the job goes on (128 + SIGINT, as shells report it).
INTERRUPTED = 130

#: (status, meaning) in order, for docs/CLI.md and ``leash --help``.
TABLE = (
    (OK, "ok"),
    (FAILED, "the job failed (or was canceled), or a check failed"),
    (BAD_INPUT, "usage error, bad input, or refused at the door"),
    (NO_REDIS, "cannot reach Redis"),
    (ITEM_ERRORS, "the job succeeded with item errors"),
    (UNREACHABLE, "the model provider or the archive is unreachable"),
)


class BadInput(click.ClickException):
    """One line about what to fix; exit ``BAD_INPUT``."""

    exit_code = BAD_INPUT


class Refused(click.ClickException):
    """Refused at the door (admission, a full queue): the same command may work later."""

    exit_code = BAD_INPUT


class NoRedisError(click.ClickException):
    """No Redis to talk to; exit ``NO_REDIS``."""

    exit_code = NO_REDIS


class Unreachable(click.ClickException):
    """The provider or the archive did not answer; exit ``UNREACHABLE``."""

    exit_code = UNREACHABLE


class Failed(click.ClickException):
    """The job failed or a check found a problem, said in one line; exit ``FAILED``."""

    exit_code = FAILED


def of_job(fields: dict) -> int:
    """What ``leash status`` and ``leash watch`` exit with for a job's status fields: still
    queued or running is ``OK`` (nothing went wrong yet), failed or canceled ``FAILED``,
    succeeded with item errors ``ITEM_ERRORS``."""
    if fields.get("state") == "failed":
        return FAILED
    if fields.get("state") == "succeeded" and (fields.get("item_errors") or 0) > 0:
        return ITEM_ERRORS
    return OK
