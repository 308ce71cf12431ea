"""The commands about jobs: submit (cli/submit_command.py), status, watch, results, cancel, jobs.

Who the CLI acts as, and the owner options: cli/acting.py.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys

import click

from jobs.batch.canceled import cancel_words
from jobs.batch.run import cancel_at_provider
from jobs.core import control, outcome, states
from jobs.core.text import printable
from jobs.models.backends import get_backend
from jobs.read import humane, job_status, listing, money, results

from . import exit_codes, status_text
from .acting import acting_owner, job_address, owner_option, status_or_exit
from .redis_target import connect_checked
from .submit_command import submit
from .watch import follow


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the status fields.")
@click.option("--full", is_flag=True, help="The whole error text (traceback too), nothing cut to fit.")
def status(job_id, as_json, full):
    """Print a job's status. Exit status 0 queued, running or succeeded; 1 failed or canceled;
    4 succeeded with item errors (the table: leash --help)."""
    fields = printable(status_or_exit(connect_checked(), job_id, whole_error=full))  # what a terminal can show
    if as_json:
        click.echo(json.dumps(fields))
    else:
        columns = shutil.get_terminal_size((100, 24)).columns
        for line in status_text.lines(fields, job_address(job_id), columns=columns, full=full):
            click.echo(line)
    sys.exit(exit_codes.of_job(fields))


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True,
              help="No progress line: wait for the end and print the job's status fields as JSON.")
def watch(job_id, as_json):
    """Follow a job on one line until it ends: a progress bar, items/s, ETA, elapsed.
    Exit status 0 succeeded, 4 succeeded with item errors, 1 failed, canceled or stopped, 130
    interrupted (the job goes on)."""
    conn = connect_checked()
    first = status_or_exit(conn, job_id)
    try:
        final = follow(lambda: job_status.status(conn, job_id), first=first,
                       out=_Silent() if as_json else sys.stdout)
    except KeyboardInterrupt:
        click.echo(f"stopped watching; the job goes on (leash watch {job_id})", err=True)
        sys.exit(exit_codes.INTERRUPTED)
    if as_json:
        click.echo(json.dumps(printable(final)))
    elif final["outcome"] == outcome.WITH_ITEM_ERRORS:
        click.echo(f"{outcome.words(final)}: `leash results {job_id}` shows them", err=True)
    elif final["state"] == "failed":
        click.echo(f"failed: {final['error_summary']}" if final["outcome"] == outcome.FAILED
                   else outcome.words(final), err=True)
    sys.exit(exit_codes.of_job(final))


class _Silent:
    """Where ``watch --json`` draws its progress: nowhere (only the final JSON is printed)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@click.command("results")
@click.argument("job_id")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True,
              help="jsonl: one {index, item, result, usage} object a line; csv: index,item,result,calls,tokens "
                   "(an extract job: a column per property of its schema, then error).")
@click.option("--json", "as_json", is_flag=True, help="The same as --format jsonl (JSON, one object a line).")
@click.option("-o", "--output", type=click.File("w", encoding="utf-8", lazy=True), default="-",
              help="Write here instead of stdout.")
def results_command(job_id, fmt, as_json, output):
    """Every item of a job with its result beside it, streamed page by page (any size).
    Items without a result yet (a running job) have an empty result."""
    if as_json:
        fmt = "jsonl"
    conn = connect_checked()
    status_or_exit(conn, job_id)
    writer = csv.writer(output) if fmt == "csv" else None
    columns = results.result_columns(conn, job_id) if writer is not None else []
    if writer is not None:
        writer.writerow(results.csv_header(columns))
    missing = 0
    for row in results.iter_results(conn, job_id):
        missing += row[2] is None
        if writer is not None:
            writer.writerow(results.csv_row(*row, columns=columns))
        else:
            output.write(results.jsonl_row(*row))
    if missing:
        click.echo(f"{missing} item(s) have no result yet", err=True)


@click.command("cancel")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"job_id": ..., "canceled": true|false, "was": ..., "text": ...}.')
def cancel_command(job_id, as_json):
    """Cancel a job: a queued one at once, a running one at its next heartbeat, one waiting at
    its provider at once with its provider batch. Exit status 1 when the job had already ended
    (nothing to cancel), 5 when the provider did not confirm its batch's cancel (a worker asks
    it again)."""
    conn = connect_checked()
    fields = status_or_exit(conn, job_id)
    archived = job_status.from_archive(fields)  # ended, and nothing of it left in Redis to change
    previous = fields["state"] if archived else control.cancel(conn, job_id)
    ended = previous in (states.State.SUCCEEDED, states.State.FAILED)
    if archived:
        text = (f"not canceled: {job_status.ONLY_ARCHIVED} ({outcome.words(fields)}); "
                "only queued or running jobs can be canceled")
    elif ended:
        text = f"the job has already {previous}; only queued or running jobs can be canceled"
    elif previous == control.WAITING:
        text, reached = cancel_words(*cancel_at_provider(conn, job_id, get_backend))  # what the provider said
    else:
        text = ("canceled" if previous == states.State.QUEUED
                else "cancel requested: the job stops at its next heartbeat")
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "canceled": not ended, "was": str(previous), "text": text}))
    else:
        click.echo(text, err=ended)
    if ended:
        sys.exit(exit_codes.FAILED)
    if previous == control.WAITING and not reached:
        sys.exit(exit_codes.UNREACHABLE)


@click.command("jobs")
@click.option("--state", type=click.Choice(listing.VIEWS),
              help="Only jobs in this state or outcome: canceled and stopped jobs are apart from failed ones, "
                   "those with item errors apart from succeeded ones.")
@click.option("--kind", help="Only jobs of this kind.")
@click.option("--search", help="Only jobs whose id, name or kind contains this text (any case).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@owner_option
@click.option("--json", "as_json", is_flag=True, help="Print the jobs' status fields as JSON lines.")
def jobs_command(state, kind, search, limit, owner, token, as_json):
    """An owner's jobs, newest first."""
    owner = acting_owner(owner, token)
    filters = listing.Filters(view=state, kind=kind, search=search)
    found = listing.find(connect_checked(), owner, 0, limit, filters)
    rows = []
    for job in found.jobs:
        if as_json:
            click.echo(json.dumps(job))
            continue
        shown = outcome.words(job) + (" (stale)" if job["stale"] else "")
        error = job["error_summary"] if job["outcome"] == outcome.FAILED else ""
        rows.append((job["job_id"], (job["name"] or "-")[:20], (job["kind"] or "")[:12], shown,
                     f"{job['done']}/{job['total']}", humane.relative(job["created_at"]) or "-",
                     humane.duration(job["elapsed_seconds"]) if job.get("elapsed_seconds") is not None else "-",
                     money.tokens_text(job), money.cost_cell(job), humane.cut(error, 60)[0] if error else ""))
    if rows:
        for line in _table(JOBS_HEADER, rows):
            click.echo(line)
    if not as_json:
        which = " ".join(f"{label} {value}" for label, value in (("in state", state), ("of kind", kind),
                                                                   ("matching", search)) if value)
        click.echo(f"{len(found.jobs)} of {found.total} job{'s' if found.total != 1 else ''} of owner {owner}"
                   + (f" {which}" if which else "") + ("; ~ marks estimated tokens" if any(
                       r[7].startswith("~") for r in rows) else ""), err=True)


#: The columns of ``leash jobs``; the numbers are right-aligned.
JOBS_HEADER = ("JOB", "NAME", "KIND", "STATE", "DONE", "SUBMITTED", "DURATION", "TOKENS", "COST", "ERROR")
_RIGHT = {"DONE", "DURATION", "TOKENS", "COST"}


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A header row and the rows under it, each column as wide as its widest cell."""
    widths = [max(len(str(row[n])) for row in (header, *rows)) for n in range(len(header))]
    lines = []
    for row in (header, *rows):
        cells = [str(cell).rjust(width) if name in _RIGHT else str(cell).ljust(width)
                 for name, cell, width in zip(header, row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines


COMMANDS = (submit, status, watch, results_command, cancel_command, jobs_command)
