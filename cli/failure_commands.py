"""The dead-letter commands: ``leash failures``, ``leash alert``, ``leash replay``.

Each reads ``REDIS_URL``, prints a table (or one line) by default and JSON with ``--json``.
Bad input — an unknown id, a malformed duration, a threshold out of range — is one message
and exit status 2, with nothing changed.
"""

from __future__ import annotations

import json
import sys

import click

from jobs import deadletter
from jobs.archive import restore as archive_restore
from jobs.core import clock
from jobs.deadletter import alerts, durations, errored, failures, item_errors
from jobs.read.failure_groups import with_status
from jobs.usage.budget import Budget

from . import exit_codes
from .exit_codes import BadInput
from .option_defaults import setting_option
from .redis_target import connect_checked

#: Above this many jobs, replay asks before acting (unless --yes).
CONFIRM_ABOVE = 10


class Duration(click.ParamType):
    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        if str(value).lower() == "all" and param is not None and param.name == "since":
            return ALL
        try:
            return durations.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()
#: ``--since all``: every failed job still stored.
ALL = float("inf")



def _count(n: int, noun: str) -> str:
    """``1 failed job``, ``3 failed jobs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _short(ts: str | None) -> str:
    return (ts or "-")[:19].replace("T", " ")


@click.command("failures")
@click.option("--since", default="24h", type=DURATION, show_default=True,
              help="How far back to look: 90s, 15m, 24h, 7d, 2w, or 'all'.")
@click.option("--kind", help="Only this job kind.")
@click.option("--include-canceled", is_flag=True, help="Count canceled jobs too (left out by default).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def failures_command(since, kind, include_canceled, as_json):
    """Failed jobs grouped by kind and error (ids and numbers normalised), biggest first.
    Canceled jobs end in failed too, but are not failures: they are left out unless asked."""
    conn = connect_checked()
    result = failures.report(conn, since=since, kind=kind, include_canceled=include_canceled)
    if as_json:
        click.echo(json.dumps(result))
        return
    window = "all time" if since == ALL else f"the last {durations.render(since)}"
    if not result["groups"]:
        click.echo(f"no failed jobs in {window}")
        return
    groups = len(result["groups"])
    click.echo(f"{_count(result['total'], 'failed job')} in {_count(groups, 'group')}, {window}")
    click.echo(f"{'COUNT':>7}  {'KIND':<14} {'FIRST SEEN':<19}  {'LAST SEEN':<19}  {'EXAMPLES':<49}  ERROR")
    for g in result["groups"]:
        click.echo(f"{g['count']:>7}  {g['kind'][:14]:<14} {_short(g['first_seen']):<19}  "
                   f"{_short(g['last_seen']):<19}  {' '.join(g['examples']):<49}  {with_status(conn, g)}")


@click.command("alert")
@setting_option("--since", "window", type=DURATION, show_default=True, setting="LEASH_ALERT_WINDOW",
                help="Look back this far (at most 2d: the counters are kept two days).")
@click.option("--window", "old_window", type=DURATION, hidden=True, deprecated="use --since")
@setting_option("--max-failures", type=click.IntRange(min=0), setting="LEASH_ALERT_MAX_FAILURES",
                help="Alert when more jobs than this failed in the window.")
@setting_option("--max-ratio", type=click.FloatRange(0, 1), setting="LEASH_ALERT_MAX_RATIO",
                help="Alert when failed / (failed + succeeded) is above this (0 to 1).")
@click.option("--kind", help="Only this job kind.")
@setting_option("--webhook", setting="LEASH_ALERT_WEBHOOK",
                help="POST the line as JSON here when alerting (5 s timeout, retried twice).")
@setting_option("--include-canceled", is_flag=True, setting="LEASH_ALERT_INCLUDE_CANCELED",
                help="Count canceled jobs as failures (by default they are not).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def alert_command(window, old_window, max_failures, max_ratio, kind, webhook, include_canceled, as_json):
    """One line about the failure rate; exit status 1 when over a threshold (for a scheduler),
    2 when no threshold is given (nothing is checked). Canceled jobs are not failures unless
    --include-canceled."""
    window = old_window if old_window is not None else window
    if webhook and not webhook.startswith(("http://", "https://")):
        raise BadInput(f"--webhook must be an http(s) URL, got {webhook!r}")
    if window > alerts.MAX_WINDOW:
        raise BadInput(f"--since {durations.render(window)} is longer than 2d: outcome counters are kept two days")
    result = alerts.check(connect_checked(), window, max_failures=max_failures, max_ratio=max_ratio, kind=kind,
                          include_canceled=include_canceled)
    if max_failures is None and max_ratio is None:
        # Without a threshold nothing can be over it: an "OK" would pass a misconfigured
        # scheduler job forever. Say so, and exit 2 so the scheduler notices.
        line = (f"{result.line.removeprefix('OK').strip()}; nothing checked: no threshold given "
                "(--max-failures N or --max-ratio R)")
        click.echo(json.dumps(result.as_dict() | {"alert": None, "checked": False, "text": line}) if as_json
                   else line)
        sys.exit(exit_codes.BAD_INPUT)
    click.echo(json.dumps(result.as_dict()) if as_json else result.line)
    if webhook and result.alerting:
        try:
            alerts.post_webhook(webhook, result.as_dict())
        except alerts.WebhookFailed as exc:
            click.echo(str(exc), err=True)
    sys.exit(exit_codes.FAILED if result.alerting else exit_codes.OK)


@click.command("replay")
@click.argument("job_ids", nargs=-1)
@click.option("--kind", help="Failed jobs of this kind.")
@click.option("--error-contains", help="Failed jobs whose stored error contains this text.")
@click.option("--since", type=DURATION, help="Failed within this long: 90s, 15m, 24h, 7d, 2w, or 'all'.")
@click.option("--dry-run", is_flag=True, help="List what would be replayed; change nothing.")
@click.option("--yes", is_flag=True, help=f"Do not ask when more than {CONFIRM_ABOVE} jobs match.")
@setting_option("--actor", setting="LEASH_ACTOR", help="Who is replaying (audit; default $USER).")
@click.option("--budget-tokens", type=click.IntRange(min=1),
              help="Run the replayed jobs under this token budget (e.g. larger, after 'budget reached').")
@click.option("--budget-usd", type=click.FloatRange(min=0, min_open=True),
              help="Run the replayed jobs under this USD budget.")
@click.option("--errored-items", is_flag=True,
              help="Ask only the items of JOB_IDS that ended in an error again (a job that succeeded with item "
                   "errors too); their answered items stay and cost nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def replay_command(job_ids, kind, error_contains, since, dry_run, yes, actor, budget_tokens, budget_usd, errored_items,
                   as_json):
    """Put failed jobs back to queued with attempts 0; their checkpoints and error history are
    kept. A job that failed by its item errors (more than its max_item_errors) has those items
    asked again. Select by JOB_IDS and/or --kind, --error-contains, --since. Job ids can start
    with "-": put them after "--" (leash replay --yes -- ID...)."""
    if not (job_ids or kind or error_contains or since):
        raise BadInput("say which jobs: give job ids, or --kind, --error-contains or --since")
    if errored_items and not job_ids:
        raise BadInput("--errored-items asks the errored items of the jobs given: give their ids")
    conn = connect_checked()
    # A dry run writes nothing: a job Redis lost is read from the archive (what a replay would put
    # back first), and said as one Redis holds.
    archived = archive_restore.records_to_restore(conn, list(job_ids)) if job_ids and dry_run else {}
    if errored_items and dry_run:
        try:
            deadletter.select(conn, job_ids, archived=archived)  # unknown ids: as the replay says
        except deadletter.UnknownJobs as exc:
            raise BadInput(f"{exc}; nothing was replayed") from None
        for job_id in job_ids:
            kept = archive_restore.errored_to_restore(conn, job_id)
            n = len(errored.errored_items(conn, job_id) if kept is None else kept)
            click.echo(f"would ask {n} errored item{'s' if n != 1 else ''} of {job_id} again")
        return
    budget = None
    if budget_tokens is not None or budget_usd is not None:
        budget = Budget(budget_tokens, budget_usd)
    if job_ids and not dry_run:  # a record Redis lost comes back from the archive first
        archive_restore.records(conn, list(job_ids))
    if errored_items:
        try:
            deadletter.select(conn, job_ids)  # unknown ids: nothing is changed
        except deadletter.UnknownJobs as exc:
            raise BadInput(f"{exc}; nothing was replayed") from None
        if kind or error_contains or since:
            raise BadInput("--errored-items takes the jobs given by id, without --kind, --error-contains or --since")
        outcome = errored.replay(conn, list(job_ids), actor or deadletter.default_actor(),
                                 {"ids_given": len(job_ids), "kind": None, "error_contains": None, "since": None},
                                 restore=archive_restore.restore, budget=budget)
        _print_replay(as_json, "replayed", outcome.replayed, outcome.skipped, audit_id=outcome.audit_id,
                      left_failed=outcome.left_failed)
        if outcome.left_failed:
            click.echo(f"{len(outcome.left_failed)} left as it was: its owner is at the queued cap "
                       "(LEASH_MAX_QUEUED_PER_OWNER); ask again once some have started", err=True)
        if outcome.left_failed or not outcome.replayed:
            sys.exit(exit_codes.FAILED)
        return
    try:
        selection = deadletter.select(conn, job_ids, kind=kind, error_contains=error_contains, since=since,
                                      archived=archived)
    except deadletter.UnknownJobs as exc:
        raise BadInput(f"{exc}; nothing was replayed") from None
    matched = selection.matched
    if dry_run:
        _print_replay(as_json, "would replay", matched, selection.skipped, dry_run=True,
                      errored_asked=item_errors.failed_by_them(conn, [c.job_id for c in matched], archived))
        return
    if len(matched) > CONFIRM_ABOVE and not yes:
        try:
            agreed = click.confirm(f"Replay {len(matched)} failed jobs?", default=False, err=True)
        except click.Abort:
            click.echo(err=True)
            raise BadInput(f"{len(matched)} jobs match and there is no answer on stdin; "
                           "pass --yes to replay them, or --dry-run to list them") from None
        if not agreed:
            click.echo("nothing replayed", err=True)
            sys.exit(exit_codes.FAILED)
    # The ids given are the replayed ones plus the skipped ones, both in the entry: count them here.
    selector = {"ids_given": len(job_ids), "kind": kind, "error_contains": error_contains,
                "since": "all" if since == ALL else since}
    outcome = deadletter.replay(conn, matched, actor or deadletter.default_actor(), selector,
                                skipped=selection.skipped, budget=budget, restore=archive_restore.restore)
    _print_replay(as_json, "replayed", outcome.replayed, outcome.skipped, audit_id=outcome.audit_id,
                  left_failed=outcome.left_failed, errored_asked=outcome.errored_items_asked)
    if outcome.left_failed:  # the owner's queued cap: the same command works once some have started
        count = len(outcome.left_failed)
        click.echo(f"{count} job{'s' if count != 1 else ''} left failed: their owner is at the queued cap "
                   "(LEASH_MAX_QUEUED_PER_OWNER); replay them again once some have started", err=True)
        sys.exit(exit_codes.FAILED)


def _print_replay(as_json, verb, jobs, skipped, dry_run=False, audit_id=None, left_failed=(), errored_asked=None):
    """``errored_asked``: job id -> its errored items asked again (a job that failed by them)."""
    errored_asked = errored_asked or {}
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "replayed" if not dry_run else "would_replay":
                               [c.as_dict() | ({"errored_items_asked": errored_asked[c.job_id]}
                                               if c.job_id in errored_asked else {}) for c in jobs],
                               "skipped": [{"job_id": i, "reason": r} for i, r in skipped],
                               "left_failed": [{"job_id": i, "reason": r} for i, r in left_failed],
                               "audit_id": audit_id}))
        return
    click.echo(f"{verb} {len(jobs)} job{'s' if len(jobs) != 1 else ''}")
    for c in jobs:
        click.echo(f"  {c.job_id}  {c.kind:<14} {_short(clock.iso(c.failed_at))}  {c.error[:100]}")
        if c.job_id in errored_asked:
            n = errored_asked[c.job_id]
            click.echo(f"    it failed by its item errors: {'would ask' if dry_run else 'asks'} its {n} errored "
                       f"item{'s' if n != 1 else ''} again; its answered items stay")
    for job_id, reason in skipped:
        click.echo(f"  skipped {job_id}: {reason}")
    for job_id, reason in left_failed:
        click.echo(f"  {job_id} {reason}")


@click.command("replay-log")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000), help="How many entries.")
@click.option("--count", type=click.IntRange(1, 1000), hidden=True, deprecated="use --limit")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
def replay_log_command(limit, count, as_json):
    """The latest replays, newest first: who, when, which selector, how many jobs."""
    entries = deadletter.audit_log(connect_checked(), count or limit)
    if as_json:
        click.echo(json.dumps(entries))
        return
    for e in entries:
        selector = " ".join(f"{k}={v}" for k, v in e["selector"].items() if v not in (None, 0, ""))
        click.echo(f"{_short(e['at'])}  {e['actor']:<16} {e['count']:>6} replayed, {len(e['skipped'])} skipped  "
                   f"{selector or '-'}")


def register(group: click.Group) -> None:
    for command in (failures_command, alert_command, replay_command, replay_log_command):
        group.add_command(command)
