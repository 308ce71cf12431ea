"""``leash submit``: one job from a file of items and an option for every field its kind declares,
through the one submission of the form and the API (jobs.intake.submission), answered in the
command's own words (its options, not the API's JSON fields)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from jobs import kinds
from jobs.core.running.items import CONCURRENCY_FIELD
from jobs.errors import InvalidJob
from jobs.intake import files, submission
from jobs.intake.estimate_words import text as estimate_text
from jobs.intake.modes import MODE_FIELD, MODES
from jobs.models.cache import CACHE_FIELD
from jobs.read import selection
from jobs.usage.budget import BUDGET_FIELD

from .acting import acting_owner, job_address, owner_option
from .exit_codes import BadInput, Refused
from .redis_target import connect_checked


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
                   "JOB:errored take only those; JOB:results (JOB:results:label=VALUE, ...) takes their results "
                   "instead of their inputs (docs/STAGES.md). SOURCE is not read.")
@click.option("--after", "after", metavar="JOB", multiple=True,
              help="Start once job JOB has ended (repeat for several; docs/STAGES.md).")
@click.option("--after-policy", type=click.Choice(["cancel", "run", "wait"]), default=None,
              help="If a job it waits for (--after, --items-from) fails or is canceled: cancel this one (default), "
                   "run it anyway, or wait.")
@click.option("--webhook", "webhook_url", metavar="URL",
              help="POST a signed webhook to URL when the job ends (default: LEASH_WEBHOOK_URL; docs/WEBHOOKS.md).")
@click.option("--pipeline", "pipeline_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="Submit a pipeline: every stage in FILE (YAML or JSON, docs/STAGES.md) in one submission; "
                   "with it only --owner, --token, --idempotency-key, --dry-run and --json apply.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"job_id": ..., "created": ..., "url": ...} (with --dry-run: {"estimate": ...}).')
@click.argument("source", type=click.File("rb"), default="-")
def submit(kind, name, owner, token, idempotency_key, max_attempts, queue, item_concurrency,
           budget_tokens, budget_usd, mode, no_cache, dry_run, items_from, after, after_policy, webhook_url,
           pipeline_file, as_json, source, **field_texts):
    """Enqueue one job; items are read from SOURCE (a file, or - for stdin) as the form reads an
    upload: UTF-8, one per line, or a .csv's text column (not read with --items-from). Prints the
    job id, and its web address on stderr. With --pipeline FILE: every stage of the pipeline in
    FILE, printing the pipeline's id."""
    owner = acting_owner(owner, token)
    if pipeline_file is not None:
        from .pipeline_commands import submit_pipeline

        _only_pipeline_options(click.get_current_context())
        submit_pipeline(pipeline_file, owner, idempotency_key, dry_run, as_json)
        return
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


#: What applies with --pipeline: every job option is a stage's, in the file.
_WITH_PIPELINE = {"pipeline_file", "owner", "token", "idempotency_key", "dry_run", "as_json"}


def _only_pipeline_options(ctx: click.Context) -> None:
    """--pipeline takes every stage from its file: a job option given beside it is refused (it
    would apply to no stage), not silently dropped."""
    for param in ctx.command.get_params(ctx):
        if param.name in _WITH_PIPELINE or not isinstance(param, click.Option | click.Argument):
            continue
        if ctx.get_parameter_source(param.name) in (click.core.ParameterSource.COMMANDLINE,
                                                     click.core.ParameterSource.ENVIRONMENT):
            shown = param.opts[0] if isinstance(param, click.Option) else param.name.upper()
            raise BadInput(f"{shown} does not go with --pipeline: every stage's fields and options are in the "
                           "pipeline file (docs/STAGES.md)")


def _in_options(message: str) -> str:
    """A refusal in the command's words: the API's option names are these options."""
    for name, option in (("'webhook_url'", "--webhook"), ("'after_policy'", "--after-policy"), ("'after'", "--after"),
                         ("'items_from'", "--items-from")):
        message = message.replace(name, option)
    return message
