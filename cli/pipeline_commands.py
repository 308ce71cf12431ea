"""Pipelines from the command line: ``leash submit --pipeline FILE`` (a YAML or JSON file of
stages, through the same submission as ``POST /pipelines``: jobs/intake/pipelines.py),
``leash pipeline status ID`` and ``leash pipeline cancel ID``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import yaml

from jobs.batch.canceled import cancel_words
from jobs.batch.run import cancel_at_provider
from jobs.core import control, states
from jobs.errors import InvalidJob, NoSuchJob
from jobs.intake import files, pipelines, submission
from jobs.intake.estimate_words import text as stage_text
from jobs.intake.submission import Refused
from jobs.models.backends import get_backend
from jobs.read import pipeline_view
from jobs.read.money import money

from . import exit_codes
from .acting import acting_owner, job_address, owner_option
from .exit_codes import BadInput
from .exit_codes import Refused as RefusedHere
from .redis_target import connect_checked, web_url

#: A stage's field naming a file of items (read as ``leash submit`` reads SOURCE), relative to
#: the pipeline file: the command line's own convenience, the API takes ``items``.
ITEMS_FILE = "items_file"


def read_file(path: str) -> dict:
    """The pipeline a file holds: JSON for a ``.json`` file, YAML otherwise (YAML reads JSON too),
    each stage's ``items_file`` read into its ``items``."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"--pipeline: cannot read {path}: {exc}") from None
    try:
        body = json.loads(text) if file.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise BadInput(f"--pipeline: {path} is not valid {'JSON' if file.suffix.lower() == '.json' else 'YAML'}: "
                       f"{str(exc)[:300]}") from None
    if not isinstance(body, dict):
        raise BadInput(f"--pipeline: {path} must hold an object with \"stages\": [...] (docs/STAGES.md)")
    for stage in body.get("stages") or []:
        if isinstance(stage, dict) and ITEMS_FILE in stage:
            items_path = file.parent / str(stage.pop(ITEMS_FILE))
            try:
                stage["items"] = files.read_items(items_path.read_bytes(), items_path.name)
            except (OSError, files.FileProblem) as exc:
                raise BadInput(f"--pipeline: stage {stage.get('name')!r}: {ITEMS_FILE} {items_path}: {exc}") from None
    return body


def pipeline_address(pipeline_id: str) -> str:
    return f"{web_url()}/pipelines/{pipeline_id}"


def submit_pipeline(path: str, owner: str, idempotency_key: str | None, dry_run: bool, as_json: bool) -> None:
    """``leash submit --pipeline FILE``: prints the pipeline id (and each stage's job id on stderr),
    or with --dry-run its price."""
    body = read_file(path)
    conn = connect_checked()
    try:
        submitted = pipelines.submit(conn, pipelines.read(body, owner, idempotency_key), submission, dry_run=dry_run)
    except Refused as refused:
        raise RefusedHere(str(refused)) from None
    except InvalidJob as exc:
        raise BadInput(str(exc)) from None
    if dry_run:
        click.echo(json.dumps({"estimate": submitted.estimate}) if as_json else estimate_text(submitted.estimate))
        return
    if as_json:
        click.echo(json.dumps({"pipeline_id": submitted.pipeline_id, "created": submitted.created,
                               "url": pipeline_address(submitted.pipeline_id),
                               "stages": [{"name": name, "job_id": job_id, "url": job_address(job_id)}
                                          for name, job_id in submitted.stages]}))
        return
    click.echo(submitted.pipeline_id if submitted.created
               else f"{submitted.pipeline_id} (existing pipeline for this idempotency key)")
    for name, job_id in submitted.stages:
        click.echo(f"  stage {name}: {job_id}", err=True)
    click.echo(f"  {pipeline_address(submitted.pipeline_id)}", err=True)


@click.group("pipeline")
def pipeline_group() -> None:
    """A pipeline's status, or cancel every stage of it (submit one with leash submit --pipeline FILE)."""


def _record(conn, pipeline_id: str) -> dict:
    try:
        return pipeline_view.owned(conn, pipeline_id, None)
    except NoSuchJob:
        raise BadInput(f"no such pipeline: {pipeline_id} (in the Redis at {conn.leash_url})") from None


@pipeline_group.command("status")
@click.argument("pipeline_id")
@click.option("--json", "as_json", is_flag=True, help="Print the status as GET /pipelines/<id> answers it.")
def status_command(pipeline_id, as_json):
    """Print each stage's state, progress and cost. Exit status 0 queued, running or succeeded;
    1 failed or canceled."""
    conn = connect_checked()
    fields = pipeline_view.status(conn, _record(conn, pipeline_id))
    if as_json:
        click.echo(json.dumps(fields))
    else:
        title = fields["name"] or pipeline_id
        click.echo(f"pipeline {title}: {fields['state']}{' (canceled)' if fields['canceled'] else ''}, "
                   f"{money(fields['cost_usd'])}")
        for number, stage in enumerate(fields["stages"], 1):
            progress = f" {stage.get('done')}/{stage.get('total')}" if stage.get("total") is not None else ""
            cost = f", {money(stage.get('cost_usd'))}" if stage["state"] not in ("expired", "not submitted") else ""
            click.echo(f"  {number}. {stage['name']} ({stage['kind']}) {stage['words']}{progress}{cost}"
                       f"  {stage['job_id'] or ''}")
            if stage.get("error") and stage["state"] == "failed":
                click.echo(f"     {stage['error'].splitlines()[0][:200]}")
        click.echo(f"  {pipeline_address(pipeline_id)}", err=True)
    sys.exit(exit_codes.FAILED if fields["state"] == states.State.FAILED.value else exit_codes.OK)


@pipeline_group.command("list")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100))
@owner_option
@click.option("--json", "as_json", is_flag=True, help="Print each pipeline's status as a JSON line.")
def list_command(limit, owner, token, as_json):
    """An owner's pipelines, newest first: id, state, stages and cost."""
    owner = acting_owner(owner, token)
    found, _ = pipeline_view.listed(connect_checked(), owner, 0, limit)
    for fields in found:
        if as_json:
            click.echo(json.dumps(fields))
            continue
        stages = ", ".join(f"{s['name']} {s['state']}" for s in fields["stages"])
        click.echo(f"{fields['pipeline_id']}  {fields['state']:<9}  {money(fields['cost_usd']):>8}  "
                   f"{fields['name'] or ''}  [{stages}]")


def _cancel_one(said: dict[str, str]):
    """One stage canceled as ``leash cancel`` does, its provider batch too; what the provider said
    of a batch goes in ``said`` (job id -> words), to be printed as ``leash cancel`` prints it."""

    def cancel_stage(conn, job_id: str) -> str:
        previous = control.cancel(conn, job_id)
        if previous == control.WAITING:
            said[job_id] = cancel_words(*cancel_at_provider(conn, job_id, get_backend))[0]
        return previous

    return cancel_stage


@pipeline_group.command("cancel")
@click.argument("pipeline_id")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"pipeline_id": ..., "stages": [{"name", "job_id", "was", "canceled"}]} (a batch stage '
                   'also "text": what its provider said of its batch, as leash cancel --json).')
def cancel_command(pipeline_id, as_json):
    """Cancel every stage: queued and waiting ones at once, running ones at their next heartbeat.
    Exit status 1 when every stage had already ended (nothing to cancel)."""
    conn = connect_checked()
    _record(conn, pipeline_id)
    said: dict[str, str] = {}
    canceled = pipelines.cancel(conn, pipeline_id, _cancel_one(said))
    ended = (states.State.SUCCEEDED, states.State.FAILED)
    rows = [{"name": name, "job_id": job_id, "was": was, "canceled": was not in ended}
            | ({"text": said[job_id]} if job_id in said else {}) for name, job_id, was in canceled]
    if as_json:
        click.echo(json.dumps({"pipeline_id": pipeline_id, "stages": rows}))
    else:
        for row in rows:
            click.echo(f"  {row['name']}: " + (row.get("text") or f"canceled (was {row['was']})" if row["canceled"]
                                               else f"had already {row['was']}"))
    if not any(row["canceled"] for row in rows):
        sys.exit(exit_codes.FAILED)


def estimate_text(figures: dict) -> str:
    """The pipeline's estimate for people: each stage's, then the sums."""
    lines = []
    for number, stage in enumerate(figures["stages"], 1):
        lines.append(f"stage {number} {stage['name']} ({stage['kind']})"
                     + (f", priced at {stage['priced_at']}" if stage.get("priced_at") else "") + ":")
        lines += ["  " + line for line in stage_text(stage["estimate"]).splitlines()]
    calls = figures.get("calls")
    lines.append(f"the pipeline: {calls:,} calls, {figures['cached_items']:,} answered from the request cache"
                 if calls is not None else "the pipeline: calls unknown")
    lines.append(f"  worst case {money(figures['cost_usd_max'])}, expected {money(figures['cost_usd_expected'])}")
    if figures.get("budget_covers_worst_case") is not None:
        lines.append(f"  the pipeline's budget {'covers' if figures['budget_covers_worst_case'] else 'does NOT cover'}"
                     " the worst case")
    lines.append(f"  ({figures['note']})")
    return "\n".join(lines)


COMMANDS = (pipeline_group,)
