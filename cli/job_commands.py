"""The commands about jobs: submit, status, watch, results, cancel, jobs.

Who the CLI acts as: with ``LEASH_API_TOKENS`` unset (development) the shared owner, the same
as curl and the browser, so ``leash submit`` prints an address that opens anywhere. With
tokens set (production) a command that submits or lists must say whose jobs: ``--owner`` or
``--token``. Commands given a job id act on that job whoever owns it: Redis access is an
operator's access.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import sys
from pathlib import Path

import click

from jobs import kinds
from jobs.batch.canceled import cancel_words
from jobs.batch.run import cancel_at_provider
from jobs.config.front import web_app
from jobs.core import control, outcome, states
from jobs.core.items import CONCURRENCY_FIELD
from jobs.core.text import printable
from jobs.errors import InvalidJob, NoSuchJob
from jobs.intake import files, submission
from jobs.intake.estimate import text as estimate_text
from jobs.intake.modes import MODE_FIELD, MODES
from jobs.models.backends import get_backend
from jobs.models.cache import CACHE_FIELD
from jobs.read import humane, listing, money, results, selection
from jobs.read.owners import OWNER_PATTERN, SHARED_OWNER, parse_tokens
from jobs.usage.budget import BUDGET_FIELD

from . import exit_codes, status_text
from .exit_codes import BadInput, Refused
from .redis_target import connect_checked, web_url
from .watch import follow


def owner_option(func):
    func = click.option("--token", envvar="LEASH_TOKEN", show_envvar=True,
                        help="Act as the owner of this API token (from LEASH_API_TOKENS).")(func)
    return click.option("--owner", envvar="LEASH_OWNER", show_envvar=True,
                        help="Act as this owner (default without LEASH_API_TOKENS: shared).")(func)


def acting_owner(owner: str | None, token: str | None) -> str:
    try:
        tokens = parse_tokens(web_app().api_tokens)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if token:
        if not tokens:
            raise BadInput("--token needs LEASH_API_TOKENS, the owner=token list of the deployment")
        found = tokens.get(token)
        if found is None:
            raise BadInput("unknown --token: it is not one of LEASH_API_TOKENS")
        if owner and owner != found:
            raise BadInput(f"--owner {owner!r} and --token (owner {found!r}) disagree; give one of them")
        return found
    if owner:
        if not OWNER_PATTERN.match(owner):
            raise BadInput(f"--owner {owner!r} must be 1-200 letters, digits or _.:@-")
        return owner
    if tokens:
        raise BadInput("LEASH_API_TOKENS is set (production): say whose jobs these are with --owner NAME "
                       "or --token TOKEN (or LEASH_OWNER / LEASH_TOKEN)")
    return SHARED_OWNER


def job_address(job_id: str) -> str:
    return f"{web_url()}/jobs/{job_id}"


def status_or_exit(conn, job_id: str) -> dict:
    try:
        return states.status(conn, job_id)
    except NoSuchJob:
        raise BadInput(f"no such job: {job_id} (in the Redis at {conn.leash_url})") from None


def _flag(field: kinds.Field) -> str:
    return "--" + field.name.replace("_", "-")


def in_flags(message: str, given: dict) -> str:
    """A validator's message about the payload's fields, in the command's own words: the
    flags that set them (a person typed --labels, not a JSON field 'labels')."""
    for field, _ in kinds.fields():
        if f"'{field.name}'" in message and given.get(field.name) is None and field.missing:
            return field.missing
    for field, _ in kinds.fields():
        entry = field.name.removesuffix("s")
        message = re.sub(rf"\b{field.name}\[(\d+)\]",
                         lambda m, e=entry, f=field: f"{e} {int(m.group(1)) + 1} of {_flag(f)}", message)
        message = message.replace(f"'{field.name}'", _flag(field))
    return message.replace("'mode'", "--mode")


def _field_option(field: kinds.Field, kind_names: list[str]) -> click.Option:
    return click.Option([_flag(field), field.name], metavar="FILE" if field.from_file else None,
                        help=f"{field.help}{' (a file)' if field.from_file else ''} ({', '.join(kind_names)}).")


def _field_text(field: kinds.Field, given: str) -> str:
    """What an option holds: the value's text, or for a field given as a file, the file's."""
    if not field.from_file:
        return given
    try:
        return Path(given).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{_flag(field)}: cannot read {given}: {exc}") from None


class KindFieldsCommand(click.Command):
    """A command with an option for every field a kind declares (jobs.kinds.Field), named after
    it -- the built-in kinds' and those of your own modules (LEASH_IMPORTS), which are imported
    when the command line is read, not when the CLI is imported, so ``leash submit --kind
    summarise --tone formal`` and its --help know them."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        try:
            kinds.import_from_env()
        except ImportError as exc:
            raise BadInput(f"cannot import job kinds (LEASH_IMPORTS): {exc}") from None
        known = {param.name for param in self.params}
        new = [_field_option(field, names) for field, names in kinds.fields() if field.name not in known]
        if new:  # after --kind and --name, where a reader of --help looks for them
            at = next((i + 1 for i, param in enumerate(self.params) if param.name == "name"), len(self.params))
            self.params[at:at] = new
        return super().get_params(ctx)


@click.command(cls=KindFieldsCommand)
@click.option("--kind", default="classify", show_default=True)
@click.option("--name", help="A name to find the job by in lists and searches (at most 100 characters).")
@owner_option
@click.option("--idempotency-key", help="Submitting again with the same key returns the first job.")
@click.option("--max-attempts", type=int, help="Attempts before the job fails (default LEASH_MAX_ATTEMPTS).")
@click.option("--queue", help="One of the queues in LEASH_QUEUE (default: the first).")
@click.option("--item-concurrency", type=click.IntRange(min=1),
              help="Items of this job in flight at once, at most LEASH_ITEM_CONCURRENCY (the worker's).")
@click.option("--budget-tokens", type=click.IntRange(min=1),
              help="Stop the job (failed, replayable) before its model calls pass this many tokens.")
@click.option("--budget-usd", type=click.FloatRange(min=0, min_open=True),
              help="Stop the job before its model calls cost more than this (needs a known price).")
@click.option("--mode", type=click.Choice(MODES), default="direct", show_default=True,
              help="batch: the items go through the provider's batch API (half the price, within 24 h; "
                   "no worker is held while it works).")
@click.option("--no-cache", is_flag=True,
              help="Ask the model again for every item, even a request already answered (the request cache).")
@click.option("--dry-run", is_flag=True,
              help="Print what the job would cost (worst case, expected, what is cached) and submit nothing.")
@click.option("--items-from", "items_from", metavar="JOB[:label=VALUE]",
              help="The items: job JOB's, read when this job starts; JOB:label=VALUE, JOB:FIELD=VALUE or "
                   "JOB:errored take only those (docs/STAGES.md). SOURCE is not read.")
@click.option("--after", "after", metavar="JOB", multiple=True,
              help="Start once job JOB has ended (repeat for several; docs/STAGES.md).")
@click.option("--after-policy", type=click.Choice(["cancel", "run", "wait"]), default=None,
              help="If a job it waits for fails or is canceled: cancel this one (default), run it anyway, or wait.")
@click.option("--webhook", "webhook_url", metavar="URL",
              help="POST a signed webhook to URL when the job ends (default: LEASH_WEBHOOK_URL; docs/WEBHOOKS.md).")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"job_id": ..., "created": ..., "url": ...} (with --dry-run: {"estimate": ...}).')
@click.argument("source", type=click.File("rb"), default="-")
def submit(kind, name, owner, token, idempotency_key, max_attempts, queue, item_concurrency,
           budget_tokens, budget_usd, mode, no_cache, dry_run, items_from, after, after_policy, webhook_url, as_json,
           source, **field_texts):
    """Enqueue one job; items are read from SOURCE (a file, or - for stdin) as the form reads an
    upload: UTF-8, one per line, or a .csv's text column (not read with --items-from). Prints the
    job id, and its web address on stderr."""
    owner = acting_owner(owner, token)
    if items_from is None and source.isatty():
        click.echo("reading items from the terminal, one per line; end with Ctrl-D "
                   "(or give a file: leash submit items.txt)", err=True)
    if items_from is not None:
        try:
            payload: dict = {"items_from": selection.from_text(items_from)}
        except InvalidJob as exc:
            raise BadInput(_in_options(str(exc))) from None
    else:
        try:
            items = files.read_items(source.read(), getattr(source, "name", "") or "")
        except files.FileProblem as exc:
            raise BadInput(f"{getattr(source, 'name', 'the items')}: {exc}") from None
        payload = {"items": items}
    for field, _ in kinds.fields():
        if field_texts.get(field.name) is not None:
            payload[field.name] = field.from_text(_field_text(field, field_texts[field.name]))
    if item_concurrency is not None:
        payload[CONCURRENCY_FIELD] = item_concurrency
    if mode != "direct":
        payload[MODE_FIELD] = mode
    budget = {"tokens": budget_tokens, "usd": budget_usd}
    if any(v is not None for v in budget.values()):
        payload[BUDGET_FIELD] = {k: v for k, v in budget.items() if v is not None}
    if no_cache:
        payload[CACHE_FIELD] = False
    conn = connect_checked()
    try:
        submitted = submission.submit(conn, submission.Submission(
            kind, payload, owner, max_attempts, queue, name, idempotency_key, webhook_url=webhook_url,
            after=list(after), after_policy=after_policy), dry_run=dry_run)
    except submission.Refused as refused:
        # Refused at the door (exit 2): nothing was enqueued; the same command may succeed later.
        raise Refused(str(refused)) from None
    except submission.Invalid as exc:
        raise BadInput(in_flags(_in_options(str(exc)), field_texts)) from None
    if dry_run:
        click.echo(json.dumps({"estimate": submitted.estimate}) if as_json else estimate_text(submitted.estimate))
        return
    job_id, created = submitted.job_id, submitted.created
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "created": created, "url": job_address(job_id)}))
        return
    click.echo(job_id if created else f"{job_id} (existing job for this idempotency key)")
    click.echo(f"  {job_address(job_id)}", err=True)


def _in_options(message: str) -> str:
    """A refusal in the command's words: the API's option names are these options."""
    for name, option in (("'webhook_url'", "--webhook"), ("'after_policy'", "--after-policy"), ("'after'", "--after"),
                         ("'items_from'", "--items-from")):
        message = message.replace(name, option)
    return message


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the status fields.")
@click.option("--full", is_flag=True, help="The whole error text (traceback too), nothing cut to fit.")
def status(job_id, as_json, full):
    """Print a job's status. Exit status 0 queued, running or succeeded; 1 failed or canceled;
    4 succeeded with item errors (the table: leash --help)."""
    fields = printable(status_or_exit(connect_checked(), job_id))  # what a terminal can show
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
        final = follow(lambda: states.status(conn, job_id), first=first,
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
    status_or_exit(conn, job_id)
    previous = control.cancel(conn, job_id)
    ended = previous in (states.State.SUCCEEDED, states.State.FAILED)
    if ended:
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
