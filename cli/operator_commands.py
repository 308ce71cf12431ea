"""The operator's commands: ``leash pause`` / ``leash resume`` a queue, ``leash quiet`` a worker
(or all), ``leash workers`` and ``leash queue`` at a glance. They act on every owner's work, so
they are for whoever holds the deployment's REDIS_URL, like ``leash worker`` itself."""

from __future__ import annotations

import json

import click
from rq.serializers import JSONSerializer
from rq.worker import Worker

from jobs.config import settings
from jobs.core import clock, switches
from jobs.deadletter import default_actor
from jobs.read import fleet

from .exit_codes import BadInput
from .redis_target import connect_checked


def _known_queue(conn, queue: str) -> str:
    known = fleet.known_queues(conn, settings().queues)
    if queue not in known:
        raise BadInput(f"no queue named {queue!r}: the queues are {', '.join(sorted(known))}")
    return queue


JSON = click.option("--json", "as_json", is_flag=True, help="One JSON object: what was done.")


@click.command("pause")
@click.argument("queue")
@JSON
def pause(queue, as_json):
    """Pause QUEUE: workers stay up and take none of its jobs (they stay queued, in order)
    until `leash resume QUEUE`. A job already running goes on to its end."""
    conn = connect_checked()
    queue = _known_queue(conn, queue)
    changed = switches.pause(conn, queue, actor=f"cli:{default_actor()}")
    since = switches.paused(conn).get(queue)
    if as_json:
        click.echo(json.dumps({"queue": queue, "paused": True, "since": clock.iso(since), "changed": changed}))
    elif changed:
        click.echo(f"paused {queue}: workers take none of its jobs until `leash resume {queue}`")
    else:
        click.echo(f"{queue} was already paused (since {clock.iso(since)})")


@click.command("resume")
@click.argument("queue")
@JSON
def resume(queue, as_json):
    """Resume a paused QUEUE: workers take its jobs again within a few seconds."""
    conn = connect_checked()
    queue = _known_queue(conn, queue)
    changed = switches.resume(conn, queue, actor=f"cli:{default_actor()}")
    if as_json:
        click.echo(json.dumps({"queue": queue, "paused": False, "changed": changed}))
    else:
        click.echo(f"resumed {queue}" if changed else f"{queue} was not paused")


@click.command("quiet")
@click.argument("worker", required=False)
@click.option("--all", "every", is_flag=True, help="Every worker running now.")
@JSON
def quiet(worker, every, as_json):
    """Make WORKER quiet (or --all): it finishes the job it runs and takes no new one; then stop
    it (SIGTERM) with nothing to hand back. `kill -TSTP <pid>` on a worker does the same."""
    if bool(worker) == every:
        raise BadInput("name one worker (see `leash workers`) or give --all")
    conn = connect_checked()
    alive = [w.name for w in Worker.all(connection=conn, serializer=JSONSerializer)]
    if worker and worker not in alive:
        raise BadInput(f"no worker named {worker!r} is running; `leash workers` lists them")
    names = alive if every else [worker]
    told = switches.quiet(conn, names, actor=f"cli:{default_actor()}")
    if as_json:
        click.echo(json.dumps({"quiet": names, "newly": told}))
        return
    for name in names:
        click.echo(f"{name}: quiet" + ("" if name in told else " (already)"))
    if not names:
        click.echo("no worker is running", err=True)


def _ago(since: float | None, now: float) -> str:
    if since is None:
        return "—"
    seconds = max(0, int(now - since))
    return f"{seconds}s" if seconds < 120 else (f"{seconds // 60}m" if seconds < 7200 else f"{seconds // 3600}h")


@click.command("workers")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: {\"workers\": [...]}.")
def workers(as_json):
    """Every worker: busy, idle or quiet, since when, its job, its host and pid."""
    rows = fleet.workers(connect_checked())
    if as_json:
        click.echo(json.dumps({"workers": [row.as_dict() for row in rows]}))
        return
    now = clock.wall()
    click.echo(f"{'worker':<34} {'state':<9} {'for':>5}  {'job':<26} {'host':<20} pid")
    for row in rows:
        click.echo(f"{row.name[:34]:<34} {row.state:<9} {_ago(row.since, now):>5}  {(row.job_id or '—')[:26]:<26} "
                   f"{(row.host or '?')[:20]:<20} {row.pid or '?'}")
    if not rows:
        click.echo("no worker is running: start one with `leash worker`")


@click.command("queue")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: {\"queues\": [...]}.")
def queue_command(as_json):
    """Each queue: jobs queued (ready for a worker), waiting (a retry's backoff, a batch job's
    next look, a deferral), held (for a slot of their owner's concurrency limit), the oldest
    queued job's age, paused or not; then per owner."""
    rows = fleet.queues(connect_checked())
    if as_json:
        click.echo(json.dumps({"queues": [row.as_dict() for row in rows]}))
        return
    now = clock.wall()
    for row in rows:
        paused = f"  PAUSED for {_ago(row.paused_since, now)}" if row.paused_since is not None else ""
        oldest = "—" if row.oldest_age is None else _ago(now - row.oldest_age, now)
        click.echo(f"{row.queue}: {row.queued} queued, {row.waiting} waiting, {row.held} held, "
                   f"oldest queued {oldest}{paused}")
        for owner, counts in sorted(row.owners.items(), key=lambda kv: -sum(kv[1].values())):
            click.echo(f"  {owner[:40]:<40} {counts['queued']:>7} queued {counts['waiting']:>7} waiting "
                       f"{counts['held']:>7} held")


@click.command("operator-log")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000), help="How many entries.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: {\"entries\": [...]}.")
def operator_log(limit, as_json):
    """The latest pauses, resumes and quiets, newest first: who (cli:USER, dashboard:USER), when, what."""
    entries = switches.audit_log(connect_checked(), count=limit)
    if as_json:
        click.echo(json.dumps({"entries": entries}))
        return
    for e in entries:
        click.echo(f"{e['at']}  {e['actor']:<24} {e['action']:<7} {', '.join(e['targets']) or '(no worker)'}"
                   + ("" if e["changed"] else "  (no change)"))
    if not entries:
        click.echo("no operator action recorded yet")


COMMANDS = (pause, resume, quiet, workers, queue_command, operator_log)
